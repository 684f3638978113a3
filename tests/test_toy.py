"""The three-logit toy (Appendix C): pinned values, exact expectations, Monte Carlo, sweep, GRPO."""

import math

import numpy as np
import pytest
import torch

import dsh
from dsh.core.paper import paper_results
from dsh.theory import toy, toy_grpo

INP = toy.appendix_c_inputs()


def test_appendix_c_inputs_reproduce_the_papers_printed_probabilities():
    """The inputs read from the paper file, pushed through a sigmoid here, give the probabilities the paper
    prints (two separately printed facts that must agree)."""
    printed = paper_results()["appendix_c"]["probabilities"]
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    (s, dC, dW), (rs, rdC, rdW) = INP["theta"], INP["theta_ref"]
    mine = {"P_C": sig(s), "P_W": 1 - sig(s), "P_stop_C": sig(dC), "P_resample_W": sig(dW),
            "P_ref_C": sig(rs), "P_ref_W": 1 - sig(rs), "P_ref_stop_C": sig(rdC), "P_ref_resample_W": sig(rdW)}
    for k, v in printed.items():
        assert mine[k] == pytest.approx(v, abs=5e-5), k


def _appendix_c_by_finite_differences(theta, theta_ref, attempts, len_C, len_W, advantage, gamma):
    """An independent computation of Appendix C: log-probabilities of the actions from sigmoids, their
    derivatives by central differences, the penalties, Q-values and contributions by direct sums."""
    def logp(th, action, X):
        s, dC, dW = (1 / (1 + math.exp(-x)) for x in th)
        if action == "sample":
            return math.log(s if X == "C" else 1 - s)
        stop = action == "STOP"
        return math.log((dC if stop else 1 - dC) if X == "C" else (1 - dW if stop else dW))

    acts = []
    for k, X in enumerate(attempts):
        acts.append(("sample", X, len_C if X == "C" else len_W))
        acts.append(("STOP" if k == len(attempts) - 1 else "RESAMPLE", X, 1))
    d = [n * (logp(theta, a, X) - logp(theta_ref, a, X)) for a, X, n in acts]
    q = [sum(gamma ** (j - i) * d[j] for j in range(i, len(d))) for i in range(len(d))]
    reward, kl = np.zeros(3), np.zeros(3)
    for i, (a, X, _) in enumerate(acts):
        g = np.array([(logp(np.add(theta, e), a, X) - logp(np.subtract(theta, e), a, X)) / 2e-6
                      for e in np.eye(3) * 1e-6])
        reward += advantage * gamma ** (len(acts) - 1 - i) * g
        kl += g * q[i]
    return reward, -kl


def test_appendix_c_against_an_independent_computation():
    """dsh.theory.toy's Appendix C numbers (hand-coded derivatives, backward recursion) against finite differences
    of the log-probabilities and direct sums; also at another trajectory, lengths and gamma."""
    for kw in (INP, {**INP, "attempts": "WWC", "len_C": 3, "len_W": 11, "gamma": 0.9, "advantage": -0.7}):
        a = toy.trajectory_attribution(**kw)
        reward, drag = _appendix_c_by_finite_differences(**kw)
        for i, name in enumerate(toy.PARAMS):
            assert a.reward[name] == pytest.approx(reward[i], abs=1e-8)
            assert a.kl_drag[name] == pytest.approx(drag[i], abs=1e-8)
            assert a.net[name] == pytest.approx(reward[i] + drag[i], abs=1e-8)
    a = toy.trajectory_attribution(**INP)
    # and within 1e-3 of every number the paper prints
    printed = paper_results()["appendix_c"]
    for p in printed["net_update"]:
        k = p["parameter"]
        assert a.reward[k] == pytest.approx(p["reward"], abs=1e-3)
        assert a.kl_drag[k] == pytest.approx(p["kl"], abs=1e-3)
        assert a.net[k] == pytest.approx(p["net"], abs=1e-3)
    for r, p in zip(a.rows, printed["kl_breakdown"]):
        assert r.action == p["action"]
        assert -r.d == pytest.approx(p["d_k"], abs=2e-3)   # the paper's d has the opposite sign
        assert -r.q == pytest.approx(p["Q"], abs=2e-3)
        assert r.grad_log_pi == pytest.approx(p["grad_log_pi"], abs=1e-4)


def test_appendix_c_rounding_and_the_papers_chain():
    a = toy.trajectory_attribution(**INP, round_to=4)
    assert -a.rows[-1].d == 0.4704      # Sample W: 8 x 0.0588
    printed = list(reversed(paper_results()["appendix_c"]["kl_breakdown"]))
    q = toy.q_from_penalties([p["d_k"] for p in printed])
    for qi, p in zip(q, printed):
        assert round(qi, 4) == p["Q"]
        assert round(p["grad_log_pi"] * qi, 4) == p["contribution"]


def test_exact_expectations_agree():
    th, ref = INP["theta"], INP["theta_ref"]
    J, K, depth = toy.expected_by_enumeration(th, ref, 8, 8)
    assert depth > 5
    assert float(J) == pytest.approx(float(toy.expected_reward(th, 8, 8)), abs=1e-11)
    assert float(K) == pytest.approx(float(toy.expected_kl(th, ref, 8, 8)), abs=1e-11)
    s = torch.sigmoid(torch.tensor(th, dtype=torch.float64)).tolist()
    assert float(toy.expected_reward(th)) == pytest.approx(dsh.predicted_accuracy(*s), abs=1e-12)
    Jg, Kg, _ = toy.expected_by_enumeration(th, ref, 3, 11, gamma=0.9)
    assert float(Kg) == pytest.approx(float(toy.expected_kl(th, ref, 3, 11, 0.9)), abs=1e-11)


@pytest.mark.parametrize("lens,gamma", [((8, 8), 1.0), ((4, 12), 1.0), ((8, 8), 0.9)])
def test_expected_gradients_autograd_vs_policy_gradient(lens, gamma):
    g = toy.expected_gradients(INP["theta"], INP["theta_ref"], *lens, gamma)
    np.testing.assert_allclose(g.kl, g.kl_score + g.kl_direct, atol=1e-12)
    if lens[0] == lens[1]:
        assert np.abs(g.kl_direct).max() < 1e-12
    else:
        assert np.abs(g.kl_direct).max() > 1e-3
    # a finite difference of the closed form
    th = np.array(INP["theta"])
    for i in range(3):
        e = np.zeros(3)
        e[i] = 1e-6
        fd = (float(toy.expected_kl(th + e, INP["theta_ref"], *lens, gamma))
              - float(toy.expected_kl(th - e, INP["theta_ref"], *lens, gamma))) / 2e-6
        assert g.kl[i] == pytest.approx(fd, rel=1e-6, abs=1e-9)


def test_expected_gradients_match_monte_carlo():
    th, ref = INP["theta"], INP["theta_ref"]
    g = toy.expected_gradients(th, ref)
    mc = toy.monte_carlo_gradients(th, ref, n=100_000, seed=7)
    for name, exact in (("reward", g.reward), ("kl", g.kl), ("kl_loss_k3", g.kl_loss_k3)):
        mean, se = mc[name]
        assert np.all(np.abs(mean - exact) < 4.5 * se), name


def test_length_sweep_shapes():
    """KL attribution grows linearly in the attempt length when only immediate penalties count, and the full
    KL-in-reward ratio saturates. (The toy's reward ratio does not depend on L by construction - its discount
    is per action - so it is not tested here.)"""
    sw = toy.length_sweep(INP["theta"], INP["theta_ref"], [1, 4, 16, 64, 256, 1024])
    for k in ("kl_immediate", "kl_loss_k3"):           # linear in L
        slope = np.polyfit(np.log(sw["L"]), np.log(sw[k]), 1)[0]
        assert slope == pytest.approx(1.0, abs=0.02)
    assert sw["kl"][-1] / sw["kl"][-2] < 1.5            # the full KL-in-reward ratio saturates
    assert sw["kl_immediate"][-1] / sw["kl_immediate"][-2] > 3.5


def test_simulated_grpo_deterministic_and_differential():
    cfg = toy_grpo.ToyGRPOConfig(steps=120, seed=3)
    a, b = toy_grpo.simulate_grpo(cfg), toy_grpo.simulate_grpo(cfg)
    np.testing.assert_array_equal(a["theta"], b["theta"])
    c = toy_grpo.simulate_grpo(toy_grpo.ToyGRPOConfig(steps=120, seed=4))
    assert not np.array_equal(a["theta"], c["theta"])
    p0, p1 = 1 / (1 + np.exp(-a["theta"][0])), 1 / (1 + np.exp(-a["theta"][-1]))
    assert p1[2] - p0[2] > 0.1                   # p_dW learns
    assert a["accuracy"][-1] > a["accuracy"][0]
    rk = a["ratio_kl"][np.isfinite(a["ratio_kl"])]
    rr = a["ratio_reward"][np.isfinite(a["ratio_reward"])]
    assert np.median(rk) > 5 * np.median(rr)
    assert list(a["resets"]) == [50, 100]


def test_plot_has_six_panels():
    import matplotlib
    matplotlib.use("Agg")
    fig = toy_grpo.plot_grpo(toy_grpo.simulate_grpo(toy_grpo.ToyGRPOConfig(steps=30)), smooth=5)
    assert len(fig.axes) == 6


@pytest.mark.parametrize("kwargs,name", [
    (dict(optimizer="rmsprop"), "optimizer"), (dict(kl_placement="both"), "kl_placement"),
    (dict(group_size=1), "group_size"), (dict(lr=0.0), "lr"), (dict(steps=0), "steps"),
    (dict(kl_weight=-1.0), "kl_weight"), (dict(theta0=(1.0, 2.0)), "theta0"), (dict(len_W=0), "len_W"),
])
def test_bad_config(kwargs, name):
    with pytest.raises(ValueError, match=f"^{name} must be"):
        toy_grpo.ToyGRPOConfig(**kwargs)


def test_bad_inputs():
    with pytest.raises(ValueError, match="^attempts must be"):
        toy.trajectory_attribution(INP["theta"], INP["theta_ref"], attempts="WXC")
    with pytest.raises(ValueError, match="^theta_ref must be three finite logits"):
        toy.expected_kl(INP["theta"], [0.0, float("nan"), 1.0])
    with pytest.raises(ValueError, match="^gamma must be"):
        toy.expected_reward(INP["theta"], gamma=0.0)
    with pytest.raises(ValueError, match="^len_C must be"):
        toy.expected_gradients(INP["theta"], INP["theta_ref"], len_C=-8)
