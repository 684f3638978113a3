"""The laptop experiment as one command (``python -m dsh pipeline --preset laptop``): every stage of the paper
from the shipped tiny base, several seeds, and two experiments beyond the paper, on two CPU cores.

Jobs (:func:`plan_jobs`), each a :func:`dsh.training.train.train` run of the ``laptop`` preset (TRL's ``SFTTrainer`` and
``GRPOTrainer`` with rollouts from :mod:`dsh.llm.engine`), then evaluated on the 1x2 ... 1x8 ladder (100 questions a
level, temperature 1, the same questions for every job) and calibrated:

- per seed: ``sft`` (no reflection), ``sft_reflection``, ``dft`` (reflection traces, ``loss_type="dft"``) from the
  base, and ``rl`` (GRPO) from that seed's ``sft_reflection``;
- **KL ablation** (Theorem 3.2 on a real model): ``rl`` again at other KL coefficients ``beta``;
- **imitated checks**: ``sft_verdict`` (reflection traces whose checks show the verdict only, no computation) and
  ``rl_verdict`` (GRPO from it): does RL improve pi_d when the decision cannot see correctness?

Weights go to ``runs_dir`` (not committed); ``results_dir`` (committed, a few MB) gets, per job,
``<job>.json`` (calibration, decision faithfulness, GRPO reward curve, training summary) and
``generations/<job>.jsonl.gz``, and ``summary.json`` (plan, every job's time, load average samples, provenance).
Finished jobs are reused and a killed run resumes (training from its last checkpoint, evaluation from its last
record).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..core import validate as v
from ..core.files import gzip_copy, read_jsonl, write_text
from ..core.provenance import provenance
from ..llm.models import resolve_model
from ..measure.stage import calibrate_stage
from ..task import laptop_task as lt
from ..training.laptop_base import SHIPPED_BASE
from .pipeline import Clock, evaluate_model, make_folders, train_stage
from .presets import LAPTOP

KL_BETAS = (0.0, 0.01, 0.1)   # the ablation's other coefficients (the preset's GRPO uses 0.001, the paper's)
EVAL_SEED = 0                 # the same test questions (and sampling streams) for every job


@dataclass(frozen=True)
class Job:
    """One training run of the laptop experiment: ``init`` is the job it starts from (None: the base)."""

    name: str
    stage: str
    method: str | None
    seed: int
    init: str | None = None
    overrides: dict = field(default_factory=dict)


def plan_jobs(seeds=(0, 1, 2), kl_betas=KL_BETAS, ablation_seeds=(0,)) -> list[Job]:
    """Every job of the experiment, in the order they run (a job after the one it starts from)."""
    seeds, ablation_seeds = tuple(seeds), tuple(ablation_seeds)
    for name, xs in (("seeds", seeds), ("ablation_seeds", ablation_seeds)):
        if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in xs):
            raise ValueError(f"{name} must be a list of integers >= 0; got {xs!r}")
    if not seeds:
        raise ValueError("seeds must name at least one seed")
    if set(ablation_seeds) - set(seeds):
        raise ValueError(f"ablation_seeds must be a subset of seeds {seeds}; got {ablation_seeds}")
    for b in kl_betas:
        if v.real("kl_betas[i]", b) < 0:
            raise ValueError(f"kl_betas must be numbers >= 0; got {kl_betas!r}")
    jobs = [Job("base", "base", None, 0)]
    for s in seeds:
        jobs += [Job(f"sft-s{s}", "sft", "sft", s), Job(f"sft_reflection-s{s}", "sft_reflection", "sft_reflection", s),
                 Job(f"dft-s{s}", "dft", "dft", s), Job(f"rl-s{s}", "rl", "grpo", s, f"sft_reflection-s{s}")]
    for s in ablation_seeds:
        for b in kl_betas:
            jobs.append(Job(f"rl_beta{b:g}-s{s}", f"rl_beta{b:g}", "grpo", s, f"sft_reflection-s{s}", {"beta": b}))
        jobs += [Job(f"sft_verdict-s{s}", "sft_verdict", "sft_reflection", s, None, {"laptop_check": "verdict"}),
                 Job(f"rl_verdict-s{s}", "rl_verdict", "grpo", s, f"sft_verdict-s{s}")]
    return jobs


def select_jobs(plan: list[Job], names=None) -> list[Job]:
    """The jobs of ``plan`` named in ``names`` (None: all), every job they start from, and the base (every run
    evaluates the base it starts from), in the plan's order."""
    if names is None:
        return list(plan)
    by_name = {j.name: j for j in plan}
    want = {"base"}
    for name in names:
        v.choice("jobs[i]", name, list(by_name))
        j = by_name[name]
        want.add(j.name)
        while j.init:
            j = by_name[j.init]
            want.add(j.name)
    return [j for j in plan if j.name in want]


def job_config(job: Job, runs_dir, base, overrides: dict | None = None):
    """The :class:`dsh.training.train.TrainConfig` of a training job (``overrides``: TrainConfig fields for every job, e.g.
    the book's short live run)."""
    model = str(base) if job.init is None else str(Path(runs_dir) / job.init)
    return LAPTOP.train_config(job.method, model=model, output_dir=str(Path(runs_dir) / job.name), seed=job.seed,
                               **{**(overrides or {}), **job.overrides})


def reward_curve(run: Path) -> list[dict]:
    """GRPO's log per rollout round (from metrics.jsonl): the round's first step, its reward, zero-variance groups and
    completion length, the KL of the round's last logged step, and the round's time split (sampling, scoring and
    the sum of its steps' updates, in seconds; None for runs made before issue 28)."""
    keys = ("reward", "frac_reward_zero_std", "kl", "completions/mean_length")
    out = []
    if (run / "metrics.jsonl").is_file():
        for r in read_jsonl(run / "metrics.jsonl"):
            if "reward" in r:
                out.append({"step": r["step"], **{k: r.get(k) for k in keys},
                            "rollout_s": r.get("time/rollout_s"), "scoring_s": r.get("time/scoring_s"),
                            "update_s": None})
            if not out:
                continue
            if r.get("kl") is not None:
                out[-1]["kl"] = r["kl"]
            if r.get("time/update_s") is not None:
                out[-1]["update_s"] = (out[-1]["update_s"] or 0.0) + r["time/update_s"]
    return out


def run_laptop(results_dir="book/results/laptop", runs_dir="runs/laptop", base=None, seeds=(0, 1, 2),
               kl_betas=KL_BETAS, ablation_seeds=(0,), n_per_level: int | None = None,
               jobs: tuple | None = None, overrides: dict | None = None, progress: bool = True) -> dict:
    """Run (or resume) every job of :func:`plan_jobs` and write ``results_dir`` (module docstring). ``jobs``:
    only these job names (and what they start from); ``n_per_level``: questions per level (default the preset's);
    ``overrides``: TrainConfig fields for every training job."""
    base = str(base or SHIPPED_BASE)
    resolve_model(base)
    plan = select_jobs(plan_jobs(seeds, kl_betas, ablation_seeds), jobs)
    settings = LAPTOP.eval_settings(**({"n_per_level": v.positive_int("n_per_level", n_per_level)}
                                       if n_per_level is not None else {}))
    if overrides is not None and not isinstance(overrides, dict):
        raise ValueError(f"overrides must be a mapping of TrainConfig fields to values; got {overrides!r}")
    cfgs = {j.name: job_config(j, runs_dir, base, overrides) for j in plan if j.method}   # validated before any work
    results, runs = Path(results_dir), Path(runs_dir)
    make_folders(results, runs, ("generations",))
    clock = Clock(progress)
    prov = provenance()              # the commit and versions the run starts from
    load = [(0.0, os.getloadavg()[0])]
    for j in plan:
        model = base
        if j.method:
            train_stage(cfgs[j.name], j.name, clock)
            model = cfgs[j.name].output_dir
        gen = runs / "generations" / f"{j.name}.jsonl"
        recs = evaluate_model(model, gen, settings, EVAL_SEED, j.name, clock, backend="dsh")
        out = {"job": dataclasses.asdict(j), "calibration": calibrate_stage(recs, seed=EVAL_SEED),
               "laptop_faithfulness": lt.faithfulness(recs)}
        if j.method:
            run = Path(cfgs[j.name].output_dir)
            out["training"] = json.loads((run / "summary.json").read_text())
            out["reward_curve"] = reward_curve(run) if j.method == "grpo" else None
        write_text(results / f"{j.name}.json", json.dumps(out, indent=1, default=str))
        gzip_copy(gen, results / "generations" / f"{j.name}.jsonl.gz")
        load.append((round(clock.elapsed(), 1), os.getloadavg()[0]))
        clock.say(f"{j.name}: accuracy {out['calibration']['all']['overall']['observed_accuracy']:.3f} "
                  f"(load {load[-1][1]:.2f})")
    summary = {"preset": LAPTOP.name, "base": base, "jobs": [dataclasses.asdict(j) for j in plan],
               "eval": dataclasses.asdict(settings), "eval_seed": EVAL_SEED, "wall_s": round(clock.elapsed(), 1),
               "timings_s": clock.timings, "load_average_1min": load, "cpu": _cpu_model(), "torch_threads": _threads(),
               **prov, "finished": time.strftime("%Y-%m-%d %H:%M:%S")}
    write_text(results / "summary.json", json.dumps(summary, indent=1, default=str))
    clock.say(f"done in {summary['wall_s']} s: {results}")
    return summary


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:  # pragma: no cover - not Linux
        pass
    import platform

    return platform.processor() or None


def _threads() -> int:
    import torch

    return torch.get_num_threads()
