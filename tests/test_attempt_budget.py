"""The attempt budget: the engine ends a row right after the n-th occurrence of a token (``stop_after``), an
evaluation and GRPO's rollouts carry it as ``attempt_budget``, and the calibration reads a capped response's last
decision as the RESAMPLE its marker states and predicts the accuracy of the process cut after K attempts."""

import dataclasses
import json
import random

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from dsh.experiment.run.evaluate import EvalSettings
from dsh.llm.engine import Engine
from dsh.llm.request import checked_stop_after
from dsh.measure.calibration import calibrate
from dsh.measure.claims import blind_prediction
from dsh.task import laptop_task as lt
from dsh.theory.two_stage import accuracy_within, predicted_accuracy
from dsh.training.train_config import TrainConfig


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=12, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, eos_token_id=11,
                      pad_token_id=0, bos_token_id=1)
    return LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("attention", ["kernels", "torch"])
def test_a_row_ends_right_after_its_nth_stop_token_and_is_otherwise_the_same(tiny, attention):
    from dsh.llm import kernels

    if attention == "kernels" and kernels.load() is None:
        pytest.skip(f"C kernels unavailable: {kernels.why_not}")
    eng = Engine(tiny, [11], slots=4, max_len=48, bucket=8, attention=attention)
    prompts = [[1, 2, 3], [1, 4], [1, 5, 6, 7], [1, 8], [1, 9, 10], [1, 2], [3, 3], [7]]
    free = eng.generate(prompts, 40, temperature=1.0, seed=3)
    counts = np.bincount([t for g in free for t in g.tokens if t != 11], minlength=12)
    stop = int(counts.argmax())                                # the commonest token: several rows hold it twice
    capped = eng.generate(prompts, 40, temperature=1.0, seed=3, stop_after=(stop, 2))
    n_capped = 0
    for f, c in zip(free, capped):
        hits = [j for j, t in enumerate(f.tokens) if t == stop]
        if len(hits) >= 2 and not (f.stopped and hits[1] == len(f.tokens) - 1):
            n_capped += 1
            assert c.capped and not c.stopped
            assert c.tokens == f.tokens[:hits[1] + 1] and c.logprobs == pytest.approx(f.logprobs[:hits[1] + 1])
        else:
            assert not c.capped and (c.tokens, c.stopped) == (f.tokens, f.stopped)
    assert n_capped >= 2
    # a count never reached changes nothing
    far = eng.generate(prompts, 40, temperature=1.0, seed=3, stop_after=(stop, 99))
    assert [(g.tokens, g.stopped, g.capped) for g in far] == [(g.tokens, g.stopped, False) for g in free]


@pytest.mark.parametrize("bad", [(1,), (1, 0), (-1, 2), ("a", 2), (1, True), 3, "x"])
def test_a_bad_stop_after_is_one_line(bad):
    with pytest.raises(ValueError, match="stop_after must be None or"):
        checked_stop_after(bad)


def _capped_records(p_s, p_dC, p_dW, K, n, seed=0, read_capped=True):
    """Laptop-format responses of the two-stage process under a budget of K attempts: a RESAMPLE after the K-th
    attempt writes the marker and the response ends there (``capped``)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        p = lt.draw("1x3", rng)
        parts, capped = [], False
        for k in range(1, K + 1):
            ok = rng.random() < p_s
            val = p.answer if ok else p.answer + rng.choice((1, 2, 10, -1))
            parts.append(f"{p.a}*{p.b}: steps\nThe answer is {val}.\nCheck: ...: the check "
                         f"{'passes' if ok else 'fails'}.")
            stop = rng.random() < (p_dC if ok else 1 - p_dW)
            if stop:
                break
            parts.append(lt.MARKER)
            capped = k == K
        rec = {"question": p.question, "answer": p.answer, "response": "\n".join(parts), "level": "1x3",
               "truncated": False, "attempt_budget": K}
        if read_capped:
            rec["capped"] = capped
        out.append(rec)
    return out


def test_capped_responses_give_the_true_decision_rates_and_the_cut_process_accuracy():
    from dsh.measure.tasks import get

    truth, K = (0.45, 0.9, 0.8), 3
    recs = _capped_records(*truth, K, n=6000)
    assert sum(r["capped"] for r in recs) > 300           # the budget binds often here
    o = calibrate(recs, n_bootstrap=50, parse=get("laptop_task").parse)["overall"]
    assert o["attempt_budget"] == K
    for est, want, key in zip((o["p_s"], o["p_d_given_correct"], o["p_d_given_wrong"]), truth,
                              ("p_s_ci", "p_d_given_correct_ci", "p_d_given_wrong_ci")):
        lo, hi = o[key]
        assert lo - 0.01 <= want <= hi + 0.01, (key, est, want)
    assert o["predicted_accuracy"] == pytest.approx(accuracy_within(o["p_s"], o["p_d_given_correct"],
                                                                    o["p_d_given_wrong"], K))
    assert abs(o["predicted_accuracy"] - o["observed_accuracy"]) < 0.03
    # the unlimited process's formula would miss it: the budget binds
    assert abs(predicted_accuracy(*truth) - accuracy_within(*truth, K)) > 0.05
    # read without the capped flag, the K-th decision counts as a STOP and p_dW falls below its truth
    plain = calibrate(_capped_records(*truth, K, n=6000, read_capped=False), n_bootstrap=0,
                      parse=get("laptop_task").parse)["overall"]
    assert plain["p_d_given_wrong"] < truth[2] - 0.05
    # the correctness-blind baseline is the cut process too
    q = 0.5
    est = {"p_s": 0.4, "p_d_given_correct": q, "p_d_given_wrong": 1 - q, "n_correct_candidates": 10,
           "n_wrong_candidates": 10, "attempt_budget": 2}
    assert blind_prediction(est) == pytest.approx(accuracy_within(0.4, q, 1 - q, 2))


def test_records_of_two_budgets_or_bad_fields_are_refused():
    recs = _capped_records(0.5, 0.9, 0.8, 3, n=20)
    with pytest.raises(ValueError, match="one attempt budget"):
        calibrate(recs + _capped_records(0.5, 0.9, 0.8, 2, n=20, seed=1), n_bootstrap=0)
    with pytest.raises(ValueError, match="field 'capped' must be true or false"):
        calibrate([{**recs[0], "capped": "yes"}], n_bootstrap=0)
    with pytest.raises(ValueError, match="field 'attempt_budget' must be an integer >= 1"):
        calibrate([{**recs[0], "attempt_budget": 0}], n_bootstrap=0)


def test_the_settings_take_a_budget_and_refuse_a_bad_one():
    s = EvalSettings(levels=("1x2",), n_per_level=2, attempt_budget=4).checked()
    assert s.key()["attempt_budget"] == 4 and "attempt_budget" not in EvalSettings().key()
    for bad in (0, -1, 2.5, "4"):
        with pytest.raises(ValueError, match="attempt_budget"):
            EvalSettings(attempt_budget=bad).checked()
    with pytest.raises(ValueError, match="attempt_budget"):
        TrainConfig(method="grpo", attempt_budget=0)
    with pytest.raises(ValueError, match="attempt_budget applies to GRPO"):
        TrainConfig(method="sft", attempt_budget=3)
    assert TrainConfig(method="grpo", attempt_budget=3).attempt_budget == 3


def test_an_evaluation_refuses_a_budget_on_another_backend_before_writing(tmp_path):
    from dsh.experiment.run.evaluate import evaluate

    out = tmp_path / "g.jsonl"
    with pytest.raises(ValueError, match="attempt_budget needs backend auto or dsh"):
        evaluate("embedded", out=str(out), settings=EvalSettings(levels=("1x2",), n_per_level=1, attempt_budget=2),
                 backend="hf", progress=False)
    assert not out.exists()


def test_the_budget_needs_a_one_token_marker_of_a_task_that_has_one():
    from dsh.llm.tiny import build_tokenizer
    from dsh.training.train import budget_stop

    tok = build_tokenizer()
    cfg = TrainConfig(method="grpo", task="laptop_task", attempt_budget=4)
    marker, n = budget_stop(cfg, tok)
    assert n == 4 and tok.decode([marker]) == lt.MARKER
    assert budget_stop(dataclasses.replace(cfg, attempt_budget=None), tok) is None
    with pytest.raises(ValueError, match="one-token reflection marker"):
        budget_stop(dataclasses.replace(cfg, task="traces"), tok)


@pytest.mark.slow   # loads the shipped base
def test_an_evaluation_writes_capped_records_that_end_at_the_budget(tmp_path, monkeypatch):
    """The shipped base writes no reflection marker; with "=" standing for it (one token of the tiny tokenizer, in
    every attempt) the evaluation ends each response right after its second "=" and records it as capped."""
    from dsh.experiment.run import evaluate as ev
    from dsh.training.laptop_base import SHIPPED_BASE

    monkeypatch.setattr(ev, "MARKER", "=")
    s = EvalSettings(levels=("1x3",), n_per_level=4, max_new_tokens=60, batch_size=4)
    free = [json.loads(x) for x in ev.evaluate(str(SHIPPED_BASE), out=str(tmp_path / "free.jsonl"), settings=s,
                                               backend="dsh", progress=False).read_text().splitlines()]
    cut = [json.loads(x) for x in ev.evaluate(str(SHIPPED_BASE), out=str(tmp_path / "cut.jsonl"),
                                              settings=dataclasses.replace(s, attempt_budget=2), backend="dsh",
                                              progress=False).read_text().splitlines()]
    by = {r["index"]: r for r in free}
    assert sum(r["capped"] for r in cut) >= 2
    for r in cut:
        f = by[r["index"]]
        assert r["attempt_budget"] == 2 and "capped" not in f
        if r["capped"]:
            assert r["response"].count("=") == 2 and r["response"].endswith("=") and not r["truncated"]
            assert f["response"].startswith(r["response"])
        else:
            assert r["response"] == f["response"]
