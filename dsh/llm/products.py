"""The decoding step's matrix products ``x @ w.T`` (:mod:`dsh.llm.kernel_engine`): torch's product (MKL on x86), or
oneDNN's with the weight packed ahead (the path torch's inductor takes on the CPU) where oneDNN's result is the same
bit for bit, so that the choice never changes a sample.

Which library is faster depends on the CPU and the shape (measured alone, 2 threads: at the laptop base's fused
gate/up product, 256 rows x 128 -> 768, oneDNN ~1.25x MKL on an AMD Zen 4; MKL faster at 128 -> 128). Whether the two
agree bit for bit depends on each library's summation order for the shape and the row count (on that CPU they agree
for an inner dimension of 128 from 8 rows on, not below 8 rows, nor at 384). :class:`Products` therefore sends a
product to oneDNN only at row counts where oneDNN was clearly faster (both libraries timed, alternating, at the
nearest of a few row counts) and agrees (checked at that row count, with random inputs, only where oneDNN was
faster): each decided when a generate first takes a product of that shape at that row count (a 700-question evaluation
meets 29 of the 256 row counts; deciding all of them ahead took 1.3 s of a fresh process's first 256-row evaluation on
an Intel Xeon), once per machine: :mod:`dsh.llm.decisions` keeps the decisions on disk for later processes. Identical
outputs on a random probe mean the same operations in the same order (a coincidence over thousands of entries is
practically impossible), so they hold for every input of that shape.

The products are also the same on one thread as on two (:func:`split_at`): MKL computes a few row counts
(on the CPU above 5-7 and 9-11 rows) in another order when it has a second thread, taking the last rows beyond a
multiple of four as a block of their own, so a sample drawn on one thread (a pipeline worker,
:mod:`dsh.experiment.run.workers`) could differ in its last bits from one drawn on two. At those row counts the
product is taken in the two pieces the two-thread path uses, which give its result on either thread count. Where no
such split gives the two-thread bits (MKL on an Intel Xeon with AVX-512: 4-5 rows at 128 -> 384, 4-15 at 384 ->
128), the product is taken on one thread (:func:`one_thread`), which gives the one-thread bits on either count.

Where a product at a row count is not split, the decoding step in C may take it through the ``sgemm_``
torch calls (:mod:`dsh.llm.blas`); :func:`sgemm_agrees` checks, once per machine and row count, that the call from C
gives torch's bits there (:meth:`Products.in_c`), and :func:`packed_agrees` where MKL's product from the weight
packed ahead does too (:meth:`Products.packed`); :func:`parts_agree`, where the same call on each part of the rows
(:func:`parts_of`), on one thread, gives them too, so that the C step may cut its rows into a part a thread
(:meth:`Products.in_parts`; on MKL a row's result depends on its own row only at the step's shapes, checked, not
assumed). :func:`panels_agree` finds where the C step's own product (:func:`dsh.llm.kernels.panel_product`: each
output one chain of fused multiply-adds over its inputs in order, in chunks whose sums are added in order) gives
torch's bits, and at which chunk (:meth:`Products.panels`): MKL sums each output that way at the step's shapes.
"""

from __future__ import annotations

import contextlib
import statistics
import time

import torch

from . import blas, decisions, kernels
from .peaks import onednn_available

F = torch.nn.functional
PROBE_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 192, 256)   # the row counts at which both libraries are timed


_INPUTS: dict = {}   # (seed, shapes) -> random tensors of those shapes
_FASTER: dict = {}   # (out, in, timed rows) -> whether oneDNN was faster there
_AGREES: dict = {}   # (out, in, rows) -> whether oneDNN's product equals torch's bit for bit
_SGEMM: dict = {}    # (kind, out, in, rows, most rows) -> whether blas.product equals torch's bit for bit
_PACKED: dict = {}   # the same -> whether blas.packed_product does too
_PANELS: dict = {}   # the same and the kernels' build -> the panel product's chunk that gives torch's bits there (0: none)
PANEL_CUTS = (1, 2, 3, 4)   # the inputs cut into this many equal chunks (the panel product's chunk), tried in order


def _random(seed: int, *shapes) -> list:
    """Random float32 tensors of ``shapes`` from ``seed`` (cached per process)."""
    key = (seed, shapes)
    if key not in _INPUTS:
        g = torch.Generator().manual_seed(seed)
        _INPUTS[key] = [torch.randn(*sh, generator=g) for sh in shapes]
    return _INPUTS[key]


_TAKEN: set = set()   # (table name, decisions file): every decision that file held taken into this process's table


def _decided(table: dict, name: str, key: tuple, decide):
    """``table[key]``: from this process's ``table``, else from this machine's file (:mod:`dsh.llm.decisions`, table
    ``name``: at its first miss in a process all of them taken at once, since a step asks for several at every row
    count it meets), else ``decide()``, then stored in both."""
    if key not in table:
        where = (name, decisions.path())
        if where not in _TAKEN:
            _TAKEN.add(where)
            for k, v in decisions.table(name).items():
                table.setdefault(k, v)
            if key in table:
                return table[key]
        value = decisions.recall(name, key)
        if value is decisions.MISSING:
            value = decide()
            decisions.remember(name, key, value)
        table[key] = value
    return table[key]


def clearly_faster(f, g, rounds: int = 5, calls: int = 5, margin: float = 0.95) -> bool:
    """Whether ``f`` is faster than ``g`` by more than the ``margin``: the median over ``rounds`` alternations of
    ``calls`` calls each (after one untimed call of each), ``f``'s at most ``margin`` times ``g``'s. Alternating keeps
    a host whose speed drifts from favouring either; the margin leaves a near tie to ``g`` (torch's product)."""
    f(), g()
    tf, tg = [], []
    for _ in range(rounds):
        for fn, ts in ((f, tf), (g, tg)):
            t = time.perf_counter()
            for _ in range(calls):
                fn()
            ts.append(time.perf_counter() - t)
    return statistics.median(tf) <= margin * statistics.median(tg)


def uses_onednn(out_features: int, in_features: int, r: int, rows: int) -> bool:
    """Whether a ``[r, in] @ [out, in].T`` product (``r`` of at most ``rows`` rows) goes to oneDNN: where oneDNN was
    :func:`clearly_faster` than torch (timed at the first of the :data:`PROBE_ROWS` up to ``rows``, and ``rows``,
    from ``r`` on) and its result equals torch's bit for bit (random inputs, checked at ``r`` itself). Each timing and
    each check runs once per machine (:mod:`dsh.llm.decisions`), when first asked for."""
    if not onednn_available():
        return False
    timed = min(t for t in (*PROBE_ROWS, rows) if r <= t <= rows)
    ops = torch.ops.mkldnn

    def faster():
        w, x = _random(0, (out_features, in_features), (rows, in_features))
        xr, packed = x[:timed].contiguous(), ops._reorder_linear_weight(w)
        return clearly_faster(lambda: ops._linear_pointwise(xr, packed, None, "none", [], ""), lambda: F.linear(xr, w))

    def agrees():
        w, x = _random(0, (out_features, in_features), (rows, in_features))
        packed = ops._reorder_linear_weight(w)
        return torch.equal(F.linear(x[:r], w), ops._linear_pointwise(x[:r], packed, None, "none", [], ""))

    return (_decided(_FASTER, "faster", (out_features, in_features, timed), faster)
            and _decided(_AGREES, "agrees", (out_features, in_features, r), agrees))


def _c_product_agrees(kind: str, out_features: int, in_features: int, n: int, rows: int, take) -> bool:
    """Whether torch's ``kind`` product at ``n`` of ``rows`` rows (random inputs) equals ``take(x, w, out, beta)``'s,
    written into ``out`` (zeros, or the residual for ``addmm``, with beta 1)."""
    w, x, r = _random(2, (out_features, in_features), (rows, in_features), (rows, out_features))
    want = _product(kind, x[:n], w, None if kind == "linear" else r[:n])
    got = take(x[:n], w, torch.zeros(n, out_features) if kind == "linear" else r[:n].clone(),
               0.0 if kind == "linear" else 1.0)
    return torch.equal(want, got)


def sgemm_agrees(kind: str, out_features: int, in_features: int, n: int, rows: int) -> bool:
    """Whether torch's ``kind`` product (``linear``, ``addmm`` into the residual) of that shape at ``n`` of at most
    ``rows`` rows equals :func:`dsh.llm.blas.product`'s, the call the decoding step in C makes (random inputs); checked
    once per machine (:mod:`dsh.llm.decisions`), when first asked for."""
    key = (kind, out_features, in_features, n, rows)
    return blas.address() is not None and _decided(_SGEMM, "sgemm", key, lambda: _c_product_agrees(*key, blas.product))


def packed_agrees(kind: str, out_features: int, in_features: int, n: int, rows: int) -> bool:
    """Whether :func:`sgemm_agrees` holds and the same product from the weight packed ahead
    (:func:`dsh.llm.blas.packed_product`) equals it bit for bit too; checked once per machine, when first asked for."""
    key = (kind, out_features, in_features, n, rows)

    def packed(x, w, out, beta):
        return blas.packed_product(x, blas.pack(w, rows), out, beta)

    return (sgemm_agrees(*key) and blas.packed_addresses() is not None
            and _decided(_PACKED, "packed", key, lambda: _c_product_agrees(*key, packed)))


def panels_agree(kind: str, out_features: int, in_features: int, n: int, rows: int) -> int:
    """The chunk at which the decoding step's own product (:func:`dsh.llm.kernels.panel_product`) of that shape at ``n``
    of at most ``rows`` rows equals torch's ``kind`` product bit for bit (random inputs; the inputs cut into
    :data:`PANEL_CUTS` equal chunks, the first cut that agrees taken: MKL sums an inner dimension of 384 as two chunks
    of 192 on an AMD Zen 4), or 0 where none does or the kernels have no panel product; checked once per machine and
    kernels' build (:mod:`dsh.llm.decisions`), when first asked for."""
    lib = kernels.load()
    if not kernels.has_panels(lib):
        return 0
    key = (kind, out_features, in_features, n, rows, lib.build)

    def decide():
        for cut in PANEL_CUTS:
            chunk = -(-in_features // cut)
            if chunk >= 2 and _c_product_agrees(kind, out_features, in_features, n, rows, lambda x, w, out, beta, c=chunk: (
                    kernels.panel_product(lib, x, kernels.panel_pack(lib, w), out, beta, c))):
                return chunk
        return 0

    return _decided(_PANELS, "panels", key, decide)


_PARTS: dict = {}    # (kind, out, in, rows, most rows, parts, packed) -> whether the product in parts equals torch's


def parts_of(n: int, parts: int) -> list:
    """The row ranges ``(start, stop)`` of ``n`` rows cut into ``parts`` parts as the decoding step in C cuts them
    (``decode_step``: part k holds rows ``n k // parts`` to ``n (k + 1) // parts - 1``)."""
    return [(n * k // parts, n * (k + 1) // parts) for k in range(parts)]


def parts_agree(kind: str, out_features: int, in_features: int, n: int, rows: int, parts: int, packed: bool) -> bool:
    """Whether torch's ``kind`` product of that shape at ``n`` of at most ``rows`` rows equals, bit for bit, the same
    product taken in ``parts`` parts of its rows (:func:`parts_of`), each on one thread by the call the decoding step
    in C makes (``sgemm_``, or from the weight packed ahead with ``packed``: :func:`sgemm_agrees`,
    :func:`packed_agrees`); random inputs, checked once per machine (:mod:`dsh.llm.decisions`), when first asked for."""
    key = (kind, out_features, in_features, n, rows, parts, packed)

    def in_parts(x, w, out, beta):
        p = blas.pack(w, rows) if packed else None
        with one_thread():
            for a, b in parts_of(x.shape[0], parts):
                if b > a:
                    if packed:
                        blas.packed_product(x[a:b], p, out[a:b], beta)
                    else:
                        blas.product(x[a:b], w, out[a:b], beta)
        return out

    ways = packed_agrees if packed else sgemm_agrees
    return ways(kind, out_features, in_features, n, rows) and _decided(
        _PARTS, "parts", key, lambda: _c_product_agrees(kind, out_features, in_features, n, rows, in_parts))


def plan(out_features: int, in_features: int, rows: int) -> frozenset:
    """The row counts ``1 .. rows`` at which :func:`uses_onednn` sends a product of that shape to oneDNN."""
    return frozenset(r for r in range(1, rows + 1) if uses_onednn(out_features, in_features, r, rows))


_SPLITS: dict = {}   # (kind, out, in, row count, rows) -> the first piece's rows, ONE_THREAD or None
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


def split_of(full, pieces, n: int):
    """None where ``full(n)`` (a product of ``n`` rows) gives the same bits on one thread as on two; else the first
    piece's rows ``head`` (the largest multiple of four below ``n``) where ``pieces(n, head)`` (the same product in two
    pieces, :func:`_pieces`) equals ``full(n)``'s two-thread result on either thread count, else :data:`ONE_THREAD`.
    torch's threads are set to one and two for the check, then restored."""
    was = torch.get_num_threads()
    try:
        got = {}
        for t in (1, 2):
            torch.set_num_threads(t)
            got[t] = full(n)
        if torch.equal(got[1], got[2]):
            return None
        head = (n - 1) // 4 * 4
        split = head and all(_same(pieces, n, head, got[2], t) for t in (1, 2))
        return head if split else ONE_THREAD
    finally:
        torch.set_num_threads(was)


def row_splits(full, pieces, rows: int) -> dict:
    """:func:`split_of` at every row count ``1 .. rows`` where it is not None."""
    return {n: s for n in range(1, rows + 1) if (s := split_of(full, pieces, n)) is not None}


def _same(pieces, n, head, want, threads) -> bool:
    torch.set_num_threads(threads)
    return torch.equal(pieces(n, head), want)


def split_at(kind: str, out_features: int, in_features: int, n: int, rows: int):
    """:func:`split_of` torch's ``kind`` product (``linear``: ``x @ w.T``; ``addmm``: ``r + x @ w.T``) of that shape
    at ``n`` of at most ``rows`` rows, on random inputs; checked once per machine (:mod:`dsh.llm.decisions`), when first
    asked for."""
    key = (kind, out_features, in_features, n, rows)

    def split():
        w, x, r = _random(1, (out_features, in_features), (rows, in_features), (rows, out_features))
        r = r if kind == "addmm" else None
        return split_of(lambda m: _product(kind, x[:m], w, None if r is None else r[:m]),
                        lambda m, head: _pieces(kind, x[:m], w, None if r is None else r[:m], head), n)

    return _decided(_SPLITS, "splits", key, split)


def thread_splits(kind: str, out_features: int, in_features: int, rows: int) -> dict:
    """:func:`split_at` at every row count ``1 .. rows`` where it is not None."""
    return {n: s for n in range(1, rows + 1) if (s := split_at(kind, out_features, in_features, n, rows)) is not None}


class Products:
    """``x @ w.T + b`` for the weights of one :meth:`dsh.llm.kernel_engine.KernelDecoder.generate` (the live weights),
    at up to ``rows`` rows: at each row count, in two pieces (or on one thread) where :func:`split_at` says so, else by
    oneDNN (the weight packed once) where :func:`uses_onednn` says so, else by torch; each weight's way at a row count
    decided when that row count first comes. ``log``: a list that every product appends ``(rows, flops, seconds)`` to
    (for ``dsh bench``), or None."""

    def __init__(self, rows: int, log: list | None = None):
        self.rows, self.log = rows, log
        self._ways: dict = {}        # (kind, id(w), rows) -> ("pieces", head), ("onednn", packed) or ("torch",)
        self._weights: dict = {}     # id(w) -> w (kept alive, so that no id is reused) and its packed form

    def prepare(self, w: torch.Tensor) -> None:
        """Take ``w`` as one of this generate's weights (held here, so that its id names it alone)."""
        self._weights[id(w)] = [w, None]

    def in_c(self, kind: str, w: torch.Tensor, n: int) -> bool:
        """Whether the decoding step in C may take this ``kind`` product of ``w`` at ``n`` rows through torch's
        ``sgemm_``: it is not split (:func:`split_at`) and :func:`sgemm_agrees`. Where the step in Python would take
        oneDNN's product, that product equals torch's bit for bit (:func:`uses_onednn`), so the C step's equals it
        too: one C call a step with MKL's products ran 1.09x (1.01-1.21x) the Python step with oneDNN's at 256 rows
        x 200 tokens on an AMD Zen 4, where oneDNN is the faster library alone."""
        return (self._way(kind, n, w)[0] in ("torch", "onednn") and n <= self.rows
                and sgemm_agrees(kind, *w.shape, n, self.rows))

    def packed(self, kind: str, w: torch.Tensor, n: int) -> bool:
        """Whether :meth:`in_c` holds and the C step may take this product from the weight packed ahead
        (:func:`packed_agrees`)."""
        return self.in_c(kind, w, n) and packed_agrees(kind, *w.shape, n, self.rows)

    def panels(self, kind: str, w: torch.Tensor, n: int) -> int:
        """Where :meth:`in_c` holds and the decoding step's own product gives torch's bits (:func:`panels_agree`),
        its chunk; else 0."""
        return panels_agree(kind, *w.shape, n, self.rows) if self.in_c(kind, w, n) else 0

    def in_parts(self, kind: str, w: torch.Tensor, n: int, parts: int, packed: bool) -> bool:
        """Whether :meth:`in_c` holds and the C step may take this product in ``parts`` parts of its ``n`` rows, each
        on one thread (from the packed weight with ``packed``): :func:`parts_agree`."""
        return self.in_c(kind, w, n) and parts_agree(kind, *w.shape, n, self.rows, parts, packed)

    def _way(self, kind: str, n: int, w) -> tuple:
        key = (kind, id(w), n)
        way = self._ways.get(key)
        if way is None:
            out, inn = w.shape
            if n > self.rows:                       # beyond the rows probed: torch's product
                way = ("torch",)
            elif (head := split_at(kind, out, inn, n, self.rows)) is not None:
                way = ("pieces", head)
            elif kind == "linear" and uses_onednn(out, inn, n, self.rows):
                held = self._weights.setdefault(id(w), [w, None])
                if held[1] is None:
                    held[1] = torch.ops.mkldnn._reorder_linear_weight(w)
                way = ("onednn", held[1])
            else:
                way = ("torch",)
            self._ways[key] = way
        return way

    def linear(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None,
               out: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ w.T (+ b)`` (with a bias: torch's product); without a bias, by torch's product, written into ``out``
        (``[rows, out_features]``, contiguous) where given: the same bits as a fresh result."""
        way = ("torch",) if b is not None else self._way("linear", x.shape[0], w)     # (its first time: decided here, untimed)
        t = time.perf_counter() if self.log is not None else 0.0
        if way[0] == "pieces":
            y = _pieces("linear", x, w, None, way[1])
        elif way[0] == "onednn":
            y = torch.ops.mkldnn._linear_pointwise(x, way[1], None, "none", [], "")
        elif b is None and out is not None:
            y = torch.mm(x, w.t(), out=out)
        else:
            y = F.linear(x, w, b)
        if self.log is not None:
            self.log.append((x.shape[0], 2 * x.shape[0] * w.numel(), time.perf_counter() - t))
        return y

    def add_linear(self, r: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """``r + x @ w.T`` as one ``addmm`` (the residual sums of the output and down projections), into ``r`` itself
        (the same bits as ``torch.addmm``'s fresh result); in two pieces (or on one thread), as a new tensor, where
        :func:`split_at` says so."""
        way = self._way("addmm", x.shape[0], w)
        t = time.perf_counter() if self.log is not None else 0.0
        y = _pieces("addmm", x, w, r, way[1]) if way[0] == "pieces" else r.addmm_(x, w.t())
        if self.log is not None:
            self.log.append((x.shape[0], 2 * x.shape[0] * w.numel(), time.perf_counter() - t))
        return y
