"""The clipping remark of Section 3.3, checked on the finite MDP.

The clipped surrogate is ``E_{tau ~ pi_old}[min(r A, clip(r, 1 - eps, 1 + eps) A)]``. Its gradient is
``E_old[sum_t w_t grad log pi(a_t | h_t)]`` where the weight ``w_t`` of token t is the derivative of the
trajectory's clipped term with respect to that token's log-probability (autograd, below). Theorem 3.1's
balance is the statement that ``w_t`` is one number per trajectory, the same for its sampling and its
decision tokens.

* ``level="sequence"``: one ratio per trajectory, ``r = pi_theta(tau) / pi_old(tau)`` (the paper's Eq. 8
  product; GSPO also uses one ratio per sequence, length-normalized). Either the whole trajectory is
  clipped or none of it: every token gets the same weight, and the remark holds.
* ``level="token"``: one ratio per token, ``r_t = pi_theta(a_t | h_t) / pi_old(a_t | h_t)``, clipped token
  by token, as in GRPO and TRL's default (``importance_sampling_level="token"``). A decision token whose
  ratio left the interval gets weight 0 while the attempt before it keeps ``r_t A``: the weights differ
  within a trajectory and the remark fails.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..core import validate as v
from .bellman import advantage
from .mdp import FiniteTwoStageMDP, enumerate_steps

LEVELS = ("sequence", "token")


@dataclass(frozen=True)
class ClippedWeights:
    """Per trajectory: ``weight`` (pi_old(tau)), ``sample_w`` / ``decision_w`` (the weights of its sampling
    and non-forced decision tokens), and the gradient of the clipped surrogate by autograd (``gradient``)
    and as ``sum w_t grad log pi`` split into ``sample`` and ``decision`` parts."""

    level: str
    eps: float
    weight: np.ndarray
    sample_w: tuple[np.ndarray, ...]
    decision_w: tuple[np.ndarray, ...]
    gradient: np.ndarray
    sample: np.ndarray
    decision: np.ndarray

    def partly_clipped_mass(self) -> float:
        """Probability (under pi_old) of the trajectories in which clipping zeroed the weight of some tokens
        but not of others (0 for sequence-level clipping, where a trajectory is clipped whole or not at all)."""
        out = 0.0
        for w, s, d in zip(self.weight, self.sample_w, self.decision_w):
            zero = np.concatenate([s, d]) == 0.0
            if zero.any() and not zero.all():
                out += w
        return float(out)

    def spread_mass(self, tol: float = 1e-12) -> float:
        """Probability (under pi_old) of the trajectories whose tokens do not all get the same weight."""
        out = 0.0
        for w, s, d in zip(self.weight, self.sample_w, self.decision_w):
            allw = np.concatenate([s, d])
            if allw.size and allw.max() - allw.min() > tol:
                out += w
        return float(out)


def _clipped_term(logp, logp_old, adv, eps, level):
    """One trajectory's clipped surrogate term from its per-token log-probabilities."""
    if level == "sequence":
        r = torch.exp((logp - logp_old).sum())
        return torch.minimum(r * adv, torch.clamp(r, 1 - eps, 1 + eps) * adv)
    r = torch.exp(logp - logp_old)
    return torch.minimum(r * adv, torch.clamp(r, 1 - eps, 1 + eps) * adv).sum()


def clipped_weights(mdp: FiniteTwoStageMDP, theta, theta_old, eps: float | None = 0.2,
                    level: str = "token") -> ClippedWeights:
    """Weights of every token in the gradient of the clipped surrogate (exact, every trajectory), with the
    advantage ``A(tau) = R(tau) - J(theta_old)``; ``eps=None`` leaves the ratio unclipped."""
    level = v.choice("level", level, LEVELS)
    if eps is None:
        eps = float("inf")
    elif isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0.0 < eps < 1.0:
        raise ValueError(f"eps must be a number in (0, 1) or None, got {eps!r}")
    eps = float(eps)
    theta = torch.as_tensor(theta, dtype=torch.float64).detach().clone().requires_grad_(True)
    theta_old = torch.as_tensor(theta_old, dtype=torch.float64).detach()
    adv = advantage(mdp, theta_old)
    old_steps, old_logp = enumerate_steps(mdp, theta_old)
    steps, _ = enumerate_steps(mdp, theta)
    p_old = old_logp.exp().tolist()
    total = torch.zeros((), dtype=torch.float64)
    s_w, d_w, s_part, d_part = [], [], 0.0, 0.0
    for po, a, st, ost in zip(p_old, adv, steps, old_steps):
        lp = torch.stack([s.logp for s in st])
        leaf = lp.detach().clone().requires_grad_(True)
        lo = torch.stack([s.logp for s in ost]).detach()
        term = _clipped_term(leaf, lo, a, eps, level)
        (w,) = torch.autograd.grad(term, leaf)
        w = w.numpy()
        s_w.append(np.array([x for x, s in zip(w, st) if s.kind == "sample"]))
        d_w.append(np.array([x for x, s in zip(w, st) if s.kind == "decision" and not s.forced]))
        total = total + po * _clipped_term(lp, lo, a, eps, level)
        for x, s in zip(w, st):
            if s.kind == "sample":
                s_part = s_part + po * float(x) * s.logp
            else:
                d_part = d_part + po * float(x) * s.logp
    grad = torch.autograd.grad(total, theta, retain_graph=True)[0]
    gs = torch.autograd.grad(s_part, theta, retain_graph=True)[0]
    gd = torch.autograd.grad(d_part, theta)[0]
    return ClippedWeights(level, eps, np.array(p_old), tuple(s_w), tuple(d_w), grad.numpy(), gs.numpy(), gd.numpy())
