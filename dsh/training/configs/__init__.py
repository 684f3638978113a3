"""accelerate launch configurations shipped with dsh (DeepSpeed ZeRO-3, ZeRO-3 with CPU offload on
one GPU, FSDP2). ``path(name)`` gives a file's location for ``accelerate launch --config_file``."""

from pathlib import Path

NAMES = ("zero3.yaml", "zero3_offload_1gpu.yaml", "fsdp2.yaml")


def path(name: str) -> str:
    if name not in NAMES:
        raise ValueError(f"name must be one of {', '.join(NAMES)}; got {name!r}")
    return str(Path(__file__).resolve().parent / name)
