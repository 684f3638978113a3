"""The reward-curve contrast (dsh.measure.trend): a hand case, the interval's coverage by simulation with a known
shift, and its refusals."""

import math
import random

import pytest

from dsh.measure.trend import fifths_contrast, verdict


def test_a_hand_computed_case():
    # 10 rounds: fifths of 2; first (0.2, 0.4), last (0.7, 0.9): delta 0.5, each variance 0.02, se sqrt(0.02)
    c = fifths_contrast([0.2, 0.4, 5, 5, 5, 5, 5, 5, 0.7, 0.9])
    assert c["n"] == 2 and math.isclose(c["delta"], 0.5) and math.isclose(c["df"], 2.0)
    half = 4.302652729911275 * math.sqrt(0.02)             # t(0.975, 2 df)
    assert all(math.isclose(x, y) for x, y in zip(c["ci"], (0.5 - half, 0.5 + half)))
    assert verdict(c) == "cannot tell"
    flat = fifths_contrast([0.5] * 12)
    assert flat["ci"] == [0.0, 0.0] and verdict(flat) == "cannot tell"
    assert fifths_contrast([0.1] * 9) is None and verdict(None) == "cannot tell"
    assert verdict({"ci": [0.01, 0.2]}) == "rises" and verdict({"ci": [-0.2, -0.01]}) == "falls"


def test_the_interval_covers_a_known_shift():
    rng = random.Random(0)
    for shift in (0.0, 0.1):
        inside = 0
        for _ in range(2000):
            xs = [rng.gauss(0.5 + shift * (i >= 32), 0.05 + 0.05 * (i >= 32)) for i in range(40)]
            lo, hi = fifths_contrast(xs)["ci"]
            inside += lo <= shift <= hi
        assert 0.93 <= inside / 2000 <= 0.97, (shift, inside)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="^values\\[i\\] must be"):
        fifths_contrast([0.1, "x"] * 10)
    with pytest.raises(ValueError, match="^level must be a number in \\(0, 1\\)"):
        fifths_contrast([0.1] * 10, level=1.5)
