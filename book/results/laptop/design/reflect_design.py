"""Issue 30, item 3: reflection SFT that teaches the decision, not the errors. Run from the project root:

    .venv/bin/python book/results/laptop/design/reflect_design.py NAME BASE METHOD [key=value ...]

trains METHOD (sft or sft_reflection) from BASE with the laptop preset's settings and the given overrides
(``task_options.loss=no_wrong_attempts``, ``max_steps=800``, ...; values parsed as JSON where they parse), then
samples validation questions (seed 7, the test questions left out in both orders; not the test ladder) at the
preset's evaluation settings and appends one JSON line to logs/reflect_NAME.jsonl: first-attempt and final
accuracy, the share at the token limit, and decision faithfulness (verdict vs the true check of the model's own
candidate: agreement, chance agreement, Cohen's kappa) on the fine-tuning levels and beyond.
"""

import json
import sys
import time
from pathlib import Path

from dsh.experiment.run import presets
from dsh.llm.complete import complete
from dsh.llm.models import load
from dsh.task import laptop_task as lt
from dsh.training.train import train

LOGS = Path(__file__).parent / "logs"
TUNED = ("1x2", "1x3", "1x4", "1x5")
VALIDATION_SEED = 7


def parse_value(x):
    try:
        return json.loads(x)
    except json.JSONDecodeError:
        return x


def validation_questions(n_per_level=100):
    held = lt.held_out(both_orders=True)
    return [p for p in lt.test_questions(n_per_level=n_per_level, seed=VALIDATION_SEED) if (p.a, p.b) not in held]


def measure(model_dir, n_per_level=100):
    model, tok = load(model_dir)
    ev = presets.LAPTOP.eval_settings()
    qs = validation_questions(n_per_level)
    outs = complete(model, tok, [p.question for p in qs], ev.max_new_tokens, ev.temperature, VALIDATION_SEED,
                    rows=256)
    recs = [{"question": p.question, "response": c.text, "level": p.level, "truncated": not c.stopped}
            for p, c in zip(qs, outs)]
    out = {}
    for group, levels in (("tuned", TUNED), ("beyond", tuple(x for x in lt.TEST_LEVELS if x not in TUNED))):
        rs = [(p, r) for p, r in zip(qs, recs) if p.level in levels]
        first = [lt.read_response(r["response"]).candidates[:1] == [p.answer] for p, r in rs]
        final = [lt.read_response(r["response"]).final_answer == p.answer for p, r in rs]
        f = lt.faithfulness([r for _, r in rs]).get("overall") or {}
        out[group] = {"n": len(rs), "first_attempt_accuracy": sum(first) / len(rs),
                      "final_accuracy": sum(final) / len(rs),
                      "truncated": sum(r["truncated"] for _, r in rs) / len(rs),
                      "mean_candidates": sum(len(lt.read_response(r["response"]).candidates) for _, r in rs) / len(rs),
                      **{k: f.get(k) for k in ("checks", "verdict_follows_check", "chance_agreement", "kappa",
                                               "kappa_ci", "check_exact")}}
    return out, recs


def main(name, base, method, *kv):
    overrides = {}
    for item in kv:
        k, x = item.split("=", 1)
        if "." in k:
            top, sub = k.split(".", 1)
            overrides.setdefault(top, {})[sub] = parse_value(x)
        else:
            overrides[k] = parse_value(x)
    run = Path(f"/tmp/p/reflect-{name}")
    cfg = presets.LAPTOP.train_config(method, model=base, output_dir=str(run), seed=0, **overrides)
    t0 = time.time()
    summary = train(cfg) if not (run / "final").is_dir() else json.loads((run / "summary.json").read_text())
    t_train = time.time() - t0
    m, recs = measure(run / "final")
    row = {"name": name, "base": base, "method": method, "overrides": overrides, "train_s": round(t_train, 1),
           "steps": summary["global_step"], "last_loss": summary["last_loss"], **m}
    with (LOGS / f"reflect_{name}.jsonl").open("a") as f:
        f.write(json.dumps(row) + "\n")
    with (LOGS / f"reflect_{name}.samples.txt").open("w") as f:
        for r in recs[::25]:
            f.write(f"### {r['question']} ({r['level']}, truncated={r['truncated']})\n{r['response']}\n\n")
    print(json.dumps(row, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:])
