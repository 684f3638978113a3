"""Claim (i) on predictions the fit did not use (dsh.measure.predictions), on simulated responses with known truth."""

import numpy as np
import pytest

from dsh.measure import predictions as P
from dsh.task import synthetic


def test_data_from_the_model_agree_on_every_check():
    """Responses written by the two-stage process, three levels with different p_s: the pooled predictions
    (mixtures of the per-level fits) agree with the observed counts, F->T rate and cut-off accuracy."""
    recs = []
    for i, (lv, ps) in enumerate([("3x3", 0.7), ("3x5", 0.45), ("3x7", 0.2)]):
        recs += synthetic.synthetic_records(ps, 0.85, 0.75, n=300, level=lv, seed=10 + i)
    out = P.unfitted_predictions(recs)
    assert out["verdict"] == "holds", P.format_checks(out)
    assert set(out["fit"]) == {"3x3", "3x5", "3x7"}
    assert out["fit"]["3x3"]["p_s"] == pytest.approx(0.7, abs=0.06)
@pytest.mark.slow   # several seconds: make check leaves it out, make test runs it
def test_false_alarms_stay_near_the_family_wise_level():
    """Twenty independent data sets from the model: at most three 'fails' (5 % expected, one in twenty)."""
    verdicts = [P.unfitted_predictions(synthetic.synthetic_records(0.4, 0.85, 0.7, n=200, seed=s))["verdict"]
                for s in range(20)]
    assert verdicts.count("fails") <= 3 and verdicts.count("holds") >= 17


@pytest.mark.parametrize("later", [0.8, 0.1])
def test_later_attempts_unlike_the_first_are_detected(later):
    """When re-attempts are more (or less) accurate than first attempts - the model's assumption broken -
    the F->T rate and the cut-off accuracy disagree with their predictions."""
    recs = synthetic.synthetic_records(0.3, 0.9, 0.7, n=600, seed=5, p_s_later=later)
    out = P.unfitted_predictions(recs)
    assert out["verdict"] == "fails"
    assert not out["checks"]["F->T rate"]["agrees"]
    assert not out["checks"]["accuracy within 2 candidates"]["agrees"]


def test_too_few_responses_cannot_tell_and_bad_arguments():
    recs = synthetic.synthetic_records(0.4, 0.85, 0.7, n=10, seed=1)
    assert P.unfitted_predictions(recs)["verdict"] == "cannot tell"
    with pytest.raises(ValueError, match="^max_attempts must be an integer >= 2"):
        P.unfitted_predictions(recs, max_attempts=1)
    with pytest.raises(ValueError, match="^cutoff must be an integer >= 1"):
        P.unfitted_predictions(recs, cutoff=0)
@pytest.mark.slow   # several seconds: make check leaves it out, make test runs it
def test_questions_that_differ_fail_the_plain_checks_but_not_the_mixture():
    """Each question follows the two-stage process with its own p_s (Beta, mean 0.4, concentration 2): the plain
    checks fail from that alone; the mixture variant holds. A process whose later attempts are better than its first
    fails both; data from the homogeneous model holds both."""
    runs = {"differ": dict(p_s_concentration=2.0), "later better": dict(p_s_later=0.8), "same": {}}
    fails = {}
    for name, kw in runs.items():
        recs = [synthetic.synthetic_records(0.4, 0.85, 0.7, n=300, seed=100 + s, **kw) for s in range(5)]
        fails[name] = [sum(P.unfitted_predictions(r, mixture=m)["verdict"] == "fails" for r in recs) for m in (False, True)]
    assert fails["differ"][0] >= 4 and fails["differ"][1] <= 1, fails
    assert fails["later better"][1] >= 4, fails
    assert fails["same"][1] <= 1, fails
@pytest.mark.slow   # several seconds: make check leaves it out, make test runs it
def test_fit_beta_recovers_the_questions_spread():
    recs = synthetic.synthetic_records(0.4, 0.85, 0.7, n=2500, seed=3, p_s_concentration=2.0)
    alpha, beta = P.fit_beta(P.candidate_lists(recs))
    assert abs(alpha / (alpha + beta) - 0.4) < 0.03 and 1.4 < alpha + beta < 2.8, (alpha, beta)
    same = synthetic.synthetic_records(0.4, 0.85, 0.7, n=2500, seed=3)
    a2, b2 = P.fit_beta(P.candidate_lists(same))
    assert a2 + b2 > 5 * (alpha + beta), (a2, b2)          # no spread: a far higher concentration
    with pytest.raises(ValueError, match="^mixture must be True or False"):
        P.unfitted_predictions(recs, mixture="yes")


def test_fit_beta_of_questions_all_right_or_all_wrong_is_the_bound():
    """Every candidate right: the likelihood rises towards beta -> 0 for any alpha (a flat ridge, where the optimizer
    used to stop at a machine-dependent point: alpha 9,633 on one machine, 98,716 on another); the fit is the bound
    it tends to, the concentration at the cap, and mirrored for every candidate wrong."""
    lo, hi = np.exp(P.LOG_BOUNDS)
    assert P.fit_beta([[True], [True, True], [True]]) == pytest.approx((hi, lo))
    assert P.fit_beta([[False, False], [False]]) == pytest.approx((lo, hi))
    a, b = P.fit_beta([[True]] * 50 + [[False, True]])           # one wrong candidate: a real fit, mean near 50/51
    assert 0.9 < a / (a + b) < 1 and b > 10 * lo
