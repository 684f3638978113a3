"""The whole laptop-graded pipeline on two workers of one thread each, into scratch folders, timed whole and set
against the committed results: a reproduction, not a new round (one thread rounds as two do since the engine's
products, and those of the training passes' LM head, were split at the row counts where MKL's depend on the
threads; chapter 07). Run from the repository root
with the project's venv, nothing else running (~1.5-1.7 h):

    python book/results/laptop-graded/design/reproduce_pipeline.py

It runs ``python -m dsh pipeline --preset laptop-graded --workers 2 --results-dir runs/reproduce/results --runs-dir
runs/reproduce/runs`` (a second call after a kill resumes it; the record then says the run came in pieces), then
compares with ``book/results/laptop-graded``: every stage's final weights; every evaluation job's key and files
(JSON records without their wall times, dates and commits; generations by their decompressed records); every
attribution study's trajectories (the same prompts, rewards, lengths, tokens) and every fit's count and verdict (the
committed studies were formed before the Gram matrices were taken per weighting, so their norms and slopes move in the
sixth digit; each study's comparison is recorded). Writes reproduce_pipeline.json beside this file: the command's
wall time, the summary's ``wall_s``, the schedule, the load along the run, each difference found, and whether every
artifact matched."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from dsh.core.files import read_json, read_jsonl

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))                  # attribution_routes, beside this file
COMMITTED = HERE.parent
OUT = Path("runs/reproduce")
VOLATILE = {"wall_s", "sample_s", "date", "commit", "hardware", "provenance", "tokens_per_s", "generation_s",
            "scoring_s", "update_s", "resumed_from"}


def _strip(x):
    if isinstance(x, dict):
        return {k: _strip(v) for k, v in x.items() if k not in VOLATILE}
    if isinstance(x, list):
        return [_strip(v) for v in x]
    return x


def compare(mine: Path, theirs: Path) -> tuple[list[str], dict]:
    """Every difference between the new results folder and the committed one, one line each (empty: none), and each
    study's :func:`study_compare` (by file name)."""
    out, studies = [], {}
    a, b = read_json(mine / "summary.json"), read_json(theirs / "summary.json")
    for stage, t in b["training"].items():
        if (a["training"].get(stage) or {}).get("final_weights") != t["final_weights"]:
            out.append(f"training {stage}: final weights differ")
    for job in sorted((theirs / "jobs").glob("*.json")):
        new = mine / "jobs" / job.name
        key = lambda r: {k: v for k, v in r.items() if k not in ("commit", "files")}   # noqa: E731
        if not new.is_file() or key(read_json(new)) != key(read_json(job)):
            out.append(f"job {job.stem}: key differs or missing")
            continue
        for rel in read_json(job).get("files", {}):
            x, y = mine / rel, theirs / rel
            same = (read_jsonl(x) == read_jsonl(y)) if rel.endswith(".jsonl.gz") else (_strip(read_json(x)) == _strip(read_json(y)))
            if not same:
                out.append(f"job {job.stem}: {rel} differs")
    for study in sorted((theirs / "attribution").glob("*.json.gz")):
        new = mine / "attribution" / study.name
        if not new.is_file():
            out.append(f"study {study.name}: missing")
            continue
        c = studies[study.name] = study_compare(read_json(study), read_json(new))
        if c["same_trajectories"] != c["trajectories"][0] or c["trajectories"][0] != c["trajectories"][1]:
            out.append(f"study {study.name}: trajectories differ ({c['same_trajectories']} of {c['trajectories']} the same)")
        moved = [k for k, f in c["fits"].items() if f["n"][0] != f["n"][1] or f["verdict"][0] != f["verdict"][1]]
        if moved:
            out.append(f"study {study.name}: fits {', '.join(moved)} changed count or verdict")
    return out, studies


def study_compare(committed: dict, new: dict) -> dict:
    """attribution_routes.compare: the same trajectories (prompt, reward, length, tokens), the gradient norms'
    relative differences, every fit's count, slope and verdict. Exact equality is not asked: the committed studies
    were formed before the Gram matrices were taken per weighting (924cf01; norms and cosines move by ~1e-6), and a
    group's cosine is a float64 sum over the threads."""
    from attribution_routes import compare as routes_compare

    return routes_compare(committed, new)


def main() -> int:
    from dsh.core.provenance import git_commit, hardware

    load, t0, commit = os.getloadavg()[0], time.time(), git_commit()    # the code the run loads
    resumed = (OUT / "results" / "summary.json").exists() or (OUT / "runs").exists()
    subprocess.run([sys.executable, "-m", "dsh", "pipeline", "--preset", "laptop-graded", "--workers", "2",
                    "--results-dir", str(OUT / "results"), "--runs-dir", str(OUT / "runs")], check=True)
    wall = time.time() - t0
    s = read_json(OUT / "results" / "summary.json")
    diffs, studies = compare(OUT / "results", COMMITTED)
    out = {"command_wall_s": round(wall, 1), "summary_wall_s": s["wall_s"], "in_pieces": resumed,
           "load_before": round(load, 2), "load_average_1min": s.get("load_average_1min"),
           "workers": s.get("workers"), "schedule": s.get("schedule"), "differences": diffs, "studies": studies,
           "reproduced": not diffs, "commit": commit, "hardware": hardware(),
           "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    (HERE / "reproduce_pipeline.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out[k] for k in ("command_wall_s", "summary_wall_s", "in_pieces", "reproduced")}))
    for d in diffs[:40]:
        print(d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
