"""Lemma 3.1, Corollary 3.1, Lemma 3.2, Theorems 3.1 and 3.2 against autograd (exact enumeration)."""

import numpy as np
import pytest
import torch

from dsh import mdp as M


@pytest.fixture(scope="module")
def setup():
    m = M.FiniteTwoStageMDP(seed=0)
    return m, m.init_theta(), m.init_theta(seed=123)


def test_lemma_3_1_factorization(setup):
    m, th, _ = setup
    chain = torch.stack([m.log_prob(th, t) for t in m.trajectories])
    fact = torch.stack([m.log_prob_factorized(th, t) for t in m.trajectories])
    assert torch.allclose(chain, fact, atol=1e-12)
    assert fact.exp().sum().item() == pytest.approx(1.0, abs=1e-12)


def test_corollary_3_1(setup):
    m, th, _ = setup
    for t in m.trajectories[::7]:
        total, gs, gd = M.score_decomposition(m, th, t)
        assert torch.allclose(total, gs + gd, atol=1e-12)
        assert gs.abs().sum() > 0


@pytest.mark.parametrize("gamma", [1.0, 0.9, 0.5])
def test_lemma_3_2(setup, gamma):
    m, th, _ = setup
    g = M.reward_gradient(m, th, gamma)
    assert torch.allclose(g.autograd, g.sample + g.decision, atol=1e-12)
    assert g.autograd.abs().max() > 1e-3
    assert g.decision.abs().max() > 1e-4
    if gamma == 1.0:
        assert torch.allclose(g.autograd, g.paper_form, atol=1e-12)
    else:  # the printed form lacks the gamma^t weight
        assert (g.autograd - g.paper_form).abs().max() > 1e-3


def test_theorem_3_1_surrogate(setup):
    m, th, ref = setup
    g = M.surrogate_gradient(m, th)
    assert torch.allclose(g.autograd, g.sample + g.decision, atol=1e-12)
    assert torch.allclose(g.autograd, g.paper_form, atol=1e-12)
    g2 = M.surrogate_gradient(m, th, theta_old=ref)  # off-policy: ratio != 1
    assert torch.allclose(g2.autograd, g2.sample + g2.decision, atol=1e-12)
    assert torch.allclose(g2.autograd, g2.paper_form, atol=1e-12)
    assert g2.objective != pytest.approx(g.objective)


@pytest.mark.parametrize("gamma", [1.0, 0.8])
def test_theorem_3_2_kl_gradient(setup, gamma):
    m, th, ref = setup
    g = M.kl_gradient(m, th, ref, gamma)
    assert g.objective > 0  # a KL divergence between different policies
    assert torch.allclose(g.autograd, g.sample + g.decision, atol=1e-10)
    zero = M.kl_gradient(m, th, th, gamma)
    assert zero.objective == pytest.approx(0.0, abs=1e-12)
    assert zero.autograd.abs().max() < 1e-12


def test_theorem_3_2_option_bellman(setup):
    m, th, ref = setup
    rows = np.array(M.option_bellman_kl(m, th, ref))
    assert len(rows) > 100
    np.testing.assert_allclose(rows[:, 0], rows[:, 1], atol=1e-12)
    np.testing.assert_allclose(rows[:, 2], rows[:, 3], atol=1e-12)
    assert np.abs(rows[:, 0]).max() > 0.1


def test_kl_immediate_penalty_grows_linearly_with_attempt_length():
    es, ed = [], []
    for L in range(1, 6):
        m = M.FiniteTwoStageMDP(attempt_length=L, max_attempts=2, stationary=True, seed=0)
        a, b = M.expected_immediate_kl(m, m.init_theta(), m.init_theta(seed=100))
        es.append(a)
        ed.append(b)
    inc = np.diff(es[1:])
    assert (inc > 0).all() and inc.max() / inc.min() < 2.0
    ratio = np.array(es) / np.array(ed)
    assert ratio[-1] > 2 * ratio[0]


def test_clipping_ratio_factorizes(setup):
    m, th, ref = setup
    for t in m.trajectories[::5]:
        total, s, r, st = M.ratio_factors(m, th, ref, t)
        assert total == pytest.approx(s * r * st, rel=1e-10)


def test_same_seed_same_model():
    a = M.FiniteTwoStageMDP(seed=3)
    b = M.FiniteTwoStageMDP(seed=3)
    assert torch.equal(a.init_theta(), b.init_theta())
    t = a.trajectories[10]
    assert torch.equal(a.log_prob(a.init_theta(), t), b.log_prob(b.init_theta(), t))
    c = M.FiniteTwoStageMDP(seed=4)
    assert not torch.equal(a.log_prob(a.init_theta(), t), c.log_prob(c.init_theta(), t))


@pytest.mark.parametrize("kwargs,name", [
    (dict(vocab_size=1), "vocab_size"), (dict(attempt_length=0), "attempt_length"),
    (dict(max_attempts=-2), "max_attempts"), (dict(seed=-1), "seed"),
])
def test_bad_mdp_arguments(kwargs, name):
    with pytest.raises(ValueError, match=f"^{name} must be"):
        M.FiniteTwoStageMDP(**kwargs)


def test_bad_gamma_and_size():
    m = M.FiniteTwoStageMDP()
    for g in (0.0, 1.5, -1):
        with pytest.raises(ValueError, match=r"^gamma must be a discount factor in \(0, 1\]"):
            M.reward_gradient(m, m.init_theta(), g)
    with pytest.raises(ValueError, match="trajectories"):
        M.FiniteTwoStageMDP(vocab_size=10, attempt_length=4, max_attempts=3)
