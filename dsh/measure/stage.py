"""What a results folder holds for one stage's generations (``calibration/<stage>.json``): calibration with and
without the truncated responses, decision faithfulness, the truncated share, and the unfitted predictions."""

from __future__ import annotations

import copy

from ..task.parse import DEFAULT_MARKERS
from ..task.records import by_question
from . import tasks
from .calibration import calibrate, record_list
from .predictions import unfitted_predictions


def calibrate_stage(records, seed: int = 0, n_bootstrap: int = 100, task: str = "traces") -> dict:
    """What ``calibration/<stage>.json`` holds for one stage's generations: calibration over all records and
    without the truncated ones (None when every record is truncated), responses read as ``task`` reads them
    (:meth:`dsh.measure.tasks.Task.parse`), decision faithfulness as it measures it, the share of
    truncated records, and the predictions the fit did not use (:func:`dsh.measure.predictions.unfitted_predictions`),
    with questions alike and with questions that may differ (``unfitted_mixture``). Records are read in question order
    (:func:`dsh.task.records.by_question`): the bootstrap's draws do not depend on the order they were written in."""
    t = tasks.get(task)
    records = by_question(record_list(records))     # the order of the questions, not of their completion
    parse = parsed_once(t.parse)
    full = calibrate(records, n_bootstrap=n_bootstrap, seed=seed, parse=parse)
    truncated = [r["truncated"] for r in records]
    if all(truncated):
        dropped = None
    elif any(truncated):
        dropped = calibrate(records, drop_truncated=True, n_bootstrap=n_bootstrap, seed=seed, parse=parse)
    else:       # nothing to drop: the same records, the same draws, the same result
        dropped = copy.deepcopy(full)
    return {"all": full, "drop_truncated": dropped,
            "faithfulness": t.faithfulness(records), "task": task,
            "truncated": float(sum(truncated) / len(records)) if records else None,
            "unfitted": unfitted_predictions(records, parse=parse) if records else None,
            "unfitted_mixture": unfitted_predictions(records, mixture=True, parse=parse) if records else None}


def parsed_once(parse):
    """``parse`` (a task's reading, ``parse(text, a, b, markers)``) remembering what it returned for each argument
    list: the calibrations, per-level fits and predictions of one stage read each response once. A reading is a
    pure function of its arguments, so the result is the same."""
    seen = {}

    def once(text, a=None, b=None, markers=DEFAULT_MARKERS):
        try:
            key = (text, a, b, markers)
            hash(key)
        except TypeError:                # an unhashable argument: read it afresh
            return parse(text, a, b, markers)
        if key not in seen:
            seen[key] = parse(text, a, b, markers)
        return seen[key]

    return once


def preferred(stage: dict) -> dict:
    """The calibration block the book reports for a stage (a ``calibration/<stage>.json``): without the truncated
    responses when there is one (a response cut at the token limit has no decision to read), else over all."""
    return stage.get("drop_truncated") or stage["all"]
