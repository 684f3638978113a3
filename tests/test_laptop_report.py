"""dsh.experiment.laptop_report on a results folder built from simulated responses whose p_s, p_dC, p_dW are known: the
tables recover the truth, the deltas have the right sign, the claims run per seed."""

import json

import pytest

from dsh.experiment import laptop_report as lr
from dsh.experiment.laptop_pipeline import plan_jobs
from dsh.measure.stage import calibrate_stage
from dsh.task import laptop_task as lt
from dsh.task.synthetic import synthetic_records

TRUTH = {  # stage: (p_s, p_dC, p_dW) at every level
    "base": (0.6, 1.0, 0.0), "sft": (0.6, 1.0, 0.0), "sft_reflection": (0.5, 0.9, 0.3), "dft": (0.5, 0.9, 0.3),
    "rl": (0.55, 0.95, 0.8), "rl_beta0": (0.6, 0.95, 0.8), "rl_beta0.01": (0.55, 0.95, 0.7),
    "rl_beta0.1": (0.5, 0.9, 0.4), "sft_verdict": (0.5, 0.5, 0.5), "rl_verdict": (0.5, 1.0, 0.0),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("laptop")
    jobs = plan_jobs(seeds=(0, 1), ablation_seeds=(0,))
    for k, j in enumerate(jobs):
        recs = []
        for i, lv in enumerate(lt.TEST_LEVELS):
            recs += synthetic_records(*TRUTH[j.stage], n=80, level=lv, seed=1000 * k + i, marker=lt.MARKER)
        out = {"job": {"name": j.name, "stage": j.stage, "method": j.method, "seed": j.seed, "init": j.init,
                       "overrides": j.overrides},
               "calibration": calibrate_stage(recs, n_bootstrap=10), "laptop_faithfulness": lt.faithfulness(recs),
               "reward_curve": [{"step": 1, "reward": 0.5, "frac_reward_zero_std": 0.2, "kl": 0.01 * k}]
               if j.method == "grpo" else None}
        (root / f"{j.name}.json").write_text(json.dumps(out))
    summary = {"jobs": [{"name": j.name} for j in jobs],
               "timings_s": {f"train_{j.name}": 1.0 for j in jobs if j.method} |
                            {f"evaluate_{j.name}": 2.0 for j in jobs}}
    (root / "summary.json").write_text(json.dumps(summary))
    return lr.load(root)


def test_long_table_recovers_the_truth(results):
    df = lr.long_table(results)
    for stage, (ps, pdc, pdw) in TRUTH.items():
        d = df[df.stage == stage]
        assert abs(d.p_s.mean() - ps) < 0.06
        assert abs(d.p_dC.mean() - pdc) < 0.08
        if pdw > 0:
            assert abs(d.p_dW.mean() - pdw) < 0.08
    assert set(lr.table1(results).index) == {f"{lr.LABELS[s]} ({n} seed{'s' if n > 1 else ''})"
                                             for s, n in (("base", 1), ("sft", 2), ("sft_reflection", 2),
                                                          ("rl", 2), ("dft", 2))}


def test_kl_table_and_deltas_have_the_signs_of_the_truth(results):
    kl = lr.kl_table(results)
    assert list(kl.comparison) == ["beta = 0", "beta = 0.01", "beta = 0.1"]
    dw = [float(x.split(" ")[0]) for x in kl["Δp_dW"]]
    assert dw[0] > dw[2] > 0          # truth: +0.5, +0.4, +0.1
    d = lr.delta_table(results, [("rl vs its SFT", "rl", "sft_reflection")])
    assert d.seeds[0] == 2 and float(d["Δp_dW"][0].split(" ")[0]) > 0.3


def test_claims_faithfulness_timings_and_figures(results):
    c = lr.claims_by_seed(results)
    assert set(c.seed) == {0, 1} and (c[c.claim.str.startswith("(ii)")].verdict == "holds").all()
    f = lr.faithfulness_table(results)      # simulated responses carry no check lines: nothing to measure
    assert len(f) == 5 and f.isna().all().all()
    t = lr.timings_table(results)
    assert t.loc["rl-s0", "train"] == 1.0 and t.loc["base", "evaluate"] == 2.0
    import matplotlib

    matplotlib.use("Agg")
    assert lr.plot_calibration(results) is not None and lr.plot_reward_curves(results) is not None


def test_load_refuses_a_folder_that_is_not_a_laptop_run(tmp_path):
    with pytest.raises(ValueError, match="results_dir must be a folder written by"):
        lr.load(tmp_path)


def test_unfaithful_causes_sorts_the_misses(tmp_path):
    import gzip

    from dsh.task.problems import Problem

    p = Problem(8, 69857)
    body, res = lt.attempt_text(8, 69857)
    good, _ = lt.attempt_block(p, body, res)
    wrong_cand = good.replace("558856: 1 5>5 5>0 8>1 8>2 5>6 6>0. 0=0: the check passes.",
                              "558854: 1 5>5 5>0 8>1 8>2 5>6 4>2. 2!=0: the check fails.")
    wrong_mult = good.replace("Check: 69857: 6>6 9>6 8>5 5>1 7>8. 8*8>1. 558856: 1 ",
                              "Check: 69858: 6>6 9>6 8>5 5>1 8>0. 0*8>0. 558856: 0 ").replace(
        "5>6 6>0. 0=0: the check passes.", "5>6 6>0. 0=0: the check fails.")
    slip = good.replace("5>6 6>0. 0=0: the check passes.", "5>6 6>1. 1!=0: the check fails.")
    rows = [{"question": p.question, "response": t, "level": "1x5"} for t in (good, wrong_cand, wrong_mult, slip)]
    (tmp_path / "generations").mkdir()
    with gzip.open(tmp_path / "generations" / "j.jsonl.gz", "wt") as f:
        f.write("\n".join(json.dumps(r) for r in rows) + "\n")
    c = lr.unfaithful_causes(tmp_path, "j")
    assert c == {"checks": 4, "unfaithful": 3, "candidate miscopied": 1, "multiplicand miscopied": 1,
                 "copied right (arithmetic)": 1, "unreadable": 0}
    ex = lr.unfaithful_examples(tmp_path, "j", n=5)
    assert len(ex) == 3 and ex[0]["candidate"] == res and "558854" in ex[0]["written"]


def test_as_pipeline_results_feeds_the_paper_tables(results):
    from dsh.experiment import report
    live = lr.as_pipeline_results(results, seed=1)
    assert set(live["calibration"]) == {"base", "sft", "sft_reflection", "rl", "dft"}
    t = report.table1(live)
    assert len(t) == 5 and list(t.columns) == list(lt.TEST_LEVELS)
    lines = lr.headline(results)
    assert any(x.startswith("RL minus SFT (reflection)") for x in lines)
    assert any(x.startswith("KL ablation (beta = 0, beta = 0.01, beta = 0.1)") for x in lines)
