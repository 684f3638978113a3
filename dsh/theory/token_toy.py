"""A token-consistent version of Appendix C's toy (beyond the paper).

In the paper's toy (:mod:`dsh.theory.toy`) an attempt is correct with probability ``sigma(theta_s)`` whatever its
length L, yet each of its L tokens carries the whole attempt's log-ratio, so the attempt's KL penalty is
``L log(pi / pi_ref)``: that the KL attribution grows linearly in L is true of the toy by construction. Here an
attempt is L tokens, each right with probability ``q = sigma(theta_s)^(1/L)`` (independently), and the attempt is
correct when every token is: ``P(C) = q^L = sigma(theta_s)`` as in the paper's toy, and an attempt's token
log-ratios sum to the log-ratio of its token sequence (the chain rule an LLM obeys). Decisions are one token each,
as before. The expected reward is therefore the paper's toy's; the expected KL of an attempt is
``L KL(Bern(q) || Bern(q_ref))``, which stays bounded as L grows (the per-token log-ratio shrinks like 1/L).

Closed forms (the process is time-homogeneous, gamma = 1): ``E[R] = P(C) p_dC / (1 - r)`` and ``E[KL] = c / (1 - r)``
with ``r = P(RESAMPLE)`` and ``c`` the expected penalty of one attempt and its decision (Wald's identity); the
gradients are their autograd derivatives. :func:`expected_by_enumeration` checks the KL by summing over every token
sequence of every attempt.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from ..core import validate as v
from . import toy
from .toy import as_theta, attribution_ratio, policy_pieces


def _token_prob(theta, L: int):
    """q and 1 - q: each token right with q = sigma(theta_s)^(1/L)."""
    q = torch.sigmoid(theta[0]) ** (1.0 / L)
    return torch.stack([q, 1 - q])


def _decision_kl(theta, theta_ref):
    """E over the attempt's outcome of the decision's log-ratio: sum_X P(X) sum_a pi_d(a|X) log(pi_d / pi_d_ref)."""
    p, pd = policy_pieces(theta)
    _, pdr = policy_pieces(theta_ref)
    return (p * (pd * torch.log(pd / pdr)).sum(1)).sum()


def expected_reward(theta, L: int = 8) -> torch.Tensor:
    """E[R] = P(C) p_dC / (1 - r): the paper's toy's (``P(C) = sigma(theta_s)`` for every L)."""
    v.positive_int("L", L)
    return toy.expected_reward(theta, L, L)     # gamma = 1: no length enters it


def expected_kl(theta, theta_ref, L: int = 8) -> torch.Tensor:
    """E[sum of token log-ratios] = c / (1 - r) with c = L KL(Bern(q) || Bern(q_ref)) + the decision's expected
    log-ratio (KL in the reward, gamma = 1)."""
    theta, theta_ref = as_theta("theta", theta), as_theta("theta_ref", theta_ref)
    L = v.positive_int("L", L)
    t, tr = _token_prob(theta, L), _token_prob(theta_ref, L)
    p, pd = policy_pieces(theta)
    c = L * (t * torch.log(t / tr)).sum() + _decision_kl(theta, theta_ref)
    return c / (1 - (p * pd[:, 1]).sum())


def expected_kl_loss_k3(theta, theta_ref, L: int = 8) -> torch.Tensor:
    """GRPO's k3 KL in the loss, per token, expected under the policy with the weights held constant (as the loss
    is differentiated): ``n_visits (L sum_b sg(q_b) k3(q_b, q_ref_b) + sum_X sg(P(X)) sum_a sg(pi_d) k3(pi_d, ref))``."""
    theta, theta_ref = as_theta("theta", theta), as_theta("theta_ref", theta_ref)
    L = v.positive_int("L", L)
    k3 = lambda pi, ref: ref / pi - torch.log(ref / pi) - 1  # noqa: E731
    t, tr = _token_prob(theta, L), _token_prob(theta_ref, L)
    p, pd = policy_pieces(theta)
    _, pdr = policy_pieces(theta_ref)
    n_visits = (1 / (1 - (p * pd[:, 1]).sum())).detach()
    return n_visits * (L * (t.detach() * k3(t, tr)).sum() + (p.detach()[:, None] * pd.detach() * k3(pd, pdr)).sum())


def expected_gradients(theta, theta_ref, L: int = 8) -> dict[str, np.ndarray]:
    """Exact expected gradients (autograd of the closed forms) of the reward, of the KL in the reward and of the k3
    KL in the loss, with respect to (theta_s, theta_dC, theta_dW)."""
    out = {}
    for name, f in (("reward", lambda th: expected_reward(th, L)), ("kl", lambda th: expected_kl(th, theta_ref, L)),
                    ("kl_loss_k3", lambda th: expected_kl_loss_k3(th, theta_ref, L))):
        th = as_theta("theta", theta).clone().requires_grad_(True)
        out[name] = torch.autograd.grad(f(th), th)[0].detach().numpy().copy()
    return out


def length_sweep(theta, theta_ref, lengths) -> dict[str, np.ndarray]:
    """Sampling / decision attribution ratios (:func:`dsh.theory.toy.attribution_ratio`) of the token-consistent
    toy for attempts of each length in ``lengths``."""
    Ls = [v.positive_int("lengths[i]", int(L)) for L in lengths]
    out = {k: [] for k in ("L", "reward", "kl", "kl_loss_k3")}
    for L in Ls:
        g = expected_gradients(theta, theta_ref, L)
        out["L"].append(L)
        for k in ("reward", "kl", "kl_loss_k3"):
            out[k].append(attribution_ratio(g[k]))
    return {k: np.asarray(x, dtype=float) for k, x in out.items()}


def expected_by_enumeration(theta, theta_ref, L: int, tol: float = 1e-13) -> tuple[float, float]:
    """E[R] and E[KL] by summing over every token sequence of every attempt (2^L per attempt) and both decisions,
    attempt after attempt until less than ``tol`` of the probability is still running: an independent check of the
    closed forms (small L only)."""
    theta, theta_ref = as_theta("theta", theta), as_theta("theta_ref", theta_ref)
    L = v.positive_int("L", L)
    if L > 12:
        raise ValueError(f"L must be at most 12 for enumeration (2^L sequences an attempt), got {L}")
    q, qr = float(torch.sigmoid(theta[0])) ** (1 / L), float(torch.sigmoid(theta_ref[0])) ** (1 / L)
    _, pd = policy_pieces(theta)
    _, pdr = policy_pieces(theta_ref)
    pd, pdr = pd.numpy(), pdr.numpy()
    stop_r, stop_k, res_p, res_k = 0.0, 0.0, 0.0, 0.0   # one attempt: P and KL of stopping right, of resampling
    attempt_kl = 0.0
    for seq in itertools.product((True, False), repeat=L):
        prob = float(np.prod([q if s else 1 - q for s in seq]))
        kl = float(sum(np.log(q / qr) if s else np.log((1 - q) / (1 - qr)) for s in seq))
        x = 0 if all(seq) else 1                                       # C or W
        attempt_kl += prob * kl
        for a in (0, 1):                                               # STOP, RESAMPLE
            w = prob * pd[x, a]
            kd = float(np.log(pd[x, a] / pdr[x, a]))
            if a == 0:
                stop_r += w if x == 0 else 0.0
                stop_k += w * kd
            else:
                res_p += w
                res_k += w * kd
    alive, J, K = 1.0, 0.0, 0.0
    while alive > tol:
        J += alive * stop_r
        K += alive * (attempt_kl + stop_k + res_k)
        alive *= res_p
    return J, K
