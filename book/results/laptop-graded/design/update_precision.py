"""A design measurement for the graded experiment's next round (RULE.md beside this file): GRPO's update with its
decoder layers' products in bfloat16 (``TrainConfig.update_precision``), measured on validation questions only,
against float32 in the same session and round 4's committed rl-s0. GRPO seed 0 from round 4's SFT (reflection) seed
0 with the laptop-graded preset (round 4's protocol) and ``update_precision="bfloat16"``, then the same with float32
(round 4's own configuration: its weights and curves should be the committed run's); nothing else changed. Run from
the repository root with the project's venv, nothing else running, with the round-4 runs folder (its
sft_reflection-s0 must be the committed model, by weights digest):

    python book/results/laptop-graded/design/update_precision.py [runs/graded-r4/runs]

Writes update_precision.json beside this file (the runs go to runs/graded-precision/<precision>/, not committed; a
run already there is reused, so the two can be run one after the other)."""
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent


def measured(run: Path, curve: list, val: list, summ: dict) -> dict:
    from round4 import without_eos  # the design script beside this one

    from dsh.measure.trend import fifths_contrast, proportion_rise

    t = fifths_contrast([r["reward"] for r in curve])
    z = fifths_contrast([r["frac_reward_zero_std"] for r in curve])
    right = [round(r["observed_accuracy"] * r["n"]) for r in (val[0], val[-1])]
    rise = proportion_rise(right[0], val[0]["n"], right[1], val[-1]["n"])
    return {"rounds": len(curve), "reward_first_fifth": t["first"], "reward_last_fifth": t["last"],
            "reward_rise": t["delta"], "reward_rise_ci": t["ci"], "mixed_first_fifth": 1 - z["first"],
            "validation_rise": rise["delta"], "validation_rise_ci": rise["ci"],
            "seconds": {k: summ.get(k) for k in ("wall_s", "generation_s", "scoring_s", "update_s")},
            **({"rounds_without_eos": without_eos(run)} if run else {}),
            "validation": [{k: r.get(k) for k in ("step", "observed_accuracy", "p_s", "p_d_given_correct",
                                                    "p_d_given_wrong", "truncated", "capped")} for r in val]}


def main(runs: Path):
    from dsh.core.provenance import git_commit, hardware
    from dsh.experiment.run import presets
    from dsh.experiment.run.steps import reward_curve
    from dsh.llm.models import model_digest
    from dsh.training.train import train

    start = runs / "sft_reflection-s0"
    committed = json.loads((RESULTS / "jobs" / "sft_reflection-s0.json").read_text())
    if model_digest(start / "final") != committed["model"]:
        raise SystemExit(f"{start} is not the committed SFT (reflection) seed 0 (weights digest)")
    out = {}
    for precision in ("bfloat16", "float32"):
        run = Path("runs/graded-precision") / precision / "rl-s0"
        t0 = time.time()
        if not (run / "final" / "model.safetensors").is_file():
            cfg = presets.LAPTOP_GRADED.train_config("grpo", model=str(start), output_dir=str(run), seed=0,
                                                     resume=run.is_dir(), update_precision=precision)
            train(cfg)
        val = [json.loads(x) for x in (run / "validation.jsonl").read_text().splitlines() if x.strip()]
        out[precision] = measured(run, reward_curve(run), val, json.loads((run / "summary.json").read_text()))
        out[precision].update(this_call_s=round(time.time() - t0), final_weights=model_digest(run / "final"),
                              load_average_1min=os.getloadavg()[0])
    summ = json.loads((RESULTS / "summary.json").read_text())
    old = measured(None, summ["reward_curves"]["rl-s0"], summ["validation_curves"]["rl-s0"],
                   summ["training"]["rl-s0"])
    old["final_weights"] = "sha256:" + summ["training"]["rl-s0"]["final_weights"].removeprefix("sha256:")
    out.update(round4_rl_s0=old, commit=git_commit(), date=time.strftime("%Y-%m-%d %H:%M:%S"), hardware=hardware())
    (HERE / "update_precision.json").write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(json.dumps({k: out[k] for k in ("bfloat16", "float32", "round4_rl_s0")}, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/graded-r4/runs"))
