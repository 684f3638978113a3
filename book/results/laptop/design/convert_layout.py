"""Historical, run once (issue 29, 2026-11-24): rewrite the laptop run of 2026-11-23 (written by the retired
``run_laptop``: ``<job>.json`` per job) into the results layout of ``dsh pipeline`` (``calibration/<stage>.json``,
``summary.json`` with the plan, training summaries and GRPO reward curves). Generations are kept as they are; each
stage's calibration is recomputed from them by ``calibrate_stage(..., task="laptop_task")``: the calibration
numbers equal the committed ones (checked below), the faithfulness block is now the laptop task's own reading
(the old one read the paper's check format and found no check: ``has_check = 0``), and ``unfitted_mixture`` is added.
Run from the repository root: ``python book/results/laptop/design/convert_layout.py``."""

import json
import subprocess
from pathlib import Path

from dsh.core.files import read_jsonl
from dsh.experiment.run.pipeline import design_checks
from dsh.experiment.run.presets import stage_label
from dsh.measure.stage import calibrate_stage

ROOT = Path("book/results/laptop")
KEYS = ("n", "p_s", "p_d_given_correct", "p_d_given_wrong", "observed_accuracy", "predicted_accuracy", "no_answer")


def pick(block):
    f = lambda s: {k: s.get(k) for k in KEYS}  # noqa: E731
    return {"overall": f(block["overall"]), "by_level": {lv: f(s) for lv, s in block["by_level"].items()}}


old = json.loads((ROOT / "summary.json").read_text())
jobs = {j["name"]: json.loads((ROOT / f"{j['name']}.json").read_text()) for j in old["jobs"]}
(ROOT / "calibration").mkdir(exist_ok=True)
calib, plan = {}, []
for j in old["jobs"]:
    name = j["name"]
    cal = calibrate_stage(read_jsonl(ROOT / "generations" / f"{name}.jsonl.gz"), seed=old["eval_seed"], task="laptop_task")
    for part in ("all", "drop_truncated"):
        assert pick(cal[part]) == pick(jobs[name]["calibration"][part]), (name, part)
    calib[name] = cal
    (ROOT / "calibration" / f"{name}.json").write_text(json.dumps(cal, indent=1))
    plan.append({"name": name, "kind": j["stage"], "method": j["method"], "seed": j["seed"] if j["method"] else None,
                 "init": j["init"] or ("base" if j["method"] else None), "overrides": j["overrides"]})
labels = {x["name"]: stage_label(x["kind"]) + ("" if x["seed"] is None else f", seed {x['seed']}") for x in plan}
summary = {
    "preset": "laptop", "task": "laptop_task", "model": old["base"], "stages": [x["name"] for x in plan], "plan": plan,
    "labels": labels, "eval": old["eval"], "seed": old["eval_seed"], "wall_s": old["wall_s"],
    "timings_s": old["timings_s"], "training": {n: j["training"] for n, j in jobs.items() if j.get("training")},
    "reward_curves": {n: j["reward_curve"] for n, j in jobs.items() if j.get("reward_curve")},
    "hardware": {**old["hardware"], "cpu": old["cpu"], "torch_threads": old["torch_threads"]},
    "load_average_1min": old["load_average_1min"],
    "truncation": {n: {"train": (jobs[n].get("training") or {}).get("truncation"), "eval": c["truncated"]}
                   for n, c in calib.items()},
    "accuracy": {n: {lv: {k: s[k] for k in ("n", "observed_accuracy", "ci_low", "ci_high")}
                     for lv, s in c["all"]["by_level"].items()} for n, c in calib.items()},
    "commit": old["commit"], "commit_at_start": old["commit_at_start"], "date": old["date"],
    "provenance_note": old["provenance_note"],
    "converted": {"by": "book/results/laptop/design/convert_layout.py", "date": "2026-11-24",
                  "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
                  + " with the issue-29 changes, committed with this file",
                  "what": "run_laptop's per-job files rewritten into the dsh pipeline layout; calibration recomputed "
                          "from the committed generations (numbers unchanged, faithfulness read by the laptop task)"},
}
summary["design"] = design_checks({"summary": summary, "calibration": calib})
(ROOT / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
for name in jobs:
    (ROOT / f"{name}.json").unlink()
print(f"converted {len(jobs)} stages")
