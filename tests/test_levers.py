"""The pipeline's time with the measured levers (dsh.experiment.report.levers), on hand-made schedules and studies."""

import pytest

from dsh.experiment.report import levers


def _schedule():
    return [{"step": "train sft-s0", "start_s": 0.0, "end_s": 100.0, "worker": 1},
            {"step": "train rl-s0", "start_s": 100.0, "end_s": 700.0, "worker": 1},
            {"step": "train rl_beta0-s0", "start_s": 0.0, "end_s": 500.0, "worker": 2},
            {"step": "job rl-s0", "start_s": 700.0, "end_s": 720.0, "worker": 1},
            {"step": "study sft-s0-t0", "start_s": 500.0, "end_s": 700.0, "worker": 2}]


CONFIGS = {"sft-s0": {"method": "sft"}, "rl-s0": {"method": "grpo", "beta": 0.001},
           "rl_beta0-s0": {"method": "grpo", "beta": 0.0}}
TRAINING = {"sft-s0": {"wall_s": 90.0}, "rl-s0": {"wall_s": 600.0, "scoring_s": 120.0},
            "rl_beta0-s0": {"wall_s": 500.0, "scoring_s": 0.5}}


def test_cuts_take_the_scoring_share_of_grpo_stages_with_a_reference_and_the_attention_gain_of_fine_tuning():
    cuts = levers.lever_cuts(_schedule(), TRAINING, CONFIGS, scoring_ratio=0.75, attention_ratio=0.9)
    assert cuts == {"train sft-s0": pytest.approx(0.1), "train rl-s0": pytest.approx(0.2 * 0.25)}
    with pytest.raises(ValueError, match="scoring_ratio must be a number in"):
        levers.lever_cuts(_schedule(), TRAINING, CONFIGS, scoring_ratio=1.5, attention_ratio=0.9)
    with pytest.raises(ValueError, match="'rl-s0' is missing"):
        levers.lever_cuts(_schedule(), {"sft-s0": TRAINING["sft-s0"]}, CONFIGS, 0.75, 0.9)


def test_the_bound_is_the_work_over_the_workers_or_the_longest_step():
    sched = _schedule()
    plain = levers.work_bound(sched, 2, {})
    assert plain == {"busy_s": 1420.0, "saved_s": 0.0, "wall_s": 710.0}
    cut = levers.work_bound(sched, 2, {"train rl-s0": 0.5, "study sft-s0-t0": 0.25})
    assert cut["busy_s"] == pytest.approx(1420 - 300 - 50) and cut["wall_s"] == pytest.approx(535.0)
    assert levers.work_bound(sched, 8, {})["wall_s"] == 600.0             # no faster than its longest step
    with pytest.raises(ValueError, match="cuts must map steps of the schedule"):
        levers.work_bound(sched, 2, {"train nothing": 0.1})
    with pytest.raises(ValueError, match="cuts must map steps"):
        levers.work_bound(sched, 2, {"train rl-s0": 1.0})
    with pytest.raises(ValueError, match="workers must be an integer >= 1"):
        levers.work_bound(sched, 0, {})


def _study(per_round: dict, rounds: int, min_signal: int = 10, max_rounds: int = 6) -> dict:
    """A study record whose fits gain per_round[term] trajectories a round (each a trajectory row of the study's
    form: a grad entry for the term against the decision and the stage), one question a level a round."""
    rows = []
    for r in range(rounds):
        for term, n in per_round.items():
            for _ in range(n):
                rows.append({"prompt": r, "L": 10.0, "tokens": {}, "kl": {"attempt": 0.0, "check": 0.0, "decision": 0.0},
                             "grad": {t: ({"attempt": 1.0, "check": 1.0, "decision": 1.0, "stage": 1.0, "cosine": 0.0}
                                          if t == term else None) for t in per_round}})
    return {"rounds": rounds, "objectives": list(per_round), "trajectories": rows,
            "settings": {"levels": ["1x1"], "prompts_per_level": 1, "min_signal": min_signal, "max_rounds": max_rounds}}


def test_a_study_stops_once_every_fit_holds_enough_or_cannot_reach_it():
    # sft reaches 10 in round 2; dft gains 1 a round: 1 x 6 / 1 < 10, out of reach from round 1
    assert levers.futile_rounds(_study({"sft": 5, "dft": 1}, rounds=6)) == 2
    # dft at 2 a round could reach 12 by round 6: drawn until it holds 10 (round 5)
    assert levers.futile_rounds(_study({"sft": 5, "dft": 2}, rounds=6)) == 5
    # never more than the study drew
    assert levers.futile_rounds(_study({"sft": 1, "dft": 2}, rounds=3, max_rounds=6)) == 3


def test_study_cuts_read_each_study_step_off_its_record():
    sched = _schedule() + [{"step": "study sft-s0-t1", "start_s": 720.0, "end_s": 800.0, "worker": 1}]
    studies = {"sft-s0": _study({"sft": 5, "dft": 1}, rounds=6), "sft-s0-t1": _study({"sft": 20}, rounds=1)}
    assert levers.study_rounds(sched, studies) == {"study sft-s0-t0": (2, 6), "study sft-s0-t1": (1, 1)}
    assert levers.study_cuts(sched, studies) == {"study sft-s0-t0": pytest.approx(1 - 2 / 6), "study sft-s0-t1": 0.0}
    with pytest.raises(ValueError, match="'sft-s0-t1' is missing"):
        levers.study_cuts(sched, {"sft-s0": studies["sft-s0"]})
