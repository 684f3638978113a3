"""Evaluate models with a preset's evaluation settings at this checkout, write each one's calibration and question-
ordered generations as the pipeline does (dsh.experiment.run.steps.stage_job), and compare their digests with a
committed stage's job record. Run from the repository root:

    python book/results/laptop-graded/design/evaluate_retrained.py laptop-graded book/results/laptop-graded <out> \
        <label>=<committed stage>=<model folder> ...

Writes <out>/evalcmp.json, <out>/<label>.calibration.json and <out>/<label>.jsonl.gz."""
import hashlib, json, sys, time
from pathlib import Path
from dsh.core.files import read_jsonl, write_jsonl_gz
from dsh.experiment.run.evaluate import evaluate
from dsh.experiment.run.presets import PRESETS
from dsh.measure.stage import calibrate_stage
from dsh.task.records import by_question
if len(sys.argv) < 5 or sys.argv[1] not in PRESETS or any(a.count("=") != 2 for a in sys.argv[4:]):
    raise SystemExit(f"usage: evaluate_retrained.py <preset: {', '.join(PRESETS)}> <results folder> <out> "
                     "<label>=<committed stage>=<model folder> ...")
p = PRESETS[sys.argv[1]]; S = p.evaluation
G = Path(sys.argv[2])
out = Path(sys.argv[3]); out.mkdir(parents=True, exist_ok=True)
res = {}
for arg in sys.argv[4:]:
    name, stage, model = arg.split("=")   # label=committed stage=model dir
    job = json.loads((G / "jobs" / f"{stage}.json").read_text())
    gen = out / f"{name}.jsonl"; gen.unlink(missing_ok=True)
    t = time.time()
    evaluate(model, out=str(gen), settings=S, seed=job["seed"], progress=False)
    recs = read_jsonl(gen)
    calib = calibrate_stage(recs, seed=job["seed"], task=p.task)
    cj = out / f"{name}.calibration.json"; cj.write_text(json.dumps(calib, indent=1))
    gz = out / f"{name}.jsonl.gz"; write_jsonl_gz(gz, by_question(recs))
    dig = lambda f: hashlib.sha256(f.read_bytes()).hexdigest()
    res[name] = {"stage": stage, "seconds": round(time.time() - t, 1),
                 "generations_same": dig(gz) == job["files"][f"generations/{stage}.jsonl.gz"],
                 "calibration_same": dig(cj) == job["files"][f"calibration/{stage}.json"]}
    print(name, res[name], flush=True)
(out / "evalcmp.json").write_text(json.dumps(res, indent=1))
