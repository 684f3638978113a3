"""dsh.task.parse on responses it was not written from (tests/heldout/generate.py: its own arithmetic layout, marker
phrasings and answer forms, labels by construction): calibration within 0.02 of the labels on every estimate."""

import json
import re
from pathlib import Path

import pytest

from dsh.measure import calibration
from dsh.task import parse

HERE = Path(__file__).parent / "heldout"
RECORDS = [json.loads(x) for x in (HERE / "parser_heldout.jsonl").read_text().splitlines()]


def _truth(records) -> dict:
    correct = [c for r in records for c in r["label_correct"]]
    decisions = [d for r in records for d in r["label_decisions"]]
    stop_c = sum(c and d == "STOP" for c, d in zip(correct, decisions))
    res_w = sum(not c and d == "RESAMPLE" for c, d in zip(correct, decisions))
    return {"n": len(records), "observed_accuracy": sum(r["label_correct"][-1] for r in records) / len(records),
            "p_s": sum(r["label_correct"][0] for r in records) / len(records),
            "p_d_given_correct": stop_c / sum(correct), "p_d_given_wrong": res_w / (len(correct) - sum(correct))}


def _generator():
    """tests/heldout/generate.py as a module (it is a script, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("heldout_generate", HERE / "generate.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return gen


def test_the_file_is_the_generators_output():
    assert _generator().generate() == RECORDS


def test_the_set_measures_generality_not_memory():
    """At least 6 marker phrasings and 6 answer forms; several markers contain none of dsh.task.parse's literal
    phrases, and no answer form is one that dsh.task.traces writes."""
    gen = _generator()
    assert len(gen.MARKERS) >= 6 and len(gen.ANSWERS) >= 6
    literal = [m.lower() for m in parse.LITERAL_MARKERS]
    unseen = [m for m in gen.MARKERS if not any(x in m.lower() for x in literal)]
    assert len(unseen) >= 3, unseen
    assert not any(f.startswith(("So {a} * {b}", "The answer is")) for f in gen.ANSWERS)
    for m in gen.MARKERS:        # every phrasing is a marker to dsh.task.parse, by a literal or by the pattern family
        assert parse.marker_regex().search(m), m


@pytest.mark.parametrize("key", ["n", "observed_accuracy", "p_s", "p_d_given_correct", "p_d_given_wrong"])
def test_calibration_matches_the_labels(key):
    got = calibration.calibrate(RECORDS, n_bootstrap=0)["overall"]
    want = _truth(RECORDS)
    assert abs(got[key] - want[key]) <= 0.02, (key, got[key], want[key])


def test_every_attempt_is_found_on_the_held_out_set():
    """Stronger than the estimates: the parser recovers each response's attempts and decisions."""
    wrong = []
    for r in RECORDS:
        a, b = parse.operands(r["question"])
        p = parse.parse_response(r["response"], a, b)
        got = ([c == r["answer"] for c in p.candidates], p.decisions)
        if got != (r["label_correct"], r["label_decisions"]):
            wrong.append((r["response"][-200:], got))
    assert len(wrong) <= 0.01 * len(RECORDS), wrong[:3]


def test_intermediate_results_are_not_candidates():
    """No candidate lies on a "running total: N" line or a partial-product line "a * d * 10^k = v"."""
    for r in RECORDS:
        a, b = parse.operands(r["question"])
        text = r["response"]
        for _, start, _ in parse.find_candidates(text, a, b):
            line = text[text.rfind("\n", 0, start) + 1:].split("\n", 1)[0]
            assert not re.match(r"running total: |\d+ \* \d \* 10\^\d+ = ", line), line
