"""The paper's three-logit toy model (Appendix C and the "Graphical Illustration" of Appendix D).

Three logits: ``theta_s`` (P(correct attempt) = sigmoid(theta_s)), ``theta_dC``
(P(STOP | correct) = sigmoid(theta_dC)) and ``theta_dW`` (P(RESAMPLE | wrong) = sigmoid(theta_dW)).
An attempt with answer X in {C, W} is ``len_X`` tokens; as in Appendix C, each of them carries the
log-ratio of its answer, so the immediate KL penalty of an attempt is
``d^sample = len_X * log(pi_sample(X) / pi_ref(X))`` and that of a decision a is
``d^decision = log(pi_d(a | X) / pi_d,ref(a | X))`` (Theorem 3.2's sign; Appendix C uses the opposite
sign, i.e. it works with the reward -d). Discounting is per action (one gamma per attempt and per
decision), as in Theorem 3.2's option-level recursion.

Everything is exact: the process is time-homogeneous, so the expected reward, the expected KL and their
Q-values have closed forms (a geometric series over attempts), which autograd differentiates.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..core import validate as v
from .two_stage import simulate

PARAMS = ("theta_s", "theta_dC", "theta_dW")
MAX_MONTE_CARLO = 10_000_000   # trajectories sampled at once (each holds its attempts)
POLICY_OF = {"theta_s": "pi_sample", "theta_dC": "pi_d", "theta_dW": "pi_d"}


def as_theta(name, theta) -> torch.Tensor:
    """``theta`` (three logits) as a float64 tensor; a one-line ValueError naming ``name`` otherwise."""
    t = torch.as_tensor(np.asarray(theta, dtype=np.float64) if not torch.is_tensor(theta) else theta,
                        dtype=torch.float64)
    if t.shape != (3,) or not torch.isfinite(t).all():
        raise ValueError(f"{name} must be three finite logits (theta_s, theta_dC, theta_dW); got {theta!r}")
    return t


def _check_common(len_C, len_W, gamma):
    return v.positive_int("len_C", len_C), v.positive_int("len_W", len_W), v.gamma(gamma)


# ------------------------------------------------------------------------------------------------
# Policy pieces (torch, differentiable)
# ------------------------------------------------------------------------------------------------
def policy_pieces(theta):
    """Probabilities of the toy: p_X for X in (C, W) and pi_d(a | X) for a in (STOP, RESAMPLE)."""
    s, dC, dW = torch.sigmoid(theta[0]), torch.sigmoid(theta[1]), torch.sigmoid(theta[2])
    p = torch.stack([s, 1 - s])                                  # (C, W)
    pd = torch.stack([torch.stack([dC, 1 - dC]),                 # after C: (STOP, RESAMPLE)
                      torch.stack([1 - dW, dW])])                # after W: (STOP, RESAMPLE)
    return p, pd


def _lengths(len_C, len_W):
    return torch.tensor([float(len_C), float(len_W)], dtype=torch.float64)


# ------------------------------------------------------------------------------------------------
# 1. Appendix C: one trajectory
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepRow:
    """One row of Appendix C's "Breakdown of KL Penalty Gradient Attribution" table."""

    step: int
    action: str
    d: float            # immediate penalty d_k (Theorem 3.2's sign)
    future: float       # gamma * Q of the next action (0 after STOP)
    q: float            # Q^KL = d + future
    grad_log_pi: float  # d log pi(action) / d parameter
    parameter: str
    contribution: float  # grad_log_pi * Q^KL (the gradient of +KL)


@dataclass(frozen=True)
class TrajectoryAttribution:
    """Reward push, KL drag and net update of one trajectory (Appendix C's "Summary" table).

    ``kl_drag`` is the gradient of ``-kl_weight * KL``, i.e. what the KL term adds to an ascent step.
    """

    rows: tuple[StepRow, ...]
    reward: dict
    kl_drag: dict
    net: dict
    probabilities: dict = field(default_factory=dict)


def trajectory_attribution(theta, theta_ref, attempts: str = "WC", len_C: int = 8, len_W: int = 8,
                           advantage: float = 0.5, gamma: float = 1.0, kl_weight: float = 1.0,
                           round_to: int | None = None) -> TrajectoryAttribution:
    """Appendix C for one trajectory: attempts ``"WC"`` means W, RESAMPLE, C, STOP.

    Reward gradient: ``advantage * grad log P(tau)`` (Part 1). KL: immediate penalties, backward
    Q-values ``Q = d + gamma * Q_next`` and contributions ``grad log pi * Q`` (Part 2).
    ``round_to`` rounds every intermediate value (probabilities, per-token log-ratios, penalties,
    Q-values, gradients) to that many decimals, as a hand calculation does.
    """
    theta = as_theta("theta", theta)
    theta_ref = as_theta("theta_ref", theta_ref)
    len_C, len_W, gamma = _check_common(len_C, len_W, gamma)
    if not isinstance(attempts, str) or not attempts or set(attempts) - {"C", "W"}:
        raise ValueError(f"attempts must be a non-empty string of C and W (e.g. 'WC'); got {attempts!r}")
    advantage = v.real("advantage", advantage)
    kl_weight = v.real("kl_weight", kl_weight)
    if round_to is not None:
        v.length("round_to", round_to)
    R = (lambda x: round(float(x), round_to)) if round_to is not None else float  # noqa: E731
    s, dC, dW = (R(torch.sigmoid(x)) for x in theta)
    rs, rdC, rdW = (R(torch.sigmoid(x)) for x in theta_ref)
    lens = {"C": len_C, "W": len_W}
    steps = []  # (step, action, d, grad_log_pi, parameter)
    for k, X in enumerate(attempts, start=1):
        pX, rX = (s, R(1 - s)) if X == "C" else (R(1 - s), R(1 - rs))
        rX = rs if X == "C" else rX
        steps.append((k, f"Sample {X}", R(lens[X] * R(np.log(pX / rX))), R((1 - s) if X == "C" else -s), "theta_s"))
        stop = k == len(attempts)
        if X == "C":
            pa, ra = (dC, rdC) if stop else (R(1 - dC), R(1 - rdC))
            g = R(1 - dC) if stop else -dC
            par = "theta_dC"
        else:
            pa, ra = (R(1 - dW), R(1 - rdW)) if stop else (dW, rdW)
            g = -dW if stop else R(1 - dW)
            par = "theta_dW"
        steps.append((k, "STOP" if stop else "RESAMPLE", R(np.log(pa / ra)), g, par))
    rows, q_next = [], 0.0
    for k, action, d, g, par in reversed(steps):
        future = R(gamma * q_next) if rows else 0.0
        q = R(d + future)
        rows.append(StepRow(k, action, float(d), float(future), float(q), float(g), par, R(g * q)))
        q_next = q
    reward = {p: 0.0 for p in PARAMS}
    n_after = 0
    for _k, _action, _d, g, par in reversed(steps):  # reward A arrives with the final STOP
        reward[par] = R(reward[par] + advantage * gamma ** n_after * g)
        n_after += 1
    kl = {p: 0.0 for p in PARAMS}
    for r in rows:
        kl[r.parameter] += r.contribution
    kl = {p: R(x) for p, x in kl.items()}
    drag = {p: R(-kl_weight * kl[p]) for p in PARAMS}
    net = {p: R(reward[p] + drag[p]) for p in PARAMS}
    probs = {"P_C": s, "P_W": 1 - s, "P_stop_C": dC, "P_resample_W": dW,
             "P_ref_C": rs, "P_ref_W": 1 - rs, "P_ref_stop_C": rdC, "P_ref_resample_W": rdW}
    return TrajectoryAttribution(tuple(rows), reward, drag, net, probs)


def appendix_c_inputs() -> dict:
    """The inputs of the paper's Appendix C example, read from ``dsh/core/paper_results.yaml``."""
    from ..core.paper import paper_results

    s = paper_results()["appendix_c"]["setup"]
    order = list(PARAMS)
    return {
        "theta": [s["theta"][k] for k in order],
        "theta_ref": [s["theta_ref"][k] for k in order],
        "attempts": "".join(a for a in s["trajectory"] if a in ("C", "W")),
        "len_C": s["len_C"], "len_W": s["len_W"], "advantage": s["advantage"], "gamma": s["gamma"],
    }


# ------------------------------------------------------------------------------------------------
# 2. Exact expectations under the policy
# ------------------------------------------------------------------------------------------------
def expected_reward(theta, len_C: int = 8, len_W: int = 8, gamma: float = 1.0) -> torch.Tensor:
    """E[gamma^(actions before STOP) R] = gamma p_C p_dC / (1 - gamma^2 r), r = P(RESAMPLE).

    At gamma = 1 this is the two-stage accuracy formula (Section 4.2)."""
    theta = as_theta("theta", theta)
    _check_common(len_C, len_W, gamma)
    p, pd = policy_pieces(theta)
    r = (p * pd[:, 1]).sum()
    return gamma * p[0] * pd[0, 0] / (1 - gamma ** 2 * r)


def _kl_terms(theta, theta_ref, len_C, len_W):
    p, pd = policy_pieces(theta)
    pr, pdr = policy_pieces(theta_ref)
    ds = _lengths(len_C, len_W) * torch.log(p / pr)             # d^sample per answer
    dd = torch.log(pd / pdr)                                   # d^decision per (answer, action)
    return p, pd, ds, dd


def expected_kl(theta, theta_ref, len_C: int = 8, len_W: int = 8, gamma: float = 1.0) -> torch.Tensor:
    """E_theta[sum_i gamma^i d_i] in closed form: c / (1 - gamma^2 r) with
    c = sum_X p_X (d^sample_X + gamma sum_a pi_d(a|X) d^decision_{a|X}) (KL in the reward)."""
    theta = as_theta("theta", theta)
    theta_ref = as_theta("theta_ref", theta_ref)
    len_C, len_W, gamma = _check_common(len_C, len_W, gamma)
    p, pd, ds, dd = _kl_terms(theta, theta_ref, len_C, len_W)
    c = (p * (ds + gamma * (pd * dd).sum(1))).sum()
    r = (p * pd[:, 1]).sum()
    return c / (1 - gamma ** 2 * r)


def expected_by_enumeration(theta, theta_ref, len_C: int = 8, len_W: int = 8, gamma: float = 1.0,
                            tol: float = 1e-12, max_depth: int = 1_000_000) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Expected reward and expected KL by summing over trajectories attempt by attempt (grouped by
    the answer of the current attempt) until the probability of still running is below ``tol``.
    An independent check of the closed forms. Returns (reward, kl, depth)."""
    theta = as_theta("theta", theta)
    theta_ref = as_theta("theta_ref", theta_ref)
    len_C, len_W, gamma = _check_common(len_C, len_W, gamma)
    p, pd, ds, dd = _kl_terms(theta, theta_ref, len_C, len_W)
    alive = torch.ones((), dtype=torch.float64)       # P(still running) at the start of attempt k
    disc = 1.0                                        # gamma^(actions so far)
    J = torch.zeros((), dtype=torch.float64)
    K = torch.zeros((), dtype=torch.float64)
    depth = 0
    while float(alive) > tol:
        if depth >= max_depth:
            raise ValueError(f"theta must give a process that stops; {float(alive):.3g} of the mass still "
                             f"runs after max_depth={max_depth} attempts")
        J = J + alive * disc * gamma * p[0] * pd[0, 0]
        K = K + alive * disc * (p * (ds + gamma * (pd * dd).sum(1))).sum()
        alive = alive * (p * pd[:, 1]).sum()
        disc *= gamma ** 2
        depth += 1
    return J, K, depth


@dataclass(frozen=True)
class ExpectedGradients:
    """Exact expected gradients (one entry per parameter: theta_s, theta_dC, theta_dW)."""

    reward: np.ndarray            # grad E[R] (= the surrogate's gradient at theta_old = theta)
    kl: np.ndarray                # grad E[KL], KL in the reward (Theorem 3.2), by autograd
    kl_score: np.ndarray          # the same as sum E[grad log pi * Q^KL] (policy-gradient form)
    kl_direct: np.ndarray         # E[sum grad d_i] (vanishes when len_C = len_W)
    kl_immediate: np.ndarray      # only the immediate penalties: E[sum grad log pi(a_i) d_i]
    kl_loss_k3: np.ndarray        # GRPO / verl low_var_kl: E[sum_tokens grad k3] with k3 in the loss
    q_sample: np.ndarray          # Q^KL_sample(X) for X in (C, W)
    q_decision: np.ndarray        # Q^KL_d(a | X), rows (C, W), columns (STOP, RESAMPLE)


def expected_gradients(theta, theta_ref, len_C: int = 8, len_W: int = 8, gamma: float = 1.0) -> ExpectedGradients:
    """Exact expected gradients of the reward and of the KL penalty under the policy itself."""
    theta = as_theta("theta", theta).clone().requires_grad_(True)
    theta_ref = as_theta("theta_ref", theta_ref)
    len_C, len_W, gamma = _check_common(len_C, len_W, gamma)
    g_r = torch.autograd.grad(expected_reward(theta, len_C, len_W, gamma), theta)[0]
    g_kl = torch.autograd.grad(expected_kl(theta, theta_ref, len_C, len_W, gamma), theta)[0]
    p, pd, ds, dd = _kl_terms(theta, theta_ref, len_C, len_W)
    r = (p * pd[:, 1]).sum()
    n_visits = (1 / (1 - gamma ** 2 * r)).detach()             # discounted visits to an attempt start
    c = (p * (ds + gamma * (pd * dd).sum(1))).sum()
    V = (c / (1 - gamma ** 2 * r)).detach()                  # KL-to-go from an attempt start
    q_d = (dd + torch.stack([torch.zeros(2, dtype=torch.float64), gamma * V * torch.ones(2, dtype=torch.float64)], 1)).detach()
    q_s = (ds + gamma * (pd * q_d).sum(1)).detach()
    pdet, pddet = p.detach(), pd.detach()
    score = n_visits * ((pdet * torch.log(p) * q_s).sum() + gamma * (pdet[:, None] * pddet * torch.log(pd) * q_d).sum())
    g_score = torch.autograd.grad(score, theta, retain_graph=True)[0]
    direct = n_visits * ((pdet * ds).sum() + gamma * (pdet[:, None] * pddet * dd).sum())
    g_direct = torch.autograd.grad(direct, theta, retain_graph=True)[0]
    imm = n_visits * ((pdet * torch.log(p) * ds.detach()).sum()
                      + gamma * (pdet[:, None] * pddet * torch.log(pd) * dd.detach()).sum())
    g_imm = torch.autograd.grad(imm, theta, retain_graph=True)[0]
    pr, pdr = policy_pieces(theta_ref)
    k3 = lambda pi, ref: ref / pi - torch.log(ref / pi) - 1  # noqa: E731
    loss = n_visits * ((pdet * _lengths(len_C, len_W) * k3(p, pr)).sum()
                       + gamma * (pdet[:, None] * pddet * k3(pd, pdr)).sum())
    g_k3 = torch.autograd.grad(loss, theta)[0]
    f = lambda t: t.detach().numpy().copy()  # noqa: E731
    return ExpectedGradients(f(g_r), f(g_kl), f(g_score), f(g_direct), f(g_imm), f(g_k3), f(q_s), f(q_d))


def attribution_ratio(grad) -> float:
    """|grad on theta_s| / |grad on (theta_dC, theta_dW)|: sampling versus decision attribution."""
    g = np.asarray(grad, dtype=float)
    den = float(np.hypot(g[1], g[2]))
    if den > 0:
        return float(abs(g[0]) / den)
    return float("nan") if g[0] == 0 else float("inf")


# ------------------------------------------------------------------------------------------------
# Monte Carlo estimates (score function), vectorized
# ------------------------------------------------------------------------------------------------
def sample_trajectories(theta, n: int, seed: int = 0, max_attempts: int = 10_000):
    """Sample n trajectories: returns the candidate matrix (1 correct, 0 wrong, -1 absent)."""

    t = as_theta("theta", theta)
    s, dC, dW = (float(torch.sigmoid(x)) for x in t)
    return simulate(s, dC, dW, n=n, seed=seed, max_attempts=max_attempts).candidates


def per_trajectory(theta, theta_ref, cand, len_C, len_W):
    """Per-trajectory score vectors and per-action penalties for sampled trajectories (gamma = 1).

    Returns (score (n, 3), reward (n,), kl_score_estimate (n, 3), k3_grad (n, 3))."""
    s, dC, dW = (float(torch.sigmoid(x)) for x in as_theta("theta", theta))
    rs, rdC, rdW = (float(torch.sigmoid(x)) for x in as_theta("theta_ref", theta_ref))
    present = cand >= 0
    n_att = present.sum(1)
    last = np.zeros_like(present)
    last[np.arange(len(cand)), n_att - 1] = True
    C = (cand == 1) & present
    W = (cand == 0) & present
    stop = last
    res = present & ~last
    # grad log pi per action, per parameter
    gs = np.where(C, 1 - s, np.where(W, -s, 0.0))
    gdC = np.where(C & stop, 1 - dC, np.where(C & res, -dC, 0.0))
    gdW = np.where(W & res, 1 - dW, np.where(W & stop, -dW, 0.0))
    # immediate penalties (Theorem 3.2's sign)
    d_s = np.where(C, len_C * np.log(s / rs), np.where(W, len_W * np.log((1 - s) / (1 - rs)), 0.0))
    d_d = np.where(C & stop, np.log(dC / rdC), 0.0) + np.where(C & res, np.log((1 - dC) / (1 - rdC)), 0.0) \
        + np.where(W & res, np.log(dW / rdW), 0.0) + np.where(W & stop, np.log((1 - dW) / (1 - rdW)), 0.0)
    # KL-to-go: Q_d(k) = d_d(k) + sum_{k'>k}(d_s + d_d);  Q_s(k) = d_s(k) + Q_d(k)
    tot = d_s + d_d
    after = np.cumsum(tot[:, ::-1], axis=1)[:, ::-1] - tot
    q_d = d_d + after
    q_s = d_s + q_d
    score = np.stack([gs.sum(1), gdC.sum(1), gdW.sum(1)], 1)
    kl = np.stack([(gs * q_s).sum(1), (gdC * q_d).sum(1), (gdW * q_d).sum(1)], 1)
    reward = (cand[np.arange(len(cand)), n_att - 1] == 1).astype(float)
    # k3 in the loss: per token (1 - ref/pi) grad log pi; an attempt has len_X tokens
    ratio_s = np.where(C, rs / s, np.where(W, (1 - rs) / (1 - s), 1.0))
    lens = np.where(C, len_C, np.where(W, len_W, 0))
    rho_d = np.where(C & stop, rdC / dC, 1.0) * np.where(C & res, (1 - rdC) / (1 - dC), 1.0) \
        * np.where(W & res, rdW / dW, 1.0) * np.where(W & stop, (1 - rdW) / (1 - dW), 1.0)
    k3 = np.stack([(lens * (1 - ratio_s) * gs).sum(1), ((1 - rho_d) * gdC).sum(1), ((1 - rho_d) * gdW).sum(1)], 1)
    return score, reward, kl, k3


def monte_carlo_gradients(theta, theta_ref, n: int = 100_000, len_C: int = 8, len_W: int = 8, seed: int = 0):
    """Monte Carlo (score-function) estimates at gamma = 1 with their standard errors:
    ``{"reward": (mean, se), "kl": (mean, se), "kl_loss_k3": (mean, se)}``, each an array over the
    three parameters. The reward estimate uses the baseline E[R] (any constant leaves it unbiased)."""
    len_C, len_W, _ = _check_common(len_C, len_W, 1.0)
    n = v.at_most("n", n, MAX_MONTE_CARLO, "sampled trajectories: memory")
    cand = sample_trajectories(theta, n, seed)
    score, R, kl, k3 = per_trajectory(theta, theta_ref, cand, len_C, len_W)
    out = {}
    for name, x in (("reward", score * (R - R.mean())[:, None]), ("kl", kl), ("kl_loss_k3", k3)):
        out[name] = (x.mean(0), x.std(0, ddof=1) / np.sqrt(n))
    return out


# ------------------------------------------------------------------------------------------------
# 3. Length sweep
# ------------------------------------------------------------------------------------------------
def length_sweep(theta, theta_ref, lengths, gamma: float = 1.0) -> dict[str, np.ndarray]:
    """Sampling/decision attribution ratios for len_C = len_W = L over ``lengths``."""
    Ls = [v.positive_int("lengths[i]", int(L)) for L in lengths]
    out = {k: [] for k in ("L", "reward", "kl", "kl_immediate", "kl_loss_k3")}
    for L in Ls:
        g = expected_gradients(theta, theta_ref, L, L, gamma)
        out["L"].append(L)
        out["reward"].append(attribution_ratio(g.reward))
        out["kl"].append(attribution_ratio(g.kl))
        out["kl_immediate"].append(attribution_ratio(g.kl_immediate))
        out["kl_loss_k3"].append(attribution_ratio(g.kl_loss_k3))
    return {k: np.asarray(x, dtype=float) for k, x in out.items()}


def q_from_penalties(d, gamma: float = 1.0) -> list[float]:
    """Backward Q-values of a sequence of immediate penalties: ``Q_i = d_i + gamma Q_{i+1}``
    (Theorem 3.2's recursion along one trajectory), ``d`` in generation order: :func:`dsh.theory.mdp.to_go`."""
    from .mdp import to_go

    return to_go([float(x) for x in d], v.gamma(gamma))
