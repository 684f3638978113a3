"""Cohen's kappa against a second route (arrays of readings) and against known truth by simulation."""

import numpy as np
import pytest

from dsh.core.agreement import cohen_kappa


def _from_arrays(x, y):
    x, y = np.asarray(x, bool), np.asarray(y, bool)
    po = np.mean(x == y)
    pe = x.mean() * y.mean() + (1 - x.mean()) * (1 - y.mean())
    return (po - pe) / (1 - pe), po, pe


def _counts(x, y):
    x, y = np.asarray(x, bool), np.asarray(y, bool)
    return int(np.sum(x & y)), int(np.sum(x & ~y)), int(np.sum(~x & y)), int(np.sum(~x & ~y))


def test_kappa_equals_the_array_route_and_the_textbook_cases():
    rng = np.random.default_rng(0)
    for _ in range(20):
        x = rng.random(300) < rng.random()
        y = np.where(rng.random(300) < rng.random(), x, rng.random(300) < 0.5)
        k, po, pe = _from_arrays(x, y)
        r = cohen_kappa(*_counts(x, y))
        assert r["kappa"] == pytest.approx(k) and r["observed"] == pytest.approx(po) and r["chance"] == pytest.approx(pe)
    assert cohen_kappa(50, 0, 0, 50)["kappa"] == 1.0                      # perfect agreement
    assert cohen_kappa(25, 25, 25, 25)["kappa"] == pytest.approx(0.0)     # agreement at chance
    assert cohen_kappa(0, 50, 50, 0)["kappa"] == -1.0
    # a high agreement rate that is all chance: both say "yes" 90 % of the time, independently
    r = cohen_kappa(81, 9, 9, 1)
    assert r["observed"] == pytest.approx(0.82) and r["chance"] == pytest.approx(0.82) and r["kappa"] == pytest.approx(0)
    assert cohen_kappa(0, 0, 0, 0)["kappa"] is None and cohen_kappa(10, 0, 0, 0)["kappa"] is None


def test_interval_covers_the_true_kappa_about_95_percent_of_the_time():
    """Two readings with a known kappa (the second copies the first with probability c, else draws "yes" with the
    first's rate p: kappa = c exactly); the interval's coverage over 2,000 simulated samples of 400 items."""
    rng = np.random.default_rng(1)
    for c, p in ((0.8, 0.6), (0.3, 0.5)):
        hits = 0
        for _ in range(2000):
            x = rng.random(400) < p
            y = np.where(rng.random(400) < c, x, rng.random(400) < p)
            lo, hi = cohen_kappa(*_counts(x, y))["kappa_ci"]
            hits += lo <= c <= hi
        assert 0.93 <= hits / 2000 <= 0.97, (c, p, hits / 2000)


def test_bad_counts_are_one_line_errors():
    with pytest.raises(ValueError, match="counts must be non-negative integers"):
        cohen_kappa(1, -1, 0, 0)
    with pytest.raises(ValueError, match="counts must be"):
        cohen_kappa(1.5, 0, 0, 0)


def test_cell_puts_each_item_where_cohen_kappa_reads_it():
    from dsh.core.agreement import cell, cohen_kappa

    items = [(True, True)] * 5 + [(True, False)] * 2 + [(False, True)] * 1 + [(False, False)] * 4
    counts = [0, 0, 0, 0]
    for a, b in items:
        counts[cell(a, b)] += 1
    assert counts == [5, 2, 1, 4]
    assert cohen_kappa(*counts)["observed"] == sum(a == b for a, b in items) / len(items)
