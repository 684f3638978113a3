"""A simulated GRPO run on the paper's three-logit toy (:mod:`dsh.theory.toy`) and its figure: groups of sampled
trajectories, group-normalized advantages, the KL in the loss (k3) or in the reward, an optimizer step on the
three logits, and the sampling/decision attribution of each step's gradient."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core import validate as v
from .toy import appendix_c_inputs, as_theta, attribution_ratio, expected_reward, per_trajectory, sample_trajectories

MAX_STEPS = 100_000        # simulated optimizer steps (300 take about a second)
MAX_SAMPLES = 100_000      # trajectories a group, groups a step
MAX_LENGTH = 100_000       # tokens of an answer


@dataclass(frozen=True)
class ToyGRPOConfig:
    """Simulated GRPO on the three-logit toy.

    Each step samples ``groups_per_step`` groups of ``group_size`` trajectories from the current
    policy, gives reward 1 to a correct final answer, normalizes advantages within each group
    ((R - mean) / (std + 1e-6), unbiased std as in TRL and verl), and ascends
    ``reward gradient - kl_weight * KL gradient``. ``kl_placement="loss"`` puts the per-token k3
    estimator in the loss (GRPO, verl's ``low_var_kl``); ``"reward"`` puts the token-level KL in the
    reward (Theorem 3.2) and uses the score-function estimator with the KL-to-go. The reference
    policy is reset to the current one every ``ref_reset_every`` steps (the paper's "cyclical
    pattern"; 0 never resets).
    """

    theta0: tuple | None = None          # None: the paper's Appendix C policy (dsh/core/paper_results.yaml)
    theta_ref0: tuple | None = None      # None: the initial policy
    len_C: int = 8
    len_W: int = 8
    group_size: int = 8
    groups_per_step: int = 16
    steps: int = 300
    lr: float = 0.05
    optimizer: str = "adam"
    kl_weight: float = 0.05
    kl_placement: str = "loss"
    ref_reset_every: int = 50
    seed: int = 0

    def __post_init__(self):
        if self.theta0 is not None:
            as_theta("theta0", self.theta0)
        if self.theta_ref0 is not None:
            as_theta("theta_ref0", self.theta_ref0)
        v.at_most("len_C", self.len_C, MAX_LENGTH, "tokens an answer")
        v.at_most("len_W", self.len_W, MAX_LENGTH, "tokens an answer")
        v.length("group_size", self.group_size, minimum=2)
        v.at_most("group_size", self.group_size, MAX_SAMPLES, "trajectories a group: memory")
        v.at_most("groups_per_step", self.groups_per_step, MAX_SAMPLES, "groups a step: memory")
        v.at_most("steps", self.steps, MAX_STEPS, "simulated steps: time")
        if v.real("lr", self.lr) <= 0:
            raise ValueError(f"lr must be a positive real number, got {self.lr!r}")
        v.choice("optimizer", self.optimizer, ("adam", "sgd"))
        if v.real("kl_weight", self.kl_weight) < 0:
            raise ValueError(f"kl_weight must be a real number >= 0, got {self.kl_weight!r}")
        v.choice("kl_placement", self.kl_placement, ("loss", "reward"))
        v.length("ref_reset_every", self.ref_reset_every)
        v.length("seed", self.seed)


def simulate_grpo(config: ToyGRPOConfig) -> dict[str, np.ndarray]:
    """Run the simulated GRPO; returns per-step arrays (deterministic under ``config.seed``).

    Keys: ``theta`` (steps + 1, 3), ``grad_reward``, ``grad_kl`` (the gradient of +KL, before the
    weight), ``grad_net`` (what the optimizer ascends), ``ratio_reward``, ``ratio_kl``
    (sampling/decision attribution), ``accuracy`` (exact expected reward, steps + 1), ``resets``.
    """
    if not isinstance(config, ToyGRPOConfig):
        raise ValueError(f"config must be a ToyGRPOConfig, got {type(config).__name__}")
    c = config
    theta0 = appendix_c_inputs()["theta"] if c.theta0 is None else c.theta0
    theta = np.array(theta0, dtype=np.float64)
    ref = np.array(theta0 if c.theta_ref0 is None else c.theta_ref0, dtype=np.float64)
    rng = np.random.default_rng(c.seed)
    m = np.zeros(3)
    s2 = np.zeros(3)
    b1, b2, eps = 0.9, 0.999, 1e-8
    n = c.group_size * c.groups_per_step
    hist = {k: [] for k in ("grad_reward", "grad_kl", "grad_net", "ratio_reward", "ratio_kl")}
    thetas, acc, resets = [theta.copy()], [float(expected_reward(theta))], []
    for step in range(c.steps):
        if c.ref_reset_every and step > 0 and step % c.ref_reset_every == 0:
            ref = theta.copy()
            resets.append(step)
        cand = sample_trajectories(theta, n, seed=int(rng.integers(2 ** 31)))
        score, R, kl_rew, kl_k3 = per_trajectory(theta, ref, cand, c.len_C, c.len_W)
        Rg = R.reshape(c.groups_per_step, c.group_size)
        A = ((Rg - Rg.mean(1, keepdims=True)) / (Rg.std(1, ddof=1, keepdims=True) + 1e-6)).reshape(-1)
        g_r = (A[:, None] * score).mean(0)
        g_kl = (kl_k3 if c.kl_placement == "loss" else kl_rew).mean(0)
        g = g_r - c.kl_weight * g_kl
        if c.optimizer == "adam":
            m = b1 * m + (1 - b1) * g
            s2 = b2 * s2 + (1 - b2) * g * g
            mh, sh = m / (1 - b1 ** (step + 1)), s2 / (1 - b2 ** (step + 1))
            theta = theta + c.lr * mh / (np.sqrt(sh) + eps)
        else:
            theta = theta + c.lr * g
        hist["grad_reward"].append(g_r)
        hist["grad_kl"].append(g_kl)
        hist["grad_net"].append(g)
        hist["ratio_reward"].append(attribution_ratio(g_r))
        hist["ratio_kl"].append(attribution_ratio(g_kl))
        thetas.append(theta.copy())
        acc.append(float(expected_reward(theta)))
    out = {k: np.asarray(x) for k, x in hist.items()}
    out.update(theta=np.asarray(thetas), accuracy=np.asarray(acc), resets=np.asarray(resets, dtype=int))
    return out


def _smooth(x, w):
    """Moving average over ``w`` steps that skips non-finite values (steps with a zero gradient)."""
    x = np.asarray(x, dtype=float)
    if w <= 1 or len(x) < w:
        return x
    ok = np.isfinite(x)
    k = np.ones(w)
    num = np.convolve(np.where(ok, x, 0.0), k, mode="valid")
    den = np.convolve(ok.astype(float), k, mode="valid")
    with np.errstate(invalid="ignore", divide="ignore"):
        return num / den


def plot_grpo(hist: dict, smooth: int = 10):
    """The six-panel figure: parameters, |reward gradient|, |KL gradient|, net gradient, the
    sampling/decision attribution ratios, and the policy's probabilities with its accuracy."""
    import matplotlib.pyplot as plt

    names = [r"$\theta_s$", r"$\theta_{d|C}$", r"$\theta_{d|W}$"]
    colors = ["tab:blue", "tab:orange", "tab:green"]
    steps = np.arange(len(hist["grad_reward"]))
    xs = steps[: len(_smooth(steps, smooth))] + (smooth - 1) / 2 if smooth > 1 else steps
    fig, ax = plt.subplots(3, 2, figsize=(11, 9.5))
    ax = ax.ravel()
    for i in range(3):
        ax[0].plot(hist["theta"][:, i], color=colors[i], label=names[i])
        ax[1].plot(xs, _smooth(np.abs(hist["grad_reward"][:, i]), smooth), color=colors[i], label=names[i])
        ax[2].plot(xs, _smooth(np.abs(hist["grad_kl"][:, i]), smooth), color=colors[i], label=names[i])
        ax[3].plot(xs, _smooth(hist["grad_net"][:, i], smooth), color=colors[i], label=names[i])
    for r in hist["resets"]:
        for a in ax:
            a.axvline(r, color="0.85", lw=0.8, zorder=0)
    ax[0].set(title="parameters", xlabel="step")
    ax[1].set(title="|reward gradient| (moving average)", xlabel="step", yscale="log")
    ax[2].set(title="|KL gradient| (moving average)", xlabel="step", yscale="log")
    ax[3].set(title="net gradient (moving average)", xlabel="step")
    ax[3].axhline(0, color="k", lw=0.6)
    rr = _smooth(np.log(hist["ratio_reward"]), smooth)
    rk = _smooth(np.log(hist["ratio_kl"]), smooth)
    ax[4].plot(xs, np.exp(rr), label="reward")
    ax[4].plot(xs, np.exp(rk), label="KL")
    ax[4].axhline(1, color="k", lw=0.6)
    ax[4].set(title="sampling / decision attribution (geometric moving average)", xlabel="step", yscale="log")
    th = hist["theta"]
    sig = 1 / (1 + np.exp(-th))
    for i, lab in enumerate(["$p_s$", "$p_{d|C}$", "$p_{d|W}$"]):
        ax[5].plot(sig[:, i], color=colors[i], label=lab)
    ax[5].plot(hist["accuracy"], "k--", label="accuracy (exact)")
    ax[5].set(title="policy", xlabel="step", ylim=(0, 1.02))
    for a in ax:
        a.legend(fontsize=8)
    fig.tight_layout()
    return fig
