"""Agreement of two yes/no readings beyond chance: Cohen's kappa (Cohen 1960) from the 2x2 counts, with its
chance baseline and a 95 % interval.

Used where a rate of agreement would mislead alone: a verdict that follows its check 64 % of the time means little
when the verdict and the check would agree 46-70 % of the time by chance (the shares of "passes" they each say).
"""

from __future__ import annotations

import math

Z95 = 1.959963984540054     # the 95 % two-sided normal quantile (the package's one)


def cell(first: bool, second: bool) -> int:
    """Index of an item in the 2x2 counts :func:`cohen_kappa` takes (0 both yes, 1 first only, 2 second only,
    3 neither), from the two readings of it."""
    return (0 if second else 1) if first else (2 if second else 3)


def cohen_kappa(both: int, first_only: int, second_only: int, neither: int) -> dict:
    """Cohen's kappa of two yes/no readings of ``n`` items from their 2x2 counts (yes-yes, yes-no, no-yes, no-no):
    observed agreement p_o, chance agreement p_e = p1 p2 + (1 - p1)(1 - p2) from the marginal shares of "yes",
    kappa = (p_o - p_e) / (1 - p_e), and a 95 % interval from Cohen's large-sample standard error
    sqrt(p_o (1 - p_o) / (n (1 - p_e)^2)), clipped to [-1, 1]. Undefined (None) without items or when both
    readings say the same thing on every item (p_e = 1)."""
    counts = (both, first_only, second_only, neither)
    if any(not isinstance(c, int) or c < 0 for c in counts):
        raise ValueError(f"counts must be non-negative integers (both, first_only, second_only, neither); got {counts}")
    n = sum(counts)
    out = {"n": n, "observed": None, "chance": None, "kappa": None, "kappa_ci": [None, None]}
    if n == 0:
        return out
    p_o = (both + neither) / n
    p1, p2 = (both + first_only) / n, (both + second_only) / n
    p_e = p1 * p2 + (1 - p1) * (1 - p2)
    out.update(observed=p_o, chance=p_e)
    if p_e >= 1:
        return out
    k = (p_o - p_e) / (1 - p_e)
    se = math.sqrt(p_o * (1 - p_o) / (n * (1 - p_e) ** 2))
    out.update(kappa=k, kappa_ci=[max(-1.0, k - Z95 * se), min(1.0, k + Z95 * se)])
    return out
