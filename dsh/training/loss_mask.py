"""Training records whose completion is learned only in part: pre-tokenized rows for TRL's SFTTrainer.

A record with ``segment_texts`` and ``segment_loss`` (e.g. a reflection trace whose wrong attempts are not to be
learned: :meth:`dsh.measure.tasks.LaptopTask.records`) becomes ``input_ids`` (the chat prompt, the completion
and the end of turn, token for token what TRL writes for the conversational record) and ``labels`` (-100 on the
prompt and on the segments not to be learned). TRL's SFTTrainer uses a dataset with ``input_ids`` and ``labels``
as it is (TRL 1.16: "An optional ``labels`` column (-100 on tokens excluded from the loss) is used as is"), so the
loss, DFT's included, covers exactly the learned tokens.
"""

from __future__ import annotations


def has_segments(records) -> bool:
    """Whether ``records`` carry learned / not-learned segments (all of them do or none)."""
    marked = [("segment_texts" in r) for r in records]
    if any(marked) and not all(marked):
        raise ValueError("records must all carry segment_texts / segment_loss or none of them")
    return bool(marked) and all(marked)


def token_record(tok, record: dict) -> dict:
    """``record`` as ``input_ids`` / ``labels`` (module docstring), keeping its ``answer`` and ``level``. Raises
    when the segments' tokens are not the completion's (a segment boundary inside a token)."""
    texts, learn = record["segment_texts"], record["segment_loss"]
    completion = record["completion"][0]["content"]
    if "".join(texts) != completion or len(texts) != len(learn):
        raise ValueError("segment_texts must join to the completion, with one segment_loss each")
    prompt = tok.apply_chat_template(record["prompt"], tokenize=False, add_generation_prompt=True)
    whole = tok.apply_chat_template(record["prompt"] + record["completion"], tokenize=False)
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    labels = [-100] * len(ids)
    for text, keep in zip(texts, learn):
        seg = tok(text, add_special_tokens=False)["input_ids"]
        ids += seg
        labels += seg if keep else [-100] * len(seg)
    tail = tok(whole[len(prompt) + len(completion):], add_special_tokens=False)["input_ids"]   # the end of turn
    ids, labels = ids + tail, labels + tail
    if not whole.startswith(prompt + completion) or ids != tok(whole, add_special_tokens=False)["input_ids"]:
        raise ValueError("segment boundaries must fall on token boundaries of the chat-formatted example "
                         "(the segments' tokens differ from the whole completion's)")
    return {"input_ids": ids, "labels": labels, "answer": record.get("answer"), "level": record.get("level")}


def token_records(tok, records) -> list[dict]:
    """:func:`token_record` of every record."""
    return [token_record(tok, r) for r in records]
