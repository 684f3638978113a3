"""Completions of questions: the one sampling path of the package, for evaluation (``dsh evaluate``, the
pipeline), the model's own attempts in reflection traces and the laptop base's reports.

Each question is chat-formatted (:func:`dsh.task.records.chat_prompt`). :func:`complete` runs
:class:`dsh.llm.engine.Engine` (llama-family models): each question has its own random stream (its key: by
default its index), so a completion does not depend on the batch it ran in. :func:`complete_hf` runs
``model.generate`` in batches with left padding (any model; one seed per batch), :func:`complete_vllm` vLLM on a GPU
(a seed per question).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core import validate as v
from ..task.records import chat_prompt, chat_prompts
from .scale import fit_slots
from .streams import stream_key


@dataclass(frozen=True)
class Completion:
    """One completion: its text (special tokens dropped), whether it stopped on an end-of-sequence token, whether
    ``stop_after`` ended it (``capped``; neither: it reached the token limit), and its prompt and completion lengths
    in tokens."""

    text: str
    stopped: bool
    prompt_tokens: int
    completion_tokens: int
    capped: bool = False

    @property
    def truncated(self) -> bool:
        """Ended by the token limit: neither an end-of-sequence token nor ``stop_after``."""
        return not (self.stopped or self.capped)


def single_token(tok, text: str, what: str) -> int:
    """The id of ``text`` when the tokenizer ``tok`` writes it as one token; else a one-line ValueError naming
    ``what`` needs it."""
    ids = tok(text, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise ValueError(f"{what} {text!r} must be one token of the model's tokenizer; it is {len(ids)} "
                         f"(a tiny model's tokenizer, dsh.llm.tiny, holds it as one)")
    return int(ids[0])


def complete(model, tok, questions, max_new_tokens: int, temperature: float = 1.0, seed: int = 0, rows: int = 64,
             keys=None, on_finish=None, progress: bool = False, prefixes=None,
             kv_cache: str = "float32", stop_after=None) -> list[Completion]:
    """:class:`Completion` of each question string (in order): at most ``max_new_tokens`` new tokens, sampled at
    ``temperature`` (0: greedy) with the counted streams of ``seed`` and ``keys`` (one int per question; default
    the index), ``rows`` rows decoded at once (capped by what the KV cache can hold on a GPU).
    ``prefixes`` (one string per question): the start of each response, written for the model, which goes on from
    it (the completion's text and token count leave the prefix out).
    ``on_finish(i, completion)`` is called as question ``i`` finishes (e.g. to write it at once). ``kv_cache``: the
    engine's KV cache dtype on the CPU path (:class:`dsh.llm.engine.Engine`). ``stop_after``: ``(token_id, n)``
    ends a completion right after its n-th ``token_id`` (an attempt budget; :meth:`dsh.llm.engine.Engine.generate`)."""
    from .engine import Engine
    from .request import checked_stop_after

    questions = list(questions)
    v.positive_int("max_new_tokens", max_new_tokens)
    v.positive_int("rows", rows)
    v.temperature("temperature", temperature)
    stop_after = checked_stop_after(stop_after)
    if keys is not None and len(keys) != len(questions):
        raise ValueError(f"keys must give one stream key per question ({len(questions)}); got {len(keys)}")
    if prefixes is not None and (len(prefixes) != len(questions) or not all(isinstance(x, str) for x in prefixes)):
        raise ValueError(f"prefixes must give one string per question ({len(questions)}); got {prefixes!r:.80}")
    if not questions:
        return []
    prefixes = [""] * len(questions) if prefixes is None else list(prefixes)
    # one call for all prompts (the template's and the tokenizer's batch paths: the same ids, a third of the time)
    prompts = tok([c + x for c, x in zip(chat_prompts(tok, questions), prefixes)], add_special_tokens=False)["input_ids"]
    max_len = max(map(len, prompts)) + max_new_tokens
    eos = model.generation_config.eos_token_id
    eos = [tok.eos_token_id] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    engine = Engine(model, eos, slots=fit_slots(model, min(rows, len(prompts)), max_len), max_len=max_len,
                    kv_cache=kv_cache)
    out: list = [None] * len(prompts)

    def finished(i, g):
        out[i] = Completion(tok.decode(g.text_tokens, skip_special_tokens=True), bool(g.stopped), len(prompts[i]),
                            len(g.text_tokens), bool(g.capped))
        if on_finish is not None:
            on_finish(i, out[i])

    engine.generate(prompts, max_new_tokens, temperature=temperature, seed=seed, progress=progress,
                    callback=finished, keys=None if keys is None else list(keys), stop_after=stop_after)
    return out


def complete_hf(model, tok, questions, max_new_tokens: int, temperature: float = 1.0, rows: int = 16,
                batch_seed=None, on_finish=None, progress: bool = False) -> list[Completion]:
    """:class:`Completion` of each question through ``model.generate`` in batches of ``rows`` (left padding; a static
    KV cache on a GPU; greedy at temperature 0), each batch drawn after ``torch.manual_seed(batch_seed(i))``, ``i``
    the index of its first question (default ``i``). ``on_finish(i, completion)`` as in :func:`complete`."""
    import torch
    from tqdm import tqdm

    if not progress:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    model.eval()
    questions = list(questions)
    eot = model.generation_config.eos_token_id
    eot = set([eot] if isinstance(eot, int) else (eot or []))
    kwargs = dict(max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id)
    if temperature > 0:
        kwargs.update(do_sample=True, temperature=temperature, top_p=1.0, top_k=0)
    else:
        kwargs.update(do_sample=False)
    if next(model.parameters()).is_cuda:
        kwargs["cache_implementation"] = "static"
    out: list = []
    bar = tqdm(total=len(questions), desc="generate", disable=not progress)
    for start in range(0, len(questions), rows):
        enc = tok([chat_prompt(tok, q) for q in questions[start:start + rows]], return_tensors="pt",
                  padding=True).to(model.device)
        torch.manual_seed(batch_seed(start) if batch_seed else start)
        with torch.no_grad():
            new = model.generate(**enc, **kwargs)[:, enc["input_ids"].shape[1]:]
        for row, mask in zip(new, enc["attention_mask"]):
            ids = row.tolist()
            n = next((j for j, t in enumerate(ids) if t in eot or t == tok.pad_token_id), len(ids))
            truncated = n == len(ids) and len(ids) >= max_new_tokens
            out.append(Completion(tok.decode(ids[:n], skip_special_tokens=True), not truncated, int(mask.sum()), n))
            if on_finish is not None:
                on_finish(len(out) - 1, out[-1])
        bar.update(len(new))
    bar.close()
    return out


def complete_vllm(loc: str, questions, max_new_tokens: int, temperature: float = 1.0, seed: int = 0, keys=None,
                  on_finish=None, progress: bool = False) -> list[Completion]:  # pragma: no cover - GPU only
    """:class:`Completion` of each question through vLLM (the model folder ``loc``), each with its own seed (the
    engine's stream key of ``seed`` and its key), so that a completion does not depend on its batch."""
    from vllm import LLM, SamplingParams

    questions = list(questions)
    keys = list(range(len(questions))) if keys is None else list(keys)
    llm = LLM(model=loc, seed=seed)
    tok = llm.get_tokenizer()
    params = [SamplingParams(temperature=temperature, top_p=1.0, top_k=-1, max_tokens=max_new_tokens,
                             seed=stream_key(seed, k)) for k in keys]
    results = llm.generate([chat_prompt(tok, q) for q in questions], params, use_tqdm=progress)
    out = []
    for i, r in enumerate(results):
        c = r.outputs[0]
        out.append(Completion(c.text, c.finish_reason != "length", len(r.prompt_token_ids), len(c.token_ids)))
        if on_finish is not None:
            on_finish(i, out[-1])
    return out
