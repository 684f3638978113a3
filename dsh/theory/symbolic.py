"""Symbolic objects (SymPy) for the formal results of the paper.

Each function builds one result from its definitions, so that the chapters can display it and the
tests can check it; nothing here is typed in from the paper except where a function is named
``paper_*`` (the paper's statement, kept for comparison with the derived form).

Conventions (the chapters explain them): a trajectory has ``T`` attempts; attempt ``k`` is
``L_k`` sampling tokens followed by one decision token (RESAMPLE for ``k < T``, STOP for ``k = T``);
every token is one time step of the discount ``gamma``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy as sp

from ..core import validate as v

# ----------------------------------------------------------------------------------------------
# Symbols
# ----------------------------------------------------------------------------------------------
p_s, p_dC, p_dW = sp.symbols("p_s p_dC p_dW", nonnegative=True)


gamma = sp.Symbol("gamma", positive=True)


A = sp.Symbol("A", real=True)  # trajectory-level advantage A_i


delta = sp.Symbol("delta", real=True)  # typical token-level log-ratio log(pi_theta / pi_ref)


L = sp.Symbol("L", positive=True, integer=True)


c = sp.Symbol("c", positive=True)  # DFT's constant implicit reward per token


def lengths_symbols(T: int) -> tuple[sp.Symbol, ...]:
    """Symbols ``L_1 ... L_T`` for the attempt lengths."""
    T = v.positive_int("T", T)
    return sp.symbols(f"L_1:{T + 1}", positive=True, integer=True)


# ----------------------------------------------------------------------------------------------
# Two-stage accuracy: absorption probability of a Markov chain
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AbsorbingChain:
    """The two-stage process as an absorbing Markov chain.

    Transient states (in order): SAMPLE (about to write a candidate), C (candidate correct),
    W (candidate wrong). Absorbing states: STOP_C (stopped on a correct answer), STOP_W.
    ``Q`` holds transient-to-transient probabilities, ``R`` transient-to-absorbing ones,
    ``N = (I - Q)^{-1}`` the fundamental matrix and ``B = N R`` the absorption probabilities.
    """

    transient: tuple[str, ...]
    absorbing: tuple[str, ...]
    Q: sp.Matrix
    R: sp.Matrix
    N: sp.Matrix
    B: sp.Matrix

    @property
    def accuracy(self) -> sp.Expr:
        """P(absorbed in STOP_C | start in SAMPLE), simplified."""
        return sp.simplify(self.B[0, 0])

    @property
    def expected_attempts(self) -> sp.Expr:
        """Expected number of candidates written before stopping (visits to C or W)."""
        return sp.simplify(self.N[0, 1] + self.N[0, 2])


def two_stage_chain() -> AbsorbingChain:
    """Build the chain from the transition rules of pi_sample and pi_d and solve it."""
    transient = ("SAMPLE", "C", "W")
    absorbing = ("STOP_C", "STOP_W")
    Q = sp.Matrix([
        [0, p_s, 1 - p_s],        # SAMPLE -> C with p_s, -> W otherwise
        [1 - p_dC, 0, 0],         # C: RESAMPLE with 1 - p_dC
        [p_dW, 0, 0],             # W: RESAMPLE with p_dW
    ])
    R = sp.Matrix([
        [0, 0],
        [p_dC, 0],                # C: STOP with p_dC
        [0, 1 - p_dW],            # W: STOP with 1 - p_dW
    ])
    N = sp.simplify((sp.eye(3) - Q).inv())
    B = sp.simplify(N * R)
    return AbsorbingChain(transient, absorbing, Q, R, N, B)


def paper_accuracy_formula() -> sp.Expr:
    """The paper's "Model Acc" equation, as printed in Section 4.2."""
    return p_s * p_dC / (1 - (p_s * (1 - p_dC) + (1 - p_s) * p_dW))


# ----------------------------------------------------------------------------------------------
# Definition 3.1: balanced / unbalanced attribution
# ----------------------------------------------------------------------------------------------
def classify_attribution(r_sample: sp.Expr, r_decision: sp.Expr, length: sp.Symbol = L) -> str:
    """Definition 3.1, one rule for every objective, applied to the *immediate* rewards of an attempt and
    of a decision (the terms outside the shared continuation ``gamma V``: ``OptionQValues.immediate_*``
    here, :func:`dsh.theory.bellman.bellman_split` on the finite MDP).

    Returns ``"balanced"`` when both are zero (all value flows through one continuation value, the
    sufficient statistic) or when ``|r_sample / r_decision|`` stays bounded away from 0 and infinity as the
    attempt length grows (``Theta(1)``), ``"unbalanced"`` when the ratio diverges or vanishes
    (scale separation ``omega(1)``). Applied to *total* Q-values instead, the rule can answer "balanced"
    for the KL penalty (chapter 02 shows it): the paper's two verdicts use two different rules.
    """
    r_sample, r_decision = sp.simplify(r_sample), sp.simplify(r_decision)
    if r_sample == 0 or r_decision == 0:
        return "balanced" if r_sample == r_decision else "unbalanced"
    ratio = sp.simplify(r_sample / r_decision)
    lim = sp.limit(sp.Abs(ratio), length, sp.oo)
    if lim in (sp.oo, sp.zoo, -sp.oo) or lim == 0:
        return "unbalanced"
    return "balanced"


# ----------------------------------------------------------------------------------------------
# Backward recursions along one trajectory, option level
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class OptionQValues:
    """Q-values along one trajectory, computed by a backward Bellman recursion.

    ``q_sample[k-1]`` is Q_sample(s_{k-1}, a'_k) and ``q_decision[k-1]`` is Q_d(s_k, a''_k)
    for k = 1..T; ``immediate_sample`` / ``immediate_decision`` are the immediate rewards
    (or penalties) of each action.
    """

    q_sample: tuple[sp.Expr, ...]
    q_decision: tuple[sp.Expr, ...]
    immediate_sample: tuple[sp.Expr, ...]
    immediate_decision: tuple[sp.Expr, ...]
    lengths: tuple = field(default=())
    terminal: sp.Expr = sp.Integer(0)  # value received after the final decision (the surrogate's A)


def backward_q_values(immediate_sample, immediate_decision, discount_sample, discount_decision,
                      terminal=0) -> tuple[list, list]:
    """Generic backward Bellman recursion over options (Q includes the immediate reward).

    ``Q_d(T) = r_d(T) + terminal``, ``Q_d(k) = r_d(k) + disc_d(k) * Q_s(k+1)`` for ``k < T`` and
    ``Q_s(k) = r_s(k) + disc_s(k) * Q_d(k)``.
    """
    T = len(immediate_sample)
    qs, qd = [None] * T, [None] * T
    for k in reversed(range(T)):
        nxt = terminal if k == T - 1 else discount_decision[k] * qs[k + 1]
        qd[k] = immediate_decision[k] + nxt
        qs[k] = immediate_sample[k] + discount_sample[k] * qd[k]
    return [sp.expand(x) for x in qs], [sp.expand(x) for x in qd]


def surrogate_q_values(T: int = 3) -> OptionQValues:
    """Theorem 3.1: Q-values of the surrogate reward with token-level discounting.

    The only reward is the advantage ``A``, a terminal value received with the final STOP token (every
    immediate reward is zero: ``A`` depends on the final answer, not on one action). A sampling action
    of ``L_k`` tokens is followed by its decision token (one step of discount), a RESAMPLE by the
    ``L_{k+1}`` tokens of the next attempt. Q_sample is taken at the end of the attempt (the state
    s_k the attempt produces), as in the paper's Q_sample(s_{k-1}, a'_k) = Phi(s_k).
    """
    Ls = lengths_symbols(T)
    zero = [sp.Integer(0)] * T
    qs, qd = backward_q_values(
        immediate_sample=zero,
        immediate_decision=zero,
        discount_sample=[gamma] * T,
        discount_decision=[gamma ** Ls[k + 1] if k + 1 < T else 1 for k in range(T)],
        terminal=A,
    )
    return OptionQValues(tuple(qs), tuple(qd), tuple(zero), tuple(zero), Ls, A)


def surrogate_phi(T: int = 3) -> list[sp.Expr]:
    """The sufficient statistic Phi(s_k) = gamma^(tokens left after s_k) * A for k = 1..T."""
    Ls = lengths_symbols(T)
    return [gamma ** (1 + sum(Ls[j] + 1 for j in range(k + 1, T))) * A for k in range(T)]


def paper_surrogate_q(T: int = 3) -> list[sp.Expr]:
    """The paper's Theorem 3.1 statement gamma^(sum_{j=k}^T len) * A_i, k = 1..T."""
    Ls = lengths_symbols(T)
    return [gamma ** sum(Ls[j] for j in range(k, T)) * A for k in range(T)]


def kl_q_values(T: int = 3, per_token: bool = True) -> OptionQValues:
    """Theorem 3.2: Q-values of the token-level KL penalty, option-level Bellman recursion.

    ``Q_sample(s_{k-1}, a'_k) = d_k^sample + gamma Q_d(s_k, a''_k)``,
    ``Q_d(s_k, a''_k) = d_k^decision + gamma Q_sample(s_k, a'_{k+1})``, ``Q_d(s_T, STOP) = d_T^decision``.
    With ``per_token`` every token's log-ratio is ``delta``, so ``d_k^sample = L_k delta`` and
    ``d_k^decision = delta``; otherwise the penalties are free symbols ``ds_k``, ``dd_k``.
    """
    Ls = lengths_symbols(T)
    if per_token:
        ds = [Ls[k] * delta for k in range(T)]
        dd = [delta] * T
    else:
        ds = list(sp.symbols(f"ds_1:{T + 1}", real=True))
        dd = list(sp.symbols(f"dd_1:{T + 1}", real=True))
    qs, qd = backward_q_values(ds, dd, [gamma] * T, [gamma] * T)
    return OptionQValues(tuple(qs), tuple(qd), tuple(ds), tuple(dd), Ls)


def unified_phi_solutions():
    """Theorem 3.2's impossibility argument as the paper writes it, a linear system (both equations with Phi(s_k) on
    the left, an index slip: :func:`unified_phi_at_reached_states` has the indices of Definition 3.1).

    A single Phi would need ``Phi_k = d_sample + gamma Phi_{k+1}`` and
    ``Phi_k = d_decision + gamma Phi_{k+1}`` with ``d_sample = L delta`` and ``d_decision = delta``.
    Returns SymPy's solution of the system for ``(Phi_k, Phi_{k+1})`` (empty: no solution) and the
    values of ``L`` for which one exists (``L = 1``).
    """
    phi_k, phi_k1 = sp.symbols("Phi_k Phi_k1", real=True)
    eqs = [sp.Eq(phi_k, L * delta + gamma * phi_k1), sp.Eq(phi_k, delta + gamma * phi_k1)]
    generic = sp.solve(eqs, [phi_k, phi_k1], dict=True)
    consistency = sp.solve(sp.Eq(L * delta, delta), L)
    return generic, consistency


def unified_phi_at_reached_states(T: int = 3):
    """Theorem 3.2's unified-Phi question with the indices of Definition 3.1: each Q-value is its immediate penalty
    plus gamma times Phi of the state its action leads to, ``Q_sample(s_{k-1}, a'_k) = d_k^sample + gamma Phi(s_k)``
    and ``Q_d(s_k, a''_k) = d_k^decision + gamma Phi(s_k^+)`` (``s_k^+``: after the decision; ``Phi(s_T^+) = 0``
    after the final STOP), with the Q-values of :func:`kl_q_values`. Returns SymPy's solution for the 2T unknowns
    ``Phi(s_k), Phi(s_k^+)`` (one exists for every L: ``Phi(s_k) = Q_d(s_k)``, ``Phi(s_k^+) = Q_sample(s_k^+)``,
    the value function V^KL) and whether it is that value function."""
    T = v.positive_int("T", T)
    kl = kl_q_values(T)
    phi = [sp.Symbol(f"Phi(s_{k + 1})", real=True) for k in range(T)]
    phi_plus = [sp.Symbol(f"Phi(s_{k + 1}^+)", real=True) for k in range(T)]
    eqs = []
    for k in range(T):
        eqs.append(sp.Eq(kl.q_sample[k], kl.immediate_sample[k] + gamma * phi[k]))
        eqs.append(sp.Eq(kl.q_decision[k], kl.immediate_decision[k] + gamma * (phi_plus[k] if k + 1 < T else 0)))
    unknowns = list(phi) + list(phi_plus[:T - 1])
    sol = sp.solve(eqs, unknowns, dict=True)
    is_value = bool(sol) and all(sp.simplify(sol[0][phi[k]] - kl.q_decision[k]) == 0 for k in range(T)) and all(
        sp.simplify(sol[0][phi_plus[k]] - kl.q_sample[k + 1]) == 0 for k in range(T - 1))
    return sol, is_value


# ----------------------------------------------------------------------------------------------
# Clipping remark: the importance ratio factorizes
# ----------------------------------------------------------------------------------------------
def ratio_factorization(T: int = 3):
    """Appendix B, Eq. 8: pi_theta(tau)/pi_old(tau) = sampling ratio * resampling ratio * stop ratio.

    Returns ``(trajectory_ratio, product_of_factors)`` built from per-option probabilities.
    """
    T = v.positive_int("T", T)
    s_new = sp.symbols(f"s_1:{T + 1}", positive=True)
    s_old = sp.symbols(f"so_1:{T + 1}", positive=True)
    d_new = sp.symbols(f"d_1:{T + 1}", positive=True)
    d_old = sp.symbols(f"do_1:{T + 1}", positive=True)
    p_new = sp.Mul(*s_new) * sp.Mul(*d_new)
    p_old = sp.Mul(*s_old) * sp.Mul(*d_old)
    sampling = sp.Mul(*[s_new[k] / s_old[k] for k in range(T)])
    resampling = sp.Mul(*[d_new[k] / d_old[k] for k in range(T - 1)])
    stopping = d_new[T - 1] / d_old[T - 1]
    return p_new / p_old, sampling * resampling * stopping
