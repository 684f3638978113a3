"""Historical, run once (issue 30, part 1, 2026-11-24): recompute every committed laptop stage's calibration from its
committed generations with the laptop task's own reading of a response (``dsh.measure.tasks.LaptopTask.parse``:
candidates are the attempts' stated answers only; the check question, which restates the answer, is pi_d's input,
never a candidate), and the summary's accuracy, truncation and design entries with it. Generations, training
summaries and reward curves are unchanged (the GRPO runs were rewarded by the old reading: see the chapter).
Run from the repository root: ``python book/results/laptop/design/recalibrate.py``."""

import json
from pathlib import Path

from dsh.core.files import read_jsonl
from dsh.experiment.run.pipeline import design_checks
from dsh.measure.stage import calibrate_stage

ROOT = Path("book/results/laptop")
summary = json.loads((ROOT / "summary.json").read_text())
calib = {}
for name in summary["stages"]:
    calib[name] = calibrate_stage(read_jsonl(ROOT / "generations" / f"{name}.jsonl.gz"), seed=summary["seed"],
                                  task="laptop_task")
    (ROOT / "calibration" / f"{name}.json").write_text(json.dumps(calib[name], indent=1))
summary["truncation"] = {n: {**summary["truncation"][n], "eval": c["truncated"]} for n, c in calib.items()}
summary["accuracy"] = {n: {lv: {k: s[k] for k in ("n", "observed_accuracy", "ci_low", "ci_high")}
                           for lv, s in c["all"]["by_level"].items()} for n, c in calib.items()}
summary["design"] = design_checks({"summary": summary, "calibration": calib})
summary["recalibrated"] = {"by": "book/results/laptop/design/recalibrate.py", "date": "2026-11-24",
                           "what": "calibration read with the laptop task's candidates (the attempts' stated answers "
                                   "only; a check's copy of the answer is no candidate), issue 30"}
(ROOT / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
print(f"recalibrated {len(calib)} stages")
