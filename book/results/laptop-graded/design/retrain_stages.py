"""Train committed stages again at this checkout, in order, each from its committed configuration (a stage's
starting model from the runs folder given, where an earlier argument trained it), and compare each one's final
weights' digest with the committed record's (the results folder's summary.json). Run from the repository root:

    python book/results/laptop-graded/design/retrain_stages.py <results folder> <runs folder> <stage> ...

Writes <runs folder>/result.json. A stage whose starting model is another stage's must come after that stage on the
command line, or find it in the runs folder.
"""
import json, sys, time, subprocess
from pathlib import Path
from dsh.training.train import train
from dsh.training.train_config import TrainConfig
import dsh
if len(sys.argv) < 4:
    raise SystemExit("usage: retrain_stages.py <results folder> <runs folder> <stage> ...")
results, runs = Path(sys.argv[1]), Path(sys.argv[2])
if not (results / "summary.json").is_file():
    raise SystemExit(f"results folder must hold a pipeline's summary.json; {results} does not")
s = json.loads((results / "summary.json").read_text())
for i, st in enumerate(sys.argv[3:]):   # every stage and its starting model checked before any training
    if st not in s["configs"]:
        raise SystemExit(f"stage must be one of {', '.join(s['configs'])}; got {st!r}")
    start = s["configs"][st]["model"]
    if start.startswith("<runs_dir>/") and not (runs / start.split("/", 1)[1]).is_dir() \
            and start.split("/", 1)[1] not in sys.argv[3:3 + i]:
        raise SystemExit(f"{st} starts from {start}: train {start.split('/', 1)[1]} first (name it before {st}) "
                         f"or put it in {runs}")
runs.mkdir(parents=True, exist_ok=True)
res = {"date": time.strftime("%Y-%m-%d %H:%M"), "env": {k: v for k, v in __import__("os").environ.items() if k in ("ATEN_CPU_CAPABILITY", "NPY_DISABLE_CPU_FEATURES", "OPENBLAS_CORETYPE", "DSH_KERNELS_MARCH")}, "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()}


def studied(stage):
    """A stage's weights digest as the results folder's attribution studies record it (as the model or the
    reference), for summaries that do not record it."""
    import gzip
    for f in sorted((results / "attribution").glob("*.json.gz")):
        d = json.loads(gzip.open(f).read())
        for who, digest in ((d["model"], d["weights"]), (d["reference"], d["reference_weights"])):
            if who == f"<runs_dir>/{stage}":
                return "sha256:" + digest
    return None


for st in sys.argv[3:]:
    cfg = dict(s["configs"][st])
    cfg["model"] = cfg["model"].replace("<runs_dir>", str(runs)).replace("<dsh>", str(Path(dsh.__file__).parent))
    cfg["output_dir"] = cfg["output_dir"].replace("<runs_dir>", str(runs))
    t = time.time(); out = train(TrainConfig(**cfg))
    res[st] = {"seconds": round(time.time() - t, 1), "got": out.get("final_weights"),
               "committed": s["training"][st].get("final_weights") or studied(st)}
    res[st]["identical"] = res[st]["got"] == res[st]["committed"]
    print(st, res[st], flush=True)
Path(runs / "result.json").write_text(json.dumps(res, indent=1))
