"""The laptop preset and its runner's plan: every stage x seed, both ablations, budgets that hold the traces,
bad input refused before any work."""

import random

import pytest

from dsh.experiment import presets
from dsh.experiment.laptop_pipeline import KL_BETAS, job_config, plan_jobs
from dsh.task import laptop_task as lt


def test_plan_has_every_stage_for_every_seed_and_both_ablations():
    jobs = plan_jobs(seeds=(0, 1, 2), ablation_seeds=(0,))
    names = [j.name for j in jobs]
    assert len(names) == len(set(names))
    for s in (0, 1, 2):
        for st in ("sft", "sft_reflection", "dft", "rl"):
            assert f"{st}-s{s}" in names
    assert {f"rl_beta{b:g}-s0" for b in KL_BETAS} <= set(names)
    assert {"sft_verdict-s0", "rl_verdict-s0"} <= set(names)
    pos = {n: i for i, n in enumerate(names)}
    for j in jobs:                      # a job runs after the one it starts from
        if j.init:
            assert pos[j.init] < pos[j.name]
    cfgs = {j.name: job_config(j, "runs/x", "base/") for j in jobs if j.method}
    assert cfgs["rl-s1"].model == "runs/x/sft_reflection-s1" and cfgs["rl-s1"].seed == 1
    assert cfgs["rl_beta0-s0"].beta == 0 and cfgs["rl-s0"].beta == presets.LAPTOP.training["grpo"]["beta"]
    assert cfgs["sft_verdict-s0"].laptop_check == "verdict" and cfgs["sft_reflection-s0"].laptop_check == "computed"
    assert cfgs["dft-s2"].model == "base/" and all(c.task == "laptop_task" for c in cfgs.values())


def test_token_limits_hold_the_longest_traces():
    from dsh.llm.tiny import build_tokenizer

    tok = build_tokenizer()
    rng = random.Random(0)
    sft = presets.LAPTOP.training["sft_reflection"]
    ev = presets.LAPTOP.evaluation
    grpo = presets.LAPTOP.training["grpo"]
    for lv in ev.levels:
        longest = max(len(tok(lt.trace(lt.draw(lv, rng), "reflection", seed=i).text)["input_ids"])
                      for i in range(300))
        assert longest + 1 <= ev.max_new_tokens
        if lv in sft["train_levels"]:
            assert longest + 20 <= sft["max_length"] and longest + 1 <= grpo["max_completion_length"]


def test_bad_plans_are_refused():
    with pytest.raises(ValueError, match="ablation_seeds must be a subset"):
        plan_jobs(seeds=(0,), ablation_seeds=(1,))
    with pytest.raises(ValueError, match="seeds must"):
        plan_jobs(seeds=(-1,))
    with pytest.raises(ValueError, match="kl_betas must be"):
        plan_jobs(kl_betas=(-0.1,))


def test_a_chosen_job_brings_what_it_starts_from_and_the_base():
    from dsh.experiment.laptop_pipeline import select_jobs

    plan = plan_jobs((0, 1), ablation_seeds=(0,))
    assert [j.name for j in select_jobs(plan, ("rl-s1",))] == ["base", "sft_reflection-s1", "rl-s1"]
    assert [j.name for j in select_jobs(plan, ("rl_verdict-s0", "sft-s0"))] == \
        ["base", "sft-s0", "sft_verdict-s0", "rl_verdict-s0"]
    assert select_jobs(plan) == plan
    with pytest.raises(ValueError, match="jobs\\[i\\] must be one of"):
        select_jobs(plan, ("rl-s7",))


def test_the_reward_curve_has_one_entry_per_rollout_round(tmp_path):
    """Rounds of several steps: the reward of each round's first step, the KL of its last, its time split."""
    import json

    from dsh.experiment.laptop_pipeline import reward_curve

    rows = [{"step": 1, "reward": 0.25, "frac_reward_zero_std": 0.5, "completions/mean_length": 40.0,
             "time/rollout_s": 3.0, "time/scoring_s": 1.0, "kl": 0.0, "time/update_s": 0.5},
            {"step": 2, "kl": 0.01, "time/update_s": 0.25},
            {"step": 3, "reward": 0.5, "frac_reward_zero_std": 0.25, "completions/mean_length": 30.0,
             "time/rollout_s": 2.0, "time/scoring_s": 1.5, "kl": 0.02, "time/update_s": 0.5},
            {"step": 4, "kl": 0.03, "time/update_s": 1.0}, {"train_runtime": 9.0, "step": 4}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    c = reward_curve(tmp_path)
    assert [(x["step"], x["reward"], x["kl"], x["rollout_s"], x["scoring_s"], x["update_s"]) for x in c] == [
        (1, 0.25, 0.01, 3.0, 1.0, 0.75), (3, 0.5, 0.03, 2.0, 1.5, 1.5)]
    assert reward_curve(tmp_path / "missing") == []
