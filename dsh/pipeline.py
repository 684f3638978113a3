"""One command for the whole experiment of a preset: training stages, evaluation, calibration.

Stages follow the paper's Table 1: Base, SFT (no reflection), SFT (reflection), RL (GRPO from the
SFT-reflection model), plus DFT. Each stage is a ``dsh.train`` run under ``runs_dir`` (weights; not
for committing); evaluation and calibration go to ``results_dir`` (small artifacts the book renders:
generations, calibration, provenance). A stage whose run already finished with the same configuration
is reused, so an interrupted pipeline resumes where it stopped.

``gpu-small`` is the small-scale analogue of the paper's protocol for the 135M embedded model, which
cannot extrapolate to operand lengths it never saw (shared/notes/small-model-findings.md): its Base is
a short digit-level SFT over 2..5 x 2..9 digits (the test range and neighbours, test problems held out),
stopped early so that accuracy still decays with length like the paper's base model; the paper's stages
then run on 4x5 + 5x4 from that Base.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import _validate as v
from .data import TEST_LEVELS

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
    max_new_tokens: int = 8192
    temperature: float = 1.0
    batch_size: int = 16


_PAPER_STAGES = (Stage("base", None), Stage("sft", "sft", "base"), Stage("sft_reflection", "sft_reflection", "base"),
                 Stage("rl", "grpo", "sft_reflection"), Stage("dft", "dft", "base"))
_BASE_LEVELS = tuple(f"{m}x{n}" for m in range(2, 6) for n in range(2, 10))

PIPELINES = {
    "ci": (_PAPER_STAGES, EvalSettings(n_per_level=2, max_new_tokens=64, batch_size=14)),
    "gpu-small": ((Stage("base", "sft", None, dict(train_levels=_BASE_LEVELS, n_train=8000, num_train_epochs=1.0,
                                                    max_steps=150, save_steps=50)),)
                  + _PAPER_STAGES[1:], EvalSettings(n_per_level=100, max_new_tokens=2048, batch_size=256)),
    "paper": (_PAPER_STAGES, EvalSettings()),
}


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


def run_pipeline(preset: str = "ci", results_dir: str = "results/ci", runs_dir: str = "runs/ci",
                 model: str = "embedded", overrides: dict | None = None, stages: tuple | None = None,
                 eval_overrides: dict | None = None, seed: int = 0, progress: bool = True) -> dict:
    """Train every stage (reusing finished runs), evaluate every model and calibrate it.

    Returns the summary that is also written to ``results_dir/summary.json``."""
    from .calibration import calibrate
    from .evaluate import evaluate
    from .models import resolve_model
    from .train import hardware, train, _git_commit

    v.length("seed", seed)
    cfgs = plan(preset, runs_dir, model, overrides)
    all_stages, settings = PIPELINES[preset]
    names = [s.name for s in all_stages]
    chosen = list(stages) if stages else names
    for s in chosen:
        v.choice("stages[i]", s, names)
    settings = dataclasses.replace(settings, **(eval_overrides or {}))
    resolve_model(model)  # fail fast
    results = Path(results_dir)
    (results / "generations").mkdir(parents=True, exist_ok=True)
    (results / "calibration").mkdir(parents=True, exist_ok=True)
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
        else:
            if run.exists():
                if (run / "summary.json").is_file():
                    raise ValueError(f"runs_dir {run} holds a finished run with another configuration; "
                                     f"choose another runs_dir")
                cfg = dataclasses.replace(cfg, resume=True)
            summary = train(cfg)
        train_summaries[st.name] = summary
        timings[f"train_{st.name}"] = round(time.time() - t0, 1)
        models_of[st.name] = str(run)
    calib = {}
    for name in chosen:
        gen = results / "generations" / f"{name}.jsonl"
        source = results / "generations" / f"{name}.source.json"
        ident = _model_identity(models_of[name], settings, seed)
        if gen.exists() and (not source.is_file() or json.loads(source.read_text()) != ident):
            gen.unlink()  # generations of another model (a retrained stage) or other settings: start over
        source.write_text(json.dumps(ident))
        t0 = time.time()
        evaluate(models_of[name], out=str(gen), levels=settings.levels, n_per_level=settings.n_per_level,
                 temperature=settings.temperature, max_new_tokens=settings.max_new_tokens, seed=seed,
                 batch_size=settings.batch_size, progress=progress)
        timings[f"evaluate_{name}"] = round(time.time() - t0, 1)
        recs = [json.loads(x) for x in gen.read_text().splitlines() if x.strip()]
        calib[name] = {"all": calibrate(recs, n_bootstrap=100, seed=seed),
                       "drop_truncated": calibrate(recs, drop_truncated=True, n_bootstrap=100, seed=seed)
                       if any(not r["truncated"] for r in recs) else None}
        (results / "calibration" / f"{name}.json").write_text(json.dumps(calib[name], indent=1))
        if gen.stat().st_size > 2_000_000:  # keep committed artifacts small
            with open(gen, "rb") as f, gzip.open(str(gen) + ".gz", "wb") as g:
                shutil.copyfileobj(f, g)
    summary = {
        "preset": preset, "model": model, "stages": chosen, "labels": {s: STAGE_LABELS[s] for s in chosen},
        "eval": dataclasses.asdict(settings), "seed": seed, "wall_s": round(time.time() - t_start, 1),
        "timings_s": timings, "training": train_summaries, "hardware": hardware(), "commit": _git_commit(),
        "accuracy": {s: {lv: {k: c["all"]["by_level"][lv][k] for k in ("n", "observed_accuracy", "ci_low", "ci_high")}
                         for lv in c["all"]["by_level"]} for s, c in calib.items()},
    }
    (results / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


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
