"""Gradient attribution along the laptop experiment's GRPO runs (issue 31, item 3), written to
``book/results/laptop/dynamics/``.

The pipeline's GRPO runs keep no checkpoints. This script trains the seed-0 GRPO arms again (RL at the paper's
beta 0.001 and the KL ablation's beta 0 and 0.1, each from the committed SFT (reflection) model of seed 0) with the
pipeline's own configuration, a checkpoint kept at every validation step (80, 160, 240; the final model is step 320),
and checks that each final model is the committed one, byte for byte (sha256 of the weights): the checkpoints lie on
the committed run's path. At each checkpoint the attribution study (:mod:`dsh.experiment.run.attribution_study`, 6
questions a level) measures the split of every term against the run's reference, and the run's own validation log
gives p_s, p_dC, p_dW at the same steps. Run from the repository root with the runs folder of the committed results
and a scratch folder (the re-trained runs stay there, and a later run of the script studies their checkpoints
again without training while their final models are the committed ones):

    python book/results/laptop/design/grpo_dynamics.py <runs_dir> <scratch_dir> [arm ...]
"""

import dataclasses
import json
import sys
import time
from pathlib import Path

from dsh.core.files import write_json_gz
from dsh.core.provenance import git_commit
from dsh.experiment.run.attribution_study import StudySettings, run_study
from dsh.experiment.run.pipeline import plan
from dsh.llm.models import weights_digest
from dsh.training.train import train

runs, scratch = Path(sys.argv[1]), Path(sys.argv[2])
arms = sys.argv[3:] or ["rl-s0", "rl_beta0.1-s0", "rl_beta0-s0"]
out = Path(__file__).resolve().parent.parent / "dynamics"
out.mkdir(exist_ok=True)
settings = StudySettings(prompts_per_level=6, min_signal=0)   # one round: the design of the dynamics
cfgs = plan("laptop", str(runs))
done_studies = {}
for arm in arms:
    cfg = cfgs[arm]
    every = cfg.validation_every
    run = scratch / arm
    cfg = dataclasses.replace(cfg, output_dir=str(run), keep_checkpoints=True, save_steps=every, save_total_limit=None)
    t0 = time.time()
    done = run / "final" / "model.safetensors"
    if done.is_file() and weights_digest(run / "final") == weights_digest(runs / arm / "final"):
        train_s = json.loads((run / "train_s.json").read_text())     # kept from an earlier run of this script
    else:
        train(cfg)
        train_s = time.time() - t0
        (run / "train_s.json").write_text(json.dumps(train_s))
    final, committed = weights_digest(run / "final"), weights_digest(runs / arm / "final")
    if final != committed:
        raise SystemExit(f"{arm}: the re-trained final model ({final[:16]}) is not the committed one ({committed[:16]})")
    reference = Path(cfg.model)
    points = [(int(p.name.split("-")[1]), p) for p in run.glob("checkpoint-*")]
    points = [(0, reference)] + sorted([(s, p) for s, p in points if s < cfg.max_steps]) + [(cfg.max_steps, run / "final")]
    validation = [json.loads(x) for x in (runs / arm / "validation.jsonl").read_text().splitlines() if x.strip()]
    again = [json.loads(x) for x in (run / "validation.jsonl").read_text().splitlines() if x.strip()]
    if again != validation:
        raise SystemExit(f"{arm}: the re-trained run's validation log differs from the committed run's")
    for step, folder in points:
        target = out / f"{arm}-step{step}.json.gz"
        key = (str(folder), str(reference))      # step 0 is the same model and reference in every arm: studied once
        if key not in done_studies:
            done_studies[key] = run_study(str(folder), str(reference), target, settings,
                                          roots={runs: "<runs_dir>", scratch: "<scratch>"})
        study = dict(done_studies[key])
        study.update(arm=arm, step=step, validation=next((v for v in validation if v["step"] == step), None),
                     final_is_committed=True, train_s=round(train_s, 1))
        write_json_gz(target, study)
        print(f"{arm} step {step}: {len(study['trajectories'])} trajectories in {study['wall_s']} s", flush=True)
print(json.dumps({"commit": git_commit(), "date": time.strftime("%Y-%m-%d %H:%M:%S")}))
