"""Design measurements of the graded laptop experiment (RULE.md beside this file), on validation questions only.

Run from the repository root with the project's venv, one step at a time (each resumable; results merged into
graded_design.json beside this file):
    python book/results/laptop-graded/design/graded_design.py sft     # bases and SFT (reflection) candidates
    python book/results/laptop-graded/design/graded_design.py round2  # round 2 of RULE.md
    python book/results/laptop-graded/design/graded_design.py grpo E L # GRPO candidates from candidate (E, L)
Runs go to runs/graded-design/ (not committed)."""
import json
import random
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS = Path("runs/graded-design")
OUT = HERE / "graded_design.json"
SLIPS = (0.15, 0.25)
FT = {"A": ("1x2", "2x1", "1x3", "3x1", "1x4", "4x1", "1x5", "5x1"),
      "B": ("1x2", "2x1", "1x4", "4x1", "1x6", "6x1", "1x8", "8x1")}
LADDER = ("1x2", "1x3", "1x4", "1x5", "1x6", "1x7", "1x8")
GRPO_LR = (3e-5, 1e-4)


def load_out():
    return json.loads(OUT.read_text()) if OUT.is_file() else {}


def save_out(d):
    OUT.write_text(json.dumps(d, indent=1, sort_keys=True) + "\n")


def sh(*args):
    print("$", " ".join(map(str, args)), flush=True)
    subprocess.run([sys.executable, "-m", "dsh", *map(str, args)], check=True)


def base(eps):
    out = RUNS / f"base-{eps}"
    if not (out / "model.safetensors").is_file():
        sh("base", "--spec", "graded", "--slip-rate", eps, "--no-report", "--quiet", "--out", out)
    return out


def validation_problems(n=100):
    from dsh.measure import tasks
    return tasks.get("laptop_task").validation_questions(LADDER, n)


def base_accuracy(model_dir):
    from dsh.llm.complete import complete
    from dsh.llm.models import load
    from dsh.task import laptop_task as lt
    model, tok = load(str(model_dir))
    qs = validation_problems()
    outs = complete(model, tok, [p.question for p in qs], 160, 1.0, 0, rows=256)
    acc = {}
    for p, c in zip(qs, outs):
        acc.setdefault(p.level, []).append(lt.read_response(c.text).final_answer == p.answer)
    return {lv: sum(x) / len(x) for lv, x in acc.items()}


def sft(eps, ft, base_dir):
    from dsh.experiment.run import presets
    from dsh.training.train import train
    run = RUNS / f"sft_reflection-{eps}-{ft}"
    if not (run / "final" / "model.safetensors").is_file():
        cfg = presets.resolve("sft_reflection", "laptop", model=str(base_dir), output_dir=str(run), seed=0,
                              train_levels=FT[ft],
                              task_options={**presets.LAPTOP_REFLECTION, "replay": "base_corpus"})
        train(cfg)
    return run / "final"


def measure_sft(model_dir, ft, max_new_tokens=768):
    from dsh.experiment.run.check_probe import ProbeSettings, summarize
    from dsh.llm.complete import complete
    from dsh.llm.models import load
    from dsh.measure import tasks
    from dsh.measure.calibration import calibrate
    from dsh.task import laptop_task as lt
    model, tok = load(str(model_dir))
    qs = validation_problems()
    outs = complete(model, tok, [p.question for p in qs], max_new_tokens, 1.0, 0, rows=256)
    recs = [{"question": p.question, "answer": str(p.answer), "response": c.text, "level": p.level,
             "truncated": not c.stopped} for p, c in zip(qs, outs)]
    cal = calibrate(recs, parse=tasks.get("laptop_task").parse, n_bootstrap=0)["by_level"]
    levels = {}
    for lv in LADDER:
        c = cal[lv]
        mine = [r for r in recs if r["level"] == lv]
        levels[lv] = {"p_s": c["p_s"], "accuracy": c["observed_accuracy"], "p_dC": c["p_d_given_correct"],
                      "p_dW": c["p_d_given_wrong"], "truncated": sum(r["truncated"] for r in mine) / len(mine),
                      "wrong_first": c.get("n_wrong_candidates")}
    # the check probe on validation questions (50 a level, a right and a wrong attempt each)
    ps = ProbeSettings(n_per_level=50)
    pq = [p for lv in LADDER for p in [q for q in qs if q.level == lv][:50]]
    items = lt.probe_items(pq, ps.seed, ps.miscopy_fraction)
    pouts = complete(model, tok, [x["problem"].question for x in items], ps.max_new_tokens, 1.0, ps.seed,
                     rows=256, prefixes=[x["prefix"] for x in items])
    precs = [{"question": x["problem"].question, "level": x["problem"].level, "candidate": x["candidate"],
              "correct": x["correct"], "prefix": x["prefix"], "continuation": c.text,
              "response": x["prefix"] + c.text, "truncated": not c.stopped} for x, c in zip(items, pouts)]
    probe = summarize(precs, [lv for lv in LADDER if lv in FT[ft]])["by_level"]
    for lv in LADDER:
        b = probe[lv]
        levels[lv]["probe_agreement"] = b.get("verdict_follows_check")
        levels[lv]["probe_kappa"] = b.get("kappa")
        levels[lv]["probe_checks"] = b.get("checks")
    # a few raw responses a level, to read
    raw = {lv: [r["response"][:400] for r in recs if r["level"] == lv][:3] for lv in LADDER}
    return levels, sum(r["truncated"] for r in recs) / len(recs), raw


def judge(entry, ft):
    lv = entry["levels"]
    graded = [x for x in LADDER if lv[x]["p_s"] is not None and 0.2 <= lv[x]["p_s"] <= 0.8]
    outside = [x for x in graded if x not in FT[ft]]
    ft_ladder = [x for x in LADDER if x in FT[ft]]
    mixed = sum(1 - lv[x]["accuracy"] ** 8 - (1 - lv[x]["accuracy"]) ** 8 for x in ft_ladder) / len(ft_ladder)
    probe_ok = all((lv[x]["probe_agreement"] or 0) >= 0.9 and (lv[x]["probe_kappa"] or 0) >= 0.8 for x in graded)
    pts = {"a_base_5pct": min(entry["base_accuracy"].values()) >= 0.05,
           "b_graded": len(graded) >= 4 and len(outside) >= 2,
           "c_probe": bool(graded) and probe_ok,
           "d_truncated": entry["truncated"] <= 0.05,
           "e_mixed": mixed >= 0.5}
    return {"graded": graded, "graded_outside": outside, "expected_mixed_groups": mixed, "points": pts,
            "qualifies": all(pts.values())}


def run_sft():
    d = load_out()
    d.setdefault("sft_candidates", {})
    for eps in SLIPS:
        b = base(eps)
        key_b = f"base-{eps}"
        if key_b not in d.setdefault("bases", {}):
            prov = json.loads((b / "dsh_provenance.json").read_text())
            d["bases"][key_b] = {"accuracy": base_accuracy(b), "train": prov["train"],
                                 "skill_curve": prov["skill_curve"]}
            save_out(d)
        for ft in FT:
            key = f"{eps}-{ft}"
            if key in d["sft_candidates"]:
                continue
            t0 = time.time()
            m = sft(eps, ft, b)
            t1 = time.time()
            levels, trunc, raw = measure_sft(m, ft)
            entry = {"slip_rate": eps, "ft": ft, "ft_levels": FT[ft], "levels": levels, "truncated": trunc,
                     "base_accuracy": d["bases"][key_b]["accuracy"], "train_s": round(t1 - t0),
                     "measure_s": round(time.time() - t1), "raw": raw}
            entry["judged"] = judge(entry, ft)
            d["sft_candidates"][key] = entry
            save_out(d)
            print(key, json.dumps(entry["judged"]), flush=True)
    # the rule (RULE.md)
    cands = list(d["sft_candidates"].values())
    key = lambda e: (e["judged"]["qualifies"], sum(e["judged"]["points"].values()),  # noqa: E731
                     len(e["judged"]["graded_outside"]), -e["slip_rate"], e["ft"] == "A")
    best = max(cands, key=key)
    d["sft_choice"] = {"slip_rate": best["slip_rate"], "ft": best["ft"], "qualifies": best["judged"]["qualifies"],
                       "unmet": [k for k, x in best["judged"]["points"].items() if not x]}
    save_out(d)
    print("choice", d["sft_choice"], flush=True)


def run_round2():
    """RULE.md, round 2: the round-1 candidates that missed only (d), measured again with 1,024 new tokens."""
    d = load_out()
    d.setdefault("round2", {})
    for key, e in d["sft_candidates"].items():
        missed = [k for k, x in e["judged"]["points"].items() if not x]
        if missed != ["d_truncated"] or key in d["round2"]:
            continue
        levels, trunc, raw = measure_sft(RUNS / f"sft_reflection-{key}" / "final", e["ft"], max_new_tokens=1024)
        entry = {**e, "levels": levels, "truncated": trunc, "raw": raw, "max_new_tokens": 1024}
        entry["judged"] = judge(entry, e["ft"])
        d["round2"][key] = entry
        save_out(d)
        print("round 2", key, json.dumps(entry["judged"]), flush=True)
    ok = [e for e in d["round2"].values() if e["judged"]["qualifies"]]
    if ok:
        best = max(ok, key=lambda e: (len(e["judged"]["graded_outside"]), -e["slip_rate"], e["ft"] == "A"))
        d["sft_choice"] = {"slip_rate": best["slip_rate"], "ft": best["ft"], "qualifies": True, "unmet": [],
                           "round": 2, "max_new_tokens": 1024}
    else:
        d["sft_choice"] = {**d["sft_choice"], "round": 1}
    save_out(d)
    print("choice", d["sft_choice"], flush=True)


def run_grpo(eps, ft):
    from dsh.experiment.run import presets
    from dsh.experiment.run.steps import reward_curve
    from dsh.measure.trend import fifths_contrast
    from dsh.training.train import train
    d = load_out()
    d.setdefault("grpo_candidates", {})
    init = RUNS / f"sft_reflection-{eps}-{ft}"
    for lr in GRPO_LR:
        key = f"{eps}-{ft}-lr{lr:g}"
        if key in d["grpo_candidates"]:
            continue
        run = RUNS / f"grpo-{key}"
        t0 = time.time()
        if not (run / "final" / "model.safetensors").is_file():
            limit = d["sft_choice"].get("max_new_tokens")       # round 2: GRPO's limit raised with the evaluation's
            cfg = presets.resolve("grpo", "laptop", model=str(init), output_dir=str(run), seed=0,
                                  train_levels=FT[ft], temperature=1.0, learning_rate=lr,
                                  **({"max_completion_length": limit} if limit else {}))
            train(cfg)
        c = reward_curve(run)
        t = fifths_contrast([r["reward"] for r in c])
        z = fifths_contrast([r["frac_reward_zero_std"] for r in c])
        val = [json.loads(x) for x in (run / "validation.jsonl").read_text().splitlines() if x.strip()]
        e = {"lr": lr, "rounds": len(c), "reward_first": t["first"], "reward_last": t["last"],
             "reward_rise": t["delta"], "reward_rise_ci": t["ci"], "mixed_first_fifth": 1 - z["first"],
             "mixed_last_fifth": 1 - z["last"], "seconds": round(time.time() - t0),
             "validation": [{k: r.get(k) for k in ("step", "observed_accuracy", "p_s", "p_d_given_correct",
                                                     "p_d_given_wrong", "truncated")} for r in val]}
        e["qualifies"] = e["mixed_first_fifth"] >= 0.5 and e["reward_rise_ci"][0] > 0
        d["grpo_candidates"][key] = e
        save_out(d)
        print(key, {k: e[k] for k in ("reward_rise", "reward_rise_ci", "mixed_first_fifth", "qualifies")}, flush=True)
    cands = [d["grpo_candidates"][f"{eps}-{ft}-lr{lr:g}"] for lr in GRPO_LR]
    best = max(cands, key=lambda e: (e["qualifies"], e["reward_rise"]))
    d["grpo_choice"] = {"lr": best["lr"], "qualifies": best["qualifies"]}
    save_out(d)
    print("choice", d["grpo_choice"], flush=True)


if __name__ == "__main__":
    random.seed(0)
    if sys.argv[1] == "sft":
        run_sft()
    elif sys.argv[1] == "round2":
        run_round2()
    else:
        run_grpo(float(sys.argv[2]), sys.argv[3])
