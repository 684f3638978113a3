"""The laptop-wide studies at temperature 1, kept in short (issue 31), written to wide_t1_studies.json beside this
file: the pipeline's first laptop-wide studies sampled at temperature 1 (committed in book/results/laptop-wide/attribution
at commit 963112a); the study now samples at the temperature wide_study_temperature.py chose, and these studies'
per-trajectory records (15 MB) left the repository. Kept per study: its settings, rounds, samples, trajectories with
a decision and with a reward signal, the per-level median attempt lengths and their span, and every fit. Run from the
repository root with a folder holding those studies (e.g. ``git archive 963112a book/results/laptop-wide/attribution``
unpacked):

    python book/results/laptop/design/wide_t1_studies.py <folder with the studies' .json files>
"""

import json
import sys
from pathlib import Path

from dsh.experiment import report

folder = Path(sys.argv[1])
studies = {f.stem: json.loads(f.read_text()) for f in sorted(folder.glob("*.json"))}
lengths = report.attempt_lengths(studies)
out = {}
for name, s in studies.items():
    row = lengths.loc[name]
    out[name] = {"settings": s["settings"], "commit": s["commit"], "weights": s["weights"],
                 "reference_weights": s["reference_weights"], "rounds": s["rounds"], "samples": s["samples"],
                 "trajectories": len(s["trajectories"]),
                 "signal": sum(t["advantage"] != 0 for t in s["trajectories"]),
                 "medians": {k: float(v) for k, v in row.items() if not k.startswith("span") and v == v},
                 "span": float(row["span of medians"]), "fits": s["fits"]}
Path(__file__).with_suffix(".json").write_text(json.dumps(out, indent=1) + "\n")
print({n: round(x["span"], 2) for n, x in out.items()})
