"""The laptop preset's plan (every stage x seed, both ablations, run by dsh.experiment.run.pipeline like every preset),
budgets that hold the traces, bad input refused before any work."""

import json
import random
from pathlib import Path

import pytest

from dsh.experiment.run import presets
from dsh.experiment.run.attribution_fits import MIN_SPAN
from dsh.experiment.run.pipeline import plan, stages_needed
from dsh.experiment.run.steps import reward_curve
from dsh.task import laptop_task as lt

ROOT = Path(__file__).resolve().parent.parent


def test_plan_has_every_stage_for_every_seed_and_both_ablations():
    stages = presets.LAPTOP.plan_stages()           # the preset's seeds and ablation seeds: (0, 1, 2) both
    names = [s.name for s in stages]
    assert len(names) == len(set(names)) == 1 + 3 * 4 + 3 * (len(presets.KL_BETAS) + 2)
    for k in (0, 1, 2):                             # every arm and both ablations on 3 seeds
        for st in ("sft", "sft_reflection", "dft", "rl", "sft_verdict", "rl_verdict"):
            assert f"{st}-s{k}" in names
        assert {f"rl_beta{b:g}-s{k}" for b in presets.KL_BETAS} <= set(names)
    # the KL ablation: beta = 0 and two values > 0, the RL arm's (the paper's 0.001) one of them
    assert sorted({*presets.KL_BETAS, presets.LAPTOP.training["grpo"]["beta"]}) == [0.0, 0.001, 0.1]
    assert presets.LAPTOP.plan_stages(ablation_seeds=(0,))[-1].name == "rl_verdict-s0"
    pos = {n: i for i, n in enumerate(names)}
    for s in stages:                    # a stage runs after the one it starts from, with its own seed
        if s.init:
            assert pos[s.init] < pos[s.name]
        assert s.seed == (None if s.name == "base" else int(s.name.rsplit("-s", 1)[1]))
    cfgs = plan("laptop", "runs/x", "base/")
    assert sorted(cfgs) == sorted(names[1:])
    assert cfgs["rl-s1"].model == "runs/x/sft_reflection-s1" and cfgs["rl-s1"].seed == 1
    assert cfgs["rl_beta0-s0"].beta == 0 and cfgs["rl-s0"].beta == presets.LAPTOP.training["grpo"]["beta"]
    assert cfgs["sft_verdict-s0"].task_options == {**presets.LAPTOP_REFLECTION, "check": "verdict"}
    assert cfgs["sft_reflection-s0"].task_options == presets.LAPTOP_REFLECTION
    assert cfgs["rl_verdict-s0"].model == "runs/x/sft_verdict-s0"
    assert cfgs["dft-s2"].model == "base/" and all(c.task == "laptop_task" for c in cfgs.values())
    assert plan("laptop", "runs/x")["sft-s0"].model == presets.LAPTOP.model     # the shipped base by default
    # other seeds on request, for any preset: the ci preset's stages once per seed
    ci = presets.CI.plan_stages(seeds=(3, 4))
    assert [s.name for s in ci][:3] == ["base", "sft-s3", "sft_reflection-s3"]
    assert plan("ci", "r", seeds=(3, 4))["rl-s4"].model == "r/sft_reflection-s4"
    assert [s.name for s in presets.CI.plan_stages()] == ["base", "sft", "sft_reflection", "rl", "dft"]



@pytest.mark.parametrize("preset", [presets.LAPTOP, pytest.param(presets.LAPTOP_WIDE, marks=pytest.mark.slow)],
                         ids=["laptop", "laptop-wide"])
def test_token_limits_hold_the_longest_traces(preset):
    from dsh.llm.tiny import build_tokenizer

    tok = build_tokenizer()
    rng = random.Random(0)
    sft = preset.training["sft_reflection"]
    ev = preset.evaluation
    grpo = preset.training["grpo"]
    for lv in dict.fromkeys((*ev.levels, *sft["train_levels"])):
        longest = max(len(tok(lt.trace(lt.draw(lv, rng), "reflection", seed=i).text)["input_ids"])
                      for i in range(300))
        if lv in ev.levels:
            assert longest + 1 <= ev.max_new_tokens
        if lv in sft["train_levels"]:
            assert longest + 20 <= sft["max_length"] and longest + 1 <= grpo["max_completion_length"]


def test_the_wide_preset_differs_from_the_laptop_preset_only_in_its_fine_tuning_ladder():
    """laptop-wide: the laptop stages from the same base, fine-tuned on 1x1 ... 1x10 in both orders (GRPO's token
    limit raised to hold those traces), seed 0, the KL ablation without the verdict-only controls; its study samples
    1x1 ... 1x10 at the temperature its design measurement chose."""
    wide, lap = presets.LAPTOP_WIDE, presets.LAPTOP
    assert wide.model == lap.model and wide.evaluation == lap.evaluation and wide.stages == lap.stages
    for m, c in lap.training.items():
        w = wide.training[m]
        assert set(w) == set(c)
        assert {k for k in c if w[k] != c[k]} == ({"train_levels", "max_completion_length"} if m == "grpo"
                                                  else {"train_levels"})
        assert sorted(w["train_levels"]) == sorted([f"1x{n}" for n in range(1, 11)] + [f"{n}x1" for n in range(2, 11)])
    names = [s.name for s in wide.plan_stages()]
    assert names == ["base", "sft-s0", "sft_reflection-s0", "dft-s0", "rl-s0", "rl_beta0-s0", "rl_beta0.1-s0"]
    assert set(wide.attribution_stages) <= set(names) and wide.attribution.levels[-1] == "1x10"
    assert wide.attribution_repeats == wide.attribution_stages          # every stage's slopes reproduced
    committed = {p.name[:-len(".json.gz")] for p in (ROOT / "book/results/laptop-wide/attribution").glob("*.json.gz")}
    assert committed == set(wide.attribution_stages) | {f"{s}-t1" for s in wide.attribution_repeats}
    assert wide.probe is None
    # the study's temperature is the one the committed design measurement chose by its rule
    design = json.loads((ROOT / "book/results/laptop/design/wide_study_temperature.json").read_text())
    assert wide.attribution.temperature == design["chosen"] == presets.WIDE_STUDY_T
    ts = [float(t) for t in next(iter(design["stages"].values()))["temperatures"]]
    assert design["chosen"] == max(t for t in ts if all(st["temperatures"][str(t)]["span"] >= MIN_SPAN
                                                        for st in design["stages"].values()))


def test_bad_plans_are_refused():
    p = presets.LAPTOP
    with pytest.raises(ValueError, match="ablation_seeds must be a subset of seeds"):
        p.plan_stages(seeds=(0,), ablation_seeds=(1,))
    with pytest.raises(ValueError, match="^seeds must be a list of integers >= 0"):
        p.plan_stages(seeds=(-1,))
    with pytest.raises(ValueError, match="^seeds must name each seed once"):
        p.plan_stages(seeds=(1, 1))
    with pytest.raises(ValueError, match="^seeds must name at least one seed"):
        p.plan_stages(seeds=())
    with pytest.raises(ValueError, match="^ablation_seeds needs seeds"):
        presets.CI.plan_stages(ablation_seeds=(0,))
    with pytest.raises(ValueError, match="^overrides must not set seed in a seeded plan"):
        plan("laptop", "r", overrides={"seed": 3})
    with pytest.raises(ValueError, match="task_options: 'checks' is not a setting of task 'laptop_task'"):
        plan("laptop", "r", overrides={"task_options": {"checks": "verdict"}})
    with pytest.raises(ValueError, match=r"task_options\['check'\] must be one of computed, verdict"):
        plan("laptop", "r", overrides={"task_options": {"check": "both"}})


def test_a_chosen_stage_brings_what_it_starts_from():
    stages = presets.LAPTOP.plan_stages(seeds=(0, 1), ablation_seeds=(0,))
    assert stages_needed(stages, ("rl-s1",)) == ["base", "sft_reflection-s1", "rl-s1"]
    assert stages_needed(stages, ("rl_verdict-s0", "sft-s0")) == ["base", "sft-s0", "sft_verdict-s0", "rl_verdict-s0"]
    with pytest.raises(ValueError, match=r"stages\[i\] must be one of"):
        stages_needed(stages, ("rl-s7",))


def test_the_reward_curve_has_one_entry_per_rollout_round(tmp_path):
    """Rounds of several steps: the reward of each round's first step, the KL of its last, its time split."""
    import json

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
