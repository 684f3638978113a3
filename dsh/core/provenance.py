"""Where a result came from: the hardware, the library versions and the commit. Training summaries,
evaluation results, pipeline summaries, ``dsh bench`` and the gpu-small command all record :func:`provenance`."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path


def git_commit() -> str | None:
    """The checkout's commit, or ``$DSH_COMMIT`` where the tree is a copy without ``.git`` (a GPU host)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parent).stdout.strip()
    except Exception:
        out = ""
    return out or os.environ.get("DSH_COMMIT") or None


def cpu_model() -> str | None:
    """The CPU's model name (from /proc/cpuinfo on Linux, else the platform's word for it)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:  # pragma: no cover - not Linux
        pass
    return platform.processor() or None


def hardware() -> dict:
    """Platform, Python, torch, the CPU's model, CPU count and torch's threads, the GPU's name (when there is one)
    and the versions of transformers and TRL (when installed)."""
    import torch

    hw = {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
          "cpu": cpu_model(), "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads()}
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
