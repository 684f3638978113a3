"""Design measurements of the attribution study (issue 31), written to attribution_design.json beside this file.

For the committed runs of SFT (reflection) and RL (seed 0): each model's own samples at the evaluation's temperature
(1) and at the GRPO rollouts' (2), 8 and 12 questions a level of the ladder 1x1 ... 1x8, a group of 8 samples a
question: the median attempt length a level (what the length law's span can be) and the samples with a reward signal
(a group whose rewards differ) and those of them with a decision to split (what the surrogate reward's split rests
on, by the split's rules of :data:`dsh.experiment.run.attribution_study.METHOD`; one round of questions each). Run
from the repository root with the
runs folder of the committed results:

    python book/results/laptop/design/attribution_design.py <runs_dir>
"""

import collections
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

from dsh.core.provenance import git_commit
from dsh.experiment.run.attribution_study import METHOD, StudySettings, sample_groups
from dsh.llm.attribution import segment_laptop
from dsh.llm.models import load, weights_digest

runs = Path(sys.argv[1])
rows = []
for name in ("sft_reflection-s0", "rl-s0"):
    model, tok = load(str(runs / name / "final"))
    model.eval()
    for temperature in (1.0, 2.0):
        for per_level in (8, 12):
            s = replace(StudySettings(), prompts_per_level=per_level, temperature=temperature, seed=0,
                        min_signal=0).checked()
            lengths, signal, no_decision = collections.defaultdict(list), collections.Counter(), collections.Counter()
            split = 0
            for r in sample_groups(model, tok, s):
                signal[r["level"]] += r["advantage"] != 0
                try:
                    seg = segment_laptop(tok, r["question"], r["response"], r["stopped"])
                except ValueError:
                    no_decision[r["level"]] += 1
                    continue
                split += r["advantage"] != 0
                lengths[r["level"]].append(sum(seg.attempt_lengths) / len(seg.attempt_lengths))
            med = {lv: statistics.median(x) for lv, x in sorted(lengths.items())}
            rows.append({"model": name, "weights": weights_digest(runs / name / "final"), "temperature": temperature,
                         "prompts_per_level": per_level, "samples": per_level * s.group * len(s.levels),
                         "with_reward_signal": sum(signal.values()), "with_signal_and_decision": split,
                         "without_decision": sum(no_decision.values()),
                         "median_attempt": med, "span_of_medians": max(med.values()) / min(med.values())})
            print(json.dumps(rows[-1]), flush=True)
out = Path(__file__).with_suffix(".json")
out.write_text(json.dumps({"rows": rows, "method": METHOD, "commit": git_commit(),
                           "date": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=1))
