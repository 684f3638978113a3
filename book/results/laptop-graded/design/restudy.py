"""The nine committed attribution studies formed again by the packed gradient route, each set against its committed
record. Run from the repository root with the project's venv, nothing else running, after round5.py (it needs
runs/graded-r5's models):

    python book/results/laptop-graded/design/restudy.py run

The committed studies formed their gradients one trajectory at a time; the study's code now packs trajectories
(``attribution_study.GRADIENTS``; the same float32 arithmetic in another order, design/attribution_routes.py). Each
study is run again with its committed record's model, reference and settings (the models checked against the
record's weight digests first) into runs/restudy/ (a study already there is kept: the script resumes), then set
against the committed record (the same trajectories; the gradient norms' relative differences; every fit's count,
slope and verdict: attribution_routes.compare). When all nine are done it writes restudy.json beside this file (per
study: the committed and the new wall time, load, the comparison; the machine, commit and date) and puts the new
records in place of the committed ones, in attribution/."""
import gzip
import json
import os
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ATTRIBUTION = HERE.parent / "attribution"
RUNS = Path("runs/graded-r5/runs")
SCRATCH = Path("runs/restudy")


def settings_of(record: dict):
    from dsh.experiment.run import attribution_study as st
    return st.StudySettings(**{k: tuple(x) if isinstance(x, list) else x for k, x in record["settings"].items()})


def run() -> int:
    from attribution_routes import compare, where  # the design script beside this one

    from dsh.core.provenance import git_commit, hardware
    from dsh.experiment.run import attribution_study as st
    from dsh.llm.models import resolve_model, weights_digest

    SCRATCH.mkdir(parents=True, exist_ok=True)
    names = sorted(p.name[:-len(".json.gz")] for p in ATTRIBUTION.glob("*.json.gz"))
    committed = {n: json.load(gzip.open(ATTRIBUTION / f"{n}.json.gz")) for n in names}
    if all(st.gradients_of(r) == st.GRADIENTS for r in committed.values()):
        print("every committed study is formed by the packed route already; restudy.json holds the comparison")
        return 0
    rows = []
    for n in names:
        old, out = committed[n], SCRATCH / f"{n}.json.gz"
        model, ref = where(old["model"]), where(old["reference"])
        if (weights_digest(resolve_model(model)), weights_digest(resolve_model(ref))) != \
                (old["weights"], old["reference_weights"]):
            raise SystemExit(f"{n}: the models under {RUNS} are not the committed study's (weight digests differ)")
        load = os.getloadavg()[0]
        if out.is_file():
            new = json.load(gzip.open(out))
            print(f"{n}: kept from {out}", flush=True)
        else:
            t0 = time.time()
            new = st.run_study(model, ref, out, settings_of(old), roots={RUNS: "<runs_dir>"}, bars=True)
            print(f"{n}: {len(new['trajectories'])} trajectories in {time.time() - t0:.0f} s "
                  f"(committed {old['wall_s']:.0f} s)", flush=True)
        rows.append({"study": n, "committed_wall_s": old["wall_s"], "committed_commit": old.get("commit"),
                     "committed_gradients": st.gradients_of(old), "wall_s": new["wall_s"],
                     "sample_s": new["sample_s"], "rounds": [old["rounds"], new["rounds"]],
                     "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2),
                     "against_committed": compare(old, new)})
    out = {"studies": rows, "committed_s": round(sum(r["committed_wall_s"] for r in rows), 1),
           "packed_s": round(sum(r["wall_s"] for r in rows), 1), "commit": git_commit(), "hardware": hardware(),
           "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    (HERE / "restudy.json").write_text(json.dumps(out, indent=1) + "\n")
    for n in names:
        shutil.copyfile(SCRATCH / f"{n}.json.gz", ATTRIBUTION / f"{n}.json.gz")
    print(f"nine studies: {out['packed_s'] / 60:.1f} min by the packed route, {out['committed_s'] / 60:.1f} min as "
          f"committed; records put in place under {ATTRIBUTION}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] != ["run"]:
        raise SystemExit("usage: python book/results/laptop-graded/design/restudy.py run")
    sys.exit(run())
