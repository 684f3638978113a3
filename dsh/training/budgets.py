"""Token budgets derived from the traces a preset trains on, never typed.

A budget that is too small cuts examples before their answer (SFT learns to stop mid-sum), clips GRPO
rollouts (a clipped rollout gets reward 0 whatever it would have said) and marks evaluation responses as
wrong that were only unfinished. So every budget of the ``ci`` and ``gpu-small`` presets is computed from
the token-length distribution of the preset's own traces under the embedded model's tokenizer:

- SFT ``max_length`` (prompt + completion, chat template applied as TRL does): the 99th percentile of the
  stage's training traces, over its longest level, plus ``margin`` (below), and at least the longest trace
  drawn, rounded up to 64 tokens;
- GRPO ``max_completion_length``: the same over the reflection traces of the RL stage's training levels
  (the responses a model trained on them writes when it is right);
- evaluation ``max_new_tokens``: the same over reflection traces of the test levels.

``margin`` is the mean length of one more attempt (its arithmetic and its check) at that level: room for
one reflection more than the data holds. :func:`derive` computes everything; ``python -m dsh budgets
--write`` stores the result in ``dsh/training/budgets.json``, which the presets read, and a test recomputes it
and fails when the file is stale or a budget would truncate more than 1 % of fresh traces.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..core import validate as v
from ..core.files import write_text
from ..llm.models import embedded_model_dir
from ..task.problems import draw_problems
from ..task.records import chat_length
from ..task.traces import TraceConfig, make_trace

BUDGETS_FILE = Path(__file__).with_name("budgets.json")
N_PER_LEVEL = 200              # traces per level behind every budget
QUANTILE = 99.0            # percentile of the longest level a budget must hold
ROUND = 64                 # budgets are multiples of this
MAX_TRUNCATION = 0.01      # the largest share of traces a budget may cut (tested on fresh traces)


@dataclass(frozen=True)
class TraceSpec:
    """The traces behind one budget: levels, style and the trace settings of :class:`dsh.task.traces.TraceConfig`."""

    levels: tuple
    style: str                      # no_reflection or reflection
    granularity: str = "digit"
    checks: tuple = ("nines", "elevens")
    retry_fraction: float = 0.5
    max_attempts: int = 3
    chat: bool = True               # count the chat-formatted prompt + completion (SFT) or the completion only

    def trace_config(self) -> TraceConfig:
        return TraceConfig(granularity=self.granularity, style=self.style, retry_fraction=self.retry_fraction,
                           max_attempts=self.max_attempts, checks=tuple(self.checks))


def _count(tok, problem, text: str, chat: bool) -> int:
    if chat:
        return chat_length(tok, [{"role": "user", "content": problem.question}, {"role": "assistant", "content": text}])
    return len(tok(text)["input_ids"]) + 1      # + the end-of-turn token


def trace_lengths(tokenizer, spec: TraceSpec, n_per_level: int = N_PER_LEVEL, seed: int = 0) -> dict[str, np.ndarray]:
    """Token counts of ``n_per_level`` traces per level of ``spec`` (problems and traces drawn from ``seed``)."""
    n_per_level = v.positive_int("n_per_level", n_per_level)
    cfg = spec.trace_config()
    out = {}
    for lv in spec.levels:
        probs = draw_problems(lv, n_per_level, seed=seed + 7_777)
        out[lv] = np.array([_count(tokenizer, p, make_trace(p, cfg, seed=seed + i).text, spec.chat)
                            for i, p in enumerate(probs)])
    return out


def attempt_margin(tokenizer, spec: TraceSpec, level: str, n: int = 50, seed: int = 0) -> int:
    """Mean tokens of one more attempt (arithmetic, "So a * b = N." and its check) at ``level``."""
    if spec.style != "reflection":
        return 0
    one = dataclasses.replace(spec, retry_fraction=0.0)
    cfg = one.trace_config()
    probs = draw_problems(level, n, seed=seed + 31)
    return int(math.ceil(np.mean([len(tokenizer(make_trace(p, cfg, seed=seed).text)["input_ids"]) for p in probs])))


def budget(tokenizer, spec: TraceSpec, n_per_level: int = N_PER_LEVEL, seed: int = 0) -> dict:
    """The budget for ``spec`` and the statistics it came from (per level: mean, p99, max)."""
    lengths = trace_lengths(tokenizer, spec, n_per_level, seed)
    p = {lv: float(np.percentile(x, QUANTILE)) for lv, x in lengths.items()}
    longest = max(p, key=p.get)
    margin = attempt_margin(tokenizer, spec, longest, seed=seed)
    need = max(p[longest] + margin, max(float(x.max()) for x in lengths.values()))
    tokens = int(ROUND * math.ceil(need / ROUND))
    return {"tokens": tokens, "longest_level": longest, "margin": margin, "n_per_level": n_per_level,
            "levels": {lv: {"mean": round(float(x.mean()), 1), "p99": round(p[lv], 1), "max": int(x.max()),
                            "truncated": float(np.mean(x > tokens))} for lv, x in lengths.items()}}


def design_lengths(tokenizer, designs: dict, levels, n_per_level: int = N_PER_LEVEL, seed: int = 0) -> dict:
    """Mean and 99th-percentile token length of completions (no chat template) per level, for each trace design
    (``{name: TraceSpec fields granularity, checks, max_attempts}``) and style (no_reflection, reflection):
    ``{(name, style): {level: (mean, p99)}}``, what chapter 04's trace-design table shows."""
    out = {}
    for name, kw in designs.items():
        for style in ("no_reflection", "reflection"):
            lengths = trace_lengths(tokenizer, TraceSpec(tuple(levels), style, chat=False, **kw), n_per_level, seed)
            out[(name, style)] = {lv: (float(x.mean()), float(np.percentile(x, QUANTILE))) for lv, x in lengths.items()}
    return out


def committed_rows() -> dict:
    """The committed budgets (:func:`load`) as table rows ``{(preset, name): {tokens, longest level, its p99, margin,
    cut (largest over levels)}}``."""
    return {(preset, name): {"tokens": b["tokens"], "longest level": b["longest_level"],
                             "its p99": b["levels"][b["longest_level"]]["p99"], "margin": b["margin"],
                             "cut (largest over levels)": max(x["truncated"] for x in b["levels"].values())}
            for preset, by_name in load().items() for name, b in by_name.items()}


def truncation(tokenizer, spec: TraceSpec, tokens: int, n_per_level: int = N_PER_LEVEL, seed: int = 1) -> float:
    """Share of freshly drawn traces of ``spec`` longer than ``tokens``."""
    lengths = trace_lengths(tokenizer, spec, n_per_level, seed)
    return float(np.mean(np.concatenate(list(lengths.values())) > tokens))


def preset_specs(traces: dict, sft_levels, grpo_levels, eval_levels, base_levels=None) -> dict[str, TraceSpec]:
    """The budgets of a derived preset whose stages all write ``traces`` (:class:`TraceSpec` fields: granularity,
    checks, max_attempts, retry_fraction): ``{budget name: TraceSpec}``. Budget names are ``<method>.max_length``,
    ``grpo.max_completion_length``, ``eval.max_new_tokens`` and, for a base stage trained on other levels
    (``base_levels``: gpu-small's base), ``base.max_length``."""
    t = {k: traces[k] for k in ("granularity", "checks", "max_attempts", "retry_fraction")}
    out = {"sft.max_length": TraceSpec(tuple(sft_levels), "no_reflection", **t),
           "sft_reflection.max_length": TraceSpec(tuple(sft_levels), "reflection", **t),
           "grpo.max_completion_length": TraceSpec(tuple(grpo_levels), "reflection", chat=False, **t),
           "eval.max_new_tokens": TraceSpec(tuple(eval_levels), "reflection", chat=False, **t)}
    out["dft.max_length"] = out["sft_reflection.max_length"]
    if base_levels:
        out["base.max_length"] = TraceSpec(tuple(base_levels), "no_reflection", **t)
    return out


def derive(specs: dict, tokenizer=None, n_per_level: int = N_PER_LEVEL, seed: int = 0) -> dict:
    """Every budget of ``specs`` (``{preset: {budget name: TraceSpec}}``, the presets' ``DERIVED``) recomputed:
    ``{preset: {name: budget dict}}``; ``tokenizer`` defaults to the embedded model's."""
    v.at_most("n_per_level", n_per_level, 100_000, "traces a level: time")
    if tokenizer is None:
        tokenizer = embedded_tokenizer()
    return {preset: {name: budget(tokenizer, spec, n_per_level, seed) for name, spec in by_name.items()}
            for preset, by_name in specs.items()}


def embedded_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(embedded_model_dir()))


@lru_cache(maxsize=1)
def load() -> dict:
    """The committed budgets (``dsh/training/budgets.json``)."""
    if not BUDGETS_FILE.is_file():
        raise ValueError(f"{BUDGETS_FILE} is missing; run python -m dsh budgets --write")
    return json.loads(BUDGETS_FILE.read_text())


def tokens(preset: str, name: str) -> int:
    """The committed budget ``name`` (e.g. ``"sft_reflection.max_length"``) of ``preset``."""
    b = load()
    if preset not in b or name not in b[preset]:
        raise ValueError(f"no derived budget {name!r} for preset {preset!r}; run python -m dsh budgets --write")
    return int(b[preset][name]["tokens"])


def write(specs: dict, path=BUDGETS_FILE, **kw) -> dict:
    """Recompute every budget of ``specs`` (:func:`derive`) and write it to ``path`` (atomically)."""
    out = derive(specs, **kw)
    write_text(path, json.dumps(out, indent=1, sort_keys=True) + "\n")
    load.cache_clear()
    return out
