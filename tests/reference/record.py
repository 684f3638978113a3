"""Record the values that a refactor must not change (seeds -> data, toy tables, CPU training losses).

Run once, before a refactor, with the code as it was:  python tests/reference/record.py
It writes tests/reference/unchanged.json; tests/test_unchanged.py (data, toy) and tests/test_train.py
(losses of the ci runs) compare the code of today against it. Recomputing it after a refactor would defeat
its purpose: it is recorded by the old code and committed. This script is kept as it ran, at the commit named in
unchanged.json (``dsh.data`` was split into problems / traces / records afterwards; a later refactor adapts the
imports and records again before changing anything).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def sha(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def data_values() -> dict:
    from dsh import data
    from dsh.experiment.run import presets
    out = {}
    for seed in (0, 7):
        splits = data.make_splits(n_train=40, n_test=3, seed=seed)
        out[f"splits/seed{seed}"] = {k: [[p.a, p.b] for p in ps] for k, ps in splits.items()}
        configs = {f"{g}/{s}": data.TraceConfig(granularity=g, style=s) for g in data.GRANULARITIES
                   for s in data.STYLES}
        configs["presets.TRACES/reflection"] = data.TraceConfig(style="reflection", **presets.TRACES)
        for name, cfg in configs.items():
            recs = data.sft_records(splits["train"], cfg, seed)
            out[f"sft_records/{name}/seed{seed}"] = {"sha256": sha(recs), "first": recs[0]}
        out[f"prompt_records/seed{seed}"] = sha(data.prompt_records(splits["test"]))
    return out


def toy_values() -> dict:
    from dsh.theory import toy
    inputs = toy.appendix_c_inputs()
    att = toy.trajectory_attribution(**inputs)
    out = {"trajectory_attribution": {"rows": [[r.step, r.action, r.d, r.future, r.q, r.grad_log_pi, r.parameter,
                                                r.contribution] for r in att.rows],
                                      "reward": att.reward, "kl_drag": att.kl_drag, "net": att.net}}
    th, ref = inputs["theta"], inputs["theta_ref"]
    g = toy.expected_gradients(th, ref, 8, 8)
    out["expected_gradients"] = {k: getattr(g, k).tolist() for k in
                                 ("reward", "kl", "kl_score", "kl_direct", "kl_immediate", "kl_loss_k3", "q_sample",
                                  "q_decision")}
    mc = toy.monte_carlo_gradients(th, ref, n=20_000, seed=3)
    out["monte_carlo_gradients"] = {k: [m.tolist(), se.tolist()] for k, (m, se) in mc.items()}
    sw = toy.length_sweep(th, ref, [1, 4, 16, 64])
    out["length_sweep"] = {k: x.tolist() for k, x in sw.items()}
    hist = toy.simulate_grpo(toy.ToyGRPOConfig(steps=30, seed=5))
    out["simulate_grpo"] = {k: np.asarray(x).tolist() for k, x in hist.items()}
    out["q_from_penalties"] = toy.q_from_penalties([0.1, -0.2, 0.3, 0.05], gamma=0.9)
    return out


def training_losses() -> dict:
    from dsh.training import train
    from dsh.experiment.run import presets
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for m in ("sft", "sft_reflection", "dft"):   # the ci runs of tests/test_train.py's fixture
            run = Path(tmp) / m
            train.train(presets.resolve(m, "ci", output_dir=str(run)))
            rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
            out[m] = [[r["step"], r["loss"]] for r in rows if "loss" in r]
    return out


if __name__ == "__main__":
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    values = {"recorded_at_commit": commit, "data": data_values(), "toy": toy_values(),
              "training_losses": training_losses()}
    path = Path(__file__).with_name("unchanged.json")
    path.write_text(json.dumps(values, indent=1) + "\n")
    print(path)
