"""Issue 30, item 4 (first measurement): does GRPO from the chosen reflection SFT model have a signal? Run from the
project root:

    .venv/bin/python book/results/laptop/design/grpo_probe.py NAME MODEL LEVELS [key=value ...]

runs the laptop preset's GRPO from MODEL for one rollout round (256 completions, 8 optimizer steps) on prompts of
LEVELS (comma-separated, e.g. 1x2,1x3,1x4,1x5,2x1,3x1,4x1,5x1) and appends to logs/grpo_probe_NAME.jsonl the
per-step mean reward, the share of groups whose 8 rewards all agree (TRL's frac_reward_zero_std), the clipped share
and the wall time.
"""

import json
import sys
import time
from pathlib import Path

from dsh.experiment.run import presets
from dsh.training.train import train

LOGS = Path(__file__).parent / "logs"


def main(name, model, levels, *kv):
    overrides = {k: json.loads(x) for k, x in (item.split("=", 1) for item in kv)}
    run = Path(f"/tmp/p/grpo-{name}")
    cfg = presets.LAPTOP.train_config("grpo", model=model, output_dir=str(run), seed=0,
                                      train_levels=tuple(levels.split(",")), **{"max_steps": 8, **overrides})
    t0 = time.time()
    summary = train(cfg)
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    keys = ("reward", "frac_reward_zero_std", "completions/clipped_ratio", "completions/mean_length", "kl",
            "time/round_s")
    row = {"name": name, "model": model, "levels": levels, "overrides": overrides, "wall_s": round(time.time() - t0, 1),
           "rollouts": summary["rollouts"], "steps": [{k: s.get(k) for k in ("step",) + keys} for s in steps
                                                      if "reward" in s]}
    if (run / "validation.jsonl").is_file():     # validation_every > 0: p_s, p_dC, p_dW along the run
        row["validation"] = [json.loads(x) for x in (run / "validation.jsonl").read_text().splitlines() if x.strip()]
    with (LOGS / f"grpo_probe_{name}.jsonl").open("a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:])
