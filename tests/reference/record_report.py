"""Record the report's tables and the first page's rows over the committed results, which a refactor must not change.

Run once, before a refactor, with the code as it was (from a checkout of that commit, or with PYTHONPATH naming one):
    python tests/reference/record_report.py [OUT]       (default: tests/reference/report.json)
tests/test_unchanged.py recomputes the same tables with the code of today (:func:`tables`) and compares them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "book" / "results"


def _frame(df) -> list:
    """A table as JSON rows (index kept), floats as JSON writes them."""
    return json.loads(df.reset_index().to_json(orient="records", double_precision=12))


def tables(seed: int = 0) -> dict:
    """The first page's rows (as chapter 00 computes them) and the report's main tables of the laptop and the graded
    results, as JSON values."""
    from dsh.experiment import report
    from dsh.experiment.report import findings
    from dsh.experiment.run import pipeline

    lap = pipeline.load_results(RESULTS / "laptop")
    graded = pipeline.load_results(RESULTS / "laptop-graded")
    lap_studies = report.load_attribution(RESULTS / "laptop")
    graded_studies = report.load_attribution(RESULTS / "laptop-graded")
    wide = report.load_attribution(RESULTS / "laptop-wide")
    rows = {"theory": findings.theory_findings(seed), "empirical": findings.empirical_findings(lap),
            "beyond": findings.beyond_findings(lap, lap_studies, wide),
            "graded": findings.empirical_findings(graded, "graded", "laptop-graded")
            + findings.beyond_findings(graded, graded_studies, anchor="laptop-graded")}
    out = {"first_page": json.loads(json.dumps(rows, default=str))}
    for name, res, studies in (("laptop", lap, lap_studies), ("laptop-graded", graded, graded_studies)):
        verdicts = [v for s in report.seeds_of(res) for v in report.claims(res, seed=s)]
        out[name] = {"table1": _frame(report.table1(res)), "claims_by_seed": _frame(report.claims_by_seed(res)),
                     "per_level": _frame(report.per_level_table(verdicts)),
                     "stratified": _frame(report.stratified_table(res)), "probe": _frame(report.probe_table(res)),
                     "truncation": _frame(report.truncation_table(res)), "kl": _frame(report.kl_table(res)),
                     "faithfulness": _frame(report.faithfulness_table(res)),
                     "attribution_baseline": _frame(report.baseline_table(studies))}
    return out


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("report.json")
    import subprocess

    import dsh

    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(dsh.__file__).parents[1], capture_output=True,
                            text=True).stdout.strip()
    out.write_text(json.dumps({"commit": commit, "tables": tables()}, indent=1, sort_keys=True) + "\n")
    print(f"{out}: recorded at {commit}")
