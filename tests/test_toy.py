"""The three-logit toy (Appendix C): pinned values, exact expectations, Monte Carlo, sweep, GRPO."""

import numpy as np
import pytest
import torch

import dsh
from dsh import toy, toy_grpo
from dsh.paper import paper_results

INP = toy.appendix_c_inputs()


def test_appendix_c_inputs_come_from_the_paper_file():
    assert INP == {"theta": [0.4, 2.2, 1.4], "theta_ref": [0.3, 2.0, 1.2], "attempts": "WC",
                   "len_C": 8, "len_W": 8, "advantage": 0.5, "gamma": 1}


def test_appendix_c_pinned_values():
    a = toy.trajectory_attribution(**INP)
    # exact arithmetic (4 decimals)
    assert a.kl_drag["theta_s"] == pytest.approx(-0.1857, abs=5e-5)
    assert a.kl_drag["theta_dW"] == pytest.approx(-0.0782, abs=5e-5)
    assert a.kl_drag["theta_dC"] == pytest.approx(-0.0022, abs=5e-5)
    assert a.reward["theta_s"] == pytest.approx(-0.0987, abs=5e-5)
    assert a.reward["theta_dW"] == pytest.approx(0.0989, abs=5e-5)
    assert a.reward["theta_dC"] == pytest.approx(0.0499, abs=5e-5)
    assert a.net["theta_s"] == pytest.approx(-0.2844, abs=5e-5)
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
    sw = toy.length_sweep(INP["theta"], INP["theta_ref"], [1, 4, 16, 64, 256, 1024])
    assert np.ptp(sw["reward"]) < 1e-9                  # O(1), independent of L
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
