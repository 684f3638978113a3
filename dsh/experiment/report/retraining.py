"""A committed stage trained again: which commits give its committed weights (a results folder's
``design/reproduction.json``), and the retrained model's calibration beside the committed stage's and the other
seeds' (accuracy and the paper's p_s, p_dC, p_dW per level, :mod:`dsh.measure.calibration`'s estimates)."""

from __future__ import annotations

import pandas as pd

from ...measure.claims import block
from .regime import READ_AGAIN  # the four rates: the tables' names -> the calibration's keys


def _levels(cal: dict, name: str) -> dict:
    try:
        return block(cal)["by_level"]
    except (KeyError, TypeError):
        raise ValueError(f"{name} must be a calibration record (its 'all' holding 'by_level'); got keys "
                         f"{sorted(cal) if isinstance(cal, dict) else type(cal).__name__}") from None


def _interval(row: dict, key: str) -> tuple[float, float]:
    """The 95 % interval of the rate ``key`` in a level's estimates: accuracy's two ends, the others' pair."""
    return (row["ci_low"], row["ci_high"]) if key == "observed_accuracy" else tuple(row[f"{key}_ci"])


def retrained_table(committed: dict, retrained: dict, others: dict | None = None) -> pd.DataFrame:
    """One row per level and quantity: the committed stage's value and 95 % interval, the retrained model's, whether
    the retrained value lies inside the committed interval, and each of ``others`` ({name: calibration}, e.g. the
    other seeds of the stage). Calibrations as the pipeline writes them (``calibration/<stage>.json``); the levels
    are the committed one's, which the retrained one must hold."""
    com, ret = _levels(committed, "committed"), _levels(retrained, "retrained")
    oth = {n: _levels(c, n) for n, c in (others or {}).items()}
    missing = [lv for lv in com if lv not in ret or any(lv not in o for o in oth.values())]
    if missing:
        raise ValueError(f"every calibration must hold the committed levels {list(com)}; missing {missing}")
    rows = []
    for lv in com:
        for q, key in READ_AGAIN.items():
            lo, hi = _interval(com[lv], key)
            rlo, rhi = _interval(ret[lv], key)
            value = ret[lv][key]
            rows.append({"level": lv, "quantity": q, "committed": com[lv][key], "committed low": lo,
                         "committed high": hi, "retrained": value, "retrained low": rlo, "retrained high": rhi,
                         "inside committed interval": bool(lo <= value <= hi),
                         **{n: o[lv][key] for n, o in oth.items()}})
    return pd.DataFrame(rows).set_index(["level", "quantity"])


def mean_abs_difference(a: dict, b: dict) -> float:
    """Mean of |a - b| over the levels of ``a`` (which ``b`` must hold) and the four quantities of
    :data:`dsh.experiment.report.regime.READ_AGAIN`: how far two calibrations lie apart, one number."""
    la, lb = _levels(a, "a"), _levels(b, "b")
    if any(lv not in lb for lv in la):
        raise ValueError(f"b must hold a's levels {list(la)}; it holds {list(lb)}")
    d = [abs(la[lv][key] - lb[lv][key]) for lv in la for key in READ_AGAIN.values()]
    return sum(d) / len(d)


def commit_checks(record: dict, training: dict) -> pd.DataFrame:
    """``record['runs']`` (a reproduction record: each run a stage trained again at a commit) as a table in commit
    order, each run's committed digest checked against ``training`` (the results folder's summary, its
    ``training``) and its ``identical`` against the two digests: a record that disagrees with either raises."""
    rows = []
    for r in record["runs"]:
        want = training.get(r["stage"], {}).get("final_weights")
        if r["committed_weights"] != want:
            raise ValueError(f"run of {r['stage']} at {r['commit'][:7]}: its committed digest "
                             f"{r['committed_weights']} is not the summary's {want}")
        if r["identical"] != (r["weights"] == want):
            raise ValueError(f"run of {r['stage']} at {r['commit'][:7]}: identical={r['identical']} disagrees with "
                             f"its digests")
        rows.append({"commit": r["commit"][:7], "commit date": r["commit_date"],
                     "commits after 3fb2018": r["commits_after_3fb2018"], "stage": r["stage"],
                     "final weights (sha256, first 12)": r["weights"].removeprefix("sha256:")[:12],
                     "the committed weights": r["identical"],
                     "subject": r["subject"][:48]})   # pandas cuts a cell over 50 characters
    return pd.DataFrame(rows).sort_values(["commits after 3fb2018", "stage"], kind="stable").reset_index(drop=True)
