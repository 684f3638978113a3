"""Section 3.3 and Appendix D, symbolically (dsh.theory.symbolic)."""

import numpy as np
import pytest
import sympy as sp

from dsh.theory import implicit_rewards as ir
from dsh.theory import symbolic as th


def _token_positions(lengths):
    """Brute force: the time index of the last sampling token and of the decision token of every attempt
    when attempt k is L_k sampling tokens followed by one decision token."""
    t, last_sample, decision = 0, [], []
    for Lk in lengths:
        t += Lk
        last_sample.append(t - 1)
        decision.append(t)
        t += 1
    return last_sample, decision


def test_surrogate_q_values_against_brute_force_discounting():
    """Theorem 3.1 (dsh's backward recursion) against the realized value gamma^(t_end - t) A counted token
    by token on a concrete trajectory; the immediate rewards are zero and Definition 3.1's rule says balanced.
    Fails if the recursion skips or double-counts a discount (e.g. the gamma^L of the next attempt)."""
    lengths, g, a = (3, 1, 4), sp.Rational(7, 10), sp.Rational(37, 100)
    q = th.surrogate_q_values(len(lengths))
    subs = {th.gamma: g, th.A: a, **dict(zip(q.lengths, lengths))}
    last_sample, decision = _token_positions(lengths)
    t_end = decision[-1]
    for k in range(len(lengths)):
        assert q.q_sample[k].subs(subs) == g ** (t_end - last_sample[k]) * a
        assert q.q_decision[k].subs(subs) == g ** (t_end - decision[k]) * a
    assert set(q.immediate_sample) | set(q.immediate_decision) == {0}
    assert th.classify_attribution(q.immediate_sample[0], q.immediate_decision[0]) == "balanced"


def test_paper_surrogate_statement_exact_only_at_gamma_one():
    q = th.surrogate_q_values(3)
    paper = th.paper_surrogate_q(3)
    for a, b in zip(paper, q.q_sample):
        assert sp.simplify((a - b).subs(th.gamma, 1)) == 0
    assert sp.simplify(paper[0] - q.q_sample[0]) != 0


def test_kl_q_values_against_brute_force_sums():
    """Theorem 3.2's option-level recursion (dsh) against the direct sums Q_i = sum_{i' >= i} gamma^(i'-i) r_i'
    over the alternating options (attempt, decision, attempt, ...) with random penalties; fails if the
    recursion drops or repeats a discount or a penalty."""
    rng = np.random.default_rng(0)
    T = 3
    kl = th.kl_q_values(T, per_token=False)
    vals = rng.normal(size=2 * T)
    g = 0.8
    subs = {th.gamma: g, **dict(zip(kl.immediate_sample, vals[0::2])), **dict(zip(kl.immediate_decision, vals[1::2]))}
    direct = [sum(g ** (j - i) * vals[j] for j in range(i, 2 * T)) for i in range(2 * T)]
    for k in range(T):
        assert float(kl.q_sample[k].subs(subs)) == pytest.approx(direct[2 * k], abs=1e-12)
        assert float(kl.q_decision[k].subs(subs)) == pytest.approx(direct[2 * k + 1], abs=1e-12)


def test_one_rule_for_both_objectives():
    """Definition 3.1 applied by one rule (to the immediate rewards): surrogate balanced, per-token KL
    unbalanced. Applied to the total Q-values instead, the same classifier calls the KL balanced, because
    Q_d after a RESAMPLE carries the next attempt's O(L) penalties: the paper's verdicts need the
    immediate-reward reading."""
    T = 3
    kl = th.kl_q_values(T)
    L1, L2 = kl.lengths[0], kl.lengths[1]
    assert th.classify_attribution(kl.immediate_sample[0].subs(L1, th.L), kl.immediate_decision[0]) == "unbalanced"
    totals = [x.subs({L1: th.L, L2: th.L, kl.lengths[2]: th.L}) for x in (kl.q_sample[0], kl.q_decision[0])]
    assert th.classify_attribution(*totals) == "balanced"
    sur = th.surrogate_q_values(T)
    assert th.classify_attribution(sur.immediate_sample[0], sur.immediate_decision[0]) == "balanced"


def test_no_unified_phi_for_kl():
    """SymPy's answer (no solution unless L = 1) against numpy ranks of the linear system
    Phi_k - gamma Phi_k+1 = L delta, Phi_k - gamma Phi_k+1 = delta at numeric points."""
    generic, consistent = th.unified_phi_solutions()
    for L_ in (1, 2, 5):
        Mx = np.array([[1.0, -0.9], [1.0, -0.9]])
        aug = np.c_[Mx, [L_ * 0.3, 0.3]]
        solvable = np.linalg.matrix_rank(Mx) == np.linalg.matrix_rank(aug)
        assert solvable == (L_ in consistent)
    assert generic == []


def test_classify_attribution():
    assert th.classify_attribution(th.L, sp.Integer(1)) == "unbalanced"
    assert th.classify_attribution(sp.Integer(1), th.L) == "unbalanced"
    assert th.classify_attribution(2 * th.L + 1, th.L) == "balanced"
    assert th.classify_attribution(th.gamma * th.A, th.A) == "balanced"
    assert th.classify_attribution(sp.Integer(0), sp.Integer(0)) == "balanced"
    assert th.classify_attribution(sp.Integer(0), th.delta) == "unbalanced"


def test_ratio_factorization():
    ratio, factors = th.ratio_factorization(4)
    assert sp.simplify(ratio - factors) == 0


def test_attribution_properties_on_constructed_cases():
    """The classifier behind the comparison table on Q-values built to have each property (not the paper's):
    an entangled pair, a policy-free pair with a length, and a pair sharing one statistic."""
    p, q, L1, L2 = sp.symbols("p q L_1 L_2", positive=True)
    entangled = ir.ImplicitQ(((1 / q + 1 / p,), (1 / p,)), (L2 / p, sp.Integer(0)), frozenset({p}), frozenset({q}),
                             frozenset({L1, L2}))
    out = ir.attribution_properties(entangled)
    assert out["Q_d depends on pi_sample"] and out["Q_sample depends on pi_d"]
    assert out["Gradient attribution"] == "Imbalanced"
    lengthy = ir.ImplicitQ(((L1 + L2,), (L2,)), (L2, sp.Integer(0)), frozenset({p}), frozenset({q}), frozenset({L1, L2}))
    out = ir.attribution_properties(lengthy)
    assert not out["Q_d depends on pi_sample"] and out["Q_d depends on future lengths L_k'"]
    assert out["Gradient attribution"] == "Improved"
    shared = ir.ImplicitQ(((th.gamma * th.A,), (th.A,)), (th.A, th.A), frozenset({p}), frozenset({q}), frozenset({L1}))
    assert ir.attribution_properties(shared)["Gradient attribution"] == "Balanced"


def test_bad_arguments():
    with pytest.raises(ValueError, match="^T must be an integer >= 1"):
        th.lengths_symbols(0)
    with pytest.raises(ValueError, match=r"^lengths\[i\] must be an integer >= 1"):
        ir.sft_q_values((2, -1))
    with pytest.raises(ValueError, match="^T must be"):
        th.ratio_factorization(0)


@pytest.mark.parametrize("T", [1, 2, 3])
def test_unified_phi_exists_with_the_indices_of_definition_3_1(T):
    """With Phi taken at the state each action leads to, the KL Q-values share one Phi for every attempt length: the
    value function, checked here against the Q-values by substitution (and the paper's own indices have none)."""
    sol, is_value = th.unified_phi_at_reached_states(T)
    assert len(sol) == 1 and is_value
    kl = th.kl_q_values(T)
    s = sol[0]
    for k in range(T):
        phi_k = s[sp.Symbol(f"Phi(s_{k + 1})", real=True)]
        assert sp.simplify(kl.immediate_sample[k] + th.gamma * phi_k - kl.q_sample[k]) == 0
        nxt = s[sp.Symbol(f"Phi(s_{k + 1}^+)", real=True)] if k + 1 < T else 0
        assert sp.simplify(kl.immediate_decision[k] + th.gamma * nxt - kl.q_decision[k]) == 0
    generic, consistent = th.unified_phi_solutions()
    assert generic == [] and list(consistent) == [1]


def _rl_value(p_s, p_dC, p_dW, k, T):
    """Expected final correctness before attempt k of T (gamma = 1), by plain enumeration of the two outcomes."""
    if k > T:
        return 0.0
    if k == T:
        return p_s
    later = _rl_value(p_s, p_dC, p_dW, k + 1, T)
    return p_s * (p_dC + (1 - p_dC) * later) + (1 - p_s) * p_dW * later


def test_valid_property_table_cells_recomputed_independently():
    """Each computed cell of the recomputed Appendix D table, recomputed here without SymPy: RL's Q_d(W_1, RESAMPLE)
    moves with p_s, its Q after a correct attempt with p_dC; SFT's valid Q (1 / P(prefix)) of decision 1 moves with the
    first attempt's token probability, attempt 2's token Q with decision 1's, and not with the length of attempt 2;
    on the finite MDP the valid SFT Q-values (the outcome reward 1[tau = tau*] / P(tau*)) have zero immediate rewards,
    as RL's do: the one rule calls both balanced, and Phi = V serves both."""
    from dsh.theory import bellman as B
    from dsh.theory import mdp as M
    from dsh.theory import sft_pg as S

    rows = {(r["property"], r["method"]): r for r in ir.valid_property_table(3)}
    rl, sft = "RL (surrogate reward)", "SFT"
    q_d = lambda ps: _rl_value(ps, 0.9, 0.6, 2, 3)                       # Q_d(W_1, RESAMPLE)
    q_c = lambda pdc: pdc + (1 - pdc) * _rl_value(0.5, pdc, 0.6, 2, 3)   # Q_sample(s_0, C)
    assert rows[("Q_d depends on pi_sample", rl)]["value"] == ("Yes" if q_d(0.3) != q_d(0.6) else "No") == "Yes"
    assert rows[("Q_sample depends on pi_d", rl)]["value"] == ("Yes" if q_c(0.5) != q_c(0.8) else "No") == "Yes"
    # RL's Q_d(W_1, RESAMPLE) with attempts of L_2, L_3 tokens and a decision token each, discounted per token:
    # at gamma = 1 (the paper's setting) the later lengths do not enter, at gamma < 1 they do
    def q_d_discounted(gamma, L2, L3, p_s=0.5, p_dC=0.9, p_dW=0.6):
        v3 = gamma ** (L3 + 1) * p_s
        v2 = gamma ** L2 * (p_s * (gamma * p_dC + (1 - p_dC) * gamma * v3) + (1 - p_s) * p_dW * gamma * v3)
        return gamma * v2
    assert q_d_discounted(1.0, 3, 4) == q_d_discounted(1.0, 9, 2) and q_d_discounted(0.9, 3, 4) != q_d_discounted(0.9, 9, 2)
    assert rows[("Q_d depends on future lengths L_k'", rl)]["value"] == "No"
    sym = ir.rl_conditional_q(3)["q_decision"][0]
    subs = {th.p_s: 0.5, th.p_dC: 0.9, th.p_dW: 0.6, th.gamma: 0.9, th.lengths_symbols(3)[1]: 3, th.lengths_symbols(3)[2]: 4}
    assert abs(float(sym.subs(subs)) - q_d_discounted(0.9, 3, 4)) < 1e-12
    prefix_q = lambda p1, q1, L1, p2, L2: (1 / (p1 ** L1 * q1), 1 / (p1 ** L1 * q1 * p2))   # Q_d(s_1), Q(token_2,1)
    base = prefix_q(.5, .9, 3, .7, 4)
    assert rows[("Q_d depends on pi_sample", sft)]["value"] == "Yes" and base[0] != prefix_q(.6, .9, 3, .7, 4)[0]
    assert rows[("Q_sample depends on pi_d", sft)]["value"] == "Yes" and base[1] != prefix_q(.5, .8, 3, .7, 4)[1]
    assert rows[("Q_d depends on future lengths L_k'", sft)]["value"] == "No" and \
        prefix_q(.5, .9, 3, .7, 4)[0] == prefix_q(.5, .9, 3, .7, 9)[0]
    m = M.FiniteTwoStageMDP(seed=2)
    theta = m.init_theta()
    tr = S.data_trajectory(m, 0)
    p_star = float(m.log_prob(theta, tr).exp())
    reward = lambda traj: 1.0 / p_star if traj == tr else 0.0
    split = B.bellman_split(m, theta, lambda st, traj: [reward(traj)] * len(st), reward)
    assert np.abs(split.immediate).max() < 1e-9
    assert np.abs(B.surrogate_q(m, theta).immediate).max() < 1e-12
    for method in (sft, rl):
        assert rows[("Unified sufficient statistic", method)]["value"] == "Yes"
        assert rows[("Gradient attribution", method)]["value"] == "Balanced"
    assert {r["source"] for r in rows.values() if r["method"] == "DFT"} == {"the paper's expression"}
    assert all(r["agree"] == (r["paper"].split(" ")[0] == r["value"]) for r in rows.values())
    assert all(r["why"] for r in rows.values() if not r["agree"])
