"""The two-stage accuracy formula: derived from the Markov chain, checked by Monte Carlo."""

import math

import numpy as np
import pytest
import sympy as sp

import dsh
from dsh.theory import symbolic as th

SETTINGS = [(0.8, 0.95, 0.5), (0.2, 0.95, 0.5), (0.5, 0.9, 0.0), (0.3, 0.6, 0.9), (0.05, 0.99, 0.95)]


def test_formula_is_the_absorption_probability_of_the_chain():
    chain = th.two_stage_chain()
    assert sp.simplify(chain.accuracy - th.paper_accuracy_formula()) == 0
    # rows of B are probability distributions over the absorbing states
    for i in range(3):
        assert sp.simplify(chain.B[i, 0] + chain.B[i, 1] - 1) == 0
    r = th.p_s * (1 - th.p_dC) + (1 - th.p_s) * th.p_dW
    assert sp.simplify(chain.expected_attempts - 1 / (1 - r)) == 0


@pytest.mark.parametrize("ps,pdc,pdw", SETTINGS)
def test_numeric_formula_matches_symbolic(ps, pdc, pdw):
    expr = th.two_stage_chain().accuracy
    val = float(expr.subs({th.p_s: ps, th.p_dC: pdc, th.p_dW: pdw}))
    assert dsh.predicted_accuracy(ps, pdc, pdw) == pytest.approx(val, rel=1e-12)


@pytest.mark.parametrize("i,setting", list(enumerate(SETTINGS)))
def test_monte_carlo_matches_formula(i, setting):
    ps, pdc, pdw = setting
    n = 100_000
    sim = dsh.simulate(ps, pdc, pdw, n=n, seed=i, max_attempts=2000)
    pred = dsh.predicted_accuracy(ps, pdc, pdw)
    se = math.sqrt(pred * (1 - pred) / n)
    assert abs(sim.final_correct.mean() - pred) < 4.5 * se
    assert sim.stopped.all()
    r = ps * (1 - pdc) + (1 - ps) * pdw
    assert sim.n_attempts.mean() == pytest.approx(1 / (1 - r), rel=0.05)
    # p_s is the first-candidate accuracy
    first = sim.candidates[:, 0]
    assert abs(first.mean() - ps) < 4.5 * math.sqrt(ps * (1 - ps) / n) + 1e-12


def test_simulation_is_deterministic_under_seed():
    a = dsh.simulate(0.4, 0.8, 0.7, n=1000, seed=3)
    b = dsh.simulate(0.4, 0.8, 0.7, n=1000, seed=3)
    c = dsh.simulate(0.4, 0.8, 0.7, n=1000, seed=4)
    assert np.array_equal(a.candidates, b.candidates)
    assert not np.array_equal(a.candidates, c.candidates)


def test_finite_horizon_accuracy_converges():
    assert dsh.accuracy_within(0.3, 0.9, 0.8, 1) == pytest.approx(0.3)
    vals = [dsh.accuracy_within(0.3, 0.9, 0.8, k) for k in (1, 2, 5, 20, 200)]
    assert vals[-1] == pytest.approx(dsh.predicted_accuracy(0.3, 0.9, 0.8), abs=1e-10)
    sim = dsh.simulate(0.3, 0.9, 0.8, n=100_000, seed=1, max_attempts=3)
    assert abs(sim.final_correct.mean() - dsh.accuracy_within(0.3, 0.9, 0.8, 3)) < 0.006


def test_never_stopping_process_has_zero_accuracy():
    assert dsh.predicted_accuracy(1.0, 0.0, 0.5) == 0.0
    assert dsh.predicted_accuracy(0.0, 0.5, 1.0) == 0.0
    assert dsh.predicted_accuracy(1.0, 1.0, 0.0) == 1.0


@pytest.mark.parametrize("kwargs,name", [
    (dict(p_s=1.5, p_dC=0.5, p_dW=0.5), "p_s"),
    (dict(p_s=0.5, p_dC=-0.1, p_dW=0.5), "p_dC"),
    (dict(p_s=0.5, p_dC=0.5, p_dW=float("nan")), "p_dW"),
    (dict(p_s=True, p_dC=0.5, p_dW=0.5), "p_s"),
    (dict(p_s="0.5", p_dC=0.5, p_dW=0.5), "p_s"),
])
def test_bad_probabilities_raise_naming_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name} must be a probability in \[0, 1\]"):
        dsh.predicted_accuracy(**kwargs)


def test_bad_simulation_arguments():
    with pytest.raises(ValueError, match="^n must be an integer >= 1"):
        dsh.simulate(0.5, 0.5, 0.5, n=0)
    with pytest.raises(ValueError, match="^max_attempts must be an integer >= 1"):
        dsh.simulate(0.5, 0.5, 0.5, n=10, max_attempts=-1)
    with pytest.raises(ValueError, match="^seed must be an integer >= 0"):
        dsh.simulate(0.5, 0.5, 0.5, n=10, seed=-3)
    with pytest.raises(ValueError, match="^max_attempts"):
        dsh.accuracy_within(0.5, 0.5, 0.5, 0)
