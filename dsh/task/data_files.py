"""The data files of ``python -m dsh data``: SFT traces and test prompts as JSON lines (and verl's parquet files),
written aside first so that a file already in the folder is replaced only by its own bytes."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from ..core.files import atomic_write, write_jsonl
from ..core.validate import output_path
from .problems import make_splits
from .records import prompt_records, sft_records
from .traces import TraceConfig
from .verl import write_parquet


def write_data(out, cfg: TraceConfig, n_train: int, n_test: int, seed: int, verl: bool = False) -> list[Path]:
    """Write ``train_<style>_<granularity>.jsonl`` (SFT records of ``cfg``) and ``test.jsonl`` (prompts) of the split
    drawn by ``seed`` into the folder ``out`` (and ``verl_train.parquet``, ``verl_test.parquet`` when ``verl``); return
    their paths. A file already there with other contents is refused before anything is changed."""
    out = output_path("out", out, kind="folder")
    if verl:
        import pyarrow  # noqa: F401 - the parquet files need it: a missing one is named before any work
    splits = make_splits(n_train=n_train, n_test=n_test, seed=seed)
    names = [f"train_{cfg.style}_{cfg.granularity}.jsonl", "test.jsonl"]
    names += ["verl_train.parquet", "verl_test.parquet"] if verl else []
    for n in names:
        output_path("out", out / n)
    with tempfile.TemporaryDirectory(prefix=".dsh-data-") as tmp:
        tmp = Path(tmp)
        write_jsonl(sft_records(splits["train"], cfg, seed), tmp / names[0])
        write_jsonl(prompt_records(splits["test"]), tmp / names[1])
        if verl:
            write_parquet(splits["train"], tmp / names[2], "train")
            write_parquet(splits["test"], tmp / names[3], "test")
        other = [n for n in names if (out / n).exists() and (out / n).read_bytes() != (tmp / n).read_bytes()]
        if other:
            raise ValueError(f"out {out} holds {', '.join(other)} with other contents than dsh data writes for these "
                             f"settings; move them or choose another out; nothing was changed")
        for n in names:
            if not (out / n).exists():
                atomic_write(out / n, lambda t, n=n: shutil.copyfile(tmp / n, t))
    return [out / n for n in names]
