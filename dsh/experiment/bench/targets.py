"""The sampling targets set against the bounds measured in the same run.

README "Performance on two CPU cores" asks the engine for a multiple of two baselines' tokens/s at 256 rows: dsh at
the reference commit (:data:`dsh.experiment.bench.reference.REFERENCE_PATH`) and CTranslate2 in its own process
(:data:`dsh.experiment.bench.baselines.CT2_PATH`). For every repeat of a ``dsh bench --parts tiny`` run,
:func:`sampling_targets` turns each target into tokens/s (the multiple times the baseline's tokens/s in that repeat)
and sets it against two bounds of the workload the engine sampled in that repeat (:mod:`dsh.llm.roofline`):

- the **serial bound at the step's shapes**: every product at the fastest rate at the decoding step's own shapes
  measured alone (of the libraries and, in runs that measured it, the step's own panel product:
  :func:`dsh.experiment.bench.step_products.library_rates`; runs before it used the libraries' alone, which the panel
  product passes), then every KV-cache byte at the run's read bandwidth, and nothing else (no norms, sampling,
  bookkeeping, no overlap of the two);
- the **roofline**: the larger of the products at the run's large-matmul peak and the cache reads.

A share of a bound above 1 is a target that the step's products and cache reads alone forbid on that machine; the
bound of the engine's float16-cache path is used where it ran (it reads half the bytes, so its bound is the higher).
"""

from __future__ import annotations

import statistics

from ...core import validate as v
from .baselines import CT2_PATH
from .reference import REFERENCE_PATH

TARGETS = ((REFERENCE_PATH, 2.0), (CT2_PATH, 3.0))     # (baseline path, multiple of its tokens/s)
ROWS = 256                                             # the rows the targets are set at
ENGINE = "dsh engine, CPU path"                        # the engine's paths (float32 and float16 caches)


def _bound_tokens_per_s(row: dict) -> tuple[float, float]:
    """A sampling row's tokens/s at its serial bound at the step's shapes and at its roofline."""
    return (row["generated_tokens"] / row["roofline_at_step_shapes"]["serial_s"],
            row["generated_tokens"] / row["roofline"]["roofline_s"])


def sampling_targets(sampling: list, rows: int = ROWS, targets=TARGETS) -> list[dict]:
    """Per repeat and target of ``targets`` (``(baseline path, multiple)``) at ``rows`` rows, from a bench's
    sampling rows (``tiny["sampling"]``, with their rooflines): the target's tokens/s, the engine's best tokens/s in
    that repeat, the bounds' tokens/s (the engine path with the highest serial bound) and the target's and the
    engine's shares of each. A target whose baseline did not run in a repeat gives no row."""
    if not isinstance(sampling, list) or not all(isinstance(r, dict) for r in sampling):
        raise ValueError("sampling must be a bench's sampling rows (a list of dicts: tiny['sampling'])")
    v.positive_int("rows", rows)
    out = []
    for rep in sorted({r["repeat"] for r in sampling if r.get("rows") == rows}):
        same = [r for r in sampling if r.get("rows") == rows and r["repeat"] == rep]
        engine = [r for r in same if r["path"].startswith(ENGINE) and "roofline_at_step_shapes" in r]
        if not engine:
            continue
        best = max(engine, key=lambda r: _bound_tokens_per_s(r)[0])
        serial, roof = _bound_tokens_per_s(best)
        fastest = max(r["tokens_per_s"] for r in engine)
        for base, multiple in targets:
            found = [r for r in same if r["path"].startswith(base)]
            if not found:
                continue
            target = multiple * found[0]["tokens_per_s"]
            out.append({"repeat": rep, "rows": rows, "baseline": base, "multiple": multiple,
                        "baseline_tokens_per_s": found[0]["tokens_per_s"], "target_tokens_per_s": target,
                        "engine_tokens_per_s": fastest, "bound_path": best["path"],
                        "serial_bound_tokens_per_s": serial, "roofline_tokens_per_s": roof,
                        "target_share_of_serial_bound": target / serial, "target_share_of_roofline": target / roof,
                        "engine_share_of_target": fastest / target})
    return out


def target_rows(sampling: list, rows: int = ROWS) -> list[dict]:
    """:func:`sampling_targets` as rows of the bench's table: per target, the medians over the repeats of the
    target's tokens/s, its share of the serial bound at the step's shapes and the engine's share of the target;
    ``over_bound``: in how many repeats the target passed that bound."""
    by = {}
    for r in sampling_targets(sampling, rows):
        by.setdefault((r["baseline"], r["multiple"]), []).append(r)
    out = []
    for (base, multiple), rs in by.items():
        def med(k, rs=rs):
            return statistics.median(r[k] for r in rs)
        out.append({"part": "tiny targets", "path": f"{multiple:g}x {base}, {rows} rows",
                    "measure": f"target tokens/s (median of {len(rs)}; share of the serial bound at the step's shapes)",
                    "value": med("target_tokens_per_s"), "ratio to default": med("engine_share_of_target"),
                    "share of ceiling": med("target_share_of_serial_bound"),
                    "over_bound": sum(r["target_share_of_serial_bound"] > 1 for r in rs)})
    return out
