"""Section 3.3 and Appendix D, symbolically (dsh.theory)."""

import pytest
import sympy as sp

from dsh import theory as th
from dsh.paper import paper_results


def test_surrogate_q_values_share_one_statistic():
    T = 4
    q = th.surrogate_q_values(T)
    phi = th.surrogate_phi(T)
    for k in range(T):
        assert sp.simplify(q.q_sample[k] - phi[k]) == 0
        assert sp.simplify(q.q_sample[k] / q.q_decision[k] - th.gamma) == 0
    # Q_d(s_k) is Phi one state later, times the discount of the next attempt's tokens
    Ls = q.lengths
    for k in range(T - 1):
        assert sp.simplify(q.q_decision[k] - th.gamma ** Ls[k + 1] * q.q_sample[k + 1]) == 0
    assert q.q_decision[-1] == th.A
    L = Ls[1]
    assert th.classify_attribution(q.q_sample[0].subs(L, th.L), q.q_decision[0].subs(L, th.L)) == "balanced"


def test_paper_surrogate_statement_exact_only_at_gamma_one():
    q = th.surrogate_q_values(3)
    paper = th.paper_surrogate_q(3)
    for a, b in zip(paper, q.q_sample):
        assert sp.simplify((a - b).subs(th.gamma, 1)) == 0
    assert sp.simplify(paper[0] - q.q_sample[0]) != 0


def test_kl_bellman_recursion_and_scale():
    T = 3
    kl = th.kl_q_values(T)
    g = th.gamma
    for k in range(T):
        assert sp.simplify(kl.q_sample[k] - (kl.immediate_sample[k] + g * kl.q_decision[k])) == 0
        nxt = kl.q_sample[k + 1] * g if k + 1 < T else 0
        assert sp.simplify(kl.q_decision[k] - (kl.immediate_decision[k] + nxt)) == 0
    assert sp.simplify(kl.immediate_sample[0] / kl.immediate_decision[0] - kl.lengths[0]) == 0
    assert th.classify_attribution(kl.immediate_sample[0].subs(kl.lengths[0], th.L),
                                   kl.immediate_decision[0]) == "unbalanced"


def test_kl_generic_penalties_recursion():
    kl = th.kl_q_values(2, per_token=False)
    ds1, ds2 = kl.immediate_sample
    dd1, dd2 = kl.immediate_decision
    g = th.gamma
    assert sp.expand(kl.q_sample[0] - (ds1 + g * dd1 + g ** 2 * ds2 + g ** 3 * dd2)) == 0


def test_no_unified_phi_for_kl():
    generic, consistent = th.unified_phi_solutions()
    assert generic == []
    assert consistent == [1]


def test_classify_attribution():
    assert th.classify_attribution(th.L, sp.Integer(1)) == "unbalanced"
    assert th.classify_attribution(sp.Integer(1), th.L) == "unbalanced"
    assert th.classify_attribution(2 * th.L + 1, th.L) == "balanced"
    assert th.classify_attribution(th.gamma * th.A, th.A) == "balanced"


def test_ratio_factorization():
    ratio, factors = th.ratio_factorization(4)
    assert sp.simplify(ratio - factors) == 0


def test_sft_implicit_reward_and_entanglement():
    lhs, rhs = th.sft_implicit_reward()
    assert sp.simplify(lhs - rhs) == 0
    lengths = (3, 2, 2)
    sft = th.sft_q_values(lengths)
    pq, pd = th.paper_sft_q_values(lengths)
    for row_a, row_b in zip(sft.q_sample, pq):
        for a, b in zip(row_a, row_b):
            assert sp.simplify(a - b) == 0
    for a, b in zip(sft.q_decision, pd):
        assert sp.simplify(a - b) == 0
    p21 = sp.Symbol("p_2_1", positive=True)
    q1 = sp.Symbol("q_1", positive=True)
    assert sp.diff(sft.q_decision[0], p21) != 0
    assert sp.diff(sft.q_sample[0][0], q1) != 0
    assert sft.q_decision[-1] == 0


def test_dft_cancellation_needs_stop_gradient():
    dft, grad_pi, no_sg = th.dft_cancellation()
    assert sp.simplify(dft - grad_pi) == 0
    assert sp.simplify(no_sg - grad_pi) != 0


def test_dft_q_values_policy_independent_and_closed_form():
    dft = th.dft_q_values(4)
    pq, pd = th.paper_dft_q_values(4)
    for a, b in zip(dft.q_sample, pq):
        assert sp.simplify(a[0] - b) == 0
    for a, b in zip(dft.q_decision, pd):
        assert sp.simplify(a - b) == 0
    syms = set().union(*[x.free_symbols for x in dft.q_decision])
    assert syms <= set(dft.length_symbols) | {th.c}
    assert sp.limit(dft.q_decision[0] / th.c, th.lengths_symbols(4)[1], sp.oo) == sp.oo


def test_comparison_table_matches_the_paper():
    ours = th.comparison_table()
    printed = paper_results()["appendix_d_comparison_table"]["rows"]
    for prop, cells in printed.items():
        for method, text in cells.items():
            val = ours[method][prop]
            mine = ("Yes" if val else "No") if isinstance(val, bool) else val
            assert text.split(" ")[0] == mine, (prop, method)


def test_bad_arguments():
    with pytest.raises(ValueError, match="^T must be an integer >= 1"):
        th.lengths_symbols(0)
    with pytest.raises(ValueError, match=r"^lengths\[i\] must be an integer >= 1"):
        th.sft_q_values((2, -1))
    with pytest.raises(ValueError, match="^T must be"):
        th.ratio_factorization(0)
