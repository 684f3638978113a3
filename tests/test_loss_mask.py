"""Reflection SFT that learns no wrong attempt: the traces' segments, the pre-tokenized rows,
and TRL's SFTTrainer training on exactly the learned tokens."""

import math

import pytest

from dsh.llm.tiny import TinyConfig, build_tokenizer, make_model
from dsh.measure import tasks
from dsh.task import laptop_task as lt
from dsh.task.problems import Problem
from dsh.training.loss_mask import has_segments, token_record, token_records
from dsh.training.train_config import TrainConfig


def _cfg(loss="no_wrong_attempts", **kw):
    return TrainConfig(method="sft_reflection", model="x", task="laptop_task", train_levels=("1x3", "1x4"),
                       n_train=40, task_options={"attempts": "injected", "loss": loss}, **kw)


def test_segments_mark_exactly_the_wrong_attempts():
    p = Problem(8, 69857)
    wrong = lt.attempt_text(8, 69857, lt.draw_slip(8, 69857, __import__("random").Random(1)))
    t = lt.trace_from_attempts(p, [wrong])
    assert "".join(x for x, _ in t.segments) == t.text
    unlearned = [x for x, keep in t.segments if not keep]
    assert unlearned == [f"{wrong[0]}\n{lt.ANSWER}{wrong[1]}."]              # the wrong attempt, whole, only
    right = lt.attempt_text(8, 69857)
    assert all(keep for _, keep in lt.trace_from_attempts(p, [right]).segments)   # a right own attempt is learned


def test_token_rows_equal_the_chat_formatted_example_and_hide_wrong_attempts():
    tok = build_tokenizer()
    task = tasks.get("laptop_task")
    cfg = _cfg()
    recs = task.records(cfg, task.training_problems(cfg))
    assert has_segments(recs) and not has_segments(task.records(_cfg("all"), task.training_problems(cfg)))
    retried = 0
    for r in recs:
        row = token_record(tok, r)
        whole = tok.apply_chat_template(r["prompt"] + r["completion"], tokenize=True)
        whole = whole["input_ids"] if hasattr(whole, "keys") else whole
        assert row["input_ids"] == whole                          # token for token what TRL would train on
        learned = tok.decode([i for i, y in zip(row["input_ids"], row["labels"]) if y != -100])
        n_answers = learned.count(lt.ANSWER)
        assert n_answers == 1 and learned.rstrip("<eos>").endswith(lt.PASSES)   # only the right attempt's answer
        text = r["completion"][0]["content"]
        assert learned.count(lt.MARKER) == text.count(lt.MARKER) and learned.count("Check ") == text.count("Check ")
        retried += lt.MARKER in text
    assert retried >= 5                                           # the case that matters occurs
    with pytest.raises(ValueError, match="segment_texts must join"):
        token_record(tok, {**recs[0], "segment_texts": ["x"], "segment_loss": [True]})
    with pytest.raises(ValueError, match="all carry segment_texts"):
        has_segments([recs[0], {k: x for k, x in recs[0].items() if not k.startswith("segment")}])


def test_trl_trains_on_the_learned_tokens_only(tmp_path):
    """TRL's SFTTrainer keeps the rows' labels (nothing rebuilt from its own completion mask): its loss on a batch
    equals the mean negative log-likelihood over the learned tokens computed by hand, and differs from the loss
    over the whole completion."""
    import torch
    from datasets import Dataset

    from dsh.training.train import TRAINERS
    from dsh.training.train_config import to_trl_config

    tok = build_tokenizer()
    task = tasks.get("laptop_task")
    cfg = _cfg(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, max_steps=1)
    recs = [r for r in task.records(cfg, task.training_problems(cfg)) if lt.MARKER in r["completion"][0]["content"]]
    model = make_model(tok, TinyConfig(d_model=32, layers=1, heads=2, ffn=64), seed=0)
    rows = token_records(tok, recs[:4])
    trainer = TRAINERS["sft_reflection"](cfg, to_trl_config(cfg), model, tok, Dataset.from_list(rows), None, [])
    prepared = trainer.train_dataset
    assert [prepared[i]["labels"] for i in range(4)] == [r["labels"] for r in rows]
    batch = trainer.data_collator([prepared[i] for i in range(4)])
    with torch.no_grad():
        trl_loss = float(trainer.compute_loss(model, batch))
        nll_sum, n, all_sum, n_all = 0.0, 0, 0.0, 0
        for r in rows:
            ids = torch.tensor([r["input_ids"]])
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1], -1)
            tgt = ids[0, 1:]
            lab = torch.tensor(r["labels"][1:])
            tok_nll = -logp.gather(1, tgt[:, None])[:, 0]
            nll_sum += float(tok_nll[lab != -100].sum())
            n += int((lab != -100).sum())
            k = r["labels"].index(next(y for y in r["labels"] if y != -100))     # completion's start
            all_sum += float(tok_nll[k - 1:].sum())
            n_all += len(r["labels"]) - k
    assert math.isclose(trl_loss, nll_sum / n, rel_tol=1e-4)
    assert abs(nll_sum / n - all_sum / n_all) > 1e-3
