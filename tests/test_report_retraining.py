"""dsh.experiment.report.retraining: the retrained stage's table, the mean absolute difference and the commit
checks, on hand-made calibrations and records (values worked out by hand)."""

import pytest

from dsh.experiment.report import commit_checks, mean_abs_difference, retrained_table


def _cal(levels: dict) -> dict:
    """A calibration record holding, per level, (accuracy, p_s, p_dC, p_dW), each interval its value -+ 0.05."""
    by = {}
    for lv, (acc, ps, pc, pw) in levels.items():
        by[lv] = {"observed_accuracy": acc, "ci_low": acc - 0.05, "ci_high": acc + 0.05,
                  "p_s": ps, "p_s_ci": [ps - 0.05, ps + 0.05],
                  "p_d_given_correct": pc, "p_d_given_correct_ci": [pc - 0.05, pc + 0.05],
                  "p_d_given_wrong": pw, "p_d_given_wrong_ci": [pw - 0.05, pw + 0.05]}
    return {"all": {"overall": {}, "by_level": by}}


COMMITTED = _cal({"1x2": (0.9, 0.8, 0.95, 0.5), "1x3": (0.6, 0.5, 0.9, 0.4)})
RETRAINED = _cal({"1x2": (0.92, 0.8, 0.95, 0.7), "1x3": (0.6, 0.5, 0.9, 0.4)})


def test_table_values_and_inside_flags():
    t = retrained_table(COMMITTED, RETRAINED, {"s0": RETRAINED})
    assert list(t.index.get_level_values(0).unique()) == ["1x2", "1x3"] and len(t) == 8
    row = t.loc[("1x2", "p_dW")]
    assert row["committed"] == 0.5 and row["retrained"] == 0.7 and row["s0"] == 0.7
    assert not row["inside committed interval"]                         # 0.7 outside [0.45, 0.55]
    assert t.loc[("1x2", "accuracy"), "inside committed interval"]     # 0.92 inside [0.85, 0.95]
    assert t.loc[("1x2", "accuracy"), "committed low"] == pytest.approx(0.85)
    assert int(t["inside committed interval"].sum()) == 7


def test_mean_abs_difference_by_hand():
    # |0.92 - 0.9| + |0.7 - 0.5| over 8 figures
    assert mean_abs_difference(COMMITTED, RETRAINED) == pytest.approx((0.02 + 0.2) / 8)
    assert mean_abs_difference(COMMITTED, COMMITTED) == 0.0


def test_levels_and_records_checked():
    short = _cal({"1x2": (0.9, 0.8, 0.95, 0.5)})
    with pytest.raises(ValueError, match="missing \\['1x3'\\]"):
        retrained_table(COMMITTED, short)
    with pytest.raises(ValueError, match="b must hold"):
        mean_abs_difference(COMMITTED, short)
    with pytest.raises(ValueError, match="committed must be a calibration record"):
        retrained_table({"overall": {}}, RETRAINED)


def _run(commit, n, weights, committed="sha256:aa", identical=None):
    return {"commit": commit * 40, "commit_date": "2026-11-29 09:03", "commits_after_3fb2018": n, "stage": "rl-s0",
            "subject": "s", "weights": weights, "committed_weights": committed,
            "identical": weights == committed if identical is None else identical}


def test_commit_checks_orders_and_verifies():
    training = {"rl-s0": {"final_weights": "sha256:aa"}}
    t = commit_checks({"runs": [_run("b", 30, "sha256:bb"), _run("a", 4, "sha256:aa")]}, training)
    assert list(t["commit"]) == ["aaaaaaa", "bbbbbbb"] and list(t["the committed weights"]) == [True, False]
    with pytest.raises(ValueError, match="not the summary's"):
        commit_checks({"runs": [_run("a", 4, "sha256:aa", committed="sha256:cc")]}, training)
    with pytest.raises(ValueError, match="disagrees with its digests"):
        commit_checks({"runs": [_run("a", 4, "sha256:bb", identical=True)]}, training)
