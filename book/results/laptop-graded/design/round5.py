"""Round 5 of the graded laptop experiment (RULE.md beside this file, "Round 5"): round 4's protocol with GRPO's
update in bfloat16 products, on the test ladder. Run from the repository root with the project's venv, nothing else
running (it resumes where it stopped):

    python book/results/laptop-graded/design/round5.py run

Runs go to runs/graded-r5/ (not committed). Round 5 leaves every stage that trains without sampling as round 4 had
it (the base, SFT, SFT with reflection, DFT, the verdict-only SFT: the same settings, so the same weights): their
run folders are copied from round 4's runs (runs/graded-r4/runs, each checked against the committed job record's
weights digest) and their committed evaluations, probes and attribution studies are put into the results folder, so
the pipeline reuses each by its key and trains, evaluates and studies the GRPO stages. The seed-0 validation run in
bfloat16 (update_precision.py, runs/graded-precision/bfloat16/rl-s0) is copied in as rl-s0, reused when its
settings are the pipeline's. Without round 4's runs the pipeline trains the SFT family itself."""
import dataclasses
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent
RUNS = Path("runs/graded-r5")
ROUND4 = Path("runs/graded-r4/runs")
VALIDATION_RUN = Path("runs/graded-precision/bfloat16/rl-s0")
SAMPLING_FREE = ("base", "sft", "sft_reflection", "dft", "sft_verdict")


def kept(stage: str) -> bool:
    """Whether round 5 leaves ``stage`` as round 4 had it (it samples nothing in training)."""
    return stage.split("-")[0] in SAMPLING_FREE


def preset():
    """The laptop-graded preset (round 4's protocol) with every GRPO stage's update in bfloat16 products."""
    from dsh.experiment.run import presets
    p = presets.LAPTOP_GRADED
    return dataclasses.replace(p, training={**p.training, "grpo": {**p.training["grpo"],
                                                                  "update_precision": "bfloat16"}})


def copy_runs(runs: Path):
    """Round 4's run folders of the stages round 5 keeps, each only when its weights are the committed ones."""
    import json

    from dsh.llm.models import model_digest
    for src in sorted(ROUND4.iterdir()) if ROUND4.is_dir() else ():
        if not kept(src.name) or (runs / src.name).exists() or not (src / "final").is_dir():
            continue
        job = RESULTS / "jobs" / f"{src.name}.json"
        if job.is_file() and model_digest(src / "final") == json.loads(job.read_text())["model"]:
            shutil.copytree(src, runs / src.name, symlinks=True)
    if VALIDATION_RUN.is_dir() and not (runs / "rl-s0").exists():
        shutil.copytree(VALIDATION_RUN, runs / "rl-s0", symlinks=True)


def claimed(p):
    """The runs and results folders claimed for the pipeline run of preset ``p`` (claim records as the pipeline
    writes them on empty folders); the results folder holding the committed job records, calibrations, generations,
    probes and attribution studies of the stages round 5 keeps."""
    from round4 import identity  # the design script beside this one

    from dsh.experiment.run import folders
    runs, results = RUNS / "runs", RUNS / "results"
    ident = identity(p)
    if not (runs / folders.CLAIM).is_file():
        runs.mkdir(parents=True)
        folders.claim({"runs_dir": runs}, ident)
    if not (results / folders.CLAIM).is_file():
        results.mkdir(parents=True)
        folders.claim({"results_dir": results}, ident)
        for sub in ("jobs", "calibration", "generations", "probe", "attribution"):
            (results / sub).mkdir()
            for f in sorted((RESULTS / sub).iterdir()):
                if kept(f.name.split(".")[0]):
                    shutil.copy2(f, results / sub / f.name)
    return runs, results


def step_run():
    """The pipeline on the test ladder under round 5's protocol."""
    from dsh.experiment.run.pipeline import run_pipeline
    p = preset()
    runs, results = claimed(p)
    copy_runs(runs)
    run_pipeline(p, results_dir=str(results), runs_dir=str(runs))


if __name__ == "__main__":
    {"run": step_run}[sys.argv[1]]()
