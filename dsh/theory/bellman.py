"""Definition 3.1 with one rule, and Theorem 3.1 as a statement about conditional expectations.

On the finite MDP of :mod:`dsh.theory.mdp` every Q-value is an exact conditional expectation,
``Q(h_t, a_t) = E[value_t | h_t, a_t]``, computed by enumeration. :func:`bellman_split` writes each one as
``Q(h_t, a_t) = r_t + gamma E[Q(h_{t+1}, a_{t+1}) | h_t, a_t]`` (after the final token the continuation
is the terminal value, received with it), which recovers the immediate reward ``r_t`` of every token from
the Q-values alone. Definition 3.1 is then applied by the same rule to every objective: attribution is
balanced when the immediate rewards of an attempt and of a decision are of the same order (both zero
included), unbalanced when one outgrows the other with the attempt length.

:func:`surrogate_q` is Theorem 3.1 in this form: with the outcome reward (or advantage) received with the
final STOP, every immediate reward is zero, so ``Q_sample = gamma E[Q_d]`` and ``Q_d = gamma E[Q_sample]``
share one continuation value ``V``, the sufficient statistic ``Phi``. The paper's printed form
``gamma^(sum len) A_i`` is the *realized* value of one trajectory, which equals the conditional expectation
only where the future is determined (the final STOP).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..core import validate as v
from .mdp import FiniteTwoStageMDP, conditional_q, enumerate_steps, expected_return, kl_penalties, to_go


@dataclass(frozen=True)
class BellmanSplit:
    """Every step of every trajectory, flattened: ``kind`` ("sample" / "decision"), the attempt ``k``,
    ``forced`` (the parameter-free STOP after the last attempt), the trajectory probability ``weight``,
    the exact ``q`` (conditional expectation), the ``realized`` value the expectation is taken of, the
    ``continuation`` ``gamma E[Q_next | h_t, a_t]`` (the terminal value after the last step) and
    ``immediate = q - continuation``; ``traj`` indexes ``mdp.trajectories``."""

    kind: np.ndarray
    k: np.ndarray
    forced: np.ndarray
    traj: np.ndarray
    weight: np.ndarray
    q: np.ndarray
    realized: np.ndarray
    continuation: np.ndarray
    immediate: np.ndarray

    def option_immediate(self) -> tuple[float, float]:
        """Expected immediate reward of one attempt (its tokens summed) and of one non-forced decision,
        averaged over the attempts of the trajectories (gamma = 1 reading of an option's reward)."""
        keys, first, inv = np.unique(np.stack([self.traj, self.k], 1), axis=0, return_index=True, return_inverse=True)
        inv = inv.ravel()
        w = self.weight[first]
        samp = np.zeros(len(keys))
        np.add.at(samp, inv, np.where(self.kind == "sample", self.immediate, 0.0))
        dec_mask = (self.kind == "decision") & ~self.forced
        dec = np.zeros(len(keys))
        np.add.at(dec, inv, np.where(dec_mask, self.immediate, 0.0))
        has_dec = np.zeros(len(keys), dtype=bool)
        np.logical_or.at(has_dec, inv, dec_mask)
        d_cnt = float(w[has_dec].sum())
        return float((w * samp).sum() / w.sum()), (float((w * dec)[has_dec].sum() / d_cnt) if d_cnt else 0.0)


def bellman_split(mdp: FiniteTwoStageMDP, theta, values_fn, terminal_fn, gamma: float = 1.0) -> BellmanSplit:
    """Q-values ``E[values_fn(steps, traj)[t] | h_t, a_t]`` under ``theta`` and their split
    ``Q_t = r_t + gamma E[Q_{t+1} | h_t, a_t]`` (``Q_{T+1}`` = ``terminal_fn(traj)``, undiscounted: it
    arrives with the last token). Exact, by enumeration of every trajectory."""
    gamma = v.gamma(gamma)
    theta = torch.as_tensor(theta, dtype=torch.float64).detach()
    steps, logp = enumerate_steps(mdp, theta)
    w = logp.exp().tolist()
    vals = [values_fn(st, tr) for st, tr in zip(steps, mdp.trajectories)]
    q = conditional_q(w, vals, steps)
    nxt_vals = [[gamma * q[st[i + 1].prefix] for i in range(len(st) - 1)] + [float(terminal_fn(tr))]
                for st, tr in zip(steps, mdp.trajectories)]
    cont = conditional_q(w, nxt_vals, steps)
    rows = []
    for i, (wi, st, vv) in enumerate(zip(w, steps, vals)):
        for s, val in zip(st, vv):
            rows.append((s.kind, s.k, s.forced, i, wi, q[s.prefix], float(val), cont[s.prefix]))
    kind, k, forced, traj, weight, qq, real, cc = (np.array(x) for x in zip(*rows))
    return BellmanSplit(kind, k.astype(int), forced.astype(bool), traj.astype(int), weight.astype(float),
                        qq.astype(float), real.astype(float), cc.astype(float), (qq - cc).astype(float))


def advantage(mdp: FiniteTwoStageMDP, theta) -> list[float]:
    """A(tau) = R(tau) - J(theta) for every trajectory (the large-group limit of GRPO's baseline)."""
    J = float(expected_return(mdp, torch.as_tensor(theta, dtype=torch.float64).detach()))
    return [mdp.reward(tr) - J for tr in mdp.trajectories]


def surrogate_q(mdp: FiniteTwoStageMDP, theta, gamma: float = 1.0) -> BellmanSplit:
    """Theorem 3.1 on the finite MDP: ``Q(h_t, a_t) = E[gamma^(t_end - t) A(tau) | h_t, a_t]`` for every
    sampling and decision token, with the advantage as the terminal value. Every immediate reward is 0."""
    gamma = v.gamma(gamma)
    adv = dict(zip(mdp.trajectories, advantage(mdp, theta)))

    def values(steps, traj):
        t_end = steps[-1].t
        return [gamma ** (t_end - s.t) * adv[traj] for s in steps]

    return bellman_split(mdp, theta, values, lambda traj: adv[traj], gamma)


def kl_q(mdp: FiniteTwoStageMDP, theta, theta_ref, gamma: float = 1.0) -> BellmanSplit:
    """Theorem 3.2 on the finite MDP: ``Q(h_t, a_t) = E[sum_{t' >= t} gamma^(t'-t) d_t' | h_t, a_t]`` with
    ``d_t = log pi_theta / pi_ref`` (terminal value 0). The immediate rewards are the log-ratios d_t."""
    gamma = v.gamma(gamma)
    theta = torch.as_tensor(theta, dtype=torch.float64).detach()
    theta_ref = torch.as_tensor(theta_ref, dtype=torch.float64).detach()

    def values(steps, traj):
        return to_go(kl_penalties(mdp, theta, theta_ref, traj)[0], gamma)

    return bellman_split(mdp, theta, values, lambda traj: 0.0, gamma)


def immediate_kl_by_length(lengths, seed: int = 0, position_decay: float | None = None,
                           max_attempts: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Expected immediate KL penalty of one attempt and of one non-forced decision
    (:meth:`BellmanSplit.option_immediate` of :func:`kl_q`) for a stationary token policy (MDP seed ``seed``,
    reference seed ``seed + 100``) with attempts of each length in ``lengths``; ``position_decay``: the
    non-stationary variant whose sampling features shrink by that factor per position."""
    kw = {} if position_decay is None else {"position_decay": position_decay}
    es, ed = [], []
    for L in lengths:
        m = FiniteTwoStageMDP(attempt_length=v.positive_int("lengths[i]", L), max_attempts=max_attempts,
                              stationary=True, seed=seed, **kw)
        a, b = kl_q(m, m.init_theta(), m.init_theta(seed=seed + 100)).option_immediate()
        es.append(a)
        ed.append(b)
    return np.array(es), np.array(ed)
