"""The offline bundle that :mod:`dsh.experiment.run.gpu_small` reads on a GPU host without network, made on a machine
with the project's environment:

    make gpu-bundle BUNDLE=.gpu                      # or:
    python -m dsh.experiment.run.gpu_bundle --out .gpu

It holds the embedded model's GGUF file split into parts of at most ``--part-mb`` MB (``a/part-aa``,
``b/part-ab``, ...: one folder a part, so that each can travel in a transfer of its own; ``gpu_small`` joins them in
name order), ``sha`` (the whole file's SHA-256, checked after joining) and, unless ``--no-wheels``, ``whl/``: the
pure-Python wheels of trl, datasets, gguf and transformers at this project's pinned versions (and those of dill and
multiprocess that datasets needs), downloaded from the package index for the host's Python (``--python``).
"""

from __future__ import annotations

import argparse
import hashlib
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from ...core import validate as v
from ...core.files import atomic_write
from ...llm.models import embedded_gguf_path

REPO = Path(__file__).resolve().parent.parent.parent
WHEELS = ("trl", "datasets", "gguf", "transformers")     # pinned in requirements.txt
WHEEL_DEPS = ("dill", "multiprocess")                    # datasets' pure-Python dependencies, as installed here


def pinned(names, requirements: Path = REPO / "requirements.txt") -> list[str]:
    """``name==version`` for each of ``names``: from ``requirements`` where pinned there, else the installed one."""
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", requirements.read_text(), re.M)) if requirements.is_file() \
        else {}
    out = []
    for n in names:
        version = pins.get(n)
        if version is None:
            try:
                version = metadata.version(n)
            except metadata.PackageNotFoundError:
                raise ValueError(f"{n} is neither pinned in {requirements} nor installed here") from None
        out.append(f"{n}=={version}")
    return out


def make_bundle(out, part_mb: int = 49, wheels: bool = True, python: str = "3.12") -> dict:
    """Write the bundle into ``out`` (a new or empty folder) and return what it holds (parts, sha, wheels)."""
    out = v.output_path("out", out, kind="folder")
    if out.is_dir() and any(out.iterdir()):
        raise ValueError(f"out must be a new or empty folder; {out} holds files")
    v.at_most("part_mb", part_mb, 1024, "MB a part")
    gguf = embedded_gguf_path()
    data, parts, h = gguf.read_bytes(), [], hashlib.sha256()
    h.update(data)
    size = part_mb * 2 ** 20
    if len(data) > 26 * size:                  # a folder a part, a/ ... z/
        raise ValueError(f"part_mb must be at least {-(-len(data) // (26 * 2 ** 20))} for {gguf.name} "
                         f"({len(data) / 2 ** 20:.0f} MB in at most 26 parts); got {part_mb}")
    for i in range(0, len(data), size):
        k = i // size
        name = "part-" + chr(97 + k // 26) + chr(97 + k % 26)
        path = out / chr(97 + k) / name
        atomic_write(path, lambda tmp, chunk=data[i:i + size]: Path(tmp).write_bytes(chunk))
        parts.append(path.relative_to(out).as_posix())
    atomic_write(out / "sha", lambda tmp: Path(tmp).write_text(f"{h.hexdigest()}  {gguf.name}\n"))
    got = {"parts": parts, "sha256": h.hexdigest(), "wheels": []}
    if wheels:
        specs = pinned(WHEELS) + pinned(WHEEL_DEPS)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", python, "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
                        "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64",
                        "-d", str(out / "whl"), *specs], check=True)
        got["wheels"] = sorted(p.name for p in (out / "whl").glob("*.whl"))
    return got


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dsh.experiment.run.gpu_bundle", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the bundle folder to write (new or empty)")
    ap.add_argument("--part-mb", type=int, default=49, help="largest part of the model file in MB (default 49)")
    ap.add_argument("--python", default="3.12", help="the GPU host's Python version for the wheels (default 3.12)")
    ap.add_argument("--no-wheels", action="store_true", help="the model only (the host has the packages)")
    args = ap.parse_args(argv)
    try:
        got = make_bundle(args.out, args.part_mb, not args.no_wheels, args.python)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{args.out}: {len(got['parts'])} parts ({', '.join(got['parts'])}), sha256 {got['sha256'][:16]}..., "
          f"{len(got['wheels'])} wheels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
