"""The sampling baselines of ``dsh bench --parts tiny`` that run in processes of their own: ``model.generate`` with
glibc keeping freed memory in its heap, and CTranslate2 (a well-kept inference library; loaded beside the engine it
would bring a second OpenMP runtime into the process).

Each runs the workload :func:`run_generate` runs in-process (the shipped base, the same prompts, temperature 1, no
top-k/top-p, at most ``max_new`` new tokens, ``rows`` rows at a time) in a child process, which times its own
generation (start-up and model loading left out) and counts its own minor page faults.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ...training.laptop_base import SHIPPED_BASE

HEAP_PATH = "model.generate, freed memory kept in the heap"
CT2_PATH = "CTranslate2, float32, its own process"
# glibc's allocator told to keep freed memory (allocations up to 32 MB from the heap, the heap never trimmed)
HEAP_KEPT_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 * 1024 * 1024), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}
ROOT = Path(__file__).resolve().parents[3]


def run_generate(model, tok, prompts, rows, max_new, seed):
    """``model.generate`` of ``prompts`` (token-id lists) in batches of ``rows`` (left padding), sampling at
    temperature 1 with no top-k/top-p, seeded by ``seed`` -> (seconds, completion lengths up to the end token)."""
    import torch

    tok.padding_side = "left"
    eos, gen = tok.eos_token_id, []
    torch.manual_seed(seed)
    t = time.perf_counter()
    for s in range(0, len(prompts), rows):
        chunk = prompts[s:s + rows]
        enc = tok.pad({"input_ids": chunk}, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=max_new, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                 pad_token_id=tok.pad_token_id, eos_token_id=eos)
        for row in out[:, enc["input_ids"].shape[1]:].tolist():
            gen.append(row.index(eos) + 1 if eos in row else len(row))
    return time.perf_counter() - t, gen


_GENERATE_CHILD = """
import json, resource, sys
from dsh.experiment.bench.baselines import run_generate
from dsh.llm.models import load
a = json.load(open(sys.argv[1]))
model, tok = load(a["model"])
model.eval()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
secs, gen = run_generate(model, tok, a["prompts"], a["rows"], a["max_new"], a["seed"])
json.dump({"seconds": secs, "gen": gen, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before},
          open(sys.argv[1], "w"))
"""

_CT2_CHILD = """
import json, resource, sys, time
from pathlib import Path
import ctranslate2
from transformers import AutoTokenizer
a = json.load(open(sys.argv[1]))
tok = AutoTokenizer.from_pretrained(a["model"])
if not (Path(a["converted"]) / "model.bin").is_file():
    ctranslate2.converters.TransformersConverter(a["model"]).convert(a["converted"], quantization="float32", force=True)
ctranslate2.set_random_seed(a["seed"])
gen = ctranslate2.Generator(a["converted"], device="cpu", compute_type="float32", inter_threads=1,
                            intra_threads=a["threads"])
starts = [tok.convert_ids_to_tokens(p) for p in a["prompts"]]
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
t = time.perf_counter()
res = gen.generate_batch(starts, max_batch_size=a["rows"], max_length=a["max_new"], sampling_topk=0,
                         sampling_temperature=1.0, include_prompt_in_result=False, end_token=tok.eos_token,
                         return_end_token=True)
secs = time.perf_counter() - t
json.dump({"seconds": secs, "gen": [len(r.sequences_ids[0]) for r in res],
           "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before,
           "version": ctranslate2.__version__}, open(sys.argv[1], "w"))
"""


def heap_kept_available() -> bool:
    """Whether the C library is glibc (whose allocator :data:`HEAP_KEPT_ENV` tunes)."""
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def ctranslate2_available() -> bool:
    """Whether CTranslate2 is installed (``pip install ctranslate2``; not a requirement of dsh)."""
    return importlib.util.find_spec("ctranslate2") is not None


def _in_child(script: str, payload: dict, env: dict) -> dict:
    """Run ``script`` in a fresh Python process with ``payload`` (JSON) and ``env`` added to this environment; its
    JSON answer."""
    with tempfile.TemporaryDirectory(prefix="dsh-bench-child-") as d:
        io = Path(d) / "io.json"
        io.write_text(json.dumps(payload))
        child_env = {**os.environ, **env,
                     "PYTHONPATH": os.pathsep.join(x for x in (str(ROOT), os.environ.get("PYTHONPATH")) if x)}
        r = subprocess.run([sys.executable, "-c", script, str(io)], env=child_env, capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"a bench baseline's process failed: {r.stderr.strip().splitlines()[-1:]}")
        return json.loads(io.read_text())


def run_generate_heap_kept(prompts, rows, max_new, seed, env=None) -> tuple:
    """:func:`run_generate` of the shipped base in a process whose glibc keeps freed memory in its heap
    (:data:`HEAP_KEPT_ENV`; ``env`` replaces it): by default ``generate``'s growing cache is freed and allocated
    again every step, each fresh page a minor page fault (microseconds each on a VM), and a ratio to it rides on them.
    -> (seconds, completion lengths, minor page faults of the generation)."""
    out = _in_child(_GENERATE_CHILD, {"model": str(SHIPPED_BASE), "prompts": prompts, "rows": rows,
                                      "max_new": max_new, "seed": seed}, HEAP_KEPT_ENV if env is None else env)
    return out["seconds"], out["gen"], out["faults"]


def run_ctranslate2(prompts, rows, max_new, seed, converted, threads: int | None = None) -> tuple:
    """The shipped base through CTranslate2 (float32, ``threads`` intra-op threads: torch's count by default) in a
    process of its own: ``prompts`` in batches of ``rows``, sampled at temperature 1 from the whole distribution
    (``sampling_topk=0``), at most ``max_new`` tokens, the end token counted as :func:`run_generate` counts it; the
    model converted once into the folder ``converted``. -> (seconds, completion lengths, minor page faults,
    CTranslate2's version)."""
    import torch

    out = _in_child(_CT2_CHILD, {"model": str(SHIPPED_BASE), "converted": str(converted), "prompts": prompts,
                                 "rows": rows, "max_new": max_new, "seed": seed,
                                 "threads": threads or torch.get_num_threads()}, {})
    return out["seconds"], out["gen"], out["faults"], out["version"]
