"""Round 4 of the graded laptop experiment (RULE.md beside this file, "Round 4"): an attempt budget, measured on
validation questions before any test-ladder run. Run from the repository root with the project's venv, nothing else
running; each step resumes, its results merged into round4.json beside this file:

    python book/results/laptop-graded/design/round4.py budget     # K from the trace format and the token limit
    python book/results/laptop-graded/design/round4.py validate   # GRPO seed 0 under the budget (validation only)
    python book/results/laptop-graded/design/round4.py run        # the pipeline on the test ladder (after the rule)

Runs go to runs/graded-r4/ (not committed); the stages that sample nothing (SFT, SFT with reflection, DFT, the
verdict-only SFT) are those of runs/graded-run/, copied, and reused by the pipeline (their settings are unchanged);
without that folder the pipeline trains them. The committed attribution studies of the models round 4 leaves as
they were (the base and the SFT family) are put in the results folder, where the pipeline reuses each only if the
weights it has trained have the study's digests (and runs it again otherwise)."""
import json
import random
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "round4.json"
RUNS = Path("runs/graded-r4")
EARLIER = Path("runs/graded-run/runs")
LADDER = ("1x2", "1x3", "1x4", "1x5", "1x6", "1x7", "1x8")
LONGEST = ("1x8", "8x1")


def load_out():
    return json.loads(OUT.read_text()) if OUT.is_file() else {}


def save_out(d):
    OUT.write_text(json.dumps(d, indent=1, sort_keys=True) + "\n")


def preset(budget):
    """The laptop-graded preset, which is round 4's protocol (GRPO's rollouts, the validation along its runs and every
    evaluation end a response at its ``budget``-th marker; float16 KV cache, GRPO's passes through the packed attention
    in C); a one-line error when round4.json's K is not the preset's budget."""
    from dsh.experiment.run import presets
    if budget != presets.GRADED_ATTEMPT_BUDGET:
        raise ValueError(f"budget {budget} (round4.json's K) is not the laptop-graded preset's attempt budget "
                         f"{presets.GRADED_ATTEMPT_BUDGET}")
    return presets.LAPTOP_GRADED


def step_budget():
    """K = the most attempts of the longest ladder level that fit in the token limit: the format's own lengths (the
    generator's attempt, its answer, check question, check and marker, in the tiny tokenizer's tokens) over 400
    questions of 1x8 and 8x1, the longest block taken."""
    from dsh.experiment.run import presets
    from dsh.llm.tiny import build_tokenizer
    from dsh.task import laptop_task as lt
    tok = build_tokenizer()
    rng = random.Random("round4-budget")
    longest = 0
    for lv in LONGEST:
        for _ in range(200):
            p = lt.draw(lv, rng)
            body, res = lt.attempt_text(p.a, p.b)
            block, _ = lt.attempt_block(p, body, res)
            longest = max(longest, len(tok(f"{block}\n{lt.MARKER}\n", add_special_tokens=False)["input_ids"]))
    limit = presets.GRADED_TOKENS
    d = load_out()
    d["budget"] = {"longest_attempt_tokens": longest, "token_limit": limit, "K": limit // longest,
                   "levels": list(LONGEST), "questions": 400}
    save_out(d)
    print(d["budget"])


def copy_sampling_free_stages():
    """The SFT-family stage folders of the earlier run (their settings do not change in round 4)."""
    (RUNS / "runs").mkdir(parents=True, exist_ok=True)
    for src in sorted(EARLIER.iterdir()) if EARLIER.is_dir() else ():
        if src.name.split("-")[0] in ("sft", "sft_reflection", "dft", "sft_verdict") and not (RUNS / "runs" / src.name).exists():
            shutil.copytree(src, RUNS / "runs" / src.name, symlinks=True)


def without_eos(run):
    """The mean over rounds of the share of rollouts that end without an end-of-turn token (at the token limit or
    at the budget; TRL's ``completions/clipped_ratio``)."""
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    r = [x["completions/clipped_ratio"] for x in rows if "time/rollout_s" in x and "completions/clipped_ratio" in x]
    return sum(r) / len(r)


def step_validate():
    """GRPO seed 0 from SFT (reflection) seed 0 under the budget: the run the pipeline reuses as rl-s0; measured on
    its own records and its validation questions only."""
    from dsh.experiment.run.steps import reward_curve
    from dsh.measure.trend import fifths_contrast
    from dsh.training.train import train
    d = load_out()
    K = d["budget"]["K"]
    copy_sampling_free_stages()
    run = RUNS / "runs" / "rl-s0"
    t0 = time.time()
    if not (run / "final" / "model.safetensors").is_file():
        cfg = preset(K).train_config("grpo", model=str(RUNS / "runs" / "sft_reflection-s0"), output_dir=str(run),
                                     seed=0, resume=run.is_dir())
        train(cfg)
    c = reward_curve(run)
    t = fifths_contrast([r["reward"] for r in c])
    z = fifths_contrast([r["frac_reward_zero_std"] for r in c])
    val = [json.loads(x) for x in (run / "validation.jsonl").read_text().splitlines() if x.strip()]
    summ = json.loads((run / "summary.json").read_text())
    d["validate"] = {"K": K, "rounds": len(c), "reward_first": t["first"], "reward_last": t["last"],
                     "reward_rise": t["delta"], "reward_rise_ci": t["ci"], "mixed_first_fifth": 1 - z["first"],
                     "mixed_last_fifth": 1 - z["last"], "rounds_without_eos": without_eos(run),
                     "seconds": {k: summ.get(k) for k in ("wall_s", "generation_s", "scoring_s", "update_s")},
                     "this_call_s": round(time.time() - t0),
                     "validation": [{k: r.get(k) for k in ("step", "observed_accuracy", "p_s", "p_d_given_correct",
                                                             "p_d_given_wrong", "truncated", "capped")} for r in val]}
    save_out(d)
    print(json.dumps(d["validate"], indent=1))


def identity(p):
    """The identity the pipeline claims its folders with for a run of preset ``p`` (every stage, the test seed)."""
    from dsh.experiment.run.pipeline import claim_identity
    plan_ = p.plan_stages(None, None)
    return claim_identity(p, plan_, [s.name for s in plan_], p.model)


def claimed(p):
    """The runs folder claimed for the pipeline run of preset ``p`` (its claim record written as the pipeline writes
    it on an empty folder), the folders already in it (the copied stages, rl-s0) kept."""
    from dsh.experiment.run import folders
    runs = RUNS / "runs"
    if (runs / folders.CLAIM).is_file():
        return runs
    aside = RUNS / "aside"
    runs.rename(aside)
    ident = identity(p)
    runs.mkdir()
    folders.claim({"runs_dir": runs}, ident)
    for d in sorted(aside.iterdir()):
        d.rename(runs / d.name)
    aside.rmdir()
    return runs


def results_claimed(p):
    """The results folder claimed for the pipeline run of preset ``p``, holding the committed attribution studies of
    the stages that sample nothing in training (the pipeline reuses one only for weights of the same digest)."""
    from dsh.experiment.run import folders
    results = RUNS / "results"
    if (results / folders.CLAIM).is_file():
        return results
    ident = identity(p)
    results.mkdir(parents=True)
    folders.claim({"results_dir": results}, ident)
    (results / "attribution").mkdir()
    for f in sorted((HERE.parent / "attribution").glob("*.json.gz")):
        if f.name[:-len(".json.gz")].split("-")[0] in ("base", "sft", "sft_reflection", "dft", "sft_verdict"):
            shutil.copy2(f, results / "attribution" / f.name)
    return results


def step_run():
    """The pipeline on the test ladder under round 4's protocol (reuses rl-s0 and the copied stages)."""
    from dsh.experiment.run.pipeline import run_pipeline
    p = preset(load_out()["budget"]["K"])
    copy_sampling_free_stages()
    run_pipeline(p, results_dir=str(results_claimed(p)), runs_dir=str(claimed(p)))


if __name__ == "__main__":
    {"budget": step_budget, "validate": step_validate, "run": step_run}[sys.argv[1]]()
