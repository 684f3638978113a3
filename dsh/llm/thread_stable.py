"""Matrix products of the training and scoring passes that round the same on one thread as on two.

GRPO's update and its reference scoring take their log-probabilities from TRL's chunked LM head
(``trl.kernels.chunked_logprob``): a pass's tokens go through the head in chunks of 4,096 rows, forward
(``torch.mm(hidden, weight.T, out=tile)``) and backward (``grad_hidden.addmm_(tile, weight)``), the last chunk holding
the rest. MKL computes a product of a few row counts (on an AMD Zen 4: 5-7 and 9-11) in another order when it has a
second thread (:mod:`dsh.llm.products`), so a pass whose last chunk has such a row count (about one pass in 700)
rounds otherwise on one thread, and a GRPO stage trained by a one-thread pipeline worker
(:mod:`dsh.experiment.run.workers`) leaves the two-thread run's weights at that step.

Inside :class:`ThreadStable` (a torch dispatch mode: it sees the backward pass's operations too), every float32 CPU
``torch.mm(x, b[, out=])`` and ``acc.addmm_(x, b)`` of at most :data:`MAX_ROWS` rows, at a row count where the
product depends on the threads, is taken in the two pieces that give its two-thread result on either thread count,
or on one thread where no split does (:func:`dsh.llm.products.row_splits`, probed once per process for each shape and
memory layout on random inputs); a product of more rows is taken on one thread (on an Intel Xeon, MKL sums the head's
weight gradient over a chunk's 4,096 rows in another order on two threads; on an AMD Zen 4 the head's products of
4,096 rows gave the same bits on either count; the head is ~1 % of a step's products, and probing each new shape
instead cost training several times its speed).
Every other call is torch's own. :func:`trl_lm_head` puts TRL's head under it (every training run: dsh.training.train).
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .products import ONE_THREAD, one_thread, row_splits, tail_block

MAX_ROWS = 16        # row counts probed (those that differ lie below it; dsh.llm.products probed 1-299)

_FOUND: dict = {}    # (op, x layout, b layout, target layout) -> {row count: first piece's rows, or ONE_THREAD}


def _random(shape, stride, g) -> torch.Tensor:
    """A random float32 tensor of ``shape`` laid out with ``stride``."""
    size = 1 + sum((n - 1) * s for n, s in zip(shape, stride))
    return torch.randn(size, generator=g).as_strided(shape, stride)


def _mm(x, b, out, head=None):
    """``x @ b`` (into ``out`` when given); with ``head``, in two pieces, its first ``head`` rows and the rest, a
    single remaining row computed as a two-row block; with ``head`` ONE_THREAD, in one piece on one thread."""
    if head is None or head == ONE_THREAD:
        with one_thread() if head == ONE_THREAD else contextlib.nullcontext():
            return torch.mm(x, b) if out is None else torch.mm(x, b, out=out)
    n = x.shape[0]
    first = torch.mm(x[:head], b) if out is None else torch.mm(x[:head], b, out=out[:head])
    rest = torch.mm(tail_block(x, head), b)[:n - head]
    if out is None:
        return torch.cat([first, rest])
    out[head:].copy_(rest)
    return out


def _addmm_(acc, x, b, head=None):
    """``acc += x @ b`` in place; with ``head``, in two pieces (or on one thread) as :func:`_mm`."""
    if head is None or head == ONE_THREAD:
        with one_thread() if head == ONE_THREAD else contextlib.nullcontext():
            return acc.addmm_(x, b)
    n = x.shape[0]
    acc[:head].addmm_(x[:head], b)
    if n - head > 1:
        acc[head:].addmm_(x[head:], b)
    else:
        acc[head:].copy_(torch.addmm(tail_block(acc, head), tail_block(x, head), b)[:1])
    return acc


def splits(op: str, x, b, target) -> dict:
    """:func:`dsh.llm.products.row_splits` of ``op`` (``mm``: ``x @ b``, into ``target`` when it is not None;
    ``addmm_``: ``target += x @ b``) at ``x``'s width, ``b``'s shape and all three layouts, on random inputs."""
    key = (op, x.shape[1], x.stride(), tuple(b.shape), b.stride(), None if target is None else target.stride())
    if key in _FOUND:
        return _FOUND[key]
    g = torch.Generator().manual_seed(2)
    k, m = b.shape
    xs, bs = _random((MAX_ROWS, k), x.stride(), g), _random((k, m), b.stride(), g)
    ts = _random((MAX_ROWS, m), target.stride(), g) if op == "addmm_" else None    # the sum's starting values

    def run(n, head=None):
        t = None if target is None else torch.empty_strided((MAX_ROWS, m), target.stride()).zero_()   # its layout
        if op == "mm":
            return _mm(xs[:n], bs, None if t is None else t[:n], head).clone()
        return _addmm_(t.copy_(ts)[:n], xs[:n], bs, head).clone()

    _FOUND[key] = row_splits(run, run, MAX_ROWS)
    return _FOUND[key]


def _plain(*tensors) -> bool:
    """Whether every operand is a 2-D float32 CPU tensor."""
    return all(isinstance(t, torch.Tensor) and t.dim() == 2 and t.dtype == torch.float32 and t.device.type == "cpu"
               for t in tensors)


class ThreadStable(TorchDispatchMode):
    """Inside it, the float32 CPU products ``torch.mm(x, b[, out=])`` and ``acc.addmm_(x, b)`` give the same bits on
    one thread as on two, in the forward and the backward pass: up to :data:`MAX_ROWS` rows their two-thread result
    (or their one-thread result where no split gives it), above it their one-thread result (module docstring)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        aten = torch.ops.aten
        if func in (aten.mm.default, aten.mm.out):
            x, b = args
            out = kwargs.get("out")
            if _plain(x, b, *(() if out is None else (out,))):
                head = splits("mm", x, b, out).get(x.shape[0]) if x.shape[0] <= MAX_ROWS else ONE_THREAD
                if head is not None:
                    return _mm(x, b, out, head)
        elif func is aten.addmm_.default and not kwargs:
            acc, x, b = args
            if _plain(acc, x, b):
                head = splits("addmm_", x, b, acc).get(x.shape[0]) if x.shape[0] <= MAX_ROWS else ONE_THREAD
                if head is not None:
                    return _addmm_(acc, x, b, head)
        return func(*args, **kwargs)


@contextlib.contextmanager
def trl_lm_head():
    """Inside it, TRL's chunked LM head (``trl.trainer.utils._ChunkedLogProbFunction``: the log-probabilities and
    losses of SFTTrainer's and GRPOTrainer's passes) takes its products under :class:`ThreadStable`, forward and
    backward, so that they round the same on one thread as on two; the rest of a step runs as before (the mode only
    around the head: over a whole GRPO step it cost ~15 % of the update). On leaving, TRL's function is back.
    Imports TRL."""
    import trl.trainer.utils as trl_utils

    was = getattr(trl_utils, "_ChunkedLogProbFunction", None)
    if was is None:            # another TRL: everything inside under the mode (the same results, slower)
        with ThreadStable():
            yield
        return

    class Stable(was):
        @staticmethod
        def forward(ctx, *args):
            with ThreadStable():
                return was.forward(ctx, *args)

        @staticmethod
        def backward(ctx, *grads):
            with ThreadStable():
                return was.backward(ctx, *grads)

    trl_utils._ChunkedLogProbFunction = Stable
    try:
        yield
    finally:
        trl_utils._ChunkedLogProbFunction = was
