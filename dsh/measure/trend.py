"""Did a training curve rise? The mean of its last fifth against its first fifth, with a 95 % interval.

GRPO logs one mean reward per rollout round (:func:`dsh.experiment.pipeline.reward_curve`). Within a round the
rollouts are not independent (a group shares its prompt), so the unit here is the round: the two fifths' round
means are compared by Welch's two-sample t interval (unequal variances, Welch-Satterthwaite degrees of freedom).
A fifth holds at least two rounds; a shorter curve has no verdict.
"""

from __future__ import annotations

import math

from ..core import validate as v


def fifths_contrast(values, level: float = 0.95) -> dict | None:
    """``{"first": mean of the first fifth, "last": mean of the last fifth, "delta": last - first, "ci": Welch's
    ``level`` interval of delta, "n": rounds in each fifth, "df": its degrees of freedom}`` of a curve (one value a
    round, in order); None when a fifth would hold fewer than 2 rounds. Equal rounds give a zero-width interval."""
    from scipy import stats

    xs = [v.real("values[i]", x) for x in v.collection("values", values, "numbers (one a round)")]
    if not 0 < level < 1:
        raise ValueError(f"level must be a number in (0, 1), got {level!r}")
    k = len(xs) // 5
    if k < 2:
        return None
    a, b = xs[:k], xs[-k:]
    ma, mb = sum(a) / k, sum(b) / k
    va = sum((x - ma) ** 2 for x in a) / (k - 1)
    vb = sum((x - mb) ** 2 for x in b) / (k - 1)
    se2 = va / k + vb / k
    if se2 == 0:
        return {"first": ma, "last": mb, "delta": mb - ma, "ci": [mb - ma, mb - ma], "n": k, "df": None}
    df = se2 ** 2 / ((va / k) ** 2 / (k - 1) + (vb / k) ** 2 / (k - 1))
    half = float(stats.t.ppf(0.5 + level / 2, df)) * math.sqrt(se2)
    return {"first": ma, "last": mb, "delta": mb - ma, "ci": [mb - ma - half, mb - ma + half], "n": k, "df": df}


def verdict(contrast: dict | None) -> str:
    """"rises" when the interval lies above 0, "falls" when below, "cannot tell" otherwise (or without a contrast)."""
    if contrast is None:
        return "cannot tell"
    lo, hi = contrast["ci"]
    return "rises" if lo > 0 else "falls" if hi < 0 else "cannot tell"
