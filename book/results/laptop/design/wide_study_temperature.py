"""The laptop-wide study's temperature (issue 31), written to wide_study_temperature.json beside this file.

At temperature 1 the laptop-wide studies of SFT and DFT leave the reward and KL terms fewer than 200 trajectories
whose decision carries a gradient (a one-attempt model is certain of its STOP), and at the rollouts' temperature 2
the attempts' span falls below 5x. The rule, fixed before this measurement (2026-11-26): the study samples at the
highest temperature of 1, 1.25, 1.5 and 1.75 at which each of the four stages whose attempts span 5x at temperature 1
(SFT, SFT (reflection), DFT, RL at beta 0.1) still spans 5x (the per-level median attempt length over 1x1 ... 1x10,
largest over smallest) in a first round of the study's own sampling (12 questions a level, 8 samples each, the
study's seed). Measured per stage and temperature: that span, the trajectories the split takes (with a decision),
those with a reward signal, and those whose decision tokens all have probability 1 in float32 (a STOP the model is
certain of). Run from the repository root with the laptop-wide runs folder:

    python book/results/laptop/design/wide_study_temperature.py <runs_dir>
"""

import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from dsh.core.provenance import git_commit
from dsh.experiment.run import attribution_fits as af
from dsh.experiment.run import attribution_study as st
from dsh.experiment.run.presets import get
from dsh.llm.attribution import _token_logps
from dsh.llm.models import load, weights_digest

runs = Path(sys.argv[1])
STAGES = ("sft-s0", "sft_reflection-s0", "dft-s0", "rl_beta0.1-s0")
TEMPERATURES = (1.0, 1.25, 1.5, 1.75)
settings = dataclasses.replace(get("laptop-wide").attribution, temperature=1.0, seed=0)
out = {"rule": __doc__.split("The rule, ")[1].split(" Measured")[0].replace("\n", " "), "stages": {},
       "settings": dataclasses.asdict(settings), "commit": git_commit()}
for stage in STAGES:
    folder = runs / stage / "final"
    model, tok = load(str(folder))
    model.eval()
    out["stages"][stage] = {"weights": weights_digest(folder), "temperatures": {}}
    for temp in TEMPERATURES:
        t0 = time.time()
        samples = st.sample_groups(model, tok, dataclasses.replace(settings, temperature=temp), 0)
        lengths, decision, signal, certain = {}, 0, 0, 0
        for s in samples:
            seg, _ = st._segment(tok, s)
            if seg is None:
                continue
            decision += 1
            signal += s["advantage"] != 0
            lengths.setdefault(s["level"], []).append(float(np.mean(seg.attempt_lengths)))
            with torch.no_grad():
                lp = _token_logps(model, seg.input_ids, temp)
            certain += bool((lp[seg.decision_mask] == 0).all())
        medians = {lv: float(np.median(x)) for lv, x in lengths.items()}
        row = {"span": max(medians.values()) / min(medians.values()), "medians": medians, "samples": len(samples),
               "decision": decision, "signal": signal, "certain": certain,
               "reward": float(np.mean([s["reward"] for s in samples])), "seconds": round(time.time() - t0, 1)}
        out["stages"][stage]["temperatures"][str(temp)] = row
        print(stage, temp, {k: round(v, 2) if isinstance(v, float) else v for k, v in row.items() if k != "medians"},
              flush=True)
spans = {t: min(out["stages"][s]["temperatures"][str(t)]["span"] for s in STAGES) for t in TEMPERATURES}
out["chosen"] = max(t for t in TEMPERATURES if spans[t] >= af.MIN_SPAN)
out["date"] = time.strftime("%Y-%m-%d %H:%M:%S")
Path(__file__).with_suffix(".json").write_text(json.dumps(out, indent=1) + "\n")
print("chosen temperature", out["chosen"])
