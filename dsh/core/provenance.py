"""Where a result came from: the hardware, the library versions and the commit. Training summaries,
evaluation results, pipeline summaries, ``dsh bench`` and the gpu-small command all record :func:`provenance`."""

from __future__ import annotations

import functools
import os
import platform
import re
import subprocess
import time
from pathlib import Path


@functools.cache
def git_commit() -> str | None:
    """The commit of the code this process runs: the checkout's HEAD when the process first asks (modules are
    imported once, so a commit made while a long run goes on is not the code it runs; every record of one run then
    names the same commit), or ``$DSH_COMMIT`` where the tree is a copy without ``.git`` (a GPU host)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parent).stdout.strip()
    except Exception:
        out = ""
    return out or os.environ.get("DSH_COMMIT") or None


def cpuinfo_lines() -> list:
    """The lines of /proc/cpuinfo, read again at each call; [] where there is none (not Linux)."""
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:  # pragma: no cover - not Linux
        return []


def cpu_model() -> str | None:
    """The CPU's model name (from /proc/cpuinfo on Linux, else the platform's word for it)."""
    for line in cpuinfo_lines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or None


CPU_ID_FIELDS = {"vendor_id": "vendor", "cpu family": "family", "model": "model", "stepping": "stepping",
                 "CPU implementer": "implementer", "CPU architecture": "architecture", "CPU variant": "variant",
                 "CPU part": "part", "CPU revision": "revision"}


def cpu_id() -> dict:
    """The first CPU's identity from /proc/cpuinfo (x86: vendor, family, model, stepping; ARM: implementer,
    architecture, variant, part, revision), numbers as ints: what tells two CPUs apart where a virtual machine's model
    name does not ("AMD EPYC" is an AMD Zen 4 at family 25, model 17, a Zen 5 at family 26); {} where there is none."""
    out: dict = {}
    for line in cpuinfo_lines():
        if not line.strip():
            if out:
                break                             # the first processor's block only
            continue
        key, _, value = (part.strip() for part in line.partition(":"))
        if key in CPU_ID_FIELDS:
            out[CPU_ID_FIELDS[key]] = (int(value, 16) if re.fullmatch(r"0x[0-9a-fA-F]+", value)
                                       else int(value) if value.isdigit() else value)
    return out


# the vector-instruction flags that decide which code paths MKL, oneDNN and the C kernels take (and so the float
# rounding of a CPU run: the same code and seed on an AVX2 and an AVX-512 host round differently)
VECTOR_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                "amx_tile", "asimd", "sve")


def cpu_flags() -> list:
    """The CPU's :data:`VECTOR_FLAGS` (from /proc/cpuinfo's flags or Features line; [] where there is none)."""
    for line in cpuinfo_lines():
        if line.startswith(("flags", "Features")):
            have = set(line.split(":", 1)[1].split())
            return [f for f in VECTOR_FLAGS if f in have]
    return []


def cpu_feature_line() -> str:
    """The CPU's whole flags (or Features) line of /proc/cpuinfo, as it is; the platform's word for the processor where
    there is none. A key for what is built or measured for this CPU (:mod:`dsh.llm.kernels`, :mod:`dsh.llm.decisions`)."""
    for line in cpuinfo_lines():
        if line.startswith(("flags", "Features")):
            return line
    return platform.processor() or platform.machine()


def numpy_simd() -> list | None:
    """The SIMD targets NumPy dispatches to in this process (e.g. ``["X86_V3", "X86_V4", "AVX512_ICL"]``: those its
    build has and this CPU runs, less any ``NPY_DISABLE_CPU_FEATURES`` turns off); None where NumPy does not say."""
    try:
        from numpy._core import _multiarray_umath as m
    except ImportError:  # pragma: no cover - NumPy 1.x
        return None
    return [t for t in m.__cpu_dispatch__ if m.__cpu_features__.get(t)]


def openblas_cores() -> dict | None:
    """The kernel set of each OpenBLAS library loaded in this process (NumPy's, SciPy's): ``{library file: core}``,
    e.g. ``SkylakeX`` on an AVX-512 CPU, ``Haswell`` on an AVX2 one or where ``OPENBLAS_CORETYPE=Haswell`` asks for
    it; None where the process's libraries cannot be listed (not Linux)."""
    import ctypes

    try:
        paths = sorted({line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()
                        if "openblas" in line.lower() and line.split()[-1].startswith("/")})
    except OSError:  # pragma: no cover - not Linux
        return None
    out = {}
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:  # pragma: no cover
            continue
        for name in ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename", "openblas_get_corename64_",
                     "openblas_get_corename"):
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.restype = ctypes.c_char_p
                out[Path(path).name] = fn().decode()
                break
    return out


def hardware() -> dict:
    """Platform, Python, torch, the CPU's model name and identity (:func:`cpu_id`), vector flags (:func:`cpu_flags`),
    the vector instructions torch's own kernels run (``torch_cpu_capability``: AVX512, AVX2 ...), NumPy's
    (``numpy_simd``: :func:`numpy_simd`) and OpenBLAS's (``openblas``: :func:`openblas_cores`), the architecture dsh's C
    kernels are built for (``kernels_march``: ``$DSH_KERNELS_MARCH``, :mod:`dsh.llm.kernels`), CPU count and torch's
    threads, the GPU's name (when there is one) and the versions of transformers and TRL (when installed). The four
    decide a CPU run's rounding: ``ATEN_CPU_CAPABILITY=avx2``, ``NPY_DISABLE_CPU_FEATURES="X86_V4 AVX512_ICL"``,
    ``OPENBLAS_CORETYPE=Haswell`` and ``DSH_KERNELS_MARCH=znver3`` make an AVX-512 CPU compute as the AMD Zen 3 (AVX2)
    host of the committed laptop runs, and the same code and seed then give the same weights and numbers on both
    (README, "Reproducing a result on another CPU")."""
    import torch

    hw = {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
          "cpu": cpu_model(), "cpu_id": cpu_id(), "cpu_flags": cpu_flags(),
          "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
          "numpy_simd": numpy_simd(), "openblas": openblas_cores(),
          "kernels_march": os.environ.get("DSH_KERNELS_MARCH") or "native", "cpus": os.cpu_count(),
          "torch_threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        hw["gpu"] = torch.cuda.get_device_name(0)
    try:
        import transformers
        import trl

        hw["transformers"], hw["trl"] = transformers.__version__, trl.__version__
    except ImportError:  # pragma: no cover
        pass
    return hw


def provenance() -> dict:
    """``{"hardware", "commit", "date"}`` for a result written now."""
    return {"hardware": hardware(), "commit": git_commit(), "date": time.strftime("%Y-%m-%d %H:%M:%S")}


PACKAGE = Path(__file__).resolve().parent.parent     # the installed dsh package: "<dsh>" in recorded paths


def portable(obj, roots: dict | None = None):
    """``obj`` (JSON-like) with every string that is a path under one of ``roots`` (``{folder: label}``; the dsh
    package as ``<dsh>`` always) written from its label: ``<dsh>/assets/laptop-base``, ``<runs_dir>/sft-s0``. What a
    results file records then names no machine's folders. Only absolute paths and relative ones that exist here are
    read as paths (matched by resolved path); other strings are kept."""
    table = [(Path(f).resolve(), label) for f, label in {**(roots or {}), PACKAGE: "<dsh>"}.items()]

    def one(x):
        if isinstance(x, dict):
            return {k: one(y) for k, y in x.items()}
        if isinstance(x, (list, tuple)):
            return [one(y) for y in x]
        if isinstance(x, str) and ("/" in x or os.sep in x) and not x.startswith("<"):
            try:                # an absolute path, or a relative one that names something here
                p = Path(x).expanduser()
                if not (p.is_absolute() or p.exists()):
                    return x
                p = p.resolve()
            except (OSError, RuntimeError, ValueError):
                return x
            for root, label in table:
                if p == root or root in p.parents:
                    return "/".join([label, *p.relative_to(root).parts])
        return x
    return one(obj)
