"""The starting model's own attempts at training problems, for reflection traces that begin with them
(:meth:`dsh.measure.tasks.LaptopTask.records`): measured in chapter 07's design table, SFT on the generator's
injected slips taught the tiny model to slip."""

from __future__ import annotations

import json
from pathlib import Path

from ..core import store
from ..core import validate as v
from ..core.files import write_text
from ..llm.complete import complete
from ..llm.models import cache_dir, load, resolve_model, weights_digest
from ..task import laptop_task as lt

ATTEMPT_TOKENS = 160    # new tokens an attempt may take (the laptop base's reports use the same limit)


def own_attempts(model: str, problems, k: int = 2, seed: int = 0, max_new_tokens: int = ATTEMPT_TOKENS) -> list[list]:
    """``k`` attempts of ``model`` (a model folder) at each problem, sampled at temperature 1 as no-reflection
    answers (:func:`dsh.llm.complete.complete`): per problem the list of ``(body, answer)`` pairs that parse
    (:func:`dsh.task.laptop_task.split_attempt`). Cached under the package cache by the weights, problems and
    settings, so that SFT and DFT of one seed see the same samples."""
    v.positive_int("k", k)
    v.positive_int("max_new_tokens", max_new_tokens)
    loc = Path(resolve_model(model))
    key = {"step": "own_attempts", "weights": weights_digest(loc), "problems": [[p.a, p.b] for p in problems], "k": k,
           "seed": seed, "max_new_tokens": max_new_tokens}
    cached = cache_dir() / "laptop-attempts" / f"{store.key_digest(key)[:32]}.json"
    if cached.is_file():
        return [[tuple(a) for a in row] for row in json.loads(cached.read_text())]
    m, tok = load(str(loc))
    outs = complete(m, tok, [p.question for p in problems for _ in range(k)], max_new_tokens, 1.0, seed)
    got = [lt.split_attempt(c.text) for c in outs]
    result = [[a for a in got[i * k:(i + 1) * k] if a is not None] for i in range(len(problems))]
    write_text(cached, json.dumps(result))
    return result
