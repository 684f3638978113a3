"""``python -m dsh bench``: dsh's paths against the libraries' defaults, on whatever device is present,
in one process, so that every ratio compares two numbers measured in the same run.

- generation: the same test questions, sampling settings (temperature 1, no top-k/top-p) and token
  limit through ``model.generate`` (default cache; on CUDA also the static cache) and through
  :class:`dsh.llm.engine.Engine` (and vLLM when installed). Useful tokens (before the end-of-turn token,
  no padding) per second, rows per second, and the share of the KV-bandwidth ceiling: a decoding step
  must read the weights and the KV cache of every row, so at batch ``B`` and mean context ``c``
  tokens/s <= bandwidth / (weight_bytes / B + c x kv_bytes_per_token), with the bandwidth measured here.
- SFT: real (non-padding) tokens per second and MFU (6 x parameters x real tokens/s over the matmul
  peak measured here) of the preset's SFT (reflection) configuration against TRL's defaults
  (padded batches of 8, sdpa) on the same data.
- GRPO: seconds per optimizer step, split into rollout generation and update, for rollouts through
  the engine against TRL's own ``model.generate`` path, same configuration otherwise.

- tiny: the laptop experiment's paths on the CPU (:mod:`dsh.experiment.bench.tiny`): sampling against the roofline
  measured in the same run, GRPO rollouts per second against the baseline configuration (a round of 32 per step,
  padded), evaluation time, training tokens/s against the 6N bound.

Sizes follow the device (:data:`SIZES`): ``cpu`` runs in a few minutes (a test runs it), ``gpu`` in
a few minutes on one H100; ``laptop`` is ``cpu`` with the tiny part at full size (about 10 minutes on 2 cores: the
README's performance table). The result is a JSON object with hardware, versions, commit and wall time.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ...core import validate as v
from ...core.files import write_text
from ...core.provenance import provenance
from ...llm.models import EMBEDDED, load, resolve_model, vllm_available
from ...llm.peaks import matmul_peak, memory_bandwidth
from ...llm.peaks import sync as _sync
from ...llm.scale import kv_bytes_per_token
from ...task.problems import TEST_LEVELS, test_problems
from ...task.records import chat_prompt
from ...training.train import train
from ..run.presets import CI, GPU_SMALL, resolve
from . import tiny as bench_tiny
from .targets import target_rows

PARTS = ("generation", "sft", "grpo", "tiny")


@dataclass(frozen=True)
class BenchSize:
    gen_prompts: int            # test questions in the generation comparison
    gen_max_new: int            # token limit per response
    gen_batch: int              # rows at once (model.generate's batch, the engine's slots)
    eval_prompts: int           # the evaluation workload, engine only (0: skip)
    eval_max_new: int
    eval_batch: int
    sft_steps: int              # optimizer steps per SFT configuration
    sft_n_train: int
    sft_default_batch: int      # the baseline's padded batch (TRL's default is 8)
    sft_levels: tuple           # operand lengths of the SFT data (() : the preset's)
    grpo_steps: int
    grpo_overrides: tuple       # (key, value) pairs over the preset's GRPO configuration
    preset: str                 # whose SFT / GRPO configuration is measured
    tiny: str = "cpu"           # the tiny part's size (dsh.experiment.bench.tiny.TINY_SIZES)


SIZES = {
    "cpu": BenchSize(gen_prompts=6, gen_max_new=24, gen_batch=6, eval_prompts=0, eval_max_new=0, eval_batch=0,
                     sft_steps=1, sft_n_train=8, sft_default_batch=2, sft_levels=("2x2",), grpo_steps=1,
                     preset=CI.name, grpo_overrides=(("n_train", 8), ("max_completion_length", 12), ("max_steps", 1))),
    "gpu": BenchSize(gen_prompts=256, gen_max_new=1024, gen_batch=256, eval_prompts=700, eval_max_new=2048,
                     eval_batch=256, sft_steps=30, sft_n_train=2000, sft_default_batch=8, sft_levels=(),
                     grpo_steps=8, preset=GPU_SMALL.name,
                     grpo_overrides=(("n_train", 512), ("max_steps", 8))),
}
SIZES["laptop"] = dataclasses.replace(SIZES["cpu"], tiny="laptop")


# ------------------------------------------------------------------------------------------------
# The device
# ------------------------------------------------------------------------------------------------
def kv_ceiling(tokens_per_s_args: dict) -> float:
    """The KV-bandwidth ceiling (tokens/s) for ``batch`` rows of mean context ``context`` tokens:
    bandwidth / (weight_bytes / batch + context x kv_bytes_per_token)."""
    a = tokens_per_s_args
    return a["bandwidth"] / (a["weight_bytes"] / a["batch"] + a["context"] * a["kv_bytes_per_token"])


# ------------------------------------------------------------------------------------------------
# Generation
# ------------------------------------------------------------------------------------------------
def _useful(rows, eos) -> list[int]:
    """Tokens before the first end-of-turn (or pad) token of each row."""
    out = []
    for r in rows:
        n = len(r)
        for j, t in enumerate(r):
            if t in eos:
                n = j
                break
        out.append(n)
    return out


def _gen_row(path, n_rows, useful, seconds, batch, prompt_lens, ceiling_of):
    ctx = (sum(prompt_lens) / len(prompt_lens)) + (sum(useful) / max(1, len(useful))) / 2
    rate = sum(useful) / seconds
    ceiling = ceiling_of(batch, ctx)
    return {"path": path, "rows": n_rows, "batch": batch, "useful_tokens": int(sum(useful)),
            "seconds": round(seconds, 3), "tokens_per_s": rate, "rows_per_s": n_rows / seconds,
            "mean_context": round(ctx, 1), "kv_ceiling_tokens_per_s": ceiling, "share_of_ceiling": rate / ceiling}


def bench_generation(model, tok, size: BenchSize, device_info: dict, seed: int = 0, progress: bool = False) -> list:
    """Rows of the generation comparison (module docstring); the first row is the library default."""
    import torch

    from ...llm.engine import Engine

    dev = next(model.parameters()).device
    levels = [f"{m}x{n}" for m, n in TEST_LEVELS]
    per = -(-max(size.gen_prompts, size.eval_prompts) // len(levels))
    questions = [p.question for p in test_problems(levels, per, seed)]
    texts = [chat_prompt(tok, q) for q in questions]
    ids = [tok(t)["input_ids"] for t in texts]
    eos = set(model.generation_config.eos_token_id) | {tok.pad_token_id}
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    kvb = kv_bytes_per_token(model)

    def ceiling_of(batch, ctx):
        return kv_ceiling({"bandwidth": device_info["bandwidth_bytes_per_s"], "weight_bytes": weight_bytes,
                           "batch": batch, "context": ctx, "kv_bytes_per_token": kvb})

    rows = []
    n, B, T = size.gen_prompts, size.gen_batch, size.gen_max_new
    sample = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=T, pad_token_id=tok.pad_token_id)
    caches = [("transformers generate (default cache)", None)]
    if dev.type == "cuda":
        caches.append(("transformers generate (static cache)", "static"))
    for label, cache in caches:
        useful, secs = [], 0.0
        if cache == "static":  # the first call compiles: not counted, as a user would run many batches
            enc = tok(texts[:B], return_tensors="pt", padding=True).to(dev)
            with torch.no_grad():
                model.generate(**enc, **sample, cache_implementation=cache)
        torch.manual_seed(seed)
        for s in range(0, n, B):
            enc = tok(texts[s:s + B], return_tensors="pt", padding=True).to(dev)
            _sync(dev)
            t = time.perf_counter()
            with torch.no_grad():
                o = model.generate(**enc, **sample, **({"cache_implementation": cache} if cache else {}))
            _sync(dev)
            secs += time.perf_counter() - t
            useful += _useful(o[:, enc["input_ids"].shape[1]:].tolist(), eos)
        rows.append(_gen_row(label, n, useful, secs, B, [len(x) for x in ids[:n]], ceiling_of))
    eng_eos = model.generation_config.eos_token_id

    def engine_row(label, prompts, slots, max_new):
        eng = Engine(model, eng_eos, slots=slots, max_len=max(map(len, prompts)) + max_new)
        eng.generate(prompts[:slots], max_new, seed=seed)   # warm-up: CUDA graphs captured here
        _sync(dev)
        t = time.perf_counter()
        gens = eng.generate(prompts, max_new, temperature=1.0, seed=seed, progress=progress)
        _sync(dev)
        secs = time.perf_counter() - t
        useful = [len(g.text_tokens) for g in gens]
        del eng
        return _gen_row(label, len(prompts), useful, secs, slots, [len(x) for x in prompts], ceiling_of)

    rows.append(engine_row("dsh engine", ids[:n], B, T))
    if size.eval_prompts:
        rows.append(engine_row(f"dsh engine, evaluation workload ({size.eval_max_new} new tokens)",
                               ids[:size.eval_prompts], size.eval_batch, size.eval_max_new))

    if dev.type == "cuda" and vllm_available():  # pragma: no cover - GPU with vLLM only
        rows.append(_bench_vllm(model, ids[:n], T, seed, ceiling_of))
    base = rows[0]["tokens_per_s"]
    for r in rows:
        r["ratio_to_default"] = r["tokens_per_s"] / base
    return rows


def _bench_vllm(model, prompts, max_new, seed, ceiling_of):  # pragma: no cover - GPU with vLLM only
    from vllm import LLM, SamplingParams

    llm = LLM(model=model.name_or_path, seed=seed, gpu_memory_utilization=0.3)
    params = SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=max_new, seed=seed)
    t = time.perf_counter()
    res = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    secs = time.perf_counter() - t
    useful = [len(r.outputs[0].token_ids) - (r.outputs[0].finish_reason == "stop") for r in res]
    return _gen_row("vLLM", len(prompts), useful, secs, len(prompts), [len(p) for p in prompts], ceiling_of)


# ------------------------------------------------------------------------------------------------
# Training
# ------------------------------------------------------------------------------------------------
def bench_sft(model_name: str, size: BenchSize, peak_flops: float, n_params: float, workdir: Path,
              seed: int = 0) -> list:
    """Rows of the SFT comparison: TRL's defaults first, then the preset's configuration."""

    common = dict(model=model_name, n_train=size.sft_n_train, max_steps=size.sft_steps, seed=seed,
                  report_to=(), save_steps=10 ** 6, logging_steps=1, num_train_epochs=1.0)
    if size.sft_levels:
        common["train_levels"] = size.sft_levels
    dsh_cfg = resolve("sft_reflection", size.preset, output_dir=str(workdir / "sft_dsh"), padding_free=True, **common)
    micro = dsh_cfg.per_device_train_batch_size
    default_cfg = resolve("sft_reflection", size.preset, output_dir=str(workdir / "sft_default"), **{
        **common, "padding_free": False, "per_device_train_batch_size": size.sft_default_batch,
        "gradient_accumulation_steps": 1})
    rows = []
    for label, cfg in ((f"TRL SFTTrainer, padded batches of {size.sft_default_batch} (sdpa)", default_cfg),
                       (f"dsh {size.preset}: padding-free, {micro} x {dsh_cfg.gradient_accumulation_steps} "
                        f"per step", dsh_cfg)):
        s = train(cfg)
        real = s["real_tokens"] or 0
        rate = real / s["wall_s"]
        rows.append({"path": label, "steps": s["global_step"], "seconds": s["wall_s"], "real_tokens": real,
                     "input_tokens": s["tokens_seen"], "real_tokens_per_s": rate,
                     "padding_share": 1 - real / s["tokens_seen"] if s["tokens_seen"] else None,
                     "mfu": 6 * n_params * rate / peak_flops, "peak_gpu_memory_gb": s["peak_gpu_memory_gb"]})
    for r in rows:
        r["ratio_to_default"] = r["real_tokens_per_s"] / rows[0]["real_tokens_per_s"]
    return rows


def bench_grpo(model_name: str, size: BenchSize, workdir: Path, seed: int = 0) -> list:
    """Rows of the GRPO comparison: TRL's generation path first, then the engine's rollouts."""

    rows = []
    for label, backend in (("TRL GRPOTrainer generation (model.generate)", "trl"), ("dsh engine rollouts", "dsh")):
        cfg = resolve("grpo", size.preset, model=model_name, output_dir=str(workdir / f"grpo_{backend}"),
                      generation_backend=backend, report_to=(), save_steps=10 ** 6, seed=seed,
                      **dict(size.grpo_overrides))
        s = train(cfg)
        steps = max(1, s["global_step"])
        gen = s["generation_s"] or 0.0
        rows.append({"path": label, "steps": steps, "completions_per_generation": cfg.generation_batch_size or
                     cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps,
                     "max_completion_length": cfg.max_completion_length, "seconds": s["wall_s"],
                     "seconds_per_step": s["wall_s"] / steps, "generation_s_per_step": gen / steps,
                     "update_s_per_step": (s["wall_s"] - gen) / steps, "backend_used": s["generation_backend"],
                     "peak_gpu_memory_gb": s["peak_gpu_memory_gb"]})
    for r in rows:
        r["ratio_to_default"] = rows[0]["seconds_per_step"] / r["seconds_per_step"]
    return rows


# ------------------------------------------------------------------------------------------------
# All of it
# ------------------------------------------------------------------------------------------------
def _own_result(path) -> bool:
    """Whether ``path`` holds a result :func:`run` wrote (a JSON object with its keys)."""
    try:
        got = json.loads(Path(path).read_text())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(got, dict) and {"size", "settings", "parts", "hardware", "commit"} <= set(got) \
        and not Path(path).is_symlink()


def run(model: str = EMBEDDED, size: str = "auto", parts=PARTS, out: str | None = None, seed: int = 0,
        progress: bool = True) -> dict:
    """Measure ``parts`` (generation, sft, grpo, tiny) at ``size`` (auto: gpu on CUDA, else cpu); write the
    JSON to ``out`` when given and return it."""
    import torch

    v.choice("size", size, ("auto",) + tuple(SIZES))
    parts = tuple(parts)
    if not parts:
        raise ValueError(f"parts must name at least one of {', '.join(PARTS)}")
    for p in parts:
        v.choice("parts[i]", p, PARTS)
    v.length("seed", seed)

    loc = resolve_model(model)
    cuda = torch.cuda.is_available()
    size_name = ("gpu" if cuda else "cpu") if size == "auto" else size
    sz = SIZES[size_name]
    if out is not None:
        out = v.output_path("out", out)      # before any measuring: a folder, or a parent that is a file, is refused
        if out.exists() and not _own_result(out):   # replaced only when it is an earlier bench result
            raise ValueError(f"out {out} exists and is not a dsh bench result; move it or choose another out; "
                             f"nothing was changed")
    t0 = time.time()
    dev = torch.device("cuda" if cuda else "cpu")
    info = {"bandwidth_bytes_per_s": memory_bandwidth(dev), "matmul_peak_flops": matmul_peak(dev)}
    result = {"size": size_name, "settings": asdict(sz), "model": model, "device": info, "parts": list(parts)}
    n_params = None
    if {"generation", "sft"} & set(parts):      # the tiny part loads its own model
        m, tok = load(loc)
        n_params = sum(p.numel() for p in m.parameters())
        result["n_params"] = n_params
        if "generation" in parts:
            result["generation"] = bench_generation(m, tok, sz, info, seed=seed, progress=progress)
        del m
        if cuda:
            torch.cuda.empty_cache()
    with tempfile.TemporaryDirectory(prefix="dsh-bench-") as work:
        if "sft" in parts:
            result["sft"] = bench_sft(loc, sz, info["matmul_peak_flops"], n_params, Path(work), seed=seed)
        if "grpo" in parts:
            result["grpo"] = bench_grpo(loc, sz, Path(work), seed=seed)
        if "tiny" in parts:
            result["tiny"] = bench_tiny.run(bench_tiny.TINY_SIZES[sz.tiny], Path(work), seed=seed)
    result.update(wall_s=round(time.time() - t0, 1), **provenance())
    if out is not None:

        write_text(out, json.dumps(result, indent=1))
    return result


def table(result: dict) -> list[dict]:
    """The side-by-side rows of a bench result: part, path, the part's headline measure, ratio to the
    default path and (generation) the share of the KV-bandwidth ceiling."""
    rows = []
    for r in result.get("generation", []):
        rows.append({"part": "generation", "path": r["path"], "measure": "useful tokens/s",
                     "value": r["tokens_per_s"], "ratio to default": r["ratio_to_default"],
                     "share of ceiling": r["share_of_ceiling"]})
    for r in result.get("sft", []):
        rows.append({"part": "SFT", "path": r["path"], "measure": "real tokens/s (MFU)",
                     "value": r["real_tokens_per_s"], "ratio to default": r["ratio_to_default"],
                     "share of ceiling": r["mfu"]})
    rows += tiny_table(result.get("tiny"))
    for r in result.get("grpo", []):
        rows.append({"part": "GRPO", "path": r["path"],
                     "measure": f"s/step (generation {r['generation_s_per_step']:.2f} s)",
                     "value": r["seconds_per_step"], "ratio to default": r["ratio_to_default"],
                     "share of ceiling": None})
    return rows


def _product_rows(tiny: dict, by_path, med) -> list[dict]:
    """The tiny table's rows of the step's products (:mod:`.step_products`): their rate inside full steps against the
    best library alone; with the attention timed in the same steps, its cache bytes/s against the run's read bandwidth
    and the seconds of the run that the products and the attention took."""
    rows = []
    for path, rs in by_path(tiny.get("products") or []).items():        # results of 2026-11-29 on
        rows.append({"part": "tiny products", "path": path,
                     "measure": f"GFLOP/s in full steps (median of {len(rs)}; share of best library alone)",
                     "value": med([r["products_flops"] / 1e9 for r in rs]), "ratio to default": None,
                     "share of ceiling": med([r["share_of_best_library"] for r in rs]),
                     "loaded": sum(bool(r.get("loaded")) for r in rs)})
        if rs[0].get("attention_bytes_per_s"):                       # results of 2026-12-07 12:00 on
            bw = (tiny.get("device") or {}).get("read_bandwidth_bytes_per_s")
            att = med([r["attention_bytes_per_s"] for r in rs])
            rows.append({"part": "tiny products", "path": path.replace("products", "attention", 1),
                         "measure": f"cache GB/s in full steps (median of {len(rs)}; share of read bw)", "value": att / 1e9,
                         "ratio to default": None, "share of ceiling": att / bw if bw else None})
            for what in ("products", "attention"):
                rows.append({"part": "tiny products", "path": path.replace("products", what, 1),
                             "measure": f"seconds of the run (median of {len(rs)}; share of it)",
                             "value": med([r["run_s"] * r[f"{what}_share_of_run"] for r in rs]), "ratio to default": None,
                             "share of ceiling": med([r[f"{what}_share_of_run"] for r in rs])})
    return rows


def tiny_table(tiny) -> list[dict]:
    """The tiny part's rows for :func:`table`: sampling and evaluation as the median over their interleaved repeats
    (tokens/s, x generate, share of the roofline; seconds, share of the time before; ``loaded``: how many repeats ran
    beside more than the bench), the sampling targets against the run's bounds (:func:`.targets.target_rows`), GRPO
    (rollouts/s, x before; the update's time; medians over a path's runs), training, the attribution routes
    (trajectories/s and the ratio to one trajectory at a time, medians over the repeats), the attention alone (GB/s
    of cache read, share of the read bandwidth), the products in the step (GFLOP/s, share of the best library rate
    at the same shapes alone; :func:`_product_rows`); where the run measured the reference commit
    (:mod:`dsh.experiment.bench.reference`), each speed against it (``x reference``: the median of the repeats' rate
    ratios, or of the reference's time over the path's)."""
    import statistics

    if not tiny:
        return []
    rows = []
    med = lambda xs: statistics.median(xs) if xs and None not in xs else None  # noqa: E731

    def by_path(runs) -> dict:
        """The repeats of each path, in the order the paths first ran."""
        out = {}
        for r in runs:
            out.setdefault(r["path"], []).append(r)
        return out

    for path, rs in by_path(tiny["sampling"]).items():
        rows.append({"part": "tiny sampling", "path": path,
                     "measure": f"tokens/s (median of {len(rs)}; share of roofline)",
                     "value": med([r["tokens_per_s"] for r in rs]),
                     "ratio to default": med([r["ratio_to_generate"] for r in rs]),
                     "share of ceiling": med([r.get("share_of_roofline") for r in rs]),
                     "x reference": med([r.get("ratio_to_reference") for r in rs]),
                     "loaded": sum(bool(r.get("loaded")) for r in rs)})
    rows += target_rows(tiny["sampling"])     # the sampling targets against the run's bounds (bench.targets)
    for path, rs in by_path(tiny["evaluation"]).items():
        ref = [r.get("time_share_of_reference") for r in rs]
        rows.append({"part": "tiny evaluation", "path": path,
                     "measure": f"seconds (median of {len(rs)}; ratio: share of before)",
                     "value": med([r["seconds"] for r in rs]),
                     "ratio to default": med([r["time_share_of_before"] for r in rs]), "share of ceiling": None,
                     "x reference": med([1 / x for x in ref]) if None not in ref else None,
                     "loaded": sum(bool(r.get("loaded")) for r in rs)})
    grpo = by_path(tiny["grpo"])
    for path, rs in grpo.items():
        rows.append({"part": "tiny GRPO", "path": path, "measure": f"rollouts/s end to end (median of {len(rs)})",
                     "value": med([r["rollouts_per_s"] for r in rs]),
                     "ratio to default": med([r["ratio_to_before"] for r in rs]), "share of ceiling": None,
                     "x reference": med([r.get("ratio_to_reference") for r in rs])})
    for path, rs in grpo.items():
        if "rollout_tokens_per_s" in rs[0]:          # results of 2026-11-26 on
            rows.append({"part": "tiny GRPO", "path": path, "measure": "rollout tokens/s end to end",
                         "value": med([r["rollout_tokens_per_s"] for r in rs]),
                         "ratio to default": med([r["token_ratio_to_before"] for r in rs]), "share of ceiling": None})
        if "update_ratio_to_reference" in rs[0]:
            rows.append({"part": "tiny GRPO", "path": path, "measure": f"update time (median of {len(rs)})",
                         "value": med([r["update_s"] for r in rs]), "ratio to default": None, "share of ceiling": None,
                         "x reference": med([r["update_ratio_to_reference"] for r in rs])})
    for path, rs in by_path(tiny.get("attribution") or []).items():       # results of 2026-11-28 on
        ratio = [r.get("ratio_to_one_at_a_time", 1.0) for r in rs]
        rows.append({"part": "tiny attribution", "path": path,
                     "measure": f"trajectories/s (median of {len(rs)})", "value": med([r["trajectories_per_s"] for r in rs]),
                     "ratio to default": med(ratio), "share of ceiling": None,
                     "loaded": sum(bool(r.get("loaded")) for r in rs)})
    for r in tiny.get("attention") or []:           # results of 2026-11-28 on
        path = f"attend, {r['rows']} rows at {r['context']}, {r['kv_cache']} cache"
        shares = [("read bw", "share_of_read_bandwidth"), ("read bw beside", "share_of_read_bandwidth_beside")]
        for label, key in shares:                      # beside: results of 2026-11-28 18:00 on
            if key in r:
                rows.append({"part": "tiny attention", "path": path, "measure": f"cache bytes/s (share of {label})",
                             "value": r["bytes_per_s"] / 1e9, "ratio to default": 1.0, "share of ceiling": r[key]})
    rows += _product_rows(tiny, by_path, med)
    for r in tiny["training"]:
        rows.append({"part": "tiny training", "path": r["path"], "measure": "tokens/s (share of 6N at peak)",
                     "value": r["tokens_per_s"], "ratio to default": r["ratio_to_default"],
                     "share of ceiling": r["share_of_peak"]})
    return rows


def machine(hw: dict) -> str:
    """The machine of a result's ``hardware`` record in a few words: its GPU; else its CPU's model name, identity
    (family and model, or part), CPU count and vector flags, as far as the record has them."""
    if hw.get("gpu"):
        return hw["gpu"]
    ident = hw.get("cpu_id") or {}
    words = [hw.get("cpu") or "cpu"]
    if "family" in ident:
        words.append(f"family {ident['family']} model {ident.get('model', '?')}")
    elif "part" in ident:
        words.append(f"part {ident['part']:#x}" if isinstance(ident["part"], int) else f"part {ident['part']}")
    if hw.get("cpus"):
        words.append(f"{hw['cpus']} CPUs")
    if hw.get("cpu_flags"):
        words.append(" ".join(hw["cpu_flags"]))
    return ", ".join(words)


def format_table(result: dict) -> str:
    rows = table(result)
    head = f"{'part':<15}{'path':<70}{'measure':<34}{'value':>11}{'x default':>10}{'ceiling':>9}{'x ref':>8}"
    lines = [f"dsh bench ({result['size']}, {machine(result['hardware'])}, {result['wall_s']} s)", head]
    for r in rows:
        share = "" if r["share of ceiling"] is None else f"{100 * r['share of ceiling']:.1f}%"
        ref = "" if r.get("x reference") is None else f"{r['x reference']:.2f}x"
        x = "" if r["ratio to default"] is None else f"{r['ratio to default']:.2f}x"
        lines.append(f"{r['part']:<15}{r['path'][:69]:<70}{r['measure'][:33]:<34}{r['value']:>11.1f}{x:>10}{share:>9}{ref:>8}")
    return "\n".join(lines)
