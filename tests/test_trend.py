"""The reward-curve contrast (dsh.measure.trend): a hand case, the interval's coverage by simulation with a known
shift, and its refusals."""

import math
import random

import pytest

from dsh.measure.trend import fifths_contrast, proportion_rise, verdict


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


def test_the_rise_of_a_share_reproduces_newcombes_published_interval():
    # Newcombe (1998), Statistics in Medicine 17:873, example (a): 56/70 against 48/80, method 10 (hybrid score, no
    # continuity correction): 0.0524 to 0.3339
    r = proportion_rise(48, 80, 56, 70)
    assert math.isclose(r["delta"], 0.2) and r["first"] == 0.6 and r["last"] == 0.8
    assert [round(x, 4) for x in r["ci"]] == [0.0524, 0.3339] and verdict(r) == "rises"
    assert [round(x, 4) for x in proportion_rise(56, 70, 48, 80)["ci"]] == [-0.3339, -0.0524]   # mirrored
    same = proportion_rise(0, 50, 0, 50)                     # no right answer either time: no change, nonzero width
    assert same["delta"] == 0 and same["ci"][0] < 0 < same["ci"][1]
    assert proportion_rise(147, 200, 172, 200, level=0.5)["ci"][0] > proportion_rise(147, 200, 172, 200)["ci"][0]


def test_the_rise_of_a_share_covers_a_known_difference():
    rng = random.Random(1)
    for p0, p1 in ((0.73, 0.73), (0.73, 0.86), (0.2, 0.5)):
        inside = sum(lo <= p1 - p0 <= hi for lo, hi in (
            proportion_rise(sum(rng.random() < p0 for _ in range(200)), 200,
                            sum(rng.random() < p1 for _ in range(200)), 200)["ci"] for _ in range(2000)))
        assert 0.93 <= inside / 2000 <= 0.975, (p0, p1, inside)


@pytest.mark.parametrize("args, message", [
    ((1.5, 2, 1, 2), "k_first must be an integer >= 0"),
    ((1, 0, 1, 2), "n_first must be an integer >= 1"),
    ((1, 2, 3, 2), r"k_last must be a count between 0 and n_last \(2\), got 3"),
    ((1, 2, 1, 2, 1.0), r"level must be a number in \(0, 1\)"),
])
def test_the_rise_of_a_share_refuses_bad_counts_in_one_line(args, message):
    with pytest.raises(ValueError, match=f"^{message}"):
        proportion_rise(*args)
