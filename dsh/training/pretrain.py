"""Training a tiny model from scratch on prompt/completion pairs: a plain nanoGPT-style loop (AdamW, linear
warm-up, cosine decay to a floor, gradient clipping), loss on the completion tokens only, length-bucketed batches
of about ``tokens_per_batch`` padded tokens.

This is the base stage of the laptop experiment (the analogue of the paper's pretrained Qwen2.5-7B-Instruct),
which TRL has no trainer for. The run is deterministic under its seed (data order, initialisation) for a fixed
number of torch threads, and resumable: ``state.pt`` in the output folder holds model, optimizer, step and data
position, written atomically every ``save_every`` steps; a killed run started again with the same arguments
continues where it stopped.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..core import validate as v
from ..core.files import write_text, writing
from ..task.records import chat_prompt

MAX_TOKENS = 2_000_000_000     # about two days at the shipped base's 12k tokens/s


@dataclass(frozen=True)
class PretrainConfig:
    """Optimisation settings of :func:`pretrain`."""

    tokens: int = field(default=4_000_000, metadata={"help": "training budget in completion+prompt tokens (not padding)"})
    lr: float = field(default=1e-3, metadata={"help": "peak learning rate"})
    min_lr_fraction: float = field(default=0.05, metadata={"help": "the cosine ends at lr * min_lr_fraction"})
    warmup_steps: int = field(default=50, metadata={"help": "linear warm-up steps"})
    tokens_per_batch: int = field(default=2048, metadata={"help": "padded tokens per batch"})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay"})
    grad_clip: float = field(default=1.0, metadata={"help": "gradient-norm clip"})
    seed: int = field(default=0, metadata={"help": "data order and initialisation"})
    save_every: int = field(default=200, metadata={"help": "steps between resumable checkpoints"})

    def __post_init__(self):
        v.positive_int("tokens", self.tokens)
        if self.tokens > MAX_TOKENS:
            raise ValueError(f"tokens must be an integer in 1..{MAX_TOKENS:,} (a day or more of training on two CPU "
                             f"cores); got {self.tokens:,}")
        v.positive_int("tokens_per_batch", self.tokens_per_batch)
        v.length("warmup_steps", self.warmup_steps)
        v.positive_int("save_every", self.save_every)
        v.length("seed", self.seed)
        if not (isinstance(self.lr, (int, float)) and 0 < self.lr < 1):
            raise ValueError(f"lr must be a learning rate in (0, 1); got {self.lr!r}")
        v.probability("min_lr_fraction", self.min_lr_fraction)
        if v.real("weight_decay", self.weight_decay) < 0 or v.real("grad_clip", self.grad_clip) <= 0:
            raise ValueError("weight_decay must be >= 0 and grad_clip > 0")


def encode(tok, pairs) -> list[tuple[list[int], int]]:
    """(token ids of chat prompt + completion + eos, number of prompt tokens) for (question, completion) pairs."""

    rows = []
    for q, c in pairs:
        pi = tok(chat_prompt(tok, q), add_special_tokens=False)["input_ids"]
        ci = tok(c, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        rows.append((pi + ci, len(pi)))
    return rows


def pack(rows, length: int, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """Examples (from :func:`encode`, shuffled with ``seed``) concatenated into rows of at most ``length`` tokens
    (each row's limit drawn uniformly from 1 .. ``length``: a row holds at least one example), as pre-training
    concatenates documents: ``(ids, labels)`` with -100 on prompts. A model trained on single
    short examples never sees a late position and fails at one (measured: the base's loss on 300-token reflection
    traces rose from 0.5 nats at positions < 60 to 5 nats at 300-500, and reflection SFT wrecked it); packed
    rows teach it to answer the latest question wherever it starts."""
    v.positive_int("length", length)
    order = list(range(len(rows)))
    rng = random.Random(f"pack-{seed}")
    rng.shuffle(order)
    out, ids, labels = [], [], []
    limit = rng.randint(1, length)     # each row's length is drawn, so that questions start at every position
    for i in order:
        seq, k = rows[i]
        if len(seq) > length:
            raise ValueError(f"length must be at least the longest example ({len(seq)} tokens); got {length}")
        if ids and len(ids) + len(seq) > limit:
            out.append((ids, labels))
            ids, labels = [], []
            limit = rng.randint(1, length)
        ids = ids + seq
        labels = labels + [-100] * k + seq[k:]
    if ids:
        out.append((ids, labels))
    return out


def batches(rows, tokens_per_batch: int, rng: random.Random) -> list[list[int]]:
    """Indices of ``rows`` grouped by length into batches of at most ``tokens_per_batch`` padded tokens, shuffled."""
    order = sorted(range(len(rows)), key=lambda i: (len(rows[i][0]), rng.random()))
    out, cur, longest = [], [], 0
    for i in order:
        n = len(rows[i][0])
        if cur and max(longest, n) * (len(cur) + 1) > tokens_per_batch:
            out.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, n)
    if cur:
        out.append(cur)
    rng.shuffle(out)
    return out


def collate(rows, ids, pad_id: int):
    """Right-padded inputs, attention mask and labels (-100 on prompt and padding); a row is (ids, number of
    prompt tokens) or (ids, labels) (:func:`pack`)."""
    import torch

    n = max(len(rows[i][0]) for i in ids)
    x = torch.full((len(ids), n), pad_id, dtype=torch.long)
    att = torch.zeros((len(ids), n), dtype=torch.long)
    lab = torch.full((len(ids), n), -100, dtype=torch.long)
    for r, i in enumerate(ids):
        seq, k = rows[i]
        x[r, :len(seq)] = torch.tensor(seq)
        att[r, :len(seq)] = 1
        if isinstance(k, int):
            lab[r, k:len(seq)] = torch.tensor(seq[k:])
        else:
            lab[r, :len(seq)] = torch.tensor(k)
    return x, att, lab


def lr_at(step: int, total: int, cfg: PretrainConfig) -> float:
    warm = min(1.0, (step + 1) / max(1, cfg.warmup_steps))
    frac = min(1.0, step / max(1, total))
    return cfg.lr * warm * (cfg.min_lr_fraction + (1 - cfg.min_lr_fraction) * 0.5 * (1 + math.cos(math.pi * frac)))


def saved_state(out: Path, cfg: PretrainConfig, n_rows: int) -> dict:
    """The state a run of ``cfg`` on ``n_rows`` rows saved in ``out`` (``state.pt``), read as tensors and plain Python
    values only (a planted pickle is refused, never run); a file dsh did not write, or a run with other settings, is
    refused in one line."""
    import torch

    try:
        st = torch.load(out / "state.pt", weights_only=True)
        ok = isinstance(st, dict) and {"model", "optimizer", "step", "tokens", "curve", "seconds", "config",
                                       "n_rows"} <= set(st)
    except Exception as e:  # noqa: BLE001 - any unreadable file gets the same one-line refusal
        ok, why = False, f"{type(e).__name__}"
    else:
        why = "not a dsh pretraining state"
    if not ok:
        raise ValueError(f"out {out} holds a state.pt that dsh did not write or cannot read ({why}); move it "
                         f"away or use another folder")
    if st["config"] != asdict(cfg) or st["n_rows"] != n_rows:
        raise ValueError(f"out {out} holds a run with other settings; use another folder or delete it")
    return st


def pretrain(model, tok, rows, out, cfg: PretrainConfig = PretrainConfig(), progress: bool = True,
             stop_after: int | None = None, monitor=None, monitor_every: int = 250,
             final_state: bool = True) -> dict | None:
    """Train ``model`` on ``rows`` (from :func:`encode` or :func:`pack`) for ``cfg.tokens`` tokens; checkpoints in
    ``out`` (resumed when present). Returns the run's statistics (steps, tokens, seconds, tokens/s, loss curve).
    ``stop_after``: leave after that many steps of this call with the state saved, as a kill would (returns None).
    ``monitor(model, step) -> dict``: called every ``monitor_every`` steps and at the end, in eval mode; its dicts
    are the run's ``monitor_log`` (kept across a resume): a learning curve. ``final_state``: the finished run's
    state is kept too, so that a kill after training (while the caller reports and saves) loses nothing: run again,
    it finds the run finished and returns its statistics; :func:`remove_work` clears the folder afterwards."""
    import torch
    from tqdm.auto import tqdm

    out = work_files(v.output_path("out", out, kind="folder"))     # a folder; no parent of it a file
    out.mkdir(parents=True, exist_ok=True)
    data_rng = random.Random(f"pretrain-{cfg.seed}")
    flat = batches(rows, cfg.tokens_per_batch, data_rng)     # epochs of batches, drawn in turn as training needs them
    mean_tokens = sum(sum(len(rows[i][0]) for i in b) for b in flat) / len(flat)
    total = max(1, int(cfg.tokens / mean_tokens))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=cfg.weight_decay)
    state_path = out / "state.pt"
    step, seen, curve, elapsed, monitor_log = 0, 0, [], 0.0, []
    if state_path.exists():
        st = saved_state(out, cfg, len(rows))
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["optimizer"])
        step, seen, curve, elapsed = st["step"], st["tokens"], st["curve"], st["seconds"]
        monitor_log = st.get("monitor_log", [])
    model.train()
    start = step
    t0 = time.time() - elapsed
    # the loss average as it was at the save (a state from before it was saved: the curve's last, rounded, value)
    ema = st.get("ema", curve[-1][2] if curve else None) if state_path.exists() else None
    bar = tqdm(total=total, initial=step, desc="pretrain", disable=not progress, unit="step")
    while step < total:
        while step >= len(flat):
            flat += batches(rows, cfg.tokens_per_batch, data_rng)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total, cfg)
        x, att, lab = collate(rows, flat[step], tok.pad_token_id)
        loss = model(input_ids=x, attention_mask=att, labels=lab).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        seen += int(att.sum())
        lv = loss.item()
        ema = lv if ema is None else 0.98 * ema + 0.02 * lv
        bar.update(1)
        if step % 25 == 0 or step == total:
            curve.append((step, seen, round(ema, 5), round(time.time() - t0, 1)))
            bar.set_postfix(loss=f"{ema:.4f}", tok_s=f"{seen / (time.time() - t0):.0f}")
        if monitor is not None and (step % monitor_every == 0 or step == total):
            model.eval()
            monitor_log.append({"step": step, "tokens": seen, "report": monitor(model, step)})
            model.train()
        interrupted = stop_after is not None and step - start >= stop_after and step < total
        if (step % cfg.save_every == 0 and step < total) or interrupted or (step == total and final_state):
            tmp = out / "state.pt.tmp"
            with writing(state_path):
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step, "tokens": seen,
                            "curve": curve, "seconds": time.time() - t0, "config": asdict(cfg), "n_rows": len(rows),
                            "monitor_log": monitor_log, "ema": ema}, tmp)
            os.replace(tmp, state_path)
        if interrupted:
            bar.close()
            return None
    bar.close()
    dt = time.time() - t0     # a run found finished (its final state) took what it took: elapsed
    stats = {"steps": step, "tokens": seen, "seconds": round(dt, 1), "tokens_per_s": round(seen / max(dt, 1e-9)),
             "final_loss_ema": ema, "curve": curve, "config": asdict(cfg),
             "monitor_log": monitor_log}
    write_text(out / "train_stats.json", json.dumps(stats, indent=1) + "\n")
    return stats


WORK_FILES = ("state.pt", "state.pt.tmp", "train_stats.json")   # what pretrain writes into its folder


def work_files(out) -> Path:
    """``out`` (pretrain's folder), refused in one line when it holds a file of :data:`WORK_FILES` that pretrain did
    not write: a ``train_stats.json`` or ``state.pt.tmp`` without the ``state.pt`` pretrain keeps beside them (it
    would be overwritten, then deleted by :func:`remove_work`)."""
    out = Path(out)
    odd = [n for n in WORK_FILES if n != "state.pt" and (out / n).exists()] if not (out / "state.pt").is_file() else []
    odd += [n for n in WORK_FILES if (out / n).exists() and ((out / n).is_symlink() or not (out / n).is_file())]
    if odd:
        raise ValueError(f"out {out} holds {', '.join(sorted(set(odd)))} that dsh did not write (no state.pt of a "
                         f"dsh run beside it); move it away or use another folder; nothing was changed")
    return out


def remove_work(out) -> None:
    """Remove what :func:`pretrain` wrote into ``out`` (:data:`WORK_FILES` and the temporaries of its writes) once
    its caller has saved the result, and the folder when nothing else is left in it: a file of the user's there is never deleted."""
    out = Path(out)
    for name in WORK_FILES:
        (out / name).unlink(missing_ok=True)
        for tmp in out.glob(f".{name}.*.tmp"):      # a temporary of its atomic writes that a kill left behind
            tmp.unlink()
    if out.is_dir() and not any(out.iterdir()):
        out.rmdir()
