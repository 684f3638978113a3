"""The whole small-scale experiment as one command on a bare GPU host without network.

    make gpu-small BUNDLE=.gpu                       # or:
    python3 -m dsh.experiment.run.gpu_small --bundle .gpu --results book/results/gpu-small-h100

``BUNDLE`` is a folder holding the embedded model and the wheels the host lacks, as the project's bundle
script lays them out: the GGUF file itself (``*.gguf``) or its parts (``a/part-*``, ``b/part-*``, joined in
name order) with an optional ``sha`` file (``<sha256>  <path>``), and ``whl/*.whl`` (trl, datasets, gguf,
transformers, ...). The command

1. joins and checks the model file, installs the wheels into ``WORK/site`` when ``trl``, ``datasets`` or
   ``gguf`` cannot be imported (``--no-index --no-deps``: nothing is downloaded);
2. runs ``python -m dsh pipeline --preset PRESET`` (every stage, evaluation, calibration) in a child
   process with ``DSH_EMBEDDED_GGUF`` (and ``DSH_CACHE`` unless set) pointing into ``WORK``, which prints each stage's
   time as it ends, under a wall-clock limit (``--time-limit``; the child is stopped, not the results);
3. writes ``provenance.json`` into the results folder (command wall time, set-up time, GPU, versions,
   commit) and fails when the folder exceeds ``--max-mb`` (16 MB).

Run again on the same machine it resumes: finished training runs under ``WORK/runs`` are reused, an
interrupted one continues from its last checkpoint, and evaluation keeps the responses already written.
Before the child starts only the standard library, numpy and dsh's own light modules are imported (never torch,
transformers, trl or datasets, which the bundle's wheels may provide; a test checks).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from ...core import validate as v
from .presets import CI, GPU_SMALL, PRESETS

REPO = Path(__file__).resolve().parent.parent.parent
NEEDED = ("trl", "datasets", "gguf")
ONE_CALL = tuple(p.name for p in PRESETS.values() if p.one_call)    # presets sized for one GPU call


def find_model(bundle: Path, work: Path) -> Path:
    """The GGUF file of ``bundle`` (joined from its parts into ``work`` when split), checked against
    ``sha`` when the bundle has one."""
    whole = sorted(bundle.glob("*.gguf"))
    if whole:
        path = whole[0]
    else:
        parts = sorted(bundle.glob("part-*")) + sorted(bundle.glob("*/part-*"), key=lambda p: p.name)
        if not parts:
            raise ValueError(f"bundle must hold the model as *.gguf or as part-* files; none in {bundle}")
        path = work / "model.gguf"
        if not path.is_file() or path.stat().st_size != sum(p.stat().st_size for p in parts):
            tmp = path.with_suffix(".tmp")
            with open(tmp, "wb") as out:
                for p in parts:
                    with open(p, "rb") as f:
                        shutil.copyfileobj(f, out)
            os.replace(tmp, path)
    sha = [p for p in (bundle / "sha", *bundle.glob("*/sha")) if p.is_file()]
    if sha:
        want = sha[0].read_text().split()[0]
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        if h.hexdigest() != want:
            raise ValueError(f"bundle model {path} does not match its sha256 in {sha[0]}")
    return path


def _importable(python: str, env: dict) -> list[str]:
    code = ("import importlib.util as u, sys; "
            f"print(','.join(m for m in {NEEDED!r} if u.find_spec(m) is None))")
    out = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.strip()
    return [m for m in out.split(",") if m]


def setup_env(bundle: Path, work: Path, python: str = sys.executable) -> tuple[dict, dict]:
    """The environment for the pipeline child: wheels installed when needed, the model located."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(REPO), env.get("PYTHONPATH", "")) if x)
    info = {"installed_wheels": []}
    missing = _importable(python, env)
    if missing:
        wheels = sorted((bundle / "whl").glob("*.whl"))
        if not wheels:
            raise ValueError(f"bundle must hold wheels under whl/ for {', '.join(missing)}; none in {bundle / 'whl'}")
        site = work / "site"
        if not (site / ".complete").is_file():
            shutil.rmtree(site, ignore_errors=True)
            subprocess.run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(site),
                            *map(str, wheels)], check=True)
            (site / ".complete").write_text("\n".join(w.name for w in wheels))
        env["PYTHONPATH"] = os.pathsep.join((str(site), env["PYTHONPATH"]))
        info["installed_wheels"] = [w.name for w in wheels]
        still = _importable(python, env)
        if still:
            raise ValueError(f"bundle wheels do not provide {', '.join(still)}")
    env["DSH_EMBEDDED_GGUF"] = str(find_model(bundle, work))
    env.setdefault("DSH_CACHE", str(work / "cache"))
    return env, info


def _gpu() -> str | None:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def folder_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m dsh.experiment.run.gpu_small", description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", required=True, help="folder with the model (*.gguf or part-*) and whl/")
    ap.add_argument("--results", default=f"book/results/{GPU_SMALL.name}-h100", help="results folder (committed)")
    ap.add_argument("--work", default=os.environ.get("DSH_WORK", "/tmp/dsh-gpu-small"),
                    help="weights, caches and installed wheels (kept for resuming)")
    ap.add_argument("--preset", default=GPU_SMALL.name, help=f"one of {', '.join(ONE_CALL)}: {GPU_SMALL.name}, or "
                    f"{CI.name} to try the command on a CPU")
    ap.add_argument("--time-limit", type=float, default=560.0, help="seconds the pipeline may run (default 560)")
    ap.add_argument("--max-mb", type=float, default=16.0, help="largest allowed results folder in MB (default 16)")
    ap.add_argument("--pipeline-arg", action="append", default=[],
                    help="extra argument for dsh pipeline (repeatable), e.g. --pipeline-arg=--set=max_steps=1")
    args = ap.parse_args(argv)
    t0 = time.time()
    try:
        v.choice("preset", args.preset, ONE_CALL)
        if args.time_limit <= 0 or args.max_mb <= 0:
            raise ValueError("time_limit and max_mb must be positive numbers")
        bundle, work, results = (Path(x).resolve() for x in (args.bundle, args.work, args.results))
        if not bundle.is_dir():
            raise ValueError(f"bundle must be a folder; {bundle} is not one")
        if results.resolve() == work.resolve() or work.resolve() in results.resolve().parents:
            raise ValueError("results must lie outside work (work holds weights and is not committed)")
        work.mkdir(parents=True, exist_ok=True)
        env, info = setup_env(bundle, work)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    setup_s = time.time() - t0
    print(f"[gpu-small] set-up {setup_s:.1f} s (wheels installed: {len(info['installed_wheels'])})", flush=True)
    cmd = [sys.executable, "-m", "dsh", "pipeline", "--preset", args.preset, "--results-dir", str(results),
           "--runs-dir", str(work / "runs"), *args.pipeline_arg]
    print("[gpu-small] " + " ".join(cmd), flush=True)
    child = subprocess.Popen(cmd, env=env, cwd=REPO)
    try:
        rc = child.wait(timeout=max(1.0, args.time_limit - setup_s))
    except subprocess.TimeoutExpired:
        child.terminate()
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
        print(f"[gpu-small] stopped at the time limit ({args.time_limit:.0f} s); run the same command again to "
              f"resume", flush=True)
        return 124
    wall = time.time() - t0
    if rc != 0:
        print(f"[gpu-small] dsh pipeline failed (exit {rc}) after {wall:.0f} s", flush=True)
        return rc
    summary = json.loads((results / "summary.json").read_text())
    prov = {"command": "python3 -m dsh.experiment.run.gpu_small " + " ".join(argv if argv is not None else sys.argv[1:]),
            "preset": args.preset, "command_wall_s": round(wall, 1), "setup_s": round(setup_s, 1),
            "pipeline_wall_s": summary["wall_s"], "timings_s": summary["timings_s"], "gpu": _gpu(),
            "hardware": summary["hardware"], "commit": summary["commit"], "wheels": info["installed_wheels"],
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    (results / "provenance.json").write_text(json.dumps(prov, indent=1))
    size = folder_mb(results)
    print(f"[gpu-small] done: {wall:.0f} s wall (set-up {setup_s:.0f} s); {results} holds {size:.2f} MB", flush=True)
    for k, x in summary["timings_s"].items():
        print(f"[gpu-small]   {k:28s} {x:8.1f} s")
    if size > args.max_mb:
        print(f"error: {results} holds {size:.1f} MB, more than --max-mb {args.max_mb}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
