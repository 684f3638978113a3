"""Calibration of the two-stage model (paper, Section 4.2 "A Simple Calibration of the Model").

From responses to known questions: ``p_s`` = first-candidate accuracy, ``p_dC`` = P(STOP | candidate
correct) and ``p_dW`` = P(RESAMPLE | candidate wrong) over all candidates, the predicted accuracy of
the two-stage formula, the observed accuracy with the paper's normal-approximation 95% interval and a
Wilson interval, a bootstrap interval for the predicted accuracy (the paper: 100 resamples of the test
set, 2.5th and 97.5th percentiles), and the transitions between consecutive candidates
(F->T, T->F, T->T, F->F; Kang et al. 2025).

Several responses to one question (an evaluation with ``samples_per_question`` > 1) are not independent draws: a
hard question is hard for each of them. The bootstrap then resamples questions with all their responses (a cluster
bootstrap), and the observed accuracy's intervals and p(F->T)'s use the cluster-robust standard error of a ratio
of sums, sqrt(sum_q (y_q - p m_q)^2) / sum_q m_q over questions q (y_q the question's successes, m_q its trials);
``design_effects`` records that error's square over the binomial one for the accuracy, p_s and p(F->T), and
``questions`` the number of questions. With one response a question none of this enters: the draws, intervals and
fields are those of independent responses.

A response with no candidate counts as wrong in the observed accuracy and is reported in ``no_answer``;
it carries no attempt, so it does not enter p_s, p_dC or p_dW.

Under an attempt budget K (records with ``"attempt_budget": K``, as :class:`dsh.experiment.run.evaluate.EvalSettings`
writes them) a response holds at most K attempts and its last answer is final: the predicted accuracy is then the
process cut after K candidates (:func:`dsh.theory.two_stage.accuracy_within`), the block records ``attempt_budget``,
and a record with ``"capped": true`` (ended right after its K-th reflection marker) has its last attempt's decision
read as the RESAMPLE that marker states (the budget, not the model, kept the next attempt from following).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core import validate as v
from ..core.agreement import Z95  # noqa: F401 - the one 95 % normal quantile; re-exported for claims and predictions
from ..core.files import read_jsonl
from ..task.parse import DEFAULT_MARKERS, operands, parse_response, truth_value
from ..theory.two_stage import accuracy


@dataclass(frozen=True)
class ResponseStats:
    """Per-response counts used by the estimators (arrays over responses)."""

    correct: np.ndarray       # final answer correct
    has_answer: np.ndarray    # at least one candidate
    first_correct: np.ndarray
    n_correct: np.ndarray     # correct candidates
    stop_correct: np.ndarray  # STOP after a correct candidate
    n_wrong: np.ndarray
    resample_wrong: np.ndarray
    transitions: np.ndarray   # (n, 4): F->T, T->F, T->T, F->F
    levels: np.ndarray
    questions: np.ndarray     # the question each response answers (level and question text)
    budgets: np.ndarray       # the attempt budget each response ran under (0: none)


def response_stats(records, markers=DEFAULT_MARKERS, parse=parse_response) -> ResponseStats:
    """Parse every record ({"question", "answer", "response"[, "level"]}) once, with ``parse`` (a task's reading:
    ``parse(text, a, b, markers)`` -> :class:`dsh.task.parse.ParsedResponse`)."""
    rows = []
    for r in record_list(records):
        a, b = operands(r["question"])
        truth = truth_value(r["answer"])
        parsed = parse(r["response"], a, b, markers)
        c = [x == truth for x in parsed.candidates]
        d = list(parsed.decisions)
        if r.get("capped") is True and d:
            d[-1] = "RESAMPLE"
        tr = [0, 0, 0, 0]
        for x, y in zip(c, c[1:]):
            tr[{(False, True): 0, (True, False): 1, (True, True): 2, (False, False): 3}[(x, y)]] += 1
        rows.append((bool(c) and c[-1], bool(c), bool(c) and c[0], sum(c),
                     sum(1 for x, y in zip(c, d) if x and y == "STOP"), sum(1 for x in c if not x),
                     sum(1 for x, y in zip(c, d) if not x and y == "RESAMPLE"), tr, _level_of(r, a, b),
                     f"{_level_of(r, a, b)}|{r['question']}", r.get("attempt_budget") or 0))
    cols = list(zip(*rows)) if rows else [[]] * 11
    f = lambda i, dt: np.asarray(cols[i], dtype=dt)  # noqa: E731
    return ResponseStats(f(0, bool), f(1, bool), f(2, bool), f(3, int), f(4, int), f(5, int), f(6, int),
                         np.asarray(cols[7], dtype=int).reshape(-1, 4), np.asarray(cols[8], dtype=object),
                         np.asarray(cols[9], dtype=object), f(10, int))


def _level_of(r: dict, a, b) -> str:
    """The record's level, or "mxn" from the question's operands, or "unknown"."""
    if isinstance(r.get("level"), str):
        return r["level"]
    if a is not None and b is not None:
        return f"{len(str(abs(a)))}x{len(str(abs(b)))}"
    return "unknown"


def _ratio(num, den):
    return float(num / den) if den > 0 else float("nan")


def _estimates(s: ResponseStats, idx=None):
    if idx is not None:
        pick = lambda x: x[idx]  # noqa: E731
    else:
        pick = lambda x: x  # noqa: E731
    has = pick(s.has_answer)
    p_s = _ratio(pick(s.first_correct).sum(), has.sum())
    p_dC = _ratio(pick(s.stop_correct).sum(), pick(s.n_correct).sum())
    p_dW = _ratio(pick(s.resample_wrong).sum(), pick(s.n_wrong).sum())
    return p_s, p_dC, p_dW


def budget_of(s: ResponseStats) -> int | None:
    """The attempt budget the responses ran under (None: none); a one-line ValueError when they differ."""
    kinds = set(s.budgets.tolist())
    if len(kinds) > 1:
        raise ValueError(f"records must share one attempt budget (or none); got {sorted(kinds)} (0: none)")
    return (kinds.pop() or None) if kinds else None


def _predict(p_s, p_dC, p_dW, budget=None):
    """The two-stage formula (cut after ``budget`` candidates when given); an undefined p_dC (no correct candidate)
    or p_dW (no wrong one) does not enter when its branch has probability 0."""
    if math.isnan(p_s):
        return float("nan")
    if math.isnan(p_dC):
        p_dC = 0.0 if p_s == 0 else float("nan")
    if math.isnan(p_dW):
        p_dW = 0.0 if p_s == 1 else float("nan")
    if math.isnan(p_dC) or math.isnan(p_dW):
        return float("nan")
    return accuracy(p_s, p_dC, p_dW, budget)


def normal_interval(k: int, n: int, z: float = Z95, effective: float | None = None) -> tuple[float, float]:
    """The paper's interval: p +- z sqrt(p(1-p)/n), not clipped to [0, 1] (the paper prints (-1.0, 3.0));
    ``effective``: the number of independent trials in place of n when the trials are clustered (as in
    :func:`wilson_interval`)."""
    if n <= 0:
        return float("nan"), float("nan")
    p = k / n
    h = z * math.sqrt(p * (1 - p) / (n if effective is None or not effective > 0 else effective))
    return p - h, p + h


def wilson_interval(k: int, n: int, z: float = Z95, effective: float | None = None) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion k / n; ``effective``: the number of independent trials that
    carry the same information (n over a design effect, :func:`design_effect`) when the trials are clustered."""
    if n <= 0:
        return float("nan"), float("nan")
    p = k / n
    n = n if effective is None or not effective > 0 else effective
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return mid - h, mid + h


def clustered_se(successes, trials, clusters) -> float:
    """The cluster-robust standard error of the ratio sum(successes) / sum(trials) (arrays over responses; clusters:
    each response's question): sqrt(sum_q (y_q - p m_q)^2) / sum m over the clusters' sums y_q, m_q (the
    linearised ratio estimator). With one response a cluster and one trial each it is sqrt(p (1 - p) / n); nan
    without trials."""
    y, m = np.asarray(successes, dtype=float), np.asarray(trials, dtype=float)
    total = m.sum()
    if total <= 0:
        return float("nan")
    p = y.sum() / total
    clusters = np.asarray(clusters)
    _, inv = np.unique(clusters if clusters.dtype.kind in "iu" else clusters.astype(str), return_inverse=True)
    resid = np.bincount(inv, weights=y - p * m)
    return float(math.sqrt((resid ** 2).sum()) / total)


def design_effect(successes, trials, clusters) -> float:
    """:func:`clustered_se` squared over the binomial p (1 - p) / sum(trials): 1 for independent trials, more where
    a cluster's trials succeed or fail together; 1 where p is 0 or 1 (both errors 0), nan without trials."""
    m = np.asarray(trials, dtype=float)
    total = m.sum()
    if total <= 0:
        return float("nan")
    p = float(np.asarray(successes, dtype=float).sum() / total)
    binomial = p * (1 - p) / total
    return 1.0 if binomial == 0 else clustered_se(successes, trials, clusters) ** 2 / binomial


def _cluster_members(inv) -> list:
    """The responses of each cluster (``inv``: each response's cluster number, 0 .. C - 1), in response order."""
    order = np.argsort(inv, kind="stable")
    return np.split(order, np.cumsum(np.bincount(inv))[:-1])


def _cluster_draw(members: list | None, rng, n: int):
    """Indices of one cluster-bootstrap resample: as many clusters as there are, drawn with replacement, each with
    all its responses (``members``: the responses of each cluster); plain response draws of ``n`` responses where
    every cluster holds one response (``members`` None)."""
    if members is None:
        return rng.integers(0, n, n)
    return np.concatenate([members[j] for j in rng.integers(0, len(members), len(members))])


def _nan_to_none(x):
    if isinstance(x, float) and math.isnan(x):
        return None
    return x


def _percentiles(x):
    x = np.asarray([y for y in x if not math.isnan(y)])
    if len(x) == 0:
        return float("nan"), float("nan")
    return float(np.percentile(x, 2.5)), float(np.percentile(x, 97.5))


def summarize(s: ResponseStats, n_bootstrap: int = 100, seed: int = 0) -> dict:
    """The calibration summary of one group of responses (see the module docstring)."""
    if not isinstance(s, ResponseStats):
        raise ValueError(f"s must be the ResponseStats of response_stats(), got {type(s).__name__}")
    n = len(s.correct)
    k = int(s.correct.sum())
    p_s, p_dC, p_dW = _estimates(s)
    budget = budget_of(s)
    pred = _predict(p_s, p_dC, p_dW, budget)
    _, inv = np.unique(s.questions.astype(str), return_inverse=True) if n else (None, np.zeros(0, dtype=int))
    clustered = n > 0 and int(inv.max()) + 1 < n
    members = _cluster_members(inv) if clustered else None
    t = s.transitions.sum(0) if n else np.zeros(4, dtype=int)
    from_f, from_t = int(t[0] + t[3]), int(t[1] + t[2])
    if clustered:          # the clusters by number (inv), not by text: clustered_se groups them once more
        deff = {"accuracy": design_effect(s.correct, np.ones(n), inv),
                "p_s": design_effect(s.first_correct[s.has_answer], np.ones(int(s.has_answer.sum())),
                                     inv[s.has_answer]),
                "p(F->T)": design_effect(s.transitions[:, 0], s.transitions[:, 0] + s.transitions[:, 3], inv)}
        lo, hi = normal_interval(k, n, effective=n / deff["accuracy"])
        wlo, whi = wilson_interval(k, n, effective=n / deff["accuracy"])
        ft_ci = list(wilson_interval(int(t[0]), from_f, effective=from_f / deff["p(F->T)"])) if from_f else None
    else:
        lo, hi = normal_interval(k, n)
        wlo, whi = wilson_interval(k, n)
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(n_bootstrap):
        idx = _cluster_draw(members, rng, n)
        e = _estimates(s, idx)
        boots.append((*e, _predict(*e, budget)))
    boots = np.asarray(boots, dtype=float).reshape(-1, 4)
    ci = [_percentiles(boots[:, j]) for j in range(4)]
    out = {
        "n": n, "observed_accuracy": k / n if n else float("nan"), "ci_low": lo, "ci_high": hi,
        "wilson_low": wlo, "wilson_high": whi,
        "p_s": p_s, "p_d_given_correct": p_dC, "p_d_given_wrong": p_dW,
        "predicted_accuracy": pred, "predicted_ci_low": ci[3][0], "predicted_ci_high": ci[3][1],
        "p_s_ci": list(ci[0]), "p_d_given_correct_ci": list(ci[1]), "p_d_given_wrong_ci": list(ci[2]),
        "no_answer": int((~s.has_answer).sum()),
        "n_candidates": int((s.n_correct + s.n_wrong).sum()),
        "n_correct_candidates": int(s.n_correct.sum()), "n_wrong_candidates": int(s.n_wrong.sum()),
        "transitions": {"F->T": int(t[0]), "T->F": int(t[1]), "T->T": int(t[2]), "F->F": int(t[3]),
                        "p(F->T)": _ratio(t[0], from_f), "p(T->F)": _ratio(t[1], from_t)},
    }
    if budget is not None:
        out["attempt_budget"] = budget
    if clustered:
        out.update({"questions": len(members), "design_effects": deff})
        out["transitions"]["p(F->T)_ci"] = ft_ci
    return _clean(out)


def _clean(x):
    if isinstance(x, dict):
        return {k: _clean(v_) for k, v_ in x.items()}
    if isinstance(x, list):
        return [_clean(v_) for v_ in x]
    return _nan_to_none(x)


def _subset(s: ResponseStats, mask) -> ResponseStats:
    return ResponseStats(*[getattr(s, f)[mask] for f in ResponseStats.__dataclass_fields__])


MAX_BOOTSTRAP = 100_000   # resamples: the paper uses 100


def calibrate(records, drop_truncated: bool = False, n_bootstrap: int = 100, seed: int = 0,
              markers=DEFAULT_MARKERS, parse=parse_response) -> dict:
    """``{"overall": {...}, "by_level": {"3x5": {...}, ...}}`` for a list of records.

    ``drop_truncated`` removes records with ``"truncated": true`` first (the paper does so for its
    calibration figure). Records must have "question", "answer" (an integer or integer string) and
    "response"; "level" and "truncated" are optional. ``parse``: how a response is read into candidates and
    decisions (:func:`dsh.task.parse.parse_response`, or a task's own reading, :mod:`dsh.measure.tasks`).
    """
    v.length("n_bootstrap", n_bootstrap)
    if n_bootstrap > MAX_BOOTSTRAP:
        raise ValueError(f"n_bootstrap must be an integer in 0..{MAX_BOOTSTRAP:,} (time); got {n_bootstrap:,}")
    v.length("seed", seed)
    recs = validate_records(records)
    if drop_truncated:
        recs = [r for r in recs if not r.get("truncated", False)]
    s = response_stats(recs, markers, parse)
    out = {"overall": summarize(s, n_bootstrap, seed), "by_level": {}}
    for lv in sorted(set(s.levels.tolist()), key=_level_key):
        out["by_level"][lv] = summarize(_subset(s, s.levels == lv), n_bootstrap, seed)
    return out


def _level_key(lv: str):
    try:
        m, n = lv.split("x")
        return (0, int(m), int(n))
    except ValueError:
        return (1, lv)


def record_list(records) -> list:
    """``records`` as a list, refused in one line when it is not a collection of records (a string, a path, a
    number, None, one record alone); the records themselves are checked by :func:`validate_records`."""
    return v.collection("records", records, "records (JSON objects with question, answer, response)")


def validate_records(records, source: str = "records") -> list[dict]:
    """Check the record contract; raises ValueError naming the record (line) and field."""
    out = []
    records = record_list(records)
    for i, r in enumerate(records, start=1):
        where = f"{source} line {i}" if source != "records" else f"record {i}"
        if not isinstance(r, dict):
            raise ValueError(f"{where}: must be a JSON object with question, answer, response")
        for fld, typ in (("question", str), ("response", str)):
            if fld not in r:
                raise ValueError(f"{where}: missing field '{fld}'")
            if not isinstance(r[fld], typ):
                raise ValueError(f"{where}: field '{fld}' must be a string")
        if "answer" not in r:
            raise ValueError(f"{where}: missing field 'answer'")
        ans = r["answer"]
        if not isinstance(ans, (int, str)) or truth_value(ans) is None:
            raise ValueError(f"{where}: field 'answer' must be an integer or an integer string, got {ans!r}")
        if "truncated" in r and not isinstance(r["truncated"], bool):
            raise ValueError(f"{where}: field 'truncated' must be true or false")
        if "capped" in r and not isinstance(r["capped"], bool):
            raise ValueError(f"{where}: field 'capped' must be true or false")
        budget = r.get("attempt_budget")
        if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 1):
            raise ValueError(f"{where}: field 'attempt_budget' must be an integer >= 1 (or absent)")
        if "level" in r and not isinstance(r["level"], str):
            raise ValueError(f"{where}: field 'level' must be a string such as '3x5'")
        out.append(r)
    if not out:
        raise ValueError(f"{source}: no records (the file is empty)")
    return out


def read_records(path) -> list[dict]:
    """Calibration records from a JSON-lines file (:func:`dsh.core.files.read_jsonl`, strict), each checked by
    :func:`validate_records`; a bad line or an empty file raises a one-line ValueError naming the file, the line and
    the field."""
    recs = read_jsonl(path, check=lambda r: validate_records([r]))
    if not recs:
        raise ValueError(f"{Path(path).name}: no records (the file is empty)")
    return recs


def format_table(result: dict) -> str:
    """A readable table of a :func:`calibrate` result."""
    cols = [("n", "n", "{:d}"), ("observed_accuracy", "obs", "{:.3f}"), ("ci_low", "ci_lo", "{:.3f}"),
            ("ci_high", "ci_hi", "{:.3f}"), ("p_s", "p_s", "{:.3f}"), ("p_d_given_correct", "p_dC", "{:.3f}"),
            ("p_d_given_wrong", "p_dW", "{:.3f}"), ("predicted_accuracy", "pred", "{:.3f}"),
            ("predicted_ci_low", "pred_lo", "{:.3f}"), ("predicted_ci_high", "pred_hi", "{:.3f}"),
            ("no_answer", "no_ans", "{:d}")]
    rows = [("overall", result["overall"])] + list(result["by_level"].items())
    head = f"{'group':<10}" + "".join(f"{c[1]:>9}" for c in cols) + f"{'F->T':>7}{'T->F':>7}"
    lines = [head]
    for name, s in rows:
        cells = "".join(f"{'-' if s[k] is None else fmt.format(s[k]):>9}" for k, _, fmt in cols)
        lines.append(f"{name:<10}" + cells + f"{s['transitions']['F->T']:>7}{s['transitions']['T->F']:>7}")
    return "\n".join(lines)
