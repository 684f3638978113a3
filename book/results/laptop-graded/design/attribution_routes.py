"""The attribution study's two gradient routes timed against each other on one committed study, and the packed
route's record set against the committed one. Run from the repository root with the project's venv, nothing else
running, after round5.py (it needs runs/graded-r5's models):

    python book/results/laptop-graded/design/attribution_routes.py

It runs the study of ``STUDY`` (the committed record's model, reference and settings) three times, alternating the
routes (packed, one trajectory at a time, packed: the host's speed drifts, so each route is timed beside the other),
and writes attribution_routes.json beside this file: each run's wall time, sampling time and load, the machine, and
how the first packed record compares with the committed one (same trajectories; the largest relative difference of
a gradient norm; every fit's count, slope and verdict)."""
import gzip
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from dsh.core.provenance import git_commit, hardware
from dsh.experiment.bench.attribution import norm_differences
from dsh.experiment.run import attribution_study as st

HERE = Path(__file__).resolve().parent
STUDY = "rl_beta0.1-s0"
RUNS = Path("runs/graded-r5/runs")
ROUTES = ("packed", "per trajectory", "packed")


def where(recorded: str) -> str:
    """A study record's model path (``<runs_dir>/<stage>`` or a shipped model's name) on this machine."""
    return str(RUNS / recorded.split("/", 1)[1]) if recorded.startswith("<runs_dir>/") else recorded


def compare(committed: dict, new: dict) -> dict:
    """How ``new`` (a study record) stands against ``committed`` of the same model, reference and settings."""
    a, b = committed["trajectories"], new["trajectories"]
    same = sum((x["prompt"], x["reward"], x["L"], x["tokens"]) == (y["prompt"], y["reward"], y["L"], y["tokens"])
               for x, y in zip(a, b))
    rel = norm_differences(a, b)
    fits = {k: {"n": [f.get("n"), new["fits"][k].get("n")], "slope": [f.get("slope"), new["fits"][k].get("slope")],
                "verdict": [f.get("verdict"), new["fits"][k].get("verdict")]} for k, f in committed["fits"].items()}
    return {"trajectories": [len(a), len(b)], "same_trajectories": same,
            "norm_rel_diff": {"median": rel["median"], "max": float(rel["largest"])}, "fits": fits}


def main() -> int:
    committed = json.load(gzip.open(HERE.parent / "attribution" / f"{STUDY}.json.gz"))
    settings = st.StudySettings(**{k: tuple(x) if isinstance(x, list) else x for k, x in committed["settings"].items()})
    model, reference = where(committed["model"]), where(committed["reference"])
    runs, first = [], None
    with tempfile.TemporaryDirectory() as tmp:
        for i, route in enumerate(ROUTES):
            load, t0 = os.getloadavg()[0], time.time()
            rec = st.run_study(model, reference, Path(tmp) / f"{i}.json.gz", settings, packed=route == "packed")
            runs.append({"route": route, "wall_s": round(time.time() - t0, 1), "sample_s": rec["sample_s"],
                         "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2),
                         "trajectories": len(rec["trajectories"])})
            print(runs[-1], flush=True)
            first = first or (rec if route == "packed" else None)
    out = {"study": STUDY, "committed_wall_s": committed["wall_s"], "committed_commit": committed.get("commit"),
           "runs": runs, "against_committed": compare(committed, first), "commit": git_commit(),
           "hardware": hardware(), "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    (HERE / "attribution_routes.json").write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
