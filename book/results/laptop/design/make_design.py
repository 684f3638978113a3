"""Builds design.json, the laptop experiment's design table, from the measurement logs in logs/ (each log names
the script and settings that produced it; the scripts are in logs/ as they were run). Run from the repository
root: python book/results/laptop/design/make_design.py"""

import json
import re
from pathlib import Path

HERE = Path(__file__).parent
LOGS = HERE / "logs"


def jline(path, prefix):
    """The JSON object on the first line of ``path`` that starts with ``prefix``."""
    for line in (LOGS / path).read_text().splitlines():
        if line.startswith(prefix):
            return json.loads(line[len(prefix):].split(" eval s")[0].split(" wall ")[0].replace("'", '"'))
    raise ValueError(f"{prefix!r} not in {path}")


def verdicts(path, block=0):
    """Per-level 'verdict right' of the block-th run of m3.py in a log."""
    rows = re.findall(r"^(1x\d) verdict right ([\d.]+) exact ([\d.]+)$", (LOGS / path).read_text(), re.M)
    rows = rows[7 * block:7 * block + 7]
    return {lv: float(v) for lv, v, _ in rows}


def acc(d):
    return " / ".join(f"{d[lv]:.2f}" for lv in sorted(d))


def rng(d):
    xs = list(d.values())
    return f"{min(xs):.2f}-{max(xs):.2f}"


rows = []
d1 = jline("d1_batch8192.log", "T 1.0 ")
d1t = jline("d1_batch8192.log", "train ")
d2t = jline("d2_compare_check_batch2048.log", "train ")
d2 = jline("d2_compare_check_batch2048.log", "T 1.0 ")
rows.append({"question": "base: optimizer steps at a fixed token budget (3M tokens)",
             "tried": "8,192 tokens a step (368 steps) vs 2,048 (1,490 steps)",
             "measured": f"loss {d1t['final_loss_ema']:.3f} vs {d2t['final_loss_ema']:.3f}; accuracy 1x2..1x8 at T=1: "
                         f"{acc(d1['accuracy'])} vs {acc(d2['accuracy'])}",
             "chosen": "2,048 tokens a step"})
v_compare = verdicts("d2_compare_check_verdicts.log")
v_sub0, v_sub1 = verdicts("d3_subtract_check.log", 0), verdicts("d3_subtract_check.log", 1)
rows.append({"question": "check format: does the base compute its verdict?",
             "tried": "two residues compared 20 tokens apart ('1=3') vs the candidate's digits subtracted from the "
                      "product's residue one at a time, verdict on the last digit ('7!=0')",
             "measured": f"verdict right on given claims (T=0, 40 a level): {rng(v_compare)} (chance 0.5) vs "
                         f"{rng(v_sub0)} (T=1: {rng(v_sub1)})",
             "chosen": "the subtraction chain (dsh.task.laptop_task.check_text)"})
nll_single = re.findall(r"(\d+)-(\d+) ([\d.]+)", (LOGS / "d4_unpacked_base_reflection_sft.log").read_text().split(
    "by position")[1])
nll_packed = re.findall(r"(\d+)-(\d+) ([\d.]+)", (LOGS / "d5_packed_fixed768.log").read_text().split("by position")[1])
rows.append({"question": "base rows: can the base work late in a long reflection trace?",
             "tried": "one example a row (~30-110 tokens) vs examples packed into rows of up to 768 tokens",
             "measured": "base's loss on reflection traces by position (nats/token): "
                         + ", ".join(f"{a}-{b}: {x}" for a, b, x in nll_single) + " vs "
                         + ", ".join(f"{a}-{b}: {x}" for a, b, x in nll_packed)
                         + "; reflection SFT from the unpacked base: 1x2 accuracy 0.93 -> 0.00",
             "chosen": "packed rows, each row's length drawn from 1..768 tokens"})
d6 = jline("d6_packed_random_8M.log", "")["temperature 1.0"]["accuracy"] if False else json.loads(
    (LOGS / "d6_packed_random_8M.log").read_text().splitlines()[2])["temperature 1.0"]["accuracy"]
d7 = json.loads((LOGS / "d7_shipped_base_provenance.json").read_text())
rows.append({"question": "base: how long to train (the paper's base decays from 74 % on 3x3 to 1 % on 3x9)",
             "tried": "8M tokens, no stopping vs the stopping rule (dsh.training.laptop_base.stop_rule) checked every 250 steps",
             "measured": f"8M tokens: {acc(d6)} (no decay) vs stopped at step {d7['stopped_early']['step']} "
                         f"({d7['stopped_early']['tokens'] / 1e6:.2f}M tokens): "
                         f"{acc(d7['report']['temperature 1.0']['accuracy'])}",
             "chosen": "the stopping rule: the shipped base"})
slips = (LOGS / "d8_sft_injected_slips.log").read_text()
own = (LOGS / "d9_sft_own_attempts.log").read_text()
a_slip = json.loads(re.search(r"## sr2.*?\naccuracy (\{.*?\})", slips, re.S).group(1))
rows.append({"question": "reflection SFT data: whose first attempts?",
             "tried": "the generator's injected slips in half the traces vs the base's own sampled attempts",
             "measured": f"accuracy after SFT (1x4/1x5 data, lr 3e-4): {acc(a_slip)} (injected; the first attempt's "
                         f"answer often lost in 'The product is N.') vs "
                         + re.search(r"accuracy by level: (\{.*?\})", own).group(1) + " (own attempts, own words, "
                         "dsh.training.pretrain's loop)",
             "chosen": "the base's own attempts, stated as 'The answer is N.' with the base's check question"})
d10 = (LOGS / "d10_sft_levels_1x2_1x5.log").read_text()
a10 = {m.group(1): float(m.group(2)) for m in re.finditer(r"^(1x\d) \{'observed_accuracy': ([\d.]+)", d10, re.M)}
f10 = re.search(r"^overall (\{.*\})$", d10, re.M).group(1)
rows.append({"question": "reflection SFT: which levels, what batch",
             "tried": "1x4/1x5 data (TRL batch 32, 125 steps) vs 1x2 ... 1x5 in both orders (batch 8, 500 steps)",
             "measured": f"1x4/1x5 only: the levels not trained on fell to 0-2 % (rows above); 1x2 ... 1x5: accuracy "
                         f"{acc(a10)}; decision faithfulness {f10}",
             "chosen": "1x2 ... 1x5 in both operand orders, batch 8, lr 3e-4 cosine, one epoch of 4,000 traces"})
g = [line.split() for line in (LOGS / "d11_grpo_64_completions.log").read_text().splitlines()[1:]]
rows.append({"question": "GRPO: rollouts per step within the hour's budget",
             "tried": "8 prompts x 8 completions a step (64) vs 4 x 8 (32)",
             "measured": f"64 a step: {len(g)} steps in 110 s (~12 s a step, rollouts clipped at 640 tokens "
                         f"{min(float(x[5]) for x in g):.0%}-{max(float(x[5]) for x in g):.0%}), zero-variance groups "
                         f"{float(g[0][2]):.2f} at step 1, mean reward {float(g[0][1]):.2f} -> {float(g[-1][1]):.2f}",
             "chosen": "32 completions a step, 30 steps, lr 5e-5 constant (7 GRPO runs must fit the hour with the "
                       "rest); the pipeline's reward curves show what it gave"})


# ---- issue 30: a base with its skills learned, reflection SFT that learns no error -----------------------------
def jsonl(name):
    return [json.loads(x) for x in (LOGS / name).read_text().splitlines() if x.strip()]


def pct(d, levels=None):
    return " / ".join(f"{100 * d[lv]:.0f}" for lv in (levels or sorted(d)))


speeds = [json.loads(x) for x in (LOGS / "base_speed.log").read_text().splitlines() if x.startswith("{")]
b1 = jsonl("base_s128x4_16M.jsonl")
b1_final = b1[-1]["validation_T1"]
reached = next(e for e in b1 if "accuracy" in e and min(e["check_exact"].values()) >= 0.98
               and min(e["accuracy"][lv] for lv in ("1x2", "1x3", "1x4", "1x5")) >= 0.98)
rows.append({"question": "base (issue 30): what it answers, what it checks, how long it trains",
             "tried": "answers on every ladder level (longer rarer), stopped early by a rule (the previous base, d7) vs "
                      "answers on 1x2 ... 1x5 and checks on 1x2 ... 1x8 (both orders, test questions out in both), "
                      "trained to its 16M-token budget (base_s128x4_16M)",
             "measured": f"previous base, test T=1: accuracy {pct(d7['report']['temperature 1.0']['accuracy'])} %, check "
                         f"exact {pct(d7['report']['temperature 1.0']['check_exact'])} %; new design, validation T=1 "
                         f"(~100 a level): accuracy {pct(b1_final['accuracy'])} %, check exact "
                         f"{pct(b1_final['check_exact'])} %, copies {pct(b1_final['check_copies'])} % (every skill "
                         f">= 98 % on 1x2 ... 1x5 from step {reached['step']}, 50 a level)",
             "chosen": "answers 1x2 ... 1x5, checks at every length, the whole budget (the shipped base)"})
rows.append({"question": "base (issue 30): model size",
             "tried": ", ".join(f"{s['params'] / 1e6:.2f}M" for s in speeds) + " parameters (40 training steps each)",
             "measured": "tokens/s alone: " + ", ".join(f"{s['tokens_per_s']:,}" for s in speeds)
                         + f"; the {speeds[0]['params'] / 1e6:.2f}M model learned every skill to >= 98 % on validation",
             "chosen": f"{speeds[0]['params'] / 1e6:.2f}M (larger models not trained: the small one met every target)"})
refl = {r["name"]: r for name in ("r0_sft", "r1_injected_masked", "r2_injected_all") for r in jsonl(f"reflect_{name}.jsonl")}


def refl_cell(r):
    t, b = r["tuned"], r["beyond"]
    kappa = f", kappa {t['kappa']:.2f} (chance {t['chance_agreement']:.2f})" if t["kappa"] is not None else ""
    exact = (f", check lines exact {t['check_exact']:.2f} (beyond 1x5: {b['check_exact']:.2f})"
             if t["check_exact"] is not None else "")
    return (f"first attempt {t['first_attempt_accuracy']:.3f}, final {t['final_accuracy']:.3f}, at the token limit "
            f"{t['truncated']:.3f}{kappa}{exact}")


rows.append({"question": "reflection SFT (issue 30): learn the wrong attempts or not (from the base_s128x4_16M design)",
             "tried": "injected slips in half the traces, loss on every token (r2) vs no loss on the wrong attempts "
                      "(r1), next to SFT without reflection (r0); validation questions of 1x2 ... 1x5, T=1",
             "measured": "; ".join(f"{k[:2]}: {refl_cell(r)}" for k, r in refl.items()),
             "chosen": "no loss on the wrong attempts (first-attempt accuracy kept); the check question miscopies the "
                       "question (at 1x2 already, and always beyond 1x5: the base had copied long numbers only in its "
                       "own attempts), so the base now restates every claim it checks"})
base2 = json.loads((HERE.parent.parent.parent.parent / "dsh" / "assets" / "laptop-base" / "dsh_provenance.json")
                   .read_text())
r2 = base2["report"]["temperature 1.0"]
rows.append({"question": "base (issue 30): can a reflective model write its own check question beyond 1x5?",
             "tried": "the base above vs the same base whose check examples first restate the claim ('Check a * b = "
                      "c.', copying numbers of every ladder length), i.e. the shipped base",
             "measured": f"shipped base, test T=1 (100 a level): accuracy {pct(r2['accuracy'])} %, check exact "
                         f"{pct(r2['check_exact'])} %, copies {pct(r2['check_copies'])} %; after reflection SFT (rows "
                         "below) its check lines beyond 1x5 are still rarely exact",
             "chosen": "the restating base (shipped), trained by python -m dsh base at commit "
                       f"{base2['provenance']['commit'][:7]}"})
refl2 = {r["name"]: r for name in ("r4_base2_sft", "r3_base2_injected_masked", "r5_base2_injected_masked_miscopies")
         for r in jsonl(f"reflect_{name}.jsonl")}
rows.append({"question": "reflection SFT (issue 30) on the shipped base: which wrong attempts",
             "tried": "SFT without reflection (r4) vs reflection SFT with injected arithmetic slips, not learned (r3) vs "
                      "half of the slips replaced by miscopies of the multiplicand, not learned (r5); seed 0, "
                      "validation questions of 1x2 ... 1x5, T=1 (own attempts not tried: the base is right on ~100 % "
                      "of them, so its traces would hold no retry)",
             "measured": "; ".join(f"{k[:2]}: {refl_cell(r)}" for k, r in refl2.items())
                         + ". Beyond 1x5 the check question copies a five-digit number (the attempt's truncated "
                           "multiplicand or a cut question): the check then passes the wrong answer",
             "chosen": "r5 (the laptop preset's reflection settings); its kappa on 1x2 ... 1x5 rests on the few wrong "
                       "candidates there. Open: checks beyond 1x5 (a reflective model copies no number longer than "
                       "those it was fine-tuned on)"})
probes = {n: jsonl(f"grpo_probe_{n}.jsonl")[-1] for n in ("tuned", "edge1x6")}
rows.append({"question": "GRPO (issue 30): is there a signal after the chosen reflection SFT (r5)?",
             "tried": "one rollout round of the preset's GRPO (256 completions, 8 a prompt) on 1x2 ... 1x5 prompts vs "
                      "on 1x6 prompts",
             "measured": "; ".join(f"{n}: mean reward {p['steps'][0]['reward']:.2f}, groups whose rewards all agree "
                                   f"{p['steps'][0]['frac_reward_zero_std']:.2f}, clipped "
                                   f"{p['steps'][0]['completions/clipped_ratio']:.2f}" for n, p in probes.items()),
             "chosen": "none yet: every group agrees (all right on the fine-tuning levels, all wrong at 1x6), so GRPO has "
                       "no gradient; the next design needs prompts at the edge of competence"})
r6 = jsonl("reflect_r6_levels_to_1x6.jsonl")[-1]
p6 = jsonl("grpo_probe_r6_edge1x6.jsonl")[-1]["steps"][0]
rows.append({"question": "an edge of competence (issue 30, a lead, not chosen yet): fine-tune on 1x6 too",
             "tried": "r5's reflection SFT with 1x6 and 6x1 added to the fine-tuning levels (4,000 traces over 10 "
                      "levels), then one GRPO round on 1x6 prompts",
             "measured": f"1x2 ... 1x5: {refl_cell(r6)}; 1x6 ... 1x8 together: first attempt "
                         f"{r6['beyond']['first_attempt_accuracy']:.2f}, final {r6['beyond']['final_accuracy']:.2f}, at "
                         f"the token limit {r6['beyond']['truncated']:.2f}, kappa {r6['beyond']['kappa']:.2f} (chance "
                         f"{r6['beyond']['chance_agreement']:.2f}); GRPO at 1x6: mean reward {p6['reward']:.2f}, groups "
                         f"whose rewards all agree {p6['frac_reward_zero_std']:.2f}, clipped "
                         f"{p6['completions/clipped_ratio']:.2f}",
             "chosen": "not chosen: GRPO gets a signal at 1x6, but first attempts on 1x2 ... 1x5 fall, responses loop "
                       "past the token limit and 1x6 would no longer lie beyond the fine-tuning data; the rollouts' "
                       "temperature (next rows) gives a signal without these costs"})
temps = {n: jsonl(f"grpo_probe_{n}.jsonl")[-1] for n in ("tuned", "t125_tuned", "t15_tuned", "t2_tuned")}
rows.append({"question": "GRPO (issue 30): a signal from the rollouts' temperature instead (r5, fine-tuning prompts)",
             "tried": "one rollout round (256 completions) on 1x2 ... 1x5 prompts at temperature 1, 1.25, 1.5, 2",
             "measured": "; ".join(f"T={p['overrides'].get('temperature', 1.0):g}: mean reward "
                                   f"{p['steps'][0]['reward']:.2f}, groups whose rewards all agree "
                                   f"{p['steps'][0]['frac_reward_zero_std']:.2f}" for p in temps.values()),
             "chosen": "temperatures 1.5 and 2 into the sweep (T <= 1.25 leaves >= 94 % of the groups without a signal)"})
sweep = {n: jsonl(f"grpo_probe_sweep_{n}.jsonl")[-1] for n in ("T1.5_lr5e-05", "T1.5_lr0.0002", "T2.0_lr5e-05",
                                                               "T2.0_lr0.0002")}


def sweep_cell(p):
    r = [s["reward"] for s in p["steps"]]
    return (f"T={p['overrides']['temperature']:g}, lr {p['overrides']['learning_rate']:g}: reward {r[0]:.2f} -> "
            f"last two rounds {sum(r[-2:]) / 2:.2f} (first two {sum(r[:2]) / 2:.2f}, difference "
            f"{sum(r[-2:]) / 2 - sum(r[:2]) / 2:+.3f}), mean length {p['steps'][0]['completions/mean_length']:.0f} -> "
            f"{p['steps'][-1]['completions/mean_length']:.0f} tokens, {p['wall_s']:.0f} s")


rows.append({"question": "GRPO (issue 30): temperature and learning rate, chosen before the test ladder was looked at",
             "tried": "10 rollout rounds (2,560 rollouts, 80 steps) from r5 on 1x2 ... 1x5 prompts, seed 0, each of "
                      "T in {1.5, 2} x learning rate in {5e-5, 2e-4}; rule fixed before the runs: the largest rise of "
                      "the mean reward (last two rounds minus first two)",
             "measured": "; ".join(sweep_cell(p) for p in sweep.values()),
             "chosen": "T=2, learning rate 2e-4 (the laptop preset's GRPO); at T=1.5 the larger rate made the reward "
                       "fall, the smaller left it flat"})
long = jsonl("grpo_probe_long_T2_lr2e-4.jsonl")[-1]
from dsh.measure.trend import fifths_contrast  # noqa: E402

t = fifths_contrast([s["reward"] for s in long["steps"]])
val = long["validation"]


def val_cell(r):
    return (f"step {r['step']}: accuracy {r['observed_accuracy']:.2f}, p_s {r['p_s']:.2f} "
            f"[{r['p_s_ci'][0]:.2f}, {r['p_s_ci'][1]:.2f}], p_dC {r['p_d_given_correct']:.2f} "
            f"[{r['p_d_given_correct_ci'][0]:.2f}, {r['p_d_given_correct_ci'][1]:.2f}], p_dW "
            f"{r['p_d_given_wrong']:.2f} [{r['p_d_given_wrong_ci'][0]:.2f}, {r['p_d_given_wrong_ci'][1]:.2f}]")


rows.append({"question": "GRPO (issue 30): does the chosen setting learn over >= 10,000 rollouts?",
             "tried": f"the chosen setting for {long['rollouts']:,} rollouts (320 steps, 40 rounds), seed 0, p_s, p_dC, "
                      "p_dW measured every 80 steps on 200 validation questions of the fine-tuning levels at T=2",
             "measured": f"mean reward, first vs last fifth of the rounds: {t['first']:.3f} -> {t['last']:.3f} "
                         f"(difference {t['delta']:+.3f}, 95 % interval {t['ci'][0]:+.3f} to {t['ci'][1]:+.3f}); "
                         f"mean length {long['steps'][0]['completions/mean_length']:.0f} -> "
                         f"{long['steps'][-1]['completions/mean_length']:.0f} tokens; {long['wall_s']:.0f} s; "
                         + "; ".join(val_cell(r) for r in (val[0], val[-1])),
             "chosen": "the laptop preset's RL: 320 steps, validation every 80 steps. The reward rises, and the run "
                       "shows what the reward buys at T=2: p_s and p_dC rise, p_dW falls (the decision stops resampling)"})
(HERE / "design.json").write_text(json.dumps(rows, indent=1) + "\n")
print(json.dumps(rows, indent=1))
