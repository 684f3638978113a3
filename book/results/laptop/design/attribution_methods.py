"""The attribution studies under the split's two rules (issue 31), written to attribution_methods.json beside this
file: method 1 (commit c02b641: a decision only where a verdict follows an answer; an attempt ran up to the next
``The answer is N.``, stray check text included) and method 2 (the studies committed now:
:data:`dsh.experiment.run.attribution_study.METHOD`; an unchecked answer that stops has the end of turn as pi_d's STOP,
an attempt that holds a verdict is left out, rounds of new questions until 200 trajectories carry a reward signal).
Both sets are read from git, per study: trajectories with a decision, those with a reward signal, and the slopes
with their intervals of the reward, the KL terms and the immediate KL against the decision. Run from the
repository root:

    python book/results/laptop/design/attribution_methods.py
"""

import json
import subprocess
import time
from pathlib import Path

from dsh.core.files import read_json

OLD = "c02b641"
TERMS = ("reward", "kl_reward", "kl_k3", "kl_immediate")
folder = "book/results/laptop/attribution"
names = sorted(p.name[:-len(".json.gz")] for p in Path(folder).glob("*.json.gz"))


def summary(study: dict) -> dict:
    fits = study["fits"]
    return {"trajectories": len(study["trajectories"]),
            "with_signal": sum(1 for t in study["trajectories"] if t["grad"].get("reward")),
            "samples": study.get("samples", len(study["trajectories"]) + study["kl_positions"]["skipped"]),
            **{t: {"slope": fits[f"{t} / decision"]["slope"], "ci": fits[f"{t} / decision"]["ci"],
                   "verdict": fits[f"{t} / decision"]["verdict"]} for t in TERMS if f"{t} / decision" in fits}}


rows = []
for n in names:
    old = json.loads(subprocess.run(["git", "show", f"{OLD}:{folder}/{n}.json"], capture_output=True, text=True,
                                    check=True).stdout)      # plain JSON at that commit
    new = read_json(f"{folder}/{n}.json.gz")
    rows.append({"study": n, "method 1": summary(old), "method 2": summary(new)})
out = Path(__file__).with_suffix(".json")
out.write_text(json.dumps({"rows": rows, "method_1_commit": OLD, "date": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=1))
print(f"wrote {out}")
