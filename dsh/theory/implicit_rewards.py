"""SFT and DFT as implicit rewards (Appendix D), in SymPy: the implicit reward of each, their Q-values of the
sampling and the decision tokens, the paper's printed forms beside them, and the comparison with RL's surrogate
(which Q-value depends on which policy, on future lengths, on correctness)."""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from ..core import validate as v
from .symbolic import c, classify_attribution, gamma, lengths_symbols, p_dC, p_dW, p_s, surrogate_q_values

# ----------------------------------------------------------------------------------------------
# Appendix D: SFT and DFT
# ----------------------------------------------------------------------------------------------
theta = sp.Symbol("theta", real=True)


def sft_implicit_reward():
    """Lemma D.1: grad log pi = (1/pi) grad pi, i.e. SFT is a policy gradient whose per-token
    reward is 1/pi. Returns ``(grad_log_pi, implicit_reward * grad_pi)`` for a generic pi(theta)."""
    pi = sp.Function("pi", positive=True)(theta)
    return sp.diff(sp.log(pi), theta), (1 / pi) * sp.diff(pi, theta)


def dft_cancellation():
    """Lemma D.2: with DFT's stop-gradient weight, sg(pi) * grad log pi = grad pi.

    Returns ``(dft_gradient, grad_pi, gradient_without_stop_gradient)``; the last is
    ``d/dtheta [pi log pi] = (log pi + 1) grad pi``, which is *not* grad pi (see the chapter).
    """
    pi = sp.Function("pi", positive=True)(theta)
    sg = sp.Symbol("sg_pi", positive=True)  # the weight, held constant under differentiation
    dft = (sg * sp.diff(sp.log(pi), theta)).subs(sg, pi)
    no_sg = sp.diff(pi * sp.log(pi), theta)
    return sp.simplify(dft), sp.diff(pi, theta), sp.simplify(no_sg)


@dataclass(frozen=True)
class ImplicitQ:
    """Implicit Q-values of a fine-tuning loss along one data trajectory (Appendix D).

    ``q_sample[k][j]`` is Q_sample(s_{k-1}, token_{k,j+1}); ``q_decision[k]`` is Q_d(s_k, a_k).
    Following Appendix D, a Q-value counts the implicit rewards of the actions *after* it.
    ``sample_symbols`` / ``decision_symbols`` are the probability symbols of pi_sample and pi_d.
    """

    q_sample: tuple[tuple[sp.Expr, ...], ...]
    q_decision: tuple[sp.Expr, ...]
    sample_symbols: frozenset
    decision_symbols: frozenset
    length_symbols: frozenset


def future_sums(rs_tokens, rd):
    """Backward sums of implicit rewards; rs_tokens[k] is a list of per-token rewards."""
    T = len(rs_tokens)
    qd = [sp.Integer(0)] * T
    qs = [None] * T
    nxt = sp.Integer(0)  # rewards after decision k
    for k in reversed(range(T)):
        qd[k] = nxt
        toks = rs_tokens[k]
        qs[k] = tuple(sp.Add(*toks[j + 1:]) + rd[k] + qd[k] for j in range(len(toks)))
        nxt = sp.Add(*toks) + rd[k] + qd[k]
    return qs, qd


def sft_q_values(lengths=(3, 2, 2)) -> ImplicitQ:
    """SFT's implicit Q-values with per-token reward 1/pi (Theorem D.1), concrete lengths.

    Token ``j`` of attempt ``k`` has probability ``p_{k,j}`` under pi_sample, decision ``k`` has
    probability ``q_k`` under pi_d.
    """
    lengths = [v.positive_int("lengths[i]", x) for x in lengths]
    ps = [[sp.Symbol(f"p_{k + 1}_{j + 1}", positive=True) for j in range(Lk)]
          for k, Lk in enumerate(lengths)]
    qs_ = [sp.Symbol(f"q_{k + 1}", positive=True) for k in range(len(lengths))]
    rs = [[1 / p for p in row] for row in ps]
    rd = [1 / q for q in qs_]
    qs, qd = future_sums(rs, rd)
    return ImplicitQ(tuple(qs), tuple(qd), frozenset(x for row in ps for x in row),
                     frozenset(qs_), frozenset())


def paper_sft_q_values(lengths=(3, 2, 2)) -> tuple[list, list]:
    """The closed forms printed in Theorem D.1, built with the same symbols as :func:`sft_q_values`."""
    T = len(lengths)
    p = lambda k, j: sp.Symbol(f"p_{k}_{j}", positive=True)  # noqa: E731
    q = lambda k: sp.Symbol(f"q_{k}", positive=True)  # noqa: E731
    future = lambda k: sp.Add(*[sp.Add(*[1 / p(kk, jj) for jj in range(1, lengths[kk - 1] + 1)])  # noqa: E731
                                + 1 / q(kk) for kk in range(k + 1, T + 1)])
    qs = [[sp.Add(*[1 / p(k, jj) for jj in range(j + 1, lengths[k - 1] + 1)]) + 1 / q(k) + future(k)
           for j in range(1, lengths[k - 1] + 1)] for k in range(1, T + 1)]
    qd = [future(k) for k in range(1, T + 1)]
    return qs, qd


def sft_q_values_homogeneous(T: int = 3) -> ImplicitQ:
    """SFT implicit Q-values when every token of attempt k has probability ``p_k`` (symbolic L_k).

    Used to ask whether the Q-values depend on the attempt lengths. ``q_sample[k]`` holds the
    Q-value of the first token of attempt k.
    """
    Ls = lengths_symbols(T)
    pk = sp.symbols(f"p_1:{T + 1}", positive=True)
    qk = sp.symbols(f"q_1:{T + 1}", positive=True)
    qd = [sp.Integer(0)] * T
    qs = [None] * T
    nxt = sp.Integer(0)
    for k in reversed(range(T)):
        qd[k] = nxt
        qs[k] = ((Ls[k] - 1) / pk[k] + 1 / qk[k] + qd[k],)
        nxt = Ls[k] / pk[k] + 1 / qk[k] + qd[k]
    return ImplicitQ(tuple(qs), tuple(qd), frozenset(pk), frozenset(qk), frozenset(Ls))


def dft_q_values(T: int = 3) -> ImplicitQ:
    """DFT's implicit Q-values (Theorem D.2): constant reward ``c`` per token, symbolic L_k.

    ``q_sample[k]`` is a function of the token index ``j`` (symbol ``j``)."""
    Ls = lengths_symbols(T)
    j = sp.Symbol("j", positive=True, integer=True)
    qd = [sp.Integer(0)] * T
    qs = [None] * T
    nxt = sp.Integer(0)
    for k in reversed(range(T)):
        qd[k] = nxt
        qs[k] = (sp.expand((Ls[k] - j) * c + c + qd[k]),)
        nxt = sp.expand(Ls[k] * c + c + qd[k])
    return ImplicitQ(tuple(qs), tuple(sp.expand(x) for x in qd), frozenset(), frozenset(), frozenset(Ls))


def paper_dft_q_values(T: int = 3) -> tuple[list, list]:
    """The closed forms printed in Theorem D.2 (token index symbol ``j``)."""
    Ls = lengths_symbols(T)
    j = sp.Symbol("j", positive=True, integer=True)
    future = lambda k: sp.Add(*[(Ls[kk] + 1) * c for kk in range(k + 1, T)])  # noqa: E731
    qs = [sp.expand((Ls[k] - j) * c + c + future(k)) for k in range(T)]
    qd = [sp.expand(future(k)) for k in range(T)]
    return qs, qd


def surrogate_q_gamma1(T: int = 3) -> ImplicitQ:
    """Theorem 3.1 at gamma = 1 in the :class:`ImplicitQ` layout (for the comparison table)."""
    q = surrogate_q_values(T)
    qs = tuple((x.subs(gamma, 1),) for x in q.q_sample)
    qd = tuple(x.subs(gamma, 1) for x in q.q_decision)
    return ImplicitQ(qs, qd, frozenset(), frozenset(), frozenset(q.lengths))


def attribution_properties(q: ImplicitQ) -> dict:
    """The rows of Appendix D's comparison table, computed from the Q-value expressions."""
    syms_d = set().union(*[x.free_symbols for x in q.q_decision])
    syms_s = set().union(*[x.free_symbols for row in q.q_sample for x in row])
    qd_policy = bool(syms_d & q.sample_symbols)
    qs_policy = bool(syms_s & q.decision_symbols)
    qd_lengths = bool(syms_d & q.length_symbols)
    # a unified Phi: Q_sample(k) / Q_d(k) is free of every length and policy symbol for each k < T
    unified = True
    for k in range(len(q.q_decision) - 1):
        ratio = sp.simplify(q.q_sample[k][0] / q.q_decision[k]) if q.q_decision[k] != 0 else sp.nan
        if ratio is sp.nan or ratio.free_symbols & (q.length_symbols | q.sample_symbols | q.decision_symbols):
            unified = False
    if unified:
        verdict = "Balanced"
    elif not (qd_policy or qs_policy):
        verdict = "Improved"
    else:
        verdict = "Imbalanced"
    return {
        "Q_d depends on pi_sample": qd_policy,
        "Q_sample depends on pi_d": qs_policy,
        "Q_d depends on future lengths L_k'": qd_lengths,
        "Unified sufficient statistic": unified,
        "Gradient attribution": verdict,
    }


def comparison_table(T: int = 3) -> dict[str, dict]:
    """Appendix D's table (SFT / DFT / RL), every cell computed by :func:`attribution_properties`."""
    return {
        "SFT": attribution_properties(sft_q_values_homogeneous(T)),
        "DFT": attribution_properties(dft_q_values(T)),
        "RL (surrogate reward)": attribution_properties(surrogate_q_gamma1(T)),
    }


# ----------------------------------------------------------------------------------------------
# Appendix D's table from the valid (conditional-expectation) Q-values
# ----------------------------------------------------------------------------------------------
PROPERTIES = ("Q_d depends on pi_sample", "Q_sample depends on pi_d", "Q_d depends on future lengths L_k'",
              "Unified sufficient statistic", "Gradient attribution")


def rl_conditional_q(T: int = 3) -> dict:
    """RL's Q-values as conditional expectations (outcome reward 1 for a correct final answer received with the last
    token, discounted by gamma per token; the baseline dropped: a constant shifts every Q alike) in the two-stage
    process with at most ``T`` attempts of ``L_k`` tokens and one decision token each. ``V[k]``: the value before
    attempt k+1, ``V_k = gamma^L_k (p_s (gamma p_dC + (1 - p_dC) gamma V_{k+1}) + (1 - p_s) p_dW gamma V_{k+1})``
    (the last attempt stops: ``V_T = gamma^(L_T + 1) p_s``); ``q_sample[k] = (Q after a correct attempt, Q after a
    wrong one)`` at the state the attempt leads to; ``q_decision[k]``: Q_d(W_k, RESAMPLE) (the final STOP's is the
    reward). Their immediate rewards are read off by :func:`valid_property_table`."""
    T = v.positive_int("T", T)
    Ls = lengths_symbols(T)
    V = [sp.Integer(0)] * (T + 1)
    for k in range(T - 1, -1, -1):
        nxt = gamma * V[k + 1] if k + 1 < T else sp.Integer(0)
        V[k] = gamma ** Ls[k] * (p_s * (gamma * p_dC + (1 - p_dC) * nxt) + (1 - p_s) * p_dW * nxt) if k + 1 < T \
            else gamma ** (Ls[k] + 1) * p_s
    q_sample = [(gamma * p_dC + (1 - p_dC) * gamma * V[k + 1], p_dW * gamma * V[k + 1]) if k + 1 < T
                else (gamma, sp.Integer(0)) for k in range(T)]
    q_decision = [gamma * V[k + 1] for k in range(T - 1)]
    return {"V": V[:T], "q_sample": q_sample, "q_decision": q_decision, "lengths": Ls}


def sft_conditional_q(T: int = 3) -> ImplicitQ:
    """SFT's valid Q-values along the data trajectory (SFT is the policy gradient of the outcome reward
    ``1[tau = tau*] / P(tau*)``): ``Q(h_t, a_t) = 1 / P(tau*_{<=t})``, one over the probability of the prefix
    through the action, with every token of attempt k at probability ``p_k`` (``L_k`` tokens) and decision k at
    ``q_k``. Immediate rewards are all zero (the reward arrives at the end)."""
    T = v.positive_int("T", T)
    Ls = lengths_symbols(T)
    ps = sp.symbols(f"p_1:{T + 1}", positive=True)
    qs = sp.symbols(f"q_1:{T + 1}", positive=True)
    prefix, q_sample, q_decision = sp.Integer(1), [], []
    for k in range(T):
        row = []
        for j in range(2):                        # the first two tokens of the attempt stand for all of them
            row.append(1 / (prefix * ps[k] ** (j + 1)))
        q_sample.append(tuple(row))
        prefix = prefix * ps[k] ** Ls[k] * qs[k]
        q_decision.append(1 / prefix)
    return ImplicitQ(tuple(q_sample), tuple(q_decision), frozenset(ps), frozenset(qs), frozenset(Ls))


def valid_property_table(T: int = 3) -> list[dict]:
    """Appendix D's comparison table recomputed: every cell of SFT and RL from the valid (conditional-expectation)
    Q-values (:func:`sft_conditional_q`, :func:`rl_conditional_q`) by the book's one rule (immediate rewards, chapter
    02), and DFT's from the paper's own expression (the book derives no valid Q for DFT: its gradient
    ``sum_t sg(pi_t) grad log pi_t`` weights the data trajectory's tokens, it is not an outcome reward's policy
    gradient), labelled so. Each row: property, method, ``value`` ("Yes"/"No" or a verdict), ``source``
    ("valid Q" or "the paper's expression"), ``paper`` (the printed cell) and ``agree``."""
    from ..core.paper import paper_results

    printed = paper_results()["appendix_d_comparison_table"]["rows"]
    yn = lambda b: "Yes" if b else "No"
    rl = rl_conditional_q(T)
    at1 = lambda x: x.subs(gamma, 1)
    rl_syms_d = set().union(*[at1(x).free_symbols for x in rl["q_decision"]])
    rl_syms_s = set().union(*[at1(x).free_symbols for pair in rl["q_sample"] for x in pair])
    rl_future = any(at1(rl["q_decision"][k]).free_symbols & set(rl["lengths"][k + 1:]) for k in range(T - 1))
    sft = sft_conditional_q(T)
    sft_d = set().union(*[x.free_symbols for x in sft.q_decision[:-1]])
    sft_s = set().union(*[x.free_symbols for row in sft.q_sample for x in row])
    # future lengths: Q_d(s_k) containing a length of an attempt after k
    sft_future = any(sft.q_decision[k].free_symbols & set(lengths_symbols(T)[k + 1:]) for k in range(T))
    # immediate rewards by the one rule: Q minus the expected Q of the next action (gamma = 1); zero for every action
    # means one continuation value, Phi = V, carries the signal to both policies
    q_d1 = [at1(x) for x in rl["q_decision"]]
    rl_imm_s = [at1(rl["q_sample"][k][0]) - (p_dC + (1 - p_dC) * q_d1[k]) for k in range(T - 1)] + \
        [at1(rl["q_sample"][k][1]) - p_dW * q_d1[k] for k in range(T - 1)]
    rl_imm_d = [q_d1[k] - at1(rl["V"][k + 1]) for k in range(T - 1)]
    ps = sp.symbols(f"p_1:{T + 1}", positive=True)          # sft_conditional_q's per-token probabilities
    sft_imm_s = [sft.q_sample[k][0] - ps[k] * sft.q_sample[k][1] for k in range(T)]
    sft_imm_d = [sft.q_decision[k] - ps[k + 1] * sft.q_sample[k + 1][0] for k in range(T - 1)]
    zero = lambda xs: all(sp.simplify(x) == 0 for x in xs)  # noqa: E731
    values = {
        "RL (surrogate reward)": {
            PROPERTIES[0]: yn(p_s in rl_syms_d), PROPERTIES[1]: yn(bool({p_dC, p_dW} & rl_syms_s)),
            PROPERTIES[2]: yn(rl_future),                 # at gamma = 1, the paper's setting
            # zero immediate rewards: Phi = V, the value of the state each action leads to, serves both
            PROPERTIES[3]: yn(zero(rl_imm_s + rl_imm_d)),
            PROPERTIES[4]: classify_attribution(rl_imm_s[0], rl_imm_d[0]).capitalize()},
        "SFT": {
            PROPERTIES[0]: yn(bool(sft_d & sft.sample_symbols)), PROPERTIES[1]: yn(bool(sft_s & sft.decision_symbols)),
            PROPERTIES[2]: yn(sft_future), PROPERTIES[3]: yn(zero(sft_imm_s + sft_imm_d)),
            PROPERTIES[4]: classify_attribution(sft_imm_s[0], sft_imm_d[0]).capitalize()},
        "DFT": {k: ("Yes" if x is True else "No" if x is False else x)
                for k, x in attribution_properties(dft_q_values(T)).items()},
    }
    why = {
        ("RL (surrogate reward)", PROPERTIES[0]): "after a RESAMPLE the expected reward is the later attempts' success, "
                                                   "which pi_sample decides (toy: Q_d(W, RESAMPLE) = p_s)",
        ("RL (surrogate reward)", PROPERTIES[1]): "the value of an attempt includes whether the decision after it stops",
        ("SFT", PROPERTIES[2]): "the valid Q is 1 / P(prefix): past and current lengths only",
        ("SFT", PROPERTIES[3]): "the valid Q is the same function of the history for both policies",
        ("SFT", PROPERTIES[4]): "immediate rewards are zero; the unevenness is the count of score terms (L_k against 1)",
    }
    rows = []
    for prop in PROPERTIES:
        for method in ("SFT", "DFT", "RL (surrogate reward)"):
            mine, paper = values[method][prop], printed[prop][method]
            agree = paper.split(" ")[0] == mine
            rows.append({"property": prop, "method": method, "value": mine,
                         "source": "the paper's expression" if method == "DFT" else "valid Q", "paper": paper,
                         "agree": agree, "why": "" if agree else why.get((method, prop), "")})
    return rows
