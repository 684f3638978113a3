"""The claims' verdicts come only where the data could have said the opposite (dsh.measure.claims): on simulated
two-stage experiments with known p_s, p_dC, p_dW, a ladder answered always or never right is "not testable here",
a graded one gives "holds" when the truth holds and "fails" when it is reversed, and claim (i) is not judged where
a correctness-blind decision predicts the accuracy as well."""

import copy

import pytest

from dsh.experiment.report.simulated import synthetic_results
from dsh.measure import claims
from dsh.measure.stage import calibrate_stage
from dsh.task.synthetic import synthetic_records

N = 400
GRADED = {"1x2": 0.7, "1x3": 0.5, "1x4": 0.35}


def _cal(truths, n=N, seed=0):
    return synthetic_results(truths, n=n, seed=seed, n_bootstrap=100)["calibration"]


def _ladder(p_dC, p_dW, p_s=GRADED):
    return {lv: (ps, p_dC, p_dW) for lv, ps in p_s.items()}


def test_a_ladder_answered_always_or_never_right_is_not_testable():
    forced = {"1x2": 0.99, "1x3": 0.98, "1x4": 0.0, "1x5": 0.0}
    cal = _cal({"sft_reflection": _ladder(0.95, 0.7, forced), "rl": _ladder(0.95, 0.0, forced)})
    got = {c["claim"].split(" ")[0]: c for c in claims.verdicts(cal)}
    for key in ("(i)", "(ii)", "(iii)"):
        assert got[key]["verdict"].startswith(claims.NOT_TESTABLE), got[key]
    # a pooled contrast would have called the drop of p_dW (0.7 -> 0.0) a finding: no level-stratified one exists
    assert got["(ii)"]["stratified"] is None
    assert all(r["verdict"].startswith(claims.NOT_TESTABLE) for r in got["(ii)"]["per_level"])


def test_claim_ii_holds_on_a_graded_ladder_when_rl_moves_the_decision_and_fails_when_it_moves_sampling():
    sft = _ladder(0.95, 0.3)
    decision = _cal({"sft_reflection": sft, "rl": _ladder(0.95, 0.8)})
    c = claims.claim_rl_improves_decision(decision)
    assert c["verdict"] == "holds", c
    assert c["stratified"]["levels"] == list(GRADED)
    assert all(r["verdict"] == "holds" for r in c["per_level"])
    sampling = _cal({"sft_reflection": sft, "rl": _ladder(0.95, 0.3, {lv: min(ps + 0.25, 0.95)
                                                                        for lv, ps in GRADED.items()})})
    assert claims.claim_rl_improves_decision(sampling)["verdict"] == "fails"


def test_claim_i_holds_on_two_stage_data_fails_when_accuracy_is_moved_and_skips_blind_decisions():
    cal = _cal({"sft_reflection": _ladder(0.97, 0.9), "rl": _ladder(0.97, 0.9)})
    c = claims.claim_predicts(cal)
    assert c["verdict"] == "holds", c["evidence"]
    assert all(r["verdict"] == "holds" for r in c["per_level"])
    moved = copy.deepcopy(cal)
    for stage in moved.values():
        for s in stage["all"]["by_level"].values():
            s["observed_accuracy"] -= 0.25
            s["ci_low"] -= 0.25
            s["ci_high"] -= 0.25
    assert claims.claim_predicts(moved)["verdict"] == "fails"
    # a decision blind to correctness (p_dC = 1 - p_dW): the blind prediction is right by construction
    blind = _cal({"sft_reflection": _ladder(0.6, 0.4), "rl": _ladder(0.6, 0.4)})
    c = claims.claim_predicts(blind)
    assert c["verdict"].startswith(claims.NOT_TESTABLE), c
    assert all("correctness-blind" in r["verdict"] for r in c["per_level"])


def test_claim_iii_holds_when_p_s_falls_faster_than_p_dw_and_fails_when_p_dw_falls_instead():
    sft = _ladder(0.95, 0.6)
    falls = _cal({"sft_reflection": sft, "rl": {"1x2": (0.75, 0.95, 0.8), "1x3": (0.5, 0.95, 0.8),
                                                "1x4": (0.25, 0.95, 0.8)}})
    c = claims.claim_ood_limited_by_sampling(falls)
    assert c["verdict"] == "holds", c
    assert [r["relative_to"] for r in c["per_level"]] == ["1x2", "1x2"]
    flat = _cal({"sft_reflection": sft, "rl": {"1x2": (0.5, 0.95, 0.9), "1x3": (0.5, 0.95, 0.5),
                                               "1x4": (0.5, 0.95, 0.1)}})
    assert claims.claim_ood_limited_by_sampling(flat)["verdict"] == "fails"


def _stage(truth, seed):
    recs = []
    for j, (lv, t) in enumerate(truth.items()):
        recs += synthetic_records(*t, n=N, level=lv, seed=seed + j)
    return calibrate_stage(recs, seed=seed, n_bootstrap=100)


@pytest.mark.parametrize("kept", [pytest.param(True, marks=pytest.mark.slow), False])
def test_the_kl_ablation_is_judged_on_the_graded_levels_of_sft_reflection(kept):
    keep, lose = _stage(_ladder(0.95, 0.7), 10), _stage(_ladder(0.95, 0.1), 20)
    cal = {"sft_reflection": _stage(_ladder(0.95, 0.7), 30), "rl_beta0.1": keep if kept else lose,
           "rl_beta0": lose if kept else keep}
    c = claims.claim_kl_keeps_decision(cal, "rl_beta0.1", "rl_beta0")
    assert c["verdict"] == ("holds" if kept else "fails"), c
    forced = {"sft_reflection": _stage(_ladder(0.95, 0.7, {"1x2": 1.0, "1x3": 0.0}), 30),
              "rl_beta0.1": _stage(_ladder(0.95, 0.7, {"1x2": 1.0, "1x3": 0.0}), 10),
              "rl_beta0": _stage(_ladder(0.95, 0.1, {"1x2": 1.0, "1x3": 0.0}), 20)}
    assert claims.claim_kl_keeps_decision(forced, "rl_beta0.1", "rl_beta0")["verdict"].startswith(claims.NOT_TESTABLE)


def test_stratified_weighs_levels_equally():
    rows = [{"level": "a", "difference": 0.1, "se": 0.03}, {"level": "b", "difference": 0.3, "se": 0.04}]
    st = claims.stratified(rows)
    assert st["difference"] == pytest.approx(0.2)
    half = 1.959963984540054 * (0.03 ** 2 + 0.04 ** 2) ** 0.5 / 2
    assert st["interval"] == pytest.approx([0.2 - half, 0.2 + half])
    assert claims.stratified([]) is None
