"""Lemma 3.1, Corollary 3.1, Lemma 3.2, Theorems 3.1 and 3.2 against autograd (exact enumeration)."""

import finite_policy as FP
import numpy as np
import pytest
import torch

from dsh.theory import bellman as B
from dsh.theory import clipping as C
from dsh.theory import mdp as M


@pytest.fixture(scope="module")
def setup():
    m = M.FiniteTwoStageMDP(seed=0)
    return m, m.init_theta(), m.init_theta(seed=123)
@pytest.mark.slow   # several seconds: make check leaves it out, make test runs it
def test_lemma_3_1_factorization_against_an_ancestral_sampler(setup):
    """Lemma 3.1: P(tau) as the product of pi_sample and pi_d (dsh) against the frequencies of 40,000
    trajectories drawn token by token by an independent sampler (tests/finite_policy.py). Fails if a factor
    is missing or wrong (e.g. the STOP probability dropped: the probabilities would no longer sum to 1 and
    the frequencies of early-stopping trajectories would disagree)."""
    m, th, _ = setup
    p = torch.stack([m.log_prob_factorized(th, t) for t in m.trajectories]).exp().numpy()
    assert p.sum() == pytest.approx(1.0, abs=1e-12)
    n = 20_000
    draws = FP.sample(m, th.numpy(), n, seed=11)
    index = {(t.attempts, t.decisions): i for i, t in enumerate(m.trajectories)}
    freq = np.bincount([index[d] for d in draws], minlength=len(p)) / n
    z = np.abs(freq - p) / np.sqrt(p * (1 - p) / n)
    assert z.max() < 4.5, z.max()
    # and token by token, with the independent softmax
    indep = np.array([FP.log_prob(m, th.numpy(), t) for t in m.trajectories])
    np.testing.assert_allclose(np.log(p), indep, atol=1e-12)


def test_corollary_3_1_against_finite_differences(setup):
    """Corollary 3.1: the sampling and decision parts of grad log P(tau) (dsh, autograd on the token stream)
    are the finite-difference derivatives of the independent log P(tau) when only the sampling parameters,
    or only the decision parameters, move. Fails if a token is attributed to the wrong part."""
    m, th, _ = setup
    t0 = th.numpy()
    for t in m.trajectories[::9]:
        total, gs, gd = M.score_decomposition(m, th, t)
        fd_s = FP.finite_difference(lambda x, t=t: FP.log_prob(m, x, t, theta_decision=t0), t0)
        fd_d = FP.finite_difference(lambda x, t=t: FP.log_prob(m, t0, t, theta_decision=x), t0)
        np.testing.assert_allclose(gs.numpy(), fd_s, atol=1e-7)
        np.testing.assert_allclose(gd.numpy(), fd_d, atol=1e-7)
        np.testing.assert_allclose(total.numpy(), fd_s + fd_d, atol=1e-7)
        assert np.abs(fd_s).max() > 1e-3


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


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_theorem_3_1_q_values_are_one_continuation(setup, gamma):
    """Theorem 3.1 with Q-values as exact conditional expectations (dsh.theory.bellman.surrogate_q): every immediate
    reward is 0, so Q_sample and Q_d are gamma times one continuation value (the shared Phi), and these Q
    give the policy gradient: sum_tau P(tau) sum_t gamma^t Q_t grad log pi_t equals autograd of
    E[gamma^t_end A] = grad J. Fails if the discount gamma^(t_end - t) or the sign of A is wrong."""
    m, th, _ = setup
    s = B.surrogate_q(m, th, gamma)
    assert np.abs(s.immediate).max() < 1e-12
    assert np.abs(s.q).max() > 0.1
    theta = th.clone().requires_grad_(True)
    baseline = float(M.expected_return(m, th, 1.0))
    total, objective, i = 0.0, 0.0, 0
    for n, tr in enumerate(m.trajectories):
        st = m.steps(theta, tr)
        for step in st:
            assert s.traj[i] == n
            total = total + s.weight[i] * gamma ** step.t * s.q[i] * step.logp
            i += 1
        logp = torch.stack([x.logp for x in st]).sum()
        objective = objective + logp.exp() * gamma ** st[-1].t * (m.reward(tr) - baseline)
    pg = torch.autograd.grad(total, theta, retain_graph=True)[0]
    grad = torch.autograd.grad(objective, theta)[0]
    np.testing.assert_allclose(pg.numpy(), grad.numpy(), atol=1e-12)
    assert np.abs(grad.numpy()).max() > 1e-3


def test_theorem_3_1_printed_form_is_a_realized_value(setup):
    """The printed Q = gamma^(sum len) A_i is the value one trajectory realizes. It equals the conditional
    expectation at a STOP (nothing random is left) and not after a RESAMPLE (the next attempt is random):
    the counterexample the chapter shows."""
    m, th, _ = setup
    s = B.surrogate_q(m, th, 1.0)
    decision = s.kind == "decision"
    gap = s.realized - s.q
    last = np.r_[s.traj[1:] != s.traj[:-1], True]          # the last step of each trajectory is its STOP
    assert np.abs(gap[decision & last]).max() < 1e-12
    assert np.abs(gap[decision & ~last]).max() > 0.1


def test_surrogate_gradient_is_grad_j_off_policy(setup):
    """The importance-weighted surrogate has gradient grad J for any theta_old (its baseline is a constant):
    autograd of the surrogate against autograd of the exact expected reward, on- and off-policy."""
    m, th, ref = setup
    g = M.surrogate_gradient(m, th)
    g2 = M.surrogate_gradient(m, th, theta_old=ref)
    assert torch.allclose(g.autograd, g.paper_form, atol=1e-12)
    assert torch.allclose(g2.autograd, g2.paper_form, atol=1e-12)
    assert g2.objective != pytest.approx(g.objective)
    assert g.autograd.abs().max() > 1e-3


@pytest.mark.parametrize("eps", [0.2, 0.1])
def test_clipping_remark_holds_per_sequence_and_fails_per_token(setup, eps):
    """The clipping remark: with one ratio per trajectory (sequence level) every token of a trajectory gets
    the same weight, clipped or not, so the balance of Theorem 3.1 survives; with GRPO's per-token ratios
    some trajectories have tokens clipped to weight 0 next to tokens that are not. The weights are
    derivatives by autograd, and sum_t w_t grad log pi_t must give autograd's gradient of the objective."""
    m, th, ref = setup
    old = th + 0.5 * (ref - th)
    seq = C.clipped_weights(m, th, old, eps, "sequence")
    tok = C.clipped_weights(m, th, old, eps, "token")
    for c in (seq, tok):
        np.testing.assert_allclose(c.gradient, c.sample + c.decision, atol=1e-12)
    assert seq.spread_mass() == 0.0 and seq.partly_clipped_mass() == 0.0
    assert sum(w for w, s in zip(seq.weight, seq.sample_w) if (s == 0).all()) > 0.01  # clipping is active
    assert tok.partly_clipped_mass() > 0.05
    unclipped = C.clipped_weights(m, th, old, None, "sequence")
    assert np.abs(unclipped.gradient - seq.gradient).max() > 1e-3


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


def test_kl_immediate_rewards_are_the_independent_log_ratios(setup):
    """Definition 3.1's split Q = r + gamma E[Q_next] (dsh.theory.bellman) applied to the exact KL Q-values recovers
    the per-token log-ratios computed independently (tests/finite_policy.py); applied to the surrogate it
    recovers zeros (test above): one rule, two verdicts."""
    m, th, ref = setup
    k = B.kl_q(m, th, ref, 0.9)
    indep = []
    for t in m.trajectories:
        a = FP.token_logps(m, th.numpy(), th.numpy(), t.attempts, t.decisions)
        b = FP.token_logps(m, ref.numpy(), ref.numpy(), t.attempts, t.decisions)
        indep += [x[1] - y[1] for x, y in zip(a, b)]
    np.testing.assert_allclose(k.immediate, indep, atol=1e-12)
    assert np.abs(indep).max() > 0.1


def _immediate_kl_sweep(**kw):
    return B.immediate_kl_by_length(range(1, 6), seed=0, **kw)


@pytest.mark.parametrize("decay", [None, 0.3])
def test_immediate_kl_by_length_against_a_direct_sum_over_trajectories(decay):
    """The one implementation (Bellman split's immediate rewards, summed per attempt) against a plain loop over
    every trajectory: each attempt's token penalties summed, each non-forced decision's penalty, probability-weighted."""
    es, ed = B.immediate_kl_by_length([1, 2, 3], seed=4, position_decay=decay)
    for L, a, b in zip([1, 2, 3], es, ed):
        m = M.FiniteTwoStageMDP(attempt_length=L, max_attempts=2, stationary=True, seed=4,
                                **({} if decay is None else {"position_decay": decay}))
        theta, ref = m.init_theta(), m.init_theta(seed=104)
        steps, logp = M.enumerate_steps(m, theta)
        s_tot = d_tot = s_cnt = d_cnt = 0.0
        for w, tr, st in zip(logp.exp().tolist(), m.trajectories, steps):
            d, _ = M.kl_penalties(m, theta, ref, tr)
            for k in range(1, st[-1].k + 1):
                idx = [i for i, s in enumerate(st) if s.k == k]
                s_tot, s_cnt = s_tot + w * sum(d[i] for i in idx[:-1]), s_cnt + w
                if k < m.max_attempts:
                    d_tot, d_cnt = d_tot + w * d[idx[-1]], d_cnt + w
        assert abs(a - s_tot / s_cnt) < 1e-12 and abs(b - d_tot / d_cnt) < 1e-12


def test_kl_gradient_ratios_spread_and_match_one_policy_at_a_time():
    r = M.kl_gradient_ratios(3, seed=7)
    m = M.FiniteTwoStageMDP(attempt_length=3, max_attempts=2, stationary=True, seed=8)
    g = M.kl_gradient(m, m.init_theta(), m.init_theta(seed=108))
    assert r.shape == (3,) and abs(r[1] - float(g.sample.norm() / g.decision.norm())) < 1e-12
@pytest.mark.slow   # several seconds: make check leaves it out, make test runs it
def test_kl_immediate_penalty_is_linear_in_l_only_for_a_stationary_policy():
    """Theorem 3.2's |d_sample| / |d_decision| ~ L_k holds for a stationary token policy (equal increments
    per token) and fails without it: with the position-decaying policy the increments shrink geometrically
    and the ratio stays bounded (Definition 3.1 would call that balanced)."""
    es, ed = _immediate_kl_sweep()
    inc = np.diff(es[1:])
    assert (inc > 0).all() and inc.max() / inc.min() < 2.0
    assert (es / ed)[-1] > 2 * (es / ed)[0]
    es2, ed2 = _immediate_kl_sweep(position_decay=0.3)
    inc2 = np.diff(es2)
    assert inc2[-1] < 0.05 * inc2[0]
    assert (es2 / ed2)[-1] < 1.2 * (es2 / ed2)[1]


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
    (dict(max_attempts=-2), "max_attempts"), (dict(seed=-1), "seed"), (dict(position_decay=0.0), "position_decay"),
    (dict(position_decay=1.5), "position_decay"),
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
