"""Can fine-tuning alone give the attribution study attempts spanning 5x? (issue 31, written to
wide_ladder_derisk.json beside this file.)

The committed models, fine-tuned on 1x2 ... 1x5, write attempts whose per-level medians span 2.1-2.4x over 1x1 ...
1x8 (chapter 08): asked 1x1 they invent a second digit, asked 1x6 ... 1x8 they copy part of the multiplicand. The
shipped base answers 1x2 ... 1x5 but copies the multiplicand in its checks up to 1x8. This trains SFT (reflection)
from the shipped base with the laptop preset's configuration (seed 0) on 1x1 ... 1x8 in both orders instead of 1x2
... 1x5 (the same number of examples; the test questions left out in both orders, as always), then measures its own
samples on 1x1 ... 1x8 as the attribution study draws them (12 questions a level, 8 samples, temperatures 1 and 2,
one round): the median attempt length a level and its span, the accuracy a level, the samples with a decision.
A design measurement for the next step, not a result of the experiment. Run from the repository root with a
scratch folder:

    python book/results/laptop/design/wide_ladder_derisk.py <scratch_dir> [N]

N (default 8): fine-tune and measure on 1x1 ... 1xN; each N is kept in the JSON under its own key.
"""

import collections
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

from dsh.core.provenance import git_commit
from dsh.experiment.run.attribution_study import METHOD, StudySettings, full_attempt_lengths, sample_groups
from dsh.experiment.run.pipeline import plan
from dsh.llm.attribution import segment_laptop
from dsh.llm.models import load, weights_digest
from dsh.training.train import train

scratch = Path(sys.argv[1])
top = int(sys.argv[2]) if len(sys.argv) > 2 else 8
WIDE = tuple(x for n in range(1, top + 1) for x in ((f"1x{n}",) if n == 1 else (f"1x{n}", f"{n}x1")))
LEVELS = tuple(f"1x{n}" for n in range(1, top + 1))
cfg = plan("laptop", str(scratch / "runs"))["sft_reflection-s0"]
cfg = dataclasses.replace(cfg, train_levels=WIDE, output_dir=str(scratch / f"sft_reflection_wide{top}-s0"))
t0 = time.time()
if not (Path(cfg.output_dir) / "final" / "model.safetensors").is_file():
    train(cfg)
train_s = round(time.time() - t0, 1)
final = Path(cfg.output_dir) / "final"
model, tok = load(str(final))
model.eval()
rows = []
for temperature in (1.0, 2.0):
    s = dataclasses.replace(StudySettings(), levels=LEVELS, temperature=temperature, min_signal=0).checked()
    lengths, right, n, decision = (collections.defaultdict(list), collections.defaultdict(list),
                                   collections.Counter(), collections.Counter())
    for r in sample_groups(model, tok, s):
        n[r["level"]] += 1
        right[r["level"]].append(r["reward"])
        try:
            seg = segment_laptop(tok, r["question"], r["response"], r["stopped"])
        except ValueError:
            continue
        decision[r["level"]] += 1
        lengths[r["level"]].append(sum(seg.attempt_lengths) / len(seg.attempt_lengths))
    med = {lv: statistics.median(x) for lv, x in sorted(lengths.items())}
    rows.append({"temperature": temperature, "median_attempt": med,
                 "span_of_medians": max(med.values()) / min(med.values()),
                 "accuracy": {lv: sum(x) / len(x) for lv, x in sorted(right.items())},
                 "with_decision": dict(decision), "samples": dict(n)})
    print(json.dumps(rows[-1]), flush=True)
full = full_attempt_lengths(tok, LEVELS)
out = Path(__file__).with_suffix(".json")
got = json.loads(out.read_text()) if out.is_file() else {}
got[f"1x1-1x{top}"] = {"train_levels": list(WIDE), "config": "laptop preset, sft_reflection-s0, train_levels replaced",
                       "weights": weights_digest(final), "train_s": train_s, "rows": rows,
                       "whole_copy_lengths": full, "method": METHOD, "commit": git_commit(),
                       "date": time.strftime("%Y-%m-%d %H:%M:%S")}
out.write_text(json.dumps(got, indent=1))
print(f"wrote {out}")
