"""Record every resolved preset, TrainConfig, evaluation setting, pipeline plan and laptop job configuration.

Ran once at commit 4434ce3 (the flat layout, before the modules moved into layers; its imports were then
``from dsh import presets, pipeline, laptop_pipeline`` and ``presets.paper_mapping``) to write
``tests/reference/presets.json``; ``tests/test_unchanged.py`` compares the code of today against that file.
Later the layout retired ``laptop_pipeline`` (the laptop jobs are now the laptop preset's seeded plan,
``Preset.plan_stages``): the same keys are dumped from the new API; ``laptop/jobs`` from the plan's stages in the
old job shape (the base's seed 0, ``init`` None for a stage that starts from the base).
``python tests/reference/record_presets.py OUT.json`` writes a fresh dump.
"""

from __future__ import annotations

import dataclasses
import json
import sys

from dsh.experiment.report.paper_mapping import paper_mapping
from dsh.experiment.run import pipeline, presets


def _j(x):
    return json.loads(json.dumps(dataclasses.asdict(x) if dataclasses.is_dataclass(x) else x, default=str,
                                 sort_keys=True))


def dump() -> dict:
    out = {}
    for name in presets.NAMES:
        p = presets.get(name)
        for m in ("sft", "sft_reflection", "dft", "grpo"):
            out[f"resolve/{name}/{m}"] = _j(presets.resolve(m, name))
            out[f"resolve/{name}/{m}/ov"] = _j(presets.resolve(m, name, seed=3, output_dir="x"))
        out[f"eval/{name}"] = _j(p.eval_settings())
        out[f"traces/{name}"] = {k: _j(t) for k, t in p.traces.items()}
        out[f"meta/{name}"] = [p.about, p.runs_dir, p.results_dir, p.one_call]
        if p.seeds is None:       # the laptop preset's plan is dumped below, as its jobs
            out[f"stages/{name}"] = [{k: x for k, x in _j(s).items() if k not in ("seed", "kind")} for s in p.stages]
            out[f"plan/{name}"] = {k: _j(c) for k, c in pipeline.plan(name, "runs/x").items()}
            out[f"plan/{name}/starts"] = {k: _j(c) for k, c in pipeline.plan(
                name, "runs/y", model="m", overrides={"seed": 2}, starts={"sft": "s0"}).items()}
            out[f"needed/{name}"] = pipeline.stages_needed(p.plan_stages(), ["rl"])
    stages = presets.LAPTOP.plan_stages(seeds=(0, 1, 2), ablation_seeds=(0,))
    out["laptop/jobs"] = [{"name": s.name, "stage": s.kind, "method": s.method, "seed": s.seed or 0,
                           "init": None if s.init == "base" else s.init, "overrides": _j(s.overrides)} for s in stages]
    out["laptop/configs"] = {k: _j(c) for k, c in pipeline.plan("laptop", "runs/laptop", "BASE").items()}
    out["mapping"] = paper_mapping()
    out["derived"] = {k: {n: _j(t) for n, t in v.items()} for k, v in presets.DERIVED.items()}
    return _j(out)


if __name__ == "__main__":
    with open(sys.argv[1], "w") as f:
        json.dump(dump(), f, indent=1, sort_keys=True, default=str)
