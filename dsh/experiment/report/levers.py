"""The pipeline's time with the measured levers: a bound computed from a measured run's schedule.

A pipeline run on two workers (``design/reproduce_pipeline.json``) records each step's time; the levers measured
beside it (``design/levers.json``) each save a share of some steps. :func:`lever_cuts` gives each step's share saved,
:func:`futile_rounds` the rounds a study would draw under a round rule that also stops on fits out of reach (per
study step: :func:`study_rounds`, :func:`study_cuts`), and :func:`work_bound` the least wall time the remaining work
needs on the workers: its steps' time over the workers (the measured run filled over 99 % of them, so no schedule
does much better), and never less than its longest step."""

from __future__ import annotations

from ...core import validate as v
from ...training.train_config import METHODS
from ..run.attribution_study import counts_after
from .training import check_schedule

FINE_TUNING = tuple(m for m in METHODS if m != "grpo")     # the methods the C kernels' attention lever applies to


def _share(name: str, x) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 < x <= 1:
        raise ValueError(f"{name} must be a number in (0, 1] (a lever's time over the path's), got {x!r}")
    return float(x)


def lever_cuts(schedule: list, training: dict, configs: dict, scoring_ratio: float, attention_ratio: float) -> dict:
    """``{step: share of its time saved}`` for the training steps of ``schedule``: a GRPO stage with a reference
    (``beta`` > 0 in ``configs``) saves its scoring share of the time (``scoring_s / wall_s`` of its record in
    ``training``) times ``1 - scoring_ratio`` (bfloat16 over float32 reference scoring, measured); a fine-tuning
    stage (SFT, SFT (reflection) and its verdict-only variant, DFT) saves ``1 - attention_ratio`` (its time with
    the C kernels' packed attention over torch's, measured). Other steps save nothing."""
    check_schedule(schedule)
    scoring_ratio, attention_ratio = _share("scoring_ratio", scoring_ratio), _share("attention_ratio", attention_ratio)
    out = {}
    for r in schedule:
        kind, _, stage = r["step"].partition(" ")
        if kind != "train":
            continue
        if stage not in configs or stage not in training:
            raise ValueError(f"configs and training must hold every trained stage of the schedule; {stage!r} is missing")
        cfg, rec = configs[stage], training[stage]
        if cfg["method"] == "grpo" and cfg.get("beta", 0) > 0:
            out[r["step"]] = (rec.get("scoring_s") or 0.0) / rec["wall_s"] * (1 - scoring_ratio)
        elif cfg["method"] in FINE_TUNING:
            out[r["step"]] = 1 - attention_ratio
    return out


def futile_rounds(study: dict) -> int:
    """The rounds ``study`` (a study record) would have drawn had its round rule also stopped once every counted fit
    either holds ``min_signal`` trajectories or cannot reach it by ``max_rounds`` at its rate so far (``n_r`` after
    ``r`` rounds: ``n_r * max_rounds / r < min_signal``); its rounds are the first of the study's own (each round is
    drawn from its own seeded questions), so the rule is read off the record. At most the study's rounds."""
    s = study["settings"]
    for r in range(1, study["rounds"] + 1):
        counts = counts_after(study, r).values()
        if all(n >= s["min_signal"] or n * s["max_rounds"] / r < s["min_signal"] for n in counts):
            return r
    return study["rounds"]


def study_rounds(schedule: list, studies: dict) -> dict:
    """``{study step: (rounds under :func:`futile_rounds`, rounds drawn)}`` for every study step of ``schedule``
    (``study NAME-tK``: the record ``NAME`` of ``studies`` for K 0, ``NAME-tK`` otherwise)."""
    check_schedule(schedule)
    out = {}
    for r in schedule:
        kind, _, name = r["step"].partition(" ")
        if kind != "study":
            continue
        stage, _, t = name.rpartition("-t")
        key = stage if t == "0" else f"{stage}-t{t}"
        if key not in studies:
            raise ValueError(f"studies must hold the record of every study of the schedule; {key!r} is missing")
        out[r["step"]] = (futile_rounds(studies[key]), studies[key]["rounds"])
    return out


def study_cuts(schedule: list, studies: dict) -> dict:
    """``{study step: share of its time saved}`` under :func:`futile_rounds` (:func:`study_rounds`), taking a
    study's time as proportional to its rounds (each round draws as many questions)."""
    return {step: 1 - kept / drawn for step, (kept, drawn) in study_rounds(schedule, studies).items()}


def work_bound(schedule: list, workers: int, cuts: dict) -> dict:
    """The work of ``schedule`` with each step in ``cuts`` (``{step: share saved}``, each in [0, 1)) shortened by its
    share: ``{"busy_s": its steps' time summed, "saved_s": the time cut, "wall_s": the least wall time on
    ``workers`` workers, busy_s / workers or the longest step, whichever is larger}``."""
    check_schedule(schedule)
    v.positive_int("workers", workers)
    steps = {r["step"] for r in schedule}
    for k, x in cuts.items():
        if k not in steps or isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 <= x < 1:
            raise ValueError(f"cuts must map steps of the schedule to a share in [0, 1); got {k!r}: {x!r}")
    full = [r["end_s"] - r["start_s"] for r in schedule]
    times = [t * (1 - cuts.get(r["step"], 0.0)) for t, r in zip(full, schedule)]
    busy = sum(times)
    return {"busy_s": busy, "saved_s": sum(full) - busy,
            "wall_s": max(busy / workers, max(times))}
