"""SFT and DFT as policy gradients, checked on the finite MDP (Appendix D; the Theorem D.1 erratum).

Fine-tuning on one data trajectory ``tau*`` (every token of it, sampling and decision tokens alike):

* SFT's gradient is ``grad log P(tau*) = sum_t grad log pi(a*_t | h*_t)`` (autograd).
* Theorem D.1 writes it as ``sum_t grad log pi(a*_t | h*_t) Q^SFT_t`` with
  ``Q^SFT_t = sum_{t' > t} 1 / pi(a*_t' | h*_t')`` (the implicit rewards of the tokens after t).
  That is not the gradient: :func:`sft_check` evaluates both.
* The policy-gradient form that holds is the one of the DFT paper: SFT is the gradient of
  ``E_{tau ~ pi}[R(tau)]`` with the (stop-gradient) outcome reward ``R(tau) = 1[tau = tau*] / P(tau*)``.
  Its Q-values, ``Q(h_t, a_t) = E[R | h_t, a_t]``, are ``1 / pi(tau*_{<=t})`` along ``tau*`` (one over the
  probability of the prefix through the action) and 0 off it: the same function of the history for
  sampling and decision tokens, and the reward is an outcome reward received at the end, like RL's.
* DFT's gradient is ``sum_t sg(pi_t) grad log pi_t = sum_t grad pi(a*_t | h*_t)``; Theorem D.2 writes it
  with ``Q^DFT_t = c * (tokens after t)``, which :func:`dft_check` compares with it for the best ``c``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..core import validate as v
from .mdp import STOP, FiniteTwoStageMDP, Trajectory, decompose, enumerate_steps


@dataclass(frozen=True)
class ImplicitRewardCheck:
    """One data trajectory: ``gradient`` (autograd of the loss), ``paper_form`` (Appendix D's
    ``sum grad log pi * Q``), ``implicit_form`` (``E_pi[sum grad log pi * Q]`` with the valid Q; SFT only,
    split into ``implicit_sample`` and ``implicit_decision``), and along the trajectory: ``kind``,
    ``pi`` (pi(a*_t | h*_t)), ``q_paper``, ``q_conditional`` (E[R | h*_t, a*_t] by enumeration) and
    ``q_prefix`` (1 / P(tau*_{<=t}))."""

    gradient: np.ndarray
    paper_form: np.ndarray
    implicit_form: np.ndarray | None
    implicit_sample: np.ndarray | None
    implicit_decision: np.ndarray | None
    kind: tuple[str, ...]
    pi: np.ndarray
    q_paper: np.ndarray
    q_conditional: np.ndarray | None
    q_prefix: np.ndarray

    @property
    def paper_error(self) -> float:
        """max |paper_form - gradient| / max |gradient|."""
        return float(np.abs(self.paper_form - self.gradient).max() / np.abs(self.gradient).max())

    @property
    def cosine(self) -> float:
        """Cosine between ``paper_form`` and ``gradient``: 1 when the printed form points the right way."""
        return float(self.paper_form @ self.gradient / (np.linalg.norm(self.paper_form) * np.linalg.norm(self.gradient)))

    @property
    def rescaled_error(self) -> float:
        """``min_c |c * paper_form - gradient| / |gradient|`` (Euclidean): what no constant can fix; 0 when the printed
        form is the gradient up to scale, 1 when it is orthogonal to it. ``sqrt(1 - cosine^2)``."""
        return float(np.sqrt(max(0.0, 1.0 - self.cosine ** 2)))

    @property
    def model_free(self) -> dict:
        """The model-free reading of the printed Q-values along the trajectory: the last token's is 0 and they
        strictly decrease, so they are not constant and, with linearly independent token scores, no constant c
        makes ``sum_t Q_t grad log pi_t`` equal to ``c sum_t grad log pi_t``; the final STOP's score gets weight 0."""
        q = np.asarray(self.q_paper)
        return {"last_q_zero": bool(q[-1] == 0), "strictly_decreasing": bool(np.all(np.diff(q) < 0))}


def data_trajectory(mdp: FiniteTwoStageMDP, index: int | None = None) -> Trajectory:
    """A data trajectory ending in a chosen STOP (not the forced one): the ``index``-th such trajectory
    with two attempts, or the last one if ``index`` is None."""
    cands = [tr for tr in mdp.trajectories
             if len(tr.attempts) == 2 and tr.decisions[-1] == STOP and mdp.max_attempts > 2]
    if not cands:
        raise ValueError("mdp must allow at least 3 attempts (max_attempts >= 3) for a data trajectory "
                         "with a chosen STOP after two attempts")
    if index is None:
        return cands[-1]
    index = v.length("index", index)
    if index >= len(cands):
        raise ValueError(f"index must be an integer in [0, {len(cands) - 1}], got {index}")
    return cands[index]


def _along(mdp, theta, traj):
    """The data trajectory's steps, log pi(a*_t | h*_t) (differentiable in ``theta``), pi(a*_t | h*_t) and
    1 / P(tau*_{<=t}), after checking that ``traj`` belongs to ``mdp``."""
    if traj not in mdp.trajectories:
        raise ValueError("traj must be one of mdp.trajectories")
    steps = mdp.steps(theta, traj)
    logp = torch.stack([s.logp for s in steps])
    lp = logp.detach().numpy()
    return steps, logp, np.exp(lp), 1.0 / np.exp(np.cumsum(lp))


def _paper_q(pi: np.ndarray, per_token: np.ndarray) -> np.ndarray:
    """Appendix D's convention: the implicit rewards of the tokens after t."""
    return np.concatenate([np.cumsum(per_token[::-1])[::-1][1:], [0.0]])


def sft_check(mdp: FiniteTwoStageMDP, theta, traj: Trajectory) -> ImplicitRewardCheck:
    """Theorem D.1 checked on one data trajectory of the finite MDP (see the module docstring)."""
    theta = torch.as_tensor(theta, dtype=torch.float64).detach().clone().requires_grad_(True)
    steps, logp, pi, q_prefix = _along(mdp, theta, traj)
    grad = torch.autograd.grad(logp.sum(), theta, retain_graph=True)[0]
    q_paper = _paper_q(pi, 1.0 / pi)
    paper = torch.autograd.grad((logp * torch.as_tensor(q_paper)).sum(), theta)[0]
    p_star = float(logp.detach().sum().exp())

    def returns(st, tr):
        return [1.0 / p_star if tr == traj else 0.0] * len(st)

    def objective(th):
        _, lp = enumerate_steps(mdp, th)
        return lp[mdp.trajectories.index(traj)].exp() / p_star

    dec = decompose(mdp, theta.detach(), 1.0, returns, objective)
    q_cond = np.array([dec.q[s.prefix] for s in steps])
    return ImplicitRewardCheck(grad.numpy(), paper.numpy(), (dec.sample + dec.decision).numpy(),
                               dec.sample.numpy(), dec.decision.numpy(), tuple(s.kind for s in steps), pi,
                               q_paper, q_cond, q_prefix)


def dft_check(mdp: FiniteTwoStageMDP, theta, traj: Trajectory) -> ImplicitRewardCheck:
    """Theorem D.2 on one data trajectory: the DFT gradient ``sum_t grad pi(a*_t | h*_t)`` (autograd of
    ``sum_t sg(pi_t) log pi_t``) against ``c * sum_t grad log pi_t * (tokens after t)`` with the ``c`` that
    fits best (least squares), stored as ``paper_form``."""
    theta = torch.as_tensor(theta, dtype=torch.float64).detach().clone().requires_grad_(True)
    steps, logp, pi, q_prefix = _along(mdp, theta, traj)
    grad = torch.autograd.grad((logp.detach().exp() * logp).sum(), theta, retain_graph=True)[0].numpy()
    q_paper = _paper_q(pi, np.ones_like(pi))
    basis = torch.autograd.grad((logp * torch.as_tensor(q_paper)).sum(), theta)[0].numpy()
    c = float(basis @ grad / (basis @ basis)) if basis @ basis > 0 else 0.0
    return ImplicitRewardCheck(grad, c * basis, None, None, None, tuple(s.kind for s in steps), pi,
                               c * q_paper, None, q_prefix)


def erratum_instances(seeds=(0, 1, 2, 3, 4), indices=(0, 5)) -> list[dict]:
    """Theorem D.1's printed form against the SFT gradient on several instances (an MDP seed and a data trajectory):
    the size of the error relative to the gradient (``paper_error``, what the 1/pi sums make large or small), the
    cosine, the error after the best scalar rescale, the model-free reading, and the outcome-reward identity's
    error (``implicit_error``: SFT as the policy gradient of ``1[tau = tau*] / P(tau*)``, an identity)."""
    rows = []
    for seed in seeds:
        m = FiniteTwoStageMDP(seed=v.length("seeds[i]", seed))
        theta = m.init_theta()
        for index in indices:
            r = sft_check(m, theta, data_trajectory(m, index))
            rows.append({"seed": seed, "trajectory": index, "paper_error": r.paper_error, "cosine": r.cosine,
                         "rescaled_error": r.rescaled_error, **r.model_free,
                         "implicit_error": float(np.abs(r.implicit_form - r.gradient).max() / np.abs(r.gradient).max())})
    return rows
