"""One command for the whole experiment of a preset: training stages, evaluation, calibration.

Stages follow the paper's Table 1: Base, SFT (no reflection), SFT (reflection), RL (GRPO from the
SFT-reflection model), plus DFT. Each stage is a ``dsh.train`` run under ``runs_dir`` (weights; not
for committing); evaluation and calibration go to ``results_dir`` (small artifacts the book renders:
generations, calibration, provenance). A stage whose run already finished with the same configuration
is reused, so an interrupted pipeline resumes where it stopped.

``gpu-small`` is the small-scale analogue of the paper's protocol for the 135M embedded model, which
cannot extrapolate to operand lengths it never saw (README, "The embedded model"): its Base is one epoch
of lean digit-level SFT over 2..5 x 2..9 digits (the test range and neighbours, test problems held out),
stopped early so that accuracy still decays with length like the paper's base model; the paper's stages
then run on 4x5 + 5x4 from that Base. Token budgets come from :mod:`dsh.budgets`; every run checks its
own design goals (:func:`design_checks`). ``python3 -m dsh.gpu_small`` runs it as one command on a GPU host.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import validate as v
from .files import gzip_copy, read_jsonl, write_text
from .presets import CI_EVAL_LEVELS, GPU_BASE_LEVELS, Budget, budget_tokens
from .problems import TEST_LEVELS

STAGE_LABELS = {"base": "Base", "sft": "SFT (no reflection)", "sft_reflection": "SFT (reflection)",
                "rl": "RL", "dft": "DFT"}


@dataclass(frozen=True)
class Stage:
    name: str                  # base, sft, sft_reflection, rl, dft
    method: str | None         # None: no training (the starting model itself)
    init: str | None = None    # the stage whose model it starts from (None: the pipeline's model)
    overrides: dict = field(default_factory=dict)


@dataclass(frozen=True)
class EvalSettings:
    levels: tuple = tuple(f"{m}x{n}" for m, n in TEST_LEVELS)
    n_per_level: int = 100
    max_new_tokens: int = 8192      # or a dsh.presets.Budget, derived from the preset's traces
    temperature: float = 1.0
    batch_size: int = 16


_PAPER_STAGES = (Stage("base", None), Stage("sft", "sft", "base"), Stage("sft_reflection", "sft_reflection", "base"),
                 Stage("rl", "grpo", "sft_reflection"), Stage("dft", "dft", "base"))

# gpu-small's Base: one epoch of lean digit-level SFT over 2..5 x 2..9 digits (test problems held out), short
# enough that accuracy still decays with length; the run summary says whether it did (design checks).
_GPU_BASE = Stage("base", "sft", None, dict(train_levels=GPU_BASE_LEVELS, n_train=9600, max_steps=300, save_steps=100,
                                            max_length=Budget("base.max_length")))

PIPELINES = {
    "ci": (_PAPER_STAGES, EvalSettings(levels=CI_EVAL_LEVELS, n_per_level=2,
                                       max_new_tokens=Budget("eval.max_new_tokens"), batch_size=8)),
    "gpu-small": ((_GPU_BASE,) + _PAPER_STAGES[1:],
                  EvalSettings(n_per_level=100, max_new_tokens=Budget("eval.max_new_tokens"), batch_size=512)),
    "paper": (_PAPER_STAGES, EvalSettings()),
}


def eval_settings(preset: str, overrides: dict | None = None) -> EvalSettings:
    """The evaluation settings of ``preset`` with its token budget resolved and ``overrides`` applied."""
    if preset not in PIPELINES:
        raise ValueError(f"preset must be one of {', '.join(PIPELINES)}; got {preset!r}")
    settings = PIPELINES[preset][1]
    fields = {f.name for f in dataclasses.fields(EvalSettings)}
    unknown = sorted(set(overrides or {}) - fields)
    if unknown:
        raise ValueError(f"unknown evaluation field(s) {', '.join(unknown)}; valid fields: {', '.join(sorted(fields))}")
    settings = dataclasses.replace(settings, max_new_tokens=budget_tokens(preset, settings.max_new_tokens))
    return dataclasses.replace(settings, **(overrides or {}))


def _run_dir_name(stage: Stage) -> str:
    return "grpo" if stage.name == "rl" else stage.name


def _matches(run: Path, cfg) -> bool:
    try:
        stored = json.loads((run / "run_config.json").read_text())["dsh"]
    except (OSError, ValueError, KeyError):
        return False
    want = json.loads(json.dumps(dataclasses.asdict(cfg), default=str))
    ignore = {"output_dir", "resume"}
    return {k: x for k, x in stored.items() if k not in ignore} == {k: x for k, x in want.items() if k not in ignore}


def plan(preset: str, runs_dir: str, model: str = "embedded", overrides: dict | None = None) -> dict:
    """The TrainConfig of every training stage (validated, nothing loaded or written)."""
    from .presets import PRESETS, resolve

    if preset not in PIPELINES or preset not in PRESETS:
        raise ValueError(f"preset must be one of {', '.join(PIPELINES)}; got {preset!r}")
    stages, _ = PIPELINES[preset]
    root = Path(runs_dir)
    out = {}
    for st in stages:
        if st.method is None:
            continue
        init = _stage(stages, st.init) if st.init else None
        start = model if init is None or init.method is None else str(root / _run_dir_name(init))
        out[st.name] = resolve(st.method, preset, model=start, output_dir=str(root / _run_dir_name(st)),
                               **{**st.overrides, **(overrides or {})})
    return out


def _stage(stages, name) -> Stage:
    return next(s for s in stages if s.name == name)


def _say(progress: bool, msg: str) -> None:
    if progress:
        print(f"[dsh pipeline] {msg}", flush=True)


def run_pipeline(preset: str = "ci", results_dir: str = "results/ci", runs_dir: str = "runs/ci",
                 model: str = "embedded", overrides: dict | None = None, stages: tuple | None = None,
                 eval_overrides: dict | None = None, seed: int = 0, progress: bool = True) -> dict:
    """Train every stage (reusing finished runs), evaluate every model and calibrate it.

    Weights and the working (resumable) generation files go to ``runs_dir``; ``results_dir`` receives
    the small artifacts the book renders (:data:`RESULTS_LAYOUT`). Each stage's time is printed as it ends
    (``progress``). Returns the summary that is also written to ``results_dir/summary.json``."""
    from .calibration import calibrate
    from .evaluate import evaluate
    from .faithfulness import summarize
    from .models import resolve_model
    from .provenance import git_commit, hardware
    from .train import train

    v.length("seed", seed)
    cfgs = plan(preset, runs_dir, model, overrides)
    all_stages, _ = PIPELINES[preset]
    names = [s.name for s in all_stages]
    chosen = list(stages) if stages else names
    for s in chosen:
        v.choice("stages[i]", s, names)
    settings = eval_settings(preset, eval_overrides)
    resolve_model(model)  # fail fast
    results, work = Path(results_dir), Path(runs_dir) / "generations"
    if results.resolve() == Path(runs_dir).resolve():
        raise ValueError("results_dir must differ from runs_dir (results are committed, runs hold weights)")
    for sub in ("generations", "calibration"):
        (results / sub).mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    timings, train_summaries, models_of = {}, {}, {}
    needed = set(chosen)
    for name in chosen:  # every stage a chosen one starts from, transitively
        st = _stage(all_stages, name)
        while st.init:
            needed.add(st.init)
            st = _stage(all_stages, st.init)
    for st in all_stages:
        if st.name not in needed:
            continue
        if st.method is None:
            models_of[st.name] = model
            continue
        cfg = cfgs[st.name]
        run = Path(cfg.output_dir)
        t0 = time.time()
        if (run / "summary.json").is_file() and _matches(run, cfg):
            summary = json.loads((run / "summary.json").read_text())
            how = "reused"
        else:
            if run.exists():
                if (run / "summary.json").is_file():
                    raise ValueError(f"runs_dir {run} holds a finished run with another configuration; "
                                     f"choose another runs_dir")
                cfg = dataclasses.replace(cfg, resume=True)
            _say(progress, f"train {st.name} ({cfg.method}) ...")
            summary = train(cfg)
            how = "trained"
        train_summaries[st.name] = summary
        timings[f"train_{st.name}"] = round(time.time() - t0, 1)
        models_of[st.name] = str(run)
        _say(progress, f"train {st.name}: {how} in {timings[f'train_{st.name}']} s "
                       f"(elapsed {time.time() - t_start:.0f} s)")
    calib = {}
    for name in chosen:
        gen = work / f"{name}.jsonl"
        source = work / f"{name}.source.json"
        ident = _model_identity(models_of[name], settings, seed)
        if gen.exists() and (not source.is_file() or json.loads(source.read_text()) != ident):
            gen.unlink()  # generations of another model (a retrained stage) or other settings: start over
        source.write_text(json.dumps(ident))
        t0 = time.time()
        evaluate(models_of[name], out=str(gen), levels=settings.levels, n_per_level=settings.n_per_level,
                 temperature=settings.temperature, max_new_tokens=settings.max_new_tokens, seed=seed,
                 batch_size=settings.batch_size, progress=progress)
        timings[f"evaluate_{name}"] = round(time.time() - t0, 1)
        recs = read_jsonl(gen)
        calib[name] = {"all": calibrate(recs, n_bootstrap=100, seed=seed),
                       "drop_truncated": calibrate(recs, drop_truncated=True, n_bootstrap=100, seed=seed)
                       if any(not r["truncated"] for r in recs) else None,
                       "faithfulness": summarize(recs),
                       "truncated": float(sum(r["truncated"] for r in recs) / len(recs)) if recs else None}
        write_text(results / "calibration" / f"{name}.json", json.dumps(calib[name], indent=1))
        gzip_copy(gen, results / "generations" / f"{name}.jsonl.gz")
        _say(progress, f"evaluate {name}: {len(recs)} responses in {timings[f'evaluate_{name}']} s, "
                       f"accuracy {calib[name]['all']['overall']['observed_accuracy']:.3f}, "
                       f"truncated {100 * (calib[name]['truncated'] or 0):.1f} % (elapsed {time.time() - t_start:.0f} s)")
    summary = {
        "preset": preset, "model": model, "stages": chosen, "labels": {s: STAGE_LABELS[s] for s in chosen},
        "eval": dataclasses.asdict(settings), "seed": seed, "wall_s": round(time.time() - t_start, 1),
        "timings_s": timings, "training": train_summaries, "hardware": hardware(), "commit": git_commit(),
        "budgets": {**{f"{name}.{k}": getattr(c, k) for name, c in cfgs.items()
                       for k in (("max_completion_length",) if c.method == "grpo" else ("max_length",))},
                    "eval.max_new_tokens": settings.max_new_tokens},
        "truncation": {s: {"train": (train_summaries.get(s) or {}).get("truncation"),
                           "eval": calib[s]["truncated"]} for s in chosen},
        "accuracy": {s: {lv: {k: c["all"]["by_level"][lv][k] for k in ("n", "observed_accuracy", "ci_low", "ci_high")}
                         for lv in c["all"]["by_level"]} for s, c in calib.items()},
    }
    summary["design"] = design_checks({"summary": summary, "calibration": calib})
    write_text(results / "summary.json", json.dumps(summary, indent=1))
    _say(progress, f"done in {summary['wall_s']} s: {results}")
    return summary


RESULTS_LAYOUT = ("summary.json", "calibration/<stage>.json", "generations/<stage>.jsonl.gz")


def _model_identity(model: str, settings: EvalSettings, seed: int) -> dict:
    """What a generations file was made from: the model (its weights file's size and modification time
    for a run directory) and the evaluation settings."""
    ident = {"model": model, "settings": json.loads(json.dumps(dataclasses.asdict(settings))), "seed": seed}
    weights = Path(model) / "final" / "model.safetensors"
    if weights.is_file():
        st = weights.stat()
        ident["weights"] = [st.st_size, st.st_mtime_ns]
    return ident


def load_results(results_dir) -> dict:
    """A results folder written by :func:`run_pipeline`: summary and calibration per stage."""
    root = Path(results_dir)
    if not (root / "summary.json").is_file():
        raise ValueError(f"results_dir must be a folder written by dsh pipeline; {root}/summary.json not found")
    summary = json.loads((root / "summary.json").read_text())
    calib = {s: json.loads((root / "calibration" / f"{s}.json").read_text()) for s in summary["stages"]}
    return {"summary": summary, "calibration": calib}


def _level_index(lv: str) -> int:
    m, n = lv.split("x")
    return int(m) * 100 + int(n)


def claims(results: dict, min_n: int = 30) -> list[dict]:
    """A plain verdict on each empirical claim of the paper from a results folder (:func:`load_results`):
    (i) the two-stage model predicts accuracy, (ii) RL improves pi_d more than pi_sample, (iii)
    out-of-distribution accuracy is limited by pi_sample. "cannot tell" when a level has fewer than
    ``min_n`` responses or a needed estimate is undefined; the evidence string carries the numbers."""
    cal = results["calibration"]
    out = []

    def levels(stage):
        c = cal.get(stage)
        if not c:
            return {}
        block = c["drop_truncated"] or c["all"]
        return block["by_level"]

    # (i)
    rows, small = [], False
    for stage in ("rl", "sft_reflection"):
        for lv, s in levels(stage).items():
            small |= s["n"] < min_n
            if s["predicted_accuracy"] is None or s["predicted_ci_low"] is None:
                continue
            inside = s["ci_low"] <= s["predicted_accuracy"] <= s["ci_high"] or \
                s["predicted_ci_low"] <= s["observed_accuracy"] <= s["predicted_ci_high"]
            rows.append((stage, lv, s["observed_accuracy"], s["predicted_accuracy"], inside))
    if small or not rows:
        v1 = "cannot tell"
    else:
        v1 = "holds" if sum(r[4] for r in rows) >= 0.8 * len(rows) else "fails"
    out.append({"claim": "(i) the two-stage model predicts accuracy", "verdict": v1,
                "evidence": "; ".join(f"{s} {lv}: observed {o:.2f}, predicted {p:.2f}" for s, lv, o, p, _ in rows)
                or "no level with defined estimates"})
    # (ii)
    rl, sr = cal.get("rl"), cal.get("sft_reflection")
    if rl and sr:
        a, b = (rl["drop_truncated"] or rl["all"])["overall"], (sr["drop_truncated"] or sr["all"])["overall"]
        need = [a["p_s"], b["p_s"], a["p_d_given_wrong"], b["p_d_given_wrong"]]
        if any(x is None for x in need) or min(a["n"], b["n"]) < min_n * 3:
            v2, ev = "cannot tell", f"n = {a['n']} and {b['n']}; estimates {need}"
        else:
            ds, dw = a["p_s"] - b["p_s"], a["p_d_given_wrong"] - b["p_d_given_wrong"]
            v2 = "holds" if dw > ds else "fails"
            ev = f"RL minus SFT (reflection): delta p_s = {ds:+.3f}, delta p_dW = {dw:+.3f}"
    else:
        v2, ev = "cannot tell", "needs both the RL and the SFT (reflection) stages"
    out.append({"claim": "(ii) RL improves pi_d more than pi_sample", "verdict": v2, "evidence": ev})
    # (iii)
    lv_rl = levels("rl")
    pts = sorted((_level_index(lv), s) for lv, s in lv_rl.items())
    usable = [(i, s) for i, s in pts if s["p_s"] is not None and s["p_d_given_wrong"] is not None and s["n"] >= min_n]
    if len(usable) < 3:
        v3, ev = "cannot tell", f"{len(usable)} levels with enough responses and defined p_s, p_dW"
    else:
        ps = [s["p_s"] for _, s in usable]
        pw = [s["p_d_given_wrong"] for _, s in usable]
        drop_s, drop_w = ps[0] - ps[-1], pw[0] - pw[-1]
        v3 = "holds" if drop_s > 0 and drop_s > drop_w else "fails"
        ev = f"from the easiest to the hardest level: p_s {ps[0]:.2f} -> {ps[-1]:.2f}, p_dW {pw[0]:.2f} -> {pw[-1]:.2f}"
    out.append({"claim": "(iii) OOD accuracy is limited by pi_sample", "verdict": v3, "evidence": ev})
    return out


def _overall(c: dict) -> dict:
    return (c.get("drop_truncated") or c["all"])["overall"]


def design_checks(results: dict) -> dict:
    """Whether a run gives the paper's questions something to measure (the design goals of the
    small-scale analogue): Base accuracy non-zero on at least 4 test levels and decaying with difficulty
    (more decreasing than increasing pairs of levels, and easiest > hardest); GRPO groups whose rewards
    all agree <= 50 % at its first step; RL changing p_dW or p_s measurably (the 95 % intervals of
    SFT (reflection) and RL do not overlap). ``None`` where the run lacks the stage."""
    cal, summ = results["calibration"], results["summary"]
    out, goals = {}, {}
    base = cal.get("base")
    if base:
        by = base["all"]["by_level"]
        levels = sorted(by, key=_level_index)
        acc = [by[lv]["observed_accuracy"] for lv in levels]
        down = sum(x > y for i, x in enumerate(acc) for y in acc[i + 1:])
        up = sum(x < y for i, x in enumerate(acc) for y in acc[i + 1:])
        out["base_accuracy"] = dict(zip(levels, acc))
        out["base_nonzero_levels"] = sum(a > 0 for a in acc)
        goals["base accuracy non-zero on >= 4 test levels"] = out["base_nonzero_levels"] >= 4
        goals["base accuracy decays with difficulty"] = bool(down > up and acc[0] > acc[-1])
    rl_train = (summ.get("training") or {}).get("rl") or {}
    zero = (rl_train.get("truncation") or {}).get("zero_std_groups_first")
    out["grpo_zero_std_groups_first"] = zero
    goals["GRPO zero-variance groups <= 50 % at step 1"] = None if zero is None else zero <= 0.5
    rl, sr = cal.get("rl"), cal.get("sft_reflection")
    if rl and sr:
        a, b = _overall(rl), _overall(sr)
        moved = []
        for key in ("p_s", "p_d_given_wrong"):
            ci_a, ci_b = a.get(key + "_ci") or [None, None], b.get(key + "_ci") or [None, None]
            delta = None if a[key] is None or b[key] is None else a[key] - b[key]
            apart = None if None in (*ci_a, *ci_b) else (ci_a[0] > ci_b[1] or ci_b[0] > ci_a[1])
            out[f"delta_{key}"] = {"rl": a[key], "sft_reflection": b[key], "delta": delta, "rl_ci": ci_a,
                                   "sft_reflection_ci": ci_b, "intervals_apart": apart}
            moved.append(apart)
        goals["RL changes p_dW or p_s measurably"] = None if all(m is None for m in moved) else any(bool(m) for m in moved)
    out["goals"] = goals
    return out
