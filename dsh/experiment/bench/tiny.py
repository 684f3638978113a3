"""``python -m dsh bench --parts tiny``: the laptop experiment's paths on the machine at hand, each against its
baseline in the same run, and against the machine's roofline measured in the same run.

- **device** (:mod:`.host`): the fp32 matmul peak of torch's product (MKL) and of oneDNN with packed weights (both at 1024^3; the
  better is the rooflines' matmul peak), the FMA issue rate (the hardware's bound), the memory read bandwidth (a sum
  over 256 MB) and the copy bandwidth (read + write), each the best of several tries, measured before and after the
  other parts; the larger of the two measurements is used, so the roofline is the stricter one. The CPU's vector
  flags and the load averages before and after are recorded beside them.
- **sampling** (the shipped base, the laptop task's test ladder 1x2 ... 1x8 as prompts, temperature 1, up to
  ``max_new`` new tokens a row, ``prompts_per_row`` prompts per row so that the rows stay busy until the last ones
  drain): ``model.generate`` in batches of ``rows``, :class:`dsh.llm.engine.Engine`'s torch path and its CPU path
  (:mod:`dsh.llm.kernel_engine`) with ``rows`` slots, and that path with a float16 KV cache where the CPU has half
  floats in hardware (its share of completions identical to the float32 cache's, same streams), and in processes of
  their own (:mod:`.baselines`) ``model.generate`` with freed memory kept in glibc's heap (by default its growing
  cache costs a minor page fault a fresh page, and a ratio to it rides on them: ``ratio_to_generate_heap_kept`` is the
  ratio to this one) and CTranslate2 where it is installed (float32: ``ratio_to_ctranslate2``), interleaved,
  ``repeats`` times, each run with its load average (``loaded``: above what the bench itself makes, :func:`loaded`)
  and minor page faults; the tables report the median over the repeats. Each run's roofline
  (:func:`sampling_roofline`) is computed from its own prompts and completions: the larger of the matmul time (every
  prompt and generated token through every linear layer, plus attention's products, at the matmul peak) and the
  KV-read time (each generated token reads the keys and values of its context once, in the cache's dtype, at the read
  bandwidth); the serial bound (the two added) is reported beside it, and the serial bound again with the products at
  the rate that the decoding step's own matrix shapes reach when measured alone at that many rows, the fastest per
  shape of the libraries and the step's own panel product (:func:`.step_products.library_rates`; measured before the
  row count's repeats and after them, the faster taken: a host slow through one measurement would lower the rate and
  raise the bound).
- **GRPO**: a policy that writes reflection traces of the laptop task's length (the shipped base after
  ``policy_sft_steps`` steps of the laptop preset's reflection SFT), then ``grpo_steps`` optimizer steps of the
  laptop preset's GRPO four ways: the baseline configuration (one rollout round of 32 completions per step
  through the engine's torch path, padded batches), TRL's own generation path (``model.generate``) in the
  preset's configuration, and the preset as it is; rollouts per second end to end (trainer wall time) with the
  time split (sampling, reference/old-policy scoring, update); and the preset with its opt-in fast paths
  (:func:`fast_paths`: the packed attention in C, a float16 KV cache), with the layers' element-wise work in C as
  well (``packed_attention="fused"``, :mod:`dsh.llm.fused_layers`), and with the update's products in bfloat16
  too where the CPU has bfloat16 dot products (:func:`grpo_paths`); the preset's validation passes (p_s, p_dC,
  p_dW measured along a run) are turned off in all of them.
- **evaluation** (:mod:`.evaluation`): ``dsh evaluate`` of the shipped base on the laptop ladder (the preset's settings) through the
  engine's torch path at 64 rows (the baseline), the preset's path, that path with a float16 KV cache (where the
  CPU has half floats), and that one again in a process of its own as the reference's runs (:mod:`.own_process`),
  interleaved; each one's share of responses identical to the baseline's (the same counted random streams).
- **training**: tokens/s of the laptop preset's reflection SFT (padding-free; and with the packed attention in C),
  TRL's ``SFTTrainer`` defaults on the same data (padded batches) and ``dsh.training.pretrain``'s plain loop, each
  against the 6N bound at the matmul peak.
- **products** (:mod:`.step_products`): the step's matrix products inside the engine's steps against the best library
  rate at the same shapes alone; **attention** (:mod:`.attention`) alone, at the sampling rows, against the read
  bandwidth; **attribution**
  (:mod:`.attribution`): the study's gradients one trajectory at a time and from packed passes, interleaved.
- **the reference** (:mod:`.reference`; sizes with ``reference``, where this checkout's history holds it): dsh at
  :data:`.reference.REFERENCE_COMMIT` from a git worktree in processes of its own, one more path of the sampling
  (its CPU path), evaluation (its preset) and GRPO (its preset, same policy) comparisons, interleaved with today's:
  ``ratio_to_reference`` (sampling, GRPO: rates; evaluation: ``time_share_of_reference``) in the same run."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ...core.files import read_jsonl
from ...core.provenance import cpu_flags
from ...llm import kernels
from ...llm.models import load
from ...llm.roofline import model_shape, roofline, sampling_work
from ...task import laptop_task as lt
from ...task.records import chat_prompt
from ...training.laptop_base import SHIPPED_BASE
from ...training.pretrain import PretrainConfig, encode, pretrain
from ...training.train import build_dataset, train
from ..run.presets import LAPTOP, resolve
from .attention import add_shares, attention_rows
from .attribution import attribution_rows
from .baselines import (
    CT2_PATH,
    HEAP_PATH,
    ctranslate2_available,
    heap_kept_available,
    run_ctranslate2,
    run_generate,
    run_generate_heap_kept,
)
from .evaluation import evaluation_rows
from .host import device_peaks, fast_paths, loaded, minor_faults
from .reference import REFERENCE_COMMIT, REFERENCE_PATH, Reference, unavailable
from .step_products import library_rates, product_rows


@dataclass(frozen=True)
class TinySize:
    rows: tuple = (32, 256)          # rows decoded at once (generate's batch, the engine's slots)
    prompts_per_row: int = 4         # prompts per row of a sampling run
    max_new: int = 200               # new tokens a row may write
    repeats: int = 5                 # interleaved repeats of every sampling run
    policy_sft_steps: int = 150      # reflection SFT steps that make the GRPO policy
    grpo_steps: int = 8              # optimizer steps of each GRPO run (one rollout round of the preset)
    grpo_max_completion: int | None = None   # None: the preset's
    grpo_repeats: int = 3            # runs of the fastest GRPO path, each followed by the reference's (when it runs)
    eval_n_per_level: int | None = None      # None: the preset's (100 a level)
    eval_repeats: int = 5
    training_steps: int = 8
    attribution_per_level: int = 12  # generator traces a level for the attribution routes (7 levels)
    attribution_repeats: int = 3     # interleaved repeats of the two attribution routes
    reference: bool = True           # dsh at REFERENCE_COMMIT as one more path, where it can run (module docstring)


TINY_SIZES = {
    "cpu": TinySize(rows=(8, 32), prompts_per_row=2, max_new=40, repeats=1, policy_sft_steps=4, grpo_steps=8,
                    grpo_max_completion=48, grpo_repeats=1, eval_n_per_level=4, eval_repeats=1, training_steps=2,
                    attribution_per_level=1, attribution_repeats=1, reference=False),
    "laptop": TinySize(),
}


# ------------------------------------------------------------------------------------------------
# Sampling
# ------------------------------------------------------------------------------------------------
def _ladder_prompts(tok, n: int, seed: int) -> list:
    per = -(-n // len(lt.TEST_LEVELS))
    qs = [p.question for p in lt.test_questions(n_per_level=per)]
    random.Random(seed).shuffle(qs)
    return [tok(chat_prompt(tok, q), add_special_tokens=False)["input_ids"] for q in qs[:n]]


def _run_engine(model, tok, prompts, rows, max_new, seed, attention, kv_cache="float32"):
    from ...llm.engine import Engine

    eng = Engine(model, [tok.eos_token_id], slots=rows, max_len=max(map(len, prompts)) + max_new, attention=attention,
                 kv_cache=kv_cache)
    eng.plan()                              # the step's products decided at every row count, untimed
    eng.generate(prompts[:rows], 8, seed=seed + 1)                 # warm-up (compiles the kernels once)
    t = time.perf_counter()
    gens = eng.generate(prompts, max_new, temperature=1.0, seed=seed)
    return time.perf_counter() - t, [g.tokens for g in gens]


SAMPLING_PATHS = ("model.generate", "dsh engine, torch path", "dsh engine, CPU path (C kernels)")
HALF_PATH = "dsh engine, CPU path, float16 KV cache"


def sampling_paths(reference: bool = False) -> tuple:
    """The sampling paths compared here: :data:`SAMPLING_PATHS`, the CPU path with a float16 KV cache where
    :func:`dsh.llm.kernels.half_cache` holds, and in processes of their own (:mod:`.baselines`) ``model.generate``
    with freed memory kept in the heap where the C library is glibc, CTranslate2 where it is installed and, with
    ``reference``, dsh at the reference commit (:mod:`.reference`)."""
    return (SAMPLING_PATHS + ((HALF_PATH,) if kernels.half_cache(kernels.load()) else ())
            + ((HEAP_PATH,) if heap_kept_available() else ()) + ((CT2_PATH,) if ctranslate2_available() else ())
            + ((REFERENCE_PATH,) if reference else ()))


def sampling_rows(size: TinySize, seed: int = 0, ref: Reference | None = None) -> list:
    """Rows of the sampling comparison (module docstring), each with its workload's ``work``
    (:func:`sampling_work`); :func:`add_rooflines` puts them against the device's peaks. ``ref``: the reference
    commit's worktree, one more path."""
    model, tok = load(str(SHIPPED_BASE))
    model.eval()
    shape = model_shape(model)
    prompts = _ladder_prompts(tok, max(size.rows) * size.prompts_per_row, seed)
    half = {**shape, "kv_bytes_per_token": shape["kv_bytes_per_token"] // 2}
    out, failed = [], set()
    d = tempfile.mkdtemp(prefix="dsh-bench-ct2-")
    converted = Path(d) / "ct2"           # CTranslate2's copy of the base, converted once
    try:
        for rows in size.rows:
            ps = prompts[:rows * size.prompts_per_row]
            before = library_rates(model, rows)   # the step's shapes alone, measured again after the repeats
            for rep in range(size.repeats):
                fp32 = None
                for path in sampling_paths(ref is not None):
                    load_1min, faults = os.getloadavg()[0], minor_faults()
                    child_faults, toks, extra = None, None, {}
                    if path == "model.generate":
                        secs, gen = run_generate(model, tok, ps, rows, size.max_new, seed + rep)
                    elif path == HEAP_PATH:
                        secs, gen, child_faults = run_generate_heap_kept(ps, rows, size.max_new, seed + rep)
                    elif path == CT2_PATH:
                        if path in failed:
                            continue
                        try:
                            secs, gen, child_faults, version = run_ctranslate2(ps, rows, size.max_new, seed + rep,
                                                                               converted)
                        except RuntimeError as e:     # an optional baseline: said and left out, the rest goes on
                            failed.add(path)
                            print(f"dsh bench: {path} left out: {e}", file=sys.stderr, flush=True)
                            continue
                        extra = {"ctranslate2": version}
                    elif path == REFERENCE_PATH:
                        got = ref.run("sampling", prompts=ps, rows=rows, max_new=size.max_new, seed=seed + rep)
                        secs, gen, extra = got["seconds"], got["gen"], {"commit": ref.commit}
                    else:
                        secs, toks = _run_engine(model, tok, ps, rows, size.max_new, seed + rep,
                                                 "torch" if "torch" in path else "kernels",
                                                 "float16" if path == HALF_PATH else "float32")
                        gen = [len(t) for t in toks]
                    row = {"part": "tiny sampling", "path": f"{path}, {rows} rows", "rows": rows, "repeat": rep,
                           "prompts": len(ps), "prompt_tokens": sum(map(len, ps)), "generated_tokens": sum(gen),
                           "seconds": round(secs, 3), "tokens_per_s": sum(gen) / secs, "load_1min": load_1min,
                           "loaded": loaded(load_1min),
                           "minor_page_faults": minor_faults() - faults if child_faults is None else child_faults,
                           "work": sampling_work(half if path == HALF_PATH else shape, [len(p) for p in ps], gen),
                           **extra}
                    if path == SAMPLING_PATHS[2]:
                        fp32 = toks
                    elif path == HALF_PATH:         # the same streams: a completion differs only where rounding moved it
                        row["identical_to_float32_cache"] = sum(a == b for a, b in zip(toks, fp32)) / len(toks)
                    out.append(row)
            # a peak: the faster of the two measurements (the step's own product where it is faster than the libraries)
            rate = max(r.get("fastest_flops", r["best_flops"]) for r in (before, library_rates(model, rows)))
            for r in out:
                if r["rows"] == rows:
                    r["step_matmul_flops"] = rate
    finally:
        shutil.rmtree(d, ignore_errors=True)
    for r in out:
        same = [x for x in out if x["rows"] == r["rows"] and x["repeat"] == r["repeat"]]
        r["ratio_to_generate"] = r["tokens_per_s"] / same[0]["tokens_per_s"]
        for key, base in (("ratio_to_generate_heap_kept", HEAP_PATH), ("ratio_to_ctranslate2", CT2_PATH),
                          ("ratio_to_reference", REFERENCE_PATH)):
            other = [x for x in same if x["path"].startswith(base)]
            if other:                    # against a baseline that does not ride on page faults; a kept library
                r[key] = r["tokens_per_s"] / other[0]["tokens_per_s"]
    return out


def add_rooflines(rows: list, peaks: dict) -> None:
    """Each sampling row's roofline at ``peaks`` and its shares of it (and of the serial bound)."""
    for r in rows:
        work = r.pop("work")
        roof = roofline(work, peaks["library_peak_flops"], peaks["read_bandwidth_bytes_per_s"])
        # the same bounds with the products at the rate the step's own shapes reach alone (library_rates)
        at_shapes = roofline(work, r["step_matmul_flops"], peaks["read_bandwidth_bytes_per_s"])
        r.update(roofline=roof, roofline_tokens_per_s=r["generated_tokens"] / roof["roofline_s"],
                 share_of_roofline=roof["roofline_s"] / r["seconds"], share_of_serial_bound=roof["serial_s"] / r["seconds"],
                 roofline_at_step_shapes=at_shapes,
                 share_of_serial_bound_at_step_shapes=at_shapes["serial_s"] / r["seconds"])


# ------------------------------------------------------------------------------------------------
# GRPO
# ------------------------------------------------------------------------------------------------
GRPO_PATHS = ("the baseline: a round of 32 per step, engine's torch path, padded",
              "TRL's generation (model.generate), the preset's rounds, padding-free",
              "dsh laptop preset: rounds of 256, CPU path, padding-free",
              "the preset with the fast paths: packed attention in C, float16 KV cache",
              "the fast paths with the layers' element-wise work in C too (packed_attention fused)",
              "the fused layers and the update's products in bfloat16")


def grpo_paths() -> tuple:
    """The GRPO paths measured on this machine: :data:`GRPO_PATHS`, the last (the update's products in bfloat16,
    ``TrainConfig.update_precision``) only where the CPU has bfloat16 dot products
    (:func:`dsh.llm.kernels.bf16_dot_products`; elsewhere bfloat16 products are emulated, slower than float32's)."""
    return GRPO_PATHS if kernels.bf16_dot_products() else GRPO_PATHS[:-1]


def _grpo_row(label: str, s: dict, run_dir: Path, **extra) -> dict:
    """One row of the GRPO comparison from a training summary ``s`` (its rollouts, wall time and time split) and
    the run folder's ``metrics.jsonl`` (the mean completion length of its rounds), with ``extra`` fields."""
    logs = read_jsonl(run_dir / "metrics.jsonl")
    lengths = [x["completions/mean_length"] for x in logs if "completions/mean_length" in x]
    return {"part": "tiny GRPO", "path": label, "steps": s["global_step"], "rollouts": s["rollouts"],
            "mean_completion_tokens": sum(lengths) / len(lengths) if lengths else None,
            "seconds": s["wall_s"], "rollouts_per_s": s["rollouts"] / s["wall_s"],
            "generation_s": s["generation_s"], "scoring_s": s["scoring_s"], "update_s": s["update_s"],
            "other_s": s["wall_s"] - s["generation_s"] - s["scoring_s"] - s["update_s"], **extra}


def grpo_rows(size: TinySize, workdir: Path, seed: int = 0, ref: Reference | None = None) -> list:
    """Rows of the GRPO comparison (module docstring), each with its ``repeat``: every path once (repeat 0), with
    ``ref`` the reference commit's preset path after them, then ``grpo_repeats - 1`` more runs of the fastest path
    (of dsh's preset paths, by rollouts per second in repeat 0), each followed by the reference's."""
    policy = workdir / "grpo_policy"
    train(resolve("sft_reflection", LAPTOP.name, model=str(SHIPPED_BASE), output_dir=str(policy),
                  n_train=8 * size.policy_sft_steps, max_steps=size.policy_sft_steps, task_options={"attempts": "injected"},
                  report_to=(), save_steps=10 ** 6, logging_steps=10 ** 6, seed=seed))
    # validation off: the preset measures p_s, p_dC, p_dW along a run (a measurement, not GRPO's work), which would
    # put two validation passes into an 8-step run's time
    common = dict(model=str(policy), max_steps=size.grpo_steps, save_steps=10 ** 6, report_to=(), seed=seed,
                  validation_every=0)
    if size.grpo_max_completion:
        common["max_completion_length"] = size.grpo_max_completion
    runs = ((GRPO_PATHS[0], dict(generation_batch_size=32, padding_free=False), True),
            (GRPO_PATHS[1], dict(generation_backend="trl"), False),
            (GRPO_PATHS[2], {}, False),
            (GRPO_PATHS[3], fast_paths(), False),
            (GRPO_PATHS[4], {**fast_paths(), "packed_attention": "fused"}, False),
            (GRPO_PATHS[5], {**fast_paths(), "packed_attention": "fused", "update_precision": "bfloat16"},
             False))[:len(grpo_paths())]
    def one_path(k, label, over, old, rep=0):
        folder = workdir / (f"grpo_{k}" + (f"_r{rep}" if rep else ""))
        cfg = resolve("grpo", LAPTOP.name, output_dir=str(folder), **common, **over)
        with kernels.disabled() if old else contextlib.nullcontext():
            s = train(cfg)
        return _grpo_row(label, s, folder, repeat=rep, backend_used=s["generation_backend"],
                         completions_per_round=cfg.generation_batch_size or cfg.per_device_train_batch_size,
                         **{f: getattr(cfg, f) for f in ("packed_attention", "rollout_kv_cache", "update_precision")})

    def reference(rep=0):
        folder = workdir / ("grpo_reference" + (f"_r{rep}" if rep else ""))
        s = ref.run("grpo", policy=str(policy), out=str(folder), steps=size.grpo_steps,
                    max_completion=size.grpo_max_completion, seed=seed)
        return _grpo_row(REFERENCE_PATH + ": its laptop preset", s, folder, repeat=rep, commit=ref.commit)

    out = [one_path(k, *r) for k, r in enumerate(runs)] + ([reference()] if ref is not None else [])
    fastest = max(range(2, len(runs)), key=lambda k: out[k]["rollouts_per_s"])     # of dsh's own paths, repeat 0
    for rep in range(1, size.grpo_repeats):   # the fastest path again, each run followed by the reference's
        out.append(one_path(fastest, *runs[fastest], rep=rep))
        if ref is not None:
            out.append(reference(rep))
    for r in out:
        r["ratio_to_before"] = r["rollouts_per_s"] / out[0]["rollouts_per_s"]
        # rollouts per second depend on how long the paths' rollouts are (the path before updates its policy every
        # 32 rollouts, so its later rounds differ): the same comparison per completion token
        if r["mean_completion_tokens"] and out[0]["mean_completion_tokens"]:
            r["rollout_tokens_per_s"] = r["rollouts"] * r["mean_completion_tokens"] / r["seconds"]
            r["token_ratio_to_before"] = r["rollout_tokens_per_s"] / out[0]["rollout_tokens_per_s"]
        if ref is not None:                     # against the reference's run of the same repeat
            mine = next(x for x in out if x["path"].startswith(REFERENCE_PATH) and x["repeat"] == r["repeat"])
            r["ratio_to_reference"] = r["rollouts_per_s"] / mine["rollouts_per_s"]
            r["update_ratio_to_reference"] = mine["update_s"] / r["update_s"]
    return out


# ------------------------------------------------------------------------------------------------
# Training
# ------------------------------------------------------------------------------------------------
def training_rows(size: TinySize, workdir: Path, seed: int = 0) -> list:
    """Training tokens/s of the laptop preset's reflection SFT, TRL's SFTTrainer defaults and the base's plain loop,
    each with its FLOP/s by the 6N rule (``flops_6n``; :func:`run` puts it against the stricter peak)."""
    base = str(SHIPPED_BASE)
    m, tok = load(base)
    n_params = sum(p.numel() for p in m.parameters())
    steps = size.training_steps
    common = dict(model=base, n_train=8 * steps, max_steps=steps, seed=seed, report_to=(), save_steps=10 ** 6,
                  logging_steps=1, task_options={"attempts": "injected"})
    cfgs = (("TRL SFTTrainer defaults (batch 8, padded, lr 2e-5 linear)", resolve(
                "sft_reflection", LAPTOP.name, output_dir=str(workdir / "tiny_default"), **common,
                learning_rate=2e-5, lr_scheduler_type="linear", warmup_ratio=0.0, per_device_train_batch_size=8,
                padding_free=False)),
            ("dsh laptop preset (TRL, batch 8, padding-free, lr 3e-4 cosine)", resolve(
                "sft_reflection", LAPTOP.name, output_dir=str(workdir / "tiny_dsh"), **common)),
            ("dsh laptop preset, packed attention in C", resolve(
                "sft_reflection", LAPTOP.name, output_dir=str(workdir / "tiny_dsh_c"), **common,
                packed_attention="kernels")),
            ("dsh laptop preset, layers' element-wise work in C too (fused)", resolve(
                "sft_reflection", LAPTOP.name, output_dir=str(workdir / "tiny_dsh_fused"), **common,
                packed_attention="fused")))
    rows = []
    for label, cfg in cfgs:
        s = train(cfg)
        real = s["real_tokens"] or 0
        rows.append({"part": "tiny training", "path": label, "seconds": s["wall_s"], "real_tokens": real,
                     "tokens_per_s": real / s["wall_s"], "flops_6n": 6 * n_params * real / s["wall_s"]})
    recs = build_dataset(cfgs[1][1])
    data = encode(tok, [(r["prompt"][0]["content"], r["completion"][0]["content"]) for r in recs])
    per = sum(len(x) for x, _ in data) // len(data) * 8
    t = time.perf_counter()
    st = pretrain(m, tok, data, workdir / "tiny_loop", PretrainConfig(tokens=per * steps, tokens_per_batch=per,
                                                                      seed=seed, save_every=10 ** 6), progress=False,
                  final_state=False)
    dt = time.perf_counter() - t
    rows.append({"part": "tiny training", "path": "dsh.training.pretrain loop (the base's path, ~8 traces a step)",
                 "seconds": round(dt, 2), "real_tokens": st["tokens"], "tokens_per_s": st["tokens"] / dt,
                 "flops_6n": 6 * n_params * st["tokens"] / dt})
    for r in rows:
        r["ratio_to_default"] = r["tokens_per_s"] / rows[0]["tokens_per_s"]
    return rows


# ------------------------------------------------------------------------------------------------
# All of it
# ------------------------------------------------------------------------------------------------
def run(size: TinySize, workdir: Path, seed: int = 0) -> dict:
    """Every part of the tiny bench (module docstring), with the device peaks measured before and after."""
    import torch

    torch.manual_seed(seed)
    flags, load_before = cpu_flags(), os.getloadavg()
    measured = [device_peaks()]
    t0 = time.time()
    why = None if size.reference else "the size runs no reference"
    why = why or unavailable()
    with Reference(workdir) if why is None else contextlib.nullcontext() as ref:
        sampling = sampling_rows(size, seed, ref)
        evaluation = evaluation_rows(size, seed, ref)
        grpo = grpo_rows(size, workdir, seed, ref)
    training = training_rows(size, workdir, seed)
    attribution = attribution_rows(size.attribution_per_level, size.attribution_repeats, seed)
    for r in attribution:
        r["loaded"] = loaded(r["load_1min"])
    attention = attention_rows(max(size.rows), size.max_new)
    products = product_rows(size.rows, size.prompts_per_row, size.max_new,
                            lambda tok, n: _ladder_prompts(tok, n, seed), seed)
    for r in products:
        r["loaded"] = loaded(r["load_1min"])
    measured.append(device_peaks())
    peaks = {k: max(m[k] for m in measured) for k in measured[0]}      # the stricter roofline
    add_rooflines(sampling, peaks)
    add_shares(attention, peaks)
    for r in training:                          # the 6N FLOP/s against the same (stricter) peak as the rooflines
        r["share_of_peak"] = r["flops_6n"] / peaks["library_peak_flops"]
    return {"size": dataclasses.asdict(size), "device_measurements": measured, "device": peaks,
            "sampling": sampling, "evaluation": evaluation, "grpo": grpo, "training": training,
            "attribution": attribution, "attention": attention, "products": products,
            "reference": {"commit": REFERENCE_COMMIT, "unavailable": why},
            "seconds": round(time.time() - t0, 1), "cpu_flags": flags, "load_average_before": load_before,
            "load_average": os.getloadavg()}
