"""The two-stage decision-sampling process as a Markov chain (paper, Section 4.2).

A response is a sequence of candidate answers. Each candidate is correct with probability
``p_s`` (the sampling policy pi_sample); after a correct candidate the decision policy pi_d
stops with probability ``p_dC``, after a wrong one it resamples with probability ``p_dW``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core import validate as v


def predicted_accuracy(p_s: float, p_dC: float, p_dW: float) -> float:
    """Accuracy of the two-stage process, the paper's "Model Acc" equation (Section 4.2):

    ``p_s p_dC / (1 - (p_s (1 - p_dC) + (1 - p_s) p_dW))``.

    When the denominator is 0 the process never stops (``p_s = 1, p_dC = 0`` or
    ``p_s = 0, p_dW = 1``) and no final answer is ever given: the accuracy is 0.
    """
    p_s = v.probability("p_s", p_s)
    p_dC = v.probability("p_dC", p_dC)
    p_dW = v.probability("p_dW", p_dW)
    resample = p_s * (1.0 - p_dC) + (1.0 - p_s) * p_dW
    denom = 1.0 - resample
    if denom <= 0.0:
        return 0.0
    return p_s * p_dC / denom


def accuracy(p_s: float, p_dC: float, p_dW: float, max_attempts: int | None = None) -> float:
    """:func:`predicted_accuracy` (no attempt budget, ``max_attempts`` None) or :func:`accuracy_within` (the process
    cut after ``max_attempts`` candidates)."""
    if max_attempts is None:
        return predicted_accuracy(p_s, p_dC, p_dW)
    return accuracy_within(p_s, p_dC, p_dW, max_attempts)


def accuracy_within(p_s: float, p_dC: float, p_dW: float, max_attempts: int) -> float:
    """Accuracy when the response is cut after ``max_attempts`` candidates (the last one is kept).

    ``sum_{k=1}^{K-1} r^{k-1} p_s p_dC + r^{K-1} p_s`` with ``r = p_s (1 - p_dC) + (1 - p_s) p_dW``,
    the probability of resampling. It tends to :func:`predicted_accuracy` as ``K`` grows.
    """
    p_s = v.probability("p_s", p_s)
    p_dC = v.probability("p_dC", p_dC)
    p_dW = v.probability("p_dW", p_dW)
    K = v.positive_int("max_attempts", max_attempts)
    r = p_s * (1.0 - p_dC) + (1.0 - p_s) * p_dW
    total = sum(r ** (k - 1) * p_s * p_dC for k in range(1, K))
    return total + r ** (K - 1) * p_s


@dataclass(frozen=True)
class SimulatedResponses:
    """Responses drawn from the two-stage process.

    ``candidates[i, k]`` is 1 if the (k+1)-th candidate of response i is correct, 0 if wrong and
    -1 if the response had stopped before; ``stopped[i]`` tells whether response i chose STOP
    (rather than being cut at ``max_attempts``).
    """

    candidates: np.ndarray
    stopped: np.ndarray

    @property
    def n_attempts(self) -> np.ndarray:
        return (self.candidates >= 0).sum(axis=1)

    @property
    def final_correct(self) -> np.ndarray:
        last = self.n_attempts - 1
        return self.candidates[np.arange(len(last)), last] == 1


MAX_SIMULATE = 10_000_000   # responses simulated at once (a few hundred MB)


def simulate(p_s: float, p_dC: float, p_dW: float, n: int, seed: int = 0,
             max_attempts: int = 64, p_s_later: float | None = None) -> SimulatedResponses:
    """Draw ``n`` responses from the two-stage process (vectorized, deterministic under ``seed``).

    ``p_s_later`` (default: ``p_s``) is the accuracy of the second and later attempts: a value other than
    ``p_s`` breaks the model's assumption that every attempt is an independent draw from the same
    pi_sample, the counterexample of chapter 01 and the "fails" case of the unfitted predictions.
    ``p_s`` may be an array of ``n`` per-question values (questions that differ in difficulty, each following the
    two-stage process)."""
    v.at_most("n", n, MAX_SIMULATE, "responses simulated at once: memory")
    if isinstance(p_s, np.ndarray):
        if p_s.shape != (v.positive_int("n", n),) or not np.all((p_s >= 0) & (p_s <= 1)):
            raise ValueError(f"p_s must be a probability or an array of n = {n} probabilities in [0, 1]")
    else:
        p_s = v.probability("p_s", p_s)
    p_later = p_s if p_s_later is None else v.probability("p_s_later", p_s_later)
    p_dC = v.probability("p_dC", p_dC)
    p_dW = v.probability("p_dW", p_dW)
    n = v.positive_int("n", n)
    K = v.positive_int("max_attempts", max_attempts)
    v.length("seed", seed)
    rng = np.random.default_rng(seed)
    cols = []  # one column per attempt, only while some response is still running
    active = np.ones(n, dtype=bool)
    stopped = np.zeros(n, dtype=bool)
    for k in range(K):
        correct = rng.random(n) < (p_s if k == 0 else p_later)
        u = rng.random(n)
        col = np.full(n, -1, dtype=np.int8)
        col[active] = correct[active]
        cols.append(col)
        stop = np.where(correct, u < p_dC, u >= p_dW)
        stopped |= active & stop
        active &= ~stop
        if not active.any():
            break
    cand = np.stack(cols, axis=1)
    return SimulatedResponses(candidates=cand, stopped=stopped)
