"""A generation request of :meth:`dsh.llm.engine.Engine.generate`, checked before any row is decoded: the prompts,
the token limit, the temperature, the rows' random streams and the optional stop token count (``stop_after``)."""

from __future__ import annotations

import torch

from ..core import validate as v
from .streams import stream_key


def checked_stop_after(stop_after) -> tuple | None:
    """``stop_after`` of :meth:`Engine.generate` checked: None, or ``(token_id, n)`` with a token id >= 0 and a
    count n >= 1 (a row ends right after it writes that token for the n-th time)."""
    if stop_after is None:
        return None
    ok = (isinstance(stop_after, (tuple, list)) and len(stop_after) == 2
          and all(isinstance(x, int) and not isinstance(x, bool) for x in stop_after)
          and stop_after[0] >= 0 and stop_after[1] >= 1)
    if not ok:
        raise ValueError(f"stop_after must be None or (token_id >= 0, count >= 1); got {stop_after!r}")
    return int(stop_after[0]), int(stop_after[1])


def checked_request(prompts, max_new_tokens, temperature, seed, keys, max_len: int) -> tuple:
    """``(prompts, max_new_tokens, streams)`` of :meth:`Engine.generate`'s arguments, checked: non-empty prompts of
    token ids that fit ``max_len`` with their new tokens, one integer key per prompt (default: its position) turned
    into its random stream (:func:`dsh.llm.streams.stream_key`; seed None: drawn from torch's generator)."""
    prompts = [list(map(int, p)) for p in prompts]
    max_new_tokens = v.positive_int("max_new_tokens", max_new_tokens)
    v.temperature("temperature", temperature)
    if any(len(p) == 0 for p in prompts):
        raise ValueError("prompts must be non-empty lists of token ids")
    too_long = [i for i, p in enumerate(prompts) if len(p) + max_new_tokens > max_len]
    if too_long:
        raise ValueError(f"max_len={max_len} is too small for prompt {too_long[0]} "
                         f"({len(prompts[too_long[0]])} tokens) + max_new_tokens={max_new_tokens}")
    keys = list(range(len(prompts))) if keys is None else keys
    if len(keys) != len(prompts) or not all(isinstance(k, int) and not isinstance(k, bool) for k in keys):
        raise ValueError("keys must be one integer per prompt")
    base = v.length("seed", seed) if seed is not None else int(torch.randint(0, 2 ** 31 - 1, ()).item())
    return prompts, max_new_tokens, [stream_key(base, k) for k in keys]
