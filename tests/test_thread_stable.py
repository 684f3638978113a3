"""The training passes' LM-head products round the same on one thread as on two (dsh.llm.thread_stable): MKL
computes a few row counts (on an AMD Zen 4: 5-7 and 9-11) in another order with a second thread; inside
``ThreadStable`` those products are taken in pieces that give the two-thread result on either thread count, or on
one thread where no split gives it."""

import pytest
import torch

from dsh.llm import thread_stable
from dsh.llm.thread_stable import ThreadStable

ROWS = thread_stable.MAX_ROWS


def _on(threads: int, f):
    was = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return f()
    finally:
        torch.set_num_threads(was)


def _head_forward(x, w, buf):
    """TRL's forward tile: ``torch.mm(hidden, weight.T, out=tile)``, the tile a slice of a wider buffer."""
    tile = buf[:x.shape[0], :w.shape[0]]
    torch.mm(x, w.t(), out=tile)
    return tile.clone()


def _head_backward(x, w, buf):
    """TRL's backward: ``grad_hidden.addmm_(tile, weight)``, the tile a slice of a wider buffer."""
    tile = buf[:x.shape[0], :w.shape[0]]
    tile.copy_(x[:, :w.shape[0]])
    acc = torch.ones(x.shape[0], w.shape[1])
    return acc.addmm_(tile, w)


@pytest.mark.parametrize("form", [_head_forward, _head_backward])
def test_inside_thread_stable_every_row_count_gives_the_two_thread_product_on_one_thread(form):
    """Fails if a row count where torch's product depends on the threads is not split, or a split (or an untouched
    call) gives other bits than torch's two-thread product."""
    g = torch.Generator().manual_seed(5)
    w, x, buf = torch.randn(68, 128, generator=g), torch.randn(ROWS, 128, generator=g), torch.empty(ROWS, 4096)
    torch_own = {t: [_on(t, lambda n=n: form(x[:n], w, buf)) for n in range(1, ROWS + 1)] for t in (1, 2)}

    def stable(n):
        with ThreadStable():
            return form(x[:n], w, buf)
    mine = {t: [_on(t, lambda n=n: stable(n)) for n in range(1, ROWS + 1)] for t in (1, 2)}
    differ = {n for n in range(1, ROWS + 1) if not torch.equal(torch_own[1][n - 1], torch_own[2][n - 1])}
    split = {n: head for (op, *_), found in thread_stable._FOUND.items() for n, head in found.items()
             if op == ("mm" if form is _head_forward else "addmm_")}
    assert differ <= set(split)
    for n in range(1, ROWS + 1):         # the two-thread product, or the one-thread one where no split gives it
        want = torch_own[1 if split.get(n) == thread_stable.ONE_THREAD else 2][n - 1]
        assert torch.equal(mine[1][n - 1], want) and torch.equal(mine[2][n - 1], want), n


@pytest.mark.parametrize("threads", [1, 2])
def test_calls_thread_stable_does_not_take_are_torchs_own(threads):
    """bfloat16 operands, a scaled addmm_ (passed through) and more rows than MAX_ROWS (on one thread): torch's own
    bits on either thread count (its product of those rows gives the same on one thread as on two)."""
    g = torch.Generator().manual_seed(6)
    w = torch.randn(68, 128, generator=g)
    x = torch.randn(ROWS + 5, 128, generator=g)
    acc, tile = torch.randn(6, 128, generator=g), torch.randn(6, 68, generator=g)

    def calls():
        return (torch.mm(x, w.t()), torch.mm(x[:6].bfloat16(), w.t().bfloat16()),
                acc.clone().addmm_(tile, w, beta=0.5))

    def stable():
        with ThreadStable():
            return calls()
    for a, b in zip(_on(threads, stable), _on(threads, calls)):
        assert torch.equal(a, b)


def _trl_head(n, threads):
    """TRL's chunked head (log-probabilities and entropies, their gradients) over n tokens, on ``threads``."""
    import trl.trainer.utils as trl_utils

    g = torch.Generator().manual_seed(7)
    h = torch.randn(n, 128, generator=g).requires_grad_()
    w = (0.3 * torch.randn(68, 128, generator=g)).requires_grad_()
    targets = torch.randint(0, 68, (n,), generator=g)

    def run():
        lp, ent, *_ = trl_utils._ChunkedLogProbFunction.apply(h, w, None, targets, 1.0, 32768, None, 1.0,
                                                               ("entropy",))
        (0.7 * lp.sum() + 0.1 * ent.sum()).backward()
        return lp.detach(), ent.detach(), h.grad.clone(), w.grad.clone()
    return _on(threads, run)


@pytest.mark.parametrize("n", [6, 10, 4096 + 9])
def test_grpos_lm_head_gives_its_two_thread_values_and_gradients_on_one_thread(n):
    """Inside trl_lm_head (what every training run runs in), TRL's chunked head over n tokens
    (its last chunk of n mod 4096 rows) gives the same log-probabilities, entropies and gradients on one thread as
    on two, each those of torch's own path on two threads or (where no split gives those: the weight gradient over
    4,096 rows on an Intel Xeon) on one; on leaving, TRL's function is back."""
    import trl.trainer.utils as trl_utils

    from dsh.llm.thread_stable import trl_lm_head

    before = trl_utils._ChunkedLogProbFunction
    ref = {t: _trl_head(n, t) for t in (1, 2)}
    with trl_lm_head():
        assert trl_utils._ChunkedLogProbFunction is not before
        got = {t: _trl_head(n, t) for t in (1, 2)}
    assert trl_utils._ChunkedLogProbFunction is before
    assert all(torch.equal(a, b) for a, b in zip(got[1], got[2]))
    assert all(torch.equal(a, b2) or torch.equal(a, b1) for a, b1, b2 in zip(got[1], ref[1], ref[2]))


def test_without_trls_chunked_head_the_whole_step_runs_thread_stable(monkeypatch):
    """Another TRL (no ``_ChunkedLogProbFunction``): the block runs under ThreadStable as a whole."""
    import trl.trainer.utils as trl_utils

    from dsh.llm.thread_stable import trl_lm_head

    monkeypatch.delattr(trl_utils, "_ChunkedLogProbFunction")
    g = torch.Generator().manual_seed(8)
    w, x, buf = torch.randn(68, 128, generator=g), torch.randn(6, 128, generator=g), torch.empty(6, 4096)
    want = _on(2, lambda: _head_forward(x, w, buf))
    with trl_lm_head():
        assert torch.equal(_on(1, lambda: _head_forward(x, w, buf)), want)
