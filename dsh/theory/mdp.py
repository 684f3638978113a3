"""A finite two-stage MDP with a real token-level policy, solved by exact enumeration.

This is the smallest "LLM" on which Lemma 3.1, Corollary 3.1, Lemma 3.2, Theorem 3.1 and
Theorem 3.2 can be checked against autograd with no sampling error: a next-token policy with one
shared parameter vector ``theta`` writes attempts of ``attempt_length`` tokens from a vocabulary
of ``vocab_size`` tokens and, after each attempt, emits one decision token (STOP or RESAMPLE).
The answer of an attempt is the sum of its tokens modulo ``vocab_size``; the correct answer is 0.
After ``max_attempts`` attempts the decision is a forced STOP (probability 1, no parameters).

Every token is one time step; the reward R(tau) = 1[final answer correct] arrives with the final
STOP token, at time ``t_end``, so the objective is ``J = E[gamma^t_end R]``.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch

from ..core import validate as v

STOP, RESAMPLE = 0, 1


@dataclass(frozen=True)
class Trajectory:
    """Attempts (tuples of tokens) and decisions (STOP=0 / RESAMPLE=1), one per attempt."""

    attempts: tuple[tuple[int, ...], ...]
    decisions: tuple[int, ...]


@dataclass(frozen=True)
class Step:
    """One token of a trajectory: ``kind`` is "sample" or "decision"; ``k`` the attempt (1-based);
    ``t`` the time step; ``logp`` log pi(a_t | h_t) (a tensor, 0 for a forced STOP);
    ``prefix`` the history including this action (used to condition on it); ``forced`` marks the
    parameter-free STOP after the last attempt."""

    kind: str
    k: int
    t: int
    logp: torch.Tensor
    prefix: tuple
    forced: bool = False


@dataclass(frozen=True)
class FiniteTwoStageMDP:
    """Policy logits are linear in a shared ``theta`` through fixed random features (seeded).

    With ``stationary`` the sampling policy uses the same features at every position and attempt
    (a "language" whose per-token behaviour does not depend on where the token is).
    ``position_decay`` < 1 multiplies the sampling features and biases of position ``j`` (0-based) by
    ``position_decay ** j``: later tokens of an attempt are nearer uniform and move less with theta, a
    non-stationary policy (chapter 02: a counterexample to growth ~ L_k - a bounded penalty is still O(L_k) - that
    breaks the premise of equal per-token movement the proof of Theorem 3.2 states).
    """

    vocab_size: int = 2
    attempt_length: int = 2
    max_attempts: int = 3
    n_params: int = 6
    seed: int = 0
    stationary: bool = False
    position_decay: float = 1.0

    def __post_init__(self):
        v.length("vocab_size", self.vocab_size, minimum=2)
        v.positive_int("attempt_length", self.attempt_length)
        v.positive_int("max_attempts", self.max_attempts)
        v.positive_int("n_params", self.n_params)
        v.length("seed", self.seed)
        if (isinstance(self.position_decay, bool) or not isinstance(self.position_decay, (int, float))
                or not 0.0 < self.position_decay <= 1.0):
            raise ValueError(f"position_decay must be a number in (0, 1], got {self.position_decay!r}")
        # log first: a huge vocab_size ** (attempt_length * k) would take forever to compute exactly
        big = self.attempt_length * self.max_attempts * math.log(self.vocab_size) > math.log(200_000)
        n = 200_001 if big else sum(self.vocab_size ** (self.attempt_length * k) for k in range(1, self.max_attempts + 1))
        if n > 200_000:
            raise ValueError(f"the MDP has {'more than 200000' if big else n} trajectories; choose vocab_size, attempt_length and "
                             "max_attempts with at most 200000 trajectories")

    # ---------------------------------------------------------------- features
    @cached_property
    def _features(self):
        K, Lk, V, P = self.max_attempts, self.attempt_length, self.vocab_size, self.n_params
        gd = torch.Generator().manual_seed(10_007 * self.seed + 1)
        gs = torch.Generator().manual_seed(10_007 * self.seed + 2)
        # decision context: (attempt k, answer of attempt k); drawn first so that it does not
        # depend on attempt_length
        fd = torch.randn(K, V, 2, P, generator=gd, dtype=torch.float64)
        bd = torch.randn(K, V, 2, generator=gd, dtype=torch.float64)
        # sampling context: (attempt k, position j, previous attempt's answer or none, previous token
        # or BOS); a stationary policy shares one table across k and j
        if self.stationary:
            fs = torch.randn(1, 1, V + 1, V + 1, V, P, generator=gs, dtype=torch.float64).expand(K, Lk, -1, -1, -1, -1)
            bs = torch.randn(1, 1, V + 1, V + 1, V, generator=gs, dtype=torch.float64).expand(K, Lk, -1, -1, -1)
        else:
            fs = torch.randn(K, Lk, V + 1, V + 1, V, P, generator=gs, dtype=torch.float64)
            bs = torch.randn(K, Lk, V + 1, V + 1, V, generator=gs, dtype=torch.float64)
        if self.position_decay != 1.0:
            scale = torch.tensor([self.position_decay ** j for j in range(Lk)], dtype=torch.float64)
            fs = fs * scale[None, :, None, None, None, None]
            bs = bs * scale[None, :, None, None, None]
        return fs, bs, fd, bd

    def init_theta(self, seed: int | None = None, scale: float = 1.0) -> torch.Tensor:
        """A parameter vector drawn from N(0, scale^2) (seeded), float64."""
        g = torch.Generator().manual_seed(self.seed + 1 if seed is None else seed)
        return scale * torch.randn(self.n_params, generator=g, dtype=torch.float64)

    def answer(self, attempt) -> int:
        return sum(attempt) % self.vocab_size

    def correct(self, attempt) -> bool:
        return self.answer(attempt) == 0

    # ---------------------------------------------------------------- policies
    def sample_logits(self, theta, k: int, j: int, prev_answer: int | None, prev_token: int | None):
        """Logits of pi_sample for token j (0-based) of attempt k (1-based)."""
        fs, bs, _, _ = self._features
        a = self.vocab_size if prev_answer is None else prev_answer
        b = self.vocab_size if prev_token is None else prev_token
        return fs[k - 1, j, a, b] @ theta + bs[k - 1, j, a, b]

    def decision_logits(self, theta, k: int, answer: int):
        """Logits of pi_d over (STOP, RESAMPLE) after attempt k with the given answer."""
        _, _, fd, bd = self._features
        return fd[k - 1, answer] @ theta + bd[k - 1, answer]

    def pi_sample(self, theta, attempt, k: int, prev_answer: int | None) -> torch.Tensor:
        """pi_sample(A_k, T_k | s_{k-1}): probability of a whole attempt given the previous state."""
        return torch.exp(self._attempt_logp(theta, attempt, k, prev_answer).sum())

    def pi_d(self, theta, decision: int, k: int, answer: int) -> torch.Tensor:
        """pi_d(a_k | s_k); a forced STOP after the last attempt has probability 1."""
        if k == self.max_attempts:
            return torch.ones((), dtype=torch.float64) if decision == STOP else torch.zeros((), dtype=torch.float64)
        return torch.softmax(self.decision_logits(theta, k, answer), -1)[decision]

    def _attempt_logp(self, theta, attempt, k, prev_answer):
        out, prev = [], None
        for j, tok in enumerate(attempt):
            out.append(torch.log_softmax(self.sample_logits(theta, k, j, prev_answer, prev), -1)[tok])
            prev = tok
        return torch.stack(out)

    # ---------------------------------------------------------------- trajectories
    @cached_property
    def trajectories(self) -> tuple[Trajectory, ...]:
        """Every trajectory with positive probability, in a fixed order."""
        attempts = list(itertools.product(range(self.vocab_size), repeat=self.attempt_length))
        out = []
        for T in range(1, self.max_attempts + 1):
            for seq in itertools.product(attempts, repeat=T):
                out.append(Trajectory(tuple(seq), (RESAMPLE,) * (T - 1) + (STOP,)))
        return tuple(out)

    def steps(self, theta, traj: Trajectory) -> list[Step]:
        """The token stream of ``traj`` in generation order (the chain rule of Lemma 3.1)."""
        steps, prefix, t, prev_answer = [], (), 0, None
        for k, (att, dec) in enumerate(zip(traj.attempts, traj.decisions), start=1):
            logps = self._attempt_logp(theta, att, k, prev_answer)
            for j, tok in enumerate(att):
                prefix = prefix + (("s", tok),)
                steps.append(Step("sample", k, t, logps[j], prefix))
                t += 1
            ans = self.answer(att)
            if k == self.max_attempts:
                lp = torch.zeros((), dtype=torch.float64) + 0.0 * theta.sum()
            else:
                lp = torch.log_softmax(self.decision_logits(theta, k, ans), -1)[dec]
            prefix = prefix + (("d", dec),)
            steps.append(Step("decision", k, t, lp, prefix, forced=k == self.max_attempts))
            t += 1
            prev_answer = ans
        return steps

    def reward(self, traj: Trajectory) -> float:
        return 1.0 if self.correct(traj.attempts[-1]) else 0.0

    def log_prob(self, theta, traj: Trajectory) -> torch.Tensor:
        """log P(tau) as the sum of next-token log-probabilities (chain rule)."""
        return torch.stack([s.logp for s in self.steps(theta, traj)]).sum()

    def log_prob_factorized(self, theta, traj: Trajectory) -> torch.Tensor:
        """log P(tau) from Lemma 3.1's product of option probabilities pi_sample and pi_d."""
        total, prev = torch.zeros((), dtype=torch.float64), None
        for k, (att, dec) in enumerate(zip(traj.attempts, traj.decisions), start=1):
            total = total + torch.log(self.pi_sample(theta, att, k, prev))
            total = total + torch.log(self.pi_d(theta, dec, k, self.answer(att)))
            prev = self.answer(att)
        return total


# ------------------------------------------------------------------------------------------------
# Exact expectations
# ------------------------------------------------------------------------------------------------
def enumerate_steps(mdp: FiniteTwoStageMDP, theta) -> tuple[list[list[Step]], torch.Tensor]:
    """The token stream of every trajectory (``mdp.trajectories`` order) and its log-probability log P(tau)."""
    steps = [mdp.steps(theta, tr) for tr in mdp.trajectories]
    logp = torch.stack([torch.stack([s.logp for s in st]).sum() for st in steps])
    return steps, logp


def expected_return(mdp: FiniteTwoStageMDP, theta, gamma: float = 1.0) -> torch.Tensor:
    """J(theta) = sum_tau P(tau) gamma^t_end R(tau), exactly (differentiable in theta)."""
    gamma = v.gamma(gamma)
    steps, logp = enumerate_steps(mdp, theta)
    ret = torch.tensor([gamma ** st[-1].t * mdp.reward(tr) for st, tr in zip(steps, mdp.trajectories)],
                       dtype=torch.float64)
    return (logp.exp() * ret).sum()


def conditional_q(weights, per_step_values, steps_list):
    """Q(h_t, a_t) = E[value_t | prefix through a_t], by grouping trajectories on their prefixes."""
    num, den = {}, {}
    for w, vals, steps in zip(weights, per_step_values, steps_list):
        for val, s in zip(vals, steps):
            num[s.prefix] = num.get(s.prefix, 0.0) + w * val
            den[s.prefix] = den.get(s.prefix, 0.0) + w
    return {key: num[key] / den[key] for key in num}


@dataclass(frozen=True)
class GradientDecomposition:
    """Exact gradient of an objective and its split into sampling and decision parts.

    ``autograd`` is the gradient of the exact objective; ``sample`` + ``decision`` is the policy
    gradient sum of Lemma 3.2 restricted to sampling / decision tokens (with the ``gamma^t`` weight);
    ``paper_form`` is the same sum without the ``gamma^t`` weight, as Lemma 3.2 is printed.
    ``q`` maps each history-and-action (a step's ``prefix``) to its Q-value, where one was computed.
    """

    objective: float
    autograd: torch.Tensor
    sample: torch.Tensor
    decision: torch.Tensor
    paper_form: torch.Tensor
    q: dict = field(default_factory=dict, repr=False)


def decompose(mdp, theta, gamma, returns_fn, objective_fn) -> GradientDecomposition:
    """Lemma 3.2 for any objective: autograd of ``objective_fn(theta)`` next to
    ``sum_tau P(tau) sum_t gamma^t Q(h_t, a_t) grad log pi(a_t | h_t)`` with
    ``Q = E[returns_fn(steps, traj)[t] | h_t, a_t]`` (exact), split into sampling and decision tokens."""
    theta = theta.detach().clone().requires_grad_(True)
    obj = objective_fn(theta)
    (g_auto,) = torch.autograd.grad(obj, theta)
    steps, logp = enumerate_steps(mdp, theta)
    w = logp.detach().exp().tolist()
    vals = [returns_fn(st, tr) for st, tr in zip(steps, mdp.trajectories)]
    q = conditional_q(w, vals, steps)
    parts = {"sample": 0.0, "decision": 0.0, "paper": 0.0}
    for wi, st in zip(w, steps):
        for s in st:
            parts[s.kind] = parts[s.kind] + wi * gamma ** s.t * q[s.prefix] * s.logp
            parts["paper"] = parts["paper"] + wi * q[s.prefix] * s.logp
    gs = torch.autograd.grad(parts["sample"], theta, retain_graph=True)[0]
    gd = torch.autograd.grad(parts["decision"], theta, retain_graph=True)[0]
    gp = torch.autograd.grad(parts["paper"], theta)[0]
    return GradientDecomposition(float(obj.detach()), g_auto, gs, gd, gp, q)


def reward_gradient(mdp: FiniteTwoStageMDP, theta, gamma: float = 1.0) -> GradientDecomposition:
    """Lemma 3.2 on the finite MDP: grad J by autograd and by sum_t gamma^t grad log pi * Q."""
    gamma = v.gamma(gamma)

    def returns(steps, traj):  # return-to-go from each step: gamma^(t_end - t) R
        r, t_end = mdp.reward(traj), steps[-1].t
        return [gamma ** (t_end - s.t) * r for s in steps]

    return decompose(mdp, theta, gamma, returns, lambda th: expected_return(mdp, th, gamma))


def expected_kl(mdp: FiniteTwoStageMDP, theta, theta_ref, gamma: float = 1.0) -> torch.Tensor:
    """E_theta[ sum_t gamma^t log(pi_theta(a_t|h_t) / pi_ref(a_t|h_t)) ] exactly (the token-level KL)."""
    gamma = v.gamma(gamma)
    steps, logp = enumerate_steps(mdp, theta)
    ref_steps = [mdp.steps(theta_ref, tr) for tr in mdp.trajectories]
    d = torch.stack([sum(gamma ** s.t * (s.logp - r.logp) for s, r in zip(st, rst))
                     for st, rst in zip(steps, ref_steps)])
    return (logp.exp() * d).sum()


def kl_penalties(mdp: FiniteTwoStageMDP, theta, theta_ref, traj: Trajectory):
    """Per-step log-ratios d_t = log pi_theta - log pi_ref along ``traj`` (floats) and the steps."""
    st = mdp.steps(theta, traj)
    rst = mdp.steps(theta_ref, traj)
    return [float(s.logp - r.logp) for s, r in zip(st, rst)], st


def to_go(d, gamma: float = 1.0) -> list[float]:
    """The discounted sum to go ``sum_{t' >= t} gamma^(t'-t) d_t'`` for every t, computed backwards as
    ``Q_t = d_t + gamma Q_{t+1}`` (Theorem 3.2's recursion along one trajectory)."""
    out, acc = [0.0] * len(d), 0.0
    for i in reversed(range(len(d))):
        acc = d[i] + gamma * acc
        out[i] = acc
    return out


def kl_gradient(mdp: FiniteTwoStageMDP, theta, theta_ref, gamma: float = 1.0) -> GradientDecomposition:
    """Theorem 3.2 on the finite MDP: grad E[KL] by autograd and by sum_t gamma^t grad log pi Q^KL,
    where Q^KL(h_t, a_t) = E[sum_{t' >= t} gamma^(t'-t) d_t' | h_t, a_t] (the direct term
    E[grad d_t] = E[grad log pi_theta] vanishes)."""
    gamma = v.gamma(gamma)
    theta_ref = theta_ref.detach()

    def returns(steps, traj):
        return to_go(kl_penalties(mdp, theta.detach(), theta_ref, traj)[0], gamma)

    return decompose(mdp, theta, gamma, returns, lambda th: expected_kl(mdp, th, theta_ref, gamma))


def option_bellman_kl(mdp: FiniteTwoStageMDP, theta, theta_ref) -> list[tuple[float, float, float, float]]:
    """Theorem 3.2's option-level Bellman recursions, checked with exact conditional expectations
    (gamma = 1).

    ``Q_sample(s_{k-1}, a'_k)`` is E[KL-to-go from the attempt's first token | history through the
    attempt]; ``Q_d(s_k, a''_k)`` is E[KL-to-go from the decision token | history through it].
    For every trajectory and attempt k returns
    ``(Q_sample, d_k^sample + E_{pi_d}[Q_d(s_k, .)], Q_d, d_k^decision + E_{pi_sample}[Q_sample(s_k, .)])``
    (the last term is 0 after the final STOP): the first two entries agree, and so do the last two.
    """
    theta, theta_ref = theta.detach(), theta_ref.detach()
    steps, logp = enumerate_steps(mdp, theta)
    w = logp.exp().tolist()
    info = []  # per trajectory: list of (key_attempt, key_decision, d_sample, d_decision, togo_first, togo_dec)
    for tr, st in zip(mdp.trajectories, steps):
        d, _ = kl_penalties(mdp, theta, theta_ref, tr)
        togo = to_go(d)
        rows = []
        for k in range(1, st[-1].k + 1):
            idx = [i for i, s in enumerate(st) if s.k == k]
            first, last = idx[0], idx[-1]
            rows.append((st[last - 1].prefix, st[last].prefix, sum(d[first:last]), d[last],
                         togo[first], togo[last]))
        info.append(rows)

    def cond(pairs):
        num, den = {}, {}
        for wi, rows in zip(w, pairs):
            for key, val in rows:
                num[key] = num.get(key, 0.0) + wi * val
                den[key] = den.get(key, 0.0) + wi
        return {key: num[key] / den[key] for key in num}

    q_s = cond([[(r[0], r[4]) for r in rows] for rows in info])
    q_d = cond([[(r[1], r[5]) for r in rows] for rows in info])
    e_qd = cond([[(r[0], q_d[r[1]]) for r in rows] for rows in info])
    e_qs = cond([[(rows[i][1], q_s[rows[i + 1][0]]) for i in range(len(rows) - 1)] for rows in info])
    out = []
    for rows in info:
        for i, r in enumerate(rows):
            nxt = e_qs[r[1]] if i + 1 < len(rows) else 0.0
            out.append((q_s[r[0]], r[2] + e_qd[r[0]], q_d[r[1]], r[3] + nxt))
    return out


def surrogate_gradient(mdp: FiniteTwoStageMDP, theta, theta_old=None) -> GradientDecomposition:
    """Theorem 3.1 on the finite MDP.

    The surrogate ``L(theta) = E_{tau ~ pi_old}[pi_theta(tau) / pi_old(tau) * A(tau)]`` with the
    exact advantage ``A(tau) = R(tau) - J(theta_old)`` (the limit of GRPO's group baseline).
    ``autograd`` is its gradient; ``sample`` / ``decision`` are
    ``E_old[ratio(tau) A(tau) sum grad log pi]`` over the sampling / decision tokens: every token of a
    trajectory is weighted by the same scalar. ``paper_form`` is the gradient of the expected reward
    itself, which the surrogate's gradient equals for any theta_old (the baseline is a constant).
    """
    theta = theta.detach().clone().requires_grad_(True)
    theta_old = theta.detach() if theta_old is None else theta_old.detach()
    _, logp_old = enumerate_steps(mdp, theta_old)
    p_old = logp_old.exp()
    R = torch.tensor([mdp.reward(tr) for tr in mdp.trajectories], dtype=torch.float64)
    adv = R - (p_old * R).sum()
    steps, logp = enumerate_steps(mdp, theta)
    ratio = torch.exp(logp - logp_old)
    obj = (p_old * ratio * adv).sum()
    (g_auto,) = torch.autograd.grad(obj, theta, retain_graph=True)
    ws = (p_old * ratio * adv).detach().tolist()  # importance weight times the same A(tau)
    s_part = sum(wi * s.logp for wi, st in zip(ws, steps) for s in st if s.kind == "sample")
    d_part = sum(wi * s.logp for wi, st in zip(ws, steps) for s in st if s.kind == "decision")
    gs = torch.autograd.grad(s_part, theta, retain_graph=True)[0]
    gd = torch.autograd.grad(d_part, theta, retain_graph=True)[0]
    gj = torch.autograd.grad(expected_return(mdp, theta), theta)[0]
    return GradientDecomposition(float(obj.detach()), g_auto, gs, gd, gj)


def ratio_factors(mdp: FiniteTwoStageMDP, theta, theta_old, traj: Trajectory):
    """The clipping remark (Appendix B, Eq. 8): pi_theta(tau)/pi_old(tau) and its three factors
    (sampling ratio, resampling ratio, stopping ratio), as floats."""
    samp = resamp = 1.0
    prev = None
    stop = 1.0
    for k, (att, dec) in enumerate(zip(traj.attempts, traj.decisions), start=1):
        samp *= float(mdp.pi_sample(theta, att, k, prev) / mdp.pi_sample(theta_old, att, k, prev))
        r = float(mdp.pi_d(theta, dec, k, mdp.answer(att)) / mdp.pi_d(theta_old, dec, k, mdp.answer(att)))
        if dec == RESAMPLE:
            resamp *= r
        else:
            stop = r
        prev = mdp.answer(att)
    total = float(torch.exp(mdp.log_prob(theta, traj) - mdp.log_prob(theta_old, traj)))
    return total, samp, resamp, stop


def score_decomposition(mdp: FiniteTwoStageMDP, theta, traj: Trajectory):
    """Corollary 3.1: ``grad log P(tau)`` (from Lemma 3.1's product of pi_sample and pi_d) and its
    two parts, ``sum_k grad log pi_sample`` and ``sum_k grad log pi_d`` (from the token stream)."""
    theta = theta.detach().clone().requires_grad_(True)
    total = torch.autograd.grad(mdp.log_prob_factorized(theta, traj), theta)[0]
    steps = mdp.steps(theta, traj)
    gs = torch.autograd.grad(torch.stack([s.logp for s in steps if s.kind == "sample"]).sum(), theta,
                             retain_graph=True)[0]
    gd = torch.autograd.grad(torch.stack([s.logp for s in steps if s.kind == "decision"]).sum(), theta,
                             allow_unused=True)[0]
    return total, gs, torch.zeros_like(gs) if gd is None else gd


def kl_gradient_ratios(n_policies: int, seed: int = 0, attempt_length: int = 3, max_attempts: int = 2) -> np.ndarray:
    """``|g_sample| / |g_decision|`` of the exact KL gradient (:func:`kl_gradient`) for ``n_policies`` random
    stationary token policies (MDP seeds ``seed + i``, reference policies seeds ``seed + i + 100``)."""
    n_policies = v.positive_int("n_policies", n_policies)
    out = []
    for i in range(n_policies):
        m = FiniteTwoStageMDP(attempt_length=attempt_length, max_attempts=max_attempts, stationary=True, seed=seed + i)
        g = kl_gradient(m, m.init_theta(), m.init_theta(seed=seed + i + 100))
        out.append(float(g.sample.norm() / g.decision.norm()))
    return np.array(out)
