"""The decoding step's matrix products ``x @ w.T`` (:mod:`dsh.llm.kernel_engine`): torch's product (MKL on x86), or
oneDNN's with the weight packed ahead (the path torch's inductor takes on the CPU) where oneDNN's result is the same
bit for bit, so that the choice never changes a sample.

Which library is faster depends on the CPU and the shape (measured alone, 2 threads: at the laptop base's fused
gate/up product, 256 rows x 128 -> 768, oneDNN ~1.25x MKL on an AMD Zen 4; MKL faster at 128 -> 128). Whether the two
agree bit for bit depends on each library's summation order for the shape and the row count (on that CPU they agree
for an inner dimension of 128 from 8 rows on, not below 8 rows, nor at 384). :class:`Products` therefore probes,
once per process and weight shape, every row count up to the slots with random inputs, timing both libraries on the
way, and sends a product to oneDNN only at row counts where oneDNN agrees and is faster. Identical outputs on a
random probe mean the same operations in the same order (a coincidence over thousands of entries is practically impossible), so
they hold for every input of that shape.

The products are also the same on one thread as on two (:func:`thread_splits`): MKL computes a few row counts
(on the CPU above 5-7 and 9-11 rows) in another order when it has a second thread, taking the last rows beyond a
multiple of four as a block of their own, so a sample drawn on one thread (a pipeline worker,
:mod:`dsh.experiment.run.workers`) could differ in its last bits from one drawn on two. At those row counts the
product is taken in the two pieces the two-thread path uses, which give its result on either thread count. Where no
such split gives the two-thread bits (MKL on an Intel Xeon with AVX-512: 4-5 rows at 128 -> 384, 4-15 at 384 ->
128), the product is taken on one thread (:func:`one_thread`), which gives the one-thread bits on either count.
"""

from __future__ import annotations

import contextlib
import time

import torch

from .peaks import best_seconds, onednn_available

F = torch.nn.functional
PROBE_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 192, 256)   # row counts timed; identity is checked at every row count


_PLANS: dict = {}    # (out, in, rows) -> the row counts at which oneDNN is used (empty: none)


def _time(f, calls: int = 10) -> float:
    """Seconds of one call of ``f``: the fastest of three runs of ``calls`` calls."""
    return best_seconds(torch.device("cpu"), lambda: [f() for _ in range(calls)], 2) / calls


def plan(out_features: int, in_features: int, rows: int) -> frozenset:
    """The row counts ``1 .. rows`` at which a ``[r, in] @ [out, in].T`` product goes to oneDNN: those where its
    result equals torch's bit for bit (random inputs, every row count) and where it was faster when timed (at the
    :data:`PROBE_ROWS` up to ``rows``, each untimed row count taking its next timed one's verdict). Cached per
    process."""
    key = (out_features, in_features, rows)
    if key in _PLANS:
        return _PLANS[key]
    chosen: set = set()
    if onednn_available():
        ops = torch.ops.mkldnn
        g = torch.Generator().manual_seed(0)
        w = torch.randn(out_features, in_features, generator=g)
        packed = ops._reorder_linear_weight(w)
        x = torch.randn(rows, in_features, generator=g)
        same = {r for r in range(1, rows + 1)
                if torch.equal(F.linear(x[:r], w), ops._linear_pointwise(x[:r], packed, None, "none", [], ""))}
        timed = sorted({r for r in PROBE_ROWS if r <= rows} | {rows})
        faster = {}
        for r in timed:
            xr = x[:r].contiguous()
            mkl = _time(lambda xr=xr: F.linear(xr, w))
            dnn = _time(lambda xr=xr: ops._linear_pointwise(xr, packed, None, "none", [], ""))
            faster[r] = dnn < mkl
        for r in same:
            nxt = next(t for t in timed if t >= r)
            if faster[nxt]:
                chosen.add(r)
    _PLANS[key] = frozenset(chosen)
    return _PLANS[key]


_SPLITS: dict = {}   # (kind, out, in, rows) -> {row count: rows of the first piece, or ONE_THREAD}
ONE_THREAD = 0       # a row count whose product no split makes thread-independent: taken on one thread


@contextlib.contextmanager
def one_thread():
    """torch (and its MKL) on one thread inside it, the thread count before restored after (a quarter of a
    microsecond each way)."""
    was = torch.get_num_threads()
    if was == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(was)


def _product(kind: str, x, w, r):
    return F.linear(x, w) if kind == "linear" else torch.addmm(r, x, w.t())


def tail_block(x, head: int):
    """The rows of ``x`` from ``head`` on, as the second piece of a split product takes them (contiguous); a single
    row beside a copy of itself (a two-row block, as MKL's two-thread path computes it: keep the first result row)."""
    return (x[head:] if x.shape[0] - head > 1 else x[head:].expand(2, -1)).contiguous()


def _pieces(kind: str, x, w, r, head: int):
    """The product of ``x``'s rows in two pieces, its first ``head`` rows and the rest (:func:`tail_block`); with
    ``head`` :data:`ONE_THREAD`, in one piece on one thread."""
    if head == ONE_THREAD:
        with one_thread():
            return _product(kind, x, w, r)
    rest = _product(kind, tail_block(x, head), w, None if r is None else tail_block(r, head))
    return torch.cat([_product(kind, x[:head], w, None if r is None else r[:head]), rest[:x.shape[0] - head]])


def row_splits(full, pieces, rows: int) -> dict:
    """The row counts ``1 .. rows`` at which ``full(n)`` (a product of ``n`` rows) gives other bits on one thread
    than on two, each mapped to the first piece's rows ``head`` (the largest multiple of four below ``n``) where
    ``pieces(n, head)`` (the same product in two pieces, :func:`_pieces`) equals ``full(n)``'s two-thread result on
    either thread count, else to :data:`ONE_THREAD`. torch's threads are set to one and two for the check, then
    restored."""
    was = torch.get_num_threads()
    got, splits = {}, {}
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            got[t] = [full(n) for n in range(1, rows + 1)]
        for n in range(1, rows + 1):
            head = (n - 1) // 4 * 4
            if torch.equal(got[1][n - 1], got[2][n - 1]):
                continue
            split = head and all(_same(pieces, n, head, got[2][n - 1], t) for t in (1, 2))
            splits[n] = head if split else ONE_THREAD
    finally:
        torch.set_num_threads(was)
    return splits


def _same(pieces, n, head, want, threads) -> bool:
    torch.set_num_threads(threads)
    return torch.equal(pieces(n, head), want)


def thread_splits(kind: str, out_features: int, in_features: int, rows: int) -> dict:
    """:func:`row_splits` of torch's ``kind`` product (``linear``: ``x @ w.T``; ``addmm``: ``r + x @ w.T``) of that
    shape, on random inputs. Cached per process."""
    key = (kind, out_features, in_features, rows)
    if key in _SPLITS:
        return _SPLITS[key]
    g = torch.Generator().manual_seed(1)
    w = torch.randn(out_features, in_features, generator=g)
    x = torch.randn(rows, in_features, generator=g)
    r = torch.randn(rows, out_features, generator=g) if kind == "addmm" else None
    _SPLITS[key] = row_splits(lambda n: _product(kind, x[:n], w, None if r is None else r[:n]),
                              lambda n, head: _pieces(kind, x[:n], w, None if r is None else r[:n], head), rows)
    return _SPLITS[key]


class Products:
    """``x @ w.T + b`` for the weights of one :meth:`dsh.llm.kernel_engine.KernelDecoder.generate` (the live weights,
    packed once for oneDNN where :func:`plan` sends some row counts to it), at up to ``rows`` rows. ``log``: a list
    that every product appends ``(rows, flops, seconds)`` to (for ``dsh bench``), or None."""

    def __init__(self, rows: int, log: list | None = None):
        self.rows, self.log = rows, log
        self._packed: dict = {}
        self._splits: dict = {}

    def prepare(self, w: torch.Tensor, residual: bool = False) -> None:
        """Pack ``w`` for oneDNN if :func:`plan` uses oneDNN at some row count of its shape; find its
        :func:`thread_splits` (``residual``: for :meth:`add_linear`)."""
        rows = frozenset() if residual else plan(w.shape[0], w.shape[1], self.rows)
        if rows:
            self._packed[id(w)] = (w, torch.ops.mkldnn._reorder_linear_weight(w), rows)
        kind = "addmm" if residual else "linear"
        self._splits[kind, tuple(w.shape)] = thread_splits(kind, w.shape[0], w.shape[1], self.rows)

    def linear(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ w.T (+ b)``: in two pieces (or on one thread) where :func:`thread_splits` says so, else oneDNN where
        :func:`plan` chose it for ``x``'s row count (no bias), else ``F.linear``."""
        t = time.perf_counter() if self.log is not None else 0.0
        got = self._packed.get(id(w))
        head = self._splits.get(("linear", tuple(w.shape)), {}).get(x.shape[0])
        if head is not None and b is None:
            y = _pieces("linear", x, w, None, head)
        elif b is None and got is not None and got[0] is w and x.shape[0] in got[2]:
            y = torch.ops.mkldnn._linear_pointwise(x, got[1], None, "none", [], "")
        else:
            y = F.linear(x, w, b)
        if self.log is not None:
            self.log.append((x.shape[0], 2 * x.shape[0] * w.numel(), time.perf_counter() - t))
        return y

    def add_linear(self, r: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """``r + x @ w.T`` as one ``addmm`` (the residual sums of the output and down projections); in two pieces
        (or on one thread) where :func:`thread_splits` says so."""
        t = time.perf_counter() if self.log is not None else 0.0
        head = self._splits.get(("addmm", tuple(w.shape)), {}).get(x.shape[0])
        y = torch.addmm(r, x, w.t()) if head is None else _pieces("addmm", x, w, r, head)
        if self.log is not None:
            self.log.append((x.shape[0], 2 * x.shape[0] * w.numel(), time.perf_counter() - t))
        return y
