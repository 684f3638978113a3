"""The laptop experiment's base model: a tiny ``LlamaForCausalLM`` trained from scratch on two CPU cores on the
task of :mod:`dsh.laptop_task`, produced by one command (``python -m dsh base``) and shipped with the package
(``dsh/assets/laptop-base``) so that the book and the tests start from it offline.

The settings below were chosen from measurements on the 2-core project machine (chapter 04's design table).
"""

from __future__ import annotations

import json
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import laptop_task as lt
from . import validate as v
from .pretrain import PretrainConfig, encode, pack, pretrain
from .tiny import TinyConfig, build_tokenizer, make_model, n_params, save

SHIPPED_BASE = Path(__file__).parent / "assets" / "laptop-base"
# the base's levels (both operand orders) and their weights: longer multiplicands are rarer, so the base's skill
# decays along the ladder like the paper's pretrained model (74 % on 3x3 down to 1 % on 3x9)
BASE_LEVELS = ("1x2", "1x3", "1x4", "1x5", "1x6", "1x7", "1x8", "2x1", "3x1", "4x1", "5x1", "6x1", "7x1", "8x1")
BASE_WEIGHTS = (4, 4, 4, 4, 2, 1, 0.5, 4, 4, 4, 4, 2, 1, 0.5)


@dataclass(frozen=True)
class BaseSpec:
    """Everything that determines the shipped base: shape, corpus and optimisation."""

    model: TinyConfig = field(default_factory=TinyConfig, metadata={"help": "the transformer's shape"})
    train: PretrainConfig = field(default_factory=PretrainConfig, metadata={"help": "optimisation"})
    n_examples: int = field(default=100_000, metadata={"help": "distinct examples in the corpus"})
    check_fraction: float = field(default=0.4, metadata={"help": "share of 'Check a * b = c.' examples"})
    pack_length: int = field(default=768, metadata={"help": "examples are packed into rows of this many tokens"})
    levels: tuple = field(default=BASE_LEVELS, metadata={"help": "levels of the corpus"})
    weights: tuple = field(default=BASE_WEIGHTS, metadata={"help": "relative frequency of each level"})


def build_base(out, spec: BaseSpec = BaseSpec(), progress: bool = True) -> dict:
    """Train the base from scratch into ``out`` (a model folder with tokenizer and ``dsh_provenance.json``);
    resumable after a kill (same ``out``, same spec). Returns the provenance."""
    import torch

    if not isinstance(spec, BaseSpec):
        raise ValueError(f"spec must be a dsh.laptop.BaseSpec, got {type(spec).__name__}")
    out = v.output_path("out", out, kind="folder")
    if out.is_dir() and any(out.iterdir()):
        raise ValueError(f"out must be a new or empty folder; {out} holds files (a killed run resumes from "
                         f".{out.name}.work beside it)")
    torch.manual_seed(spec.train.seed)
    tok = build_tokenizer()
    model = make_model(tok, spec.model, seed=spec.train.seed)
    corpus = lt.base_corpus(spec.levels, spec.weights, spec.n_examples, spec.check_fraction, seed=spec.train.seed,
                            exclude=lt.held_out())
    rows = pack(encode(tok, [(t.prompt, t.text) for t in corpus]), spec.pack_length, seed=spec.train.seed)
    work = out.parent / f".{out.name}.work"
    t0 = time.time()
    stats = pretrain(model, tok, rows, work, spec.train, progress=progress)
    prov = {"what": "dsh laptop base: LlamaForCausalLM trained from scratch", "spec": asdict(spec),
            "parameters": n_params(model), "corpus_tokens": sum(len(r[0]) for r in rows), "packed_rows": len(rows),
            "train": {k: stats[k] for k in ("steps", "tokens", "seconds", "tokens_per_s", "final_loss_ema")},
            "loss_curve": stats["curve"], "wall_seconds": round(time.time() - t0, 1),
            "torch_threads": torch.get_num_threads(), "cpu": platform.processor() or platform.machine()}
    from .provenance import provenance

    prov["provenance"] = provenance()
    model.eval()
    prov["report"] = {f"temperature {t}": base_report(model, tok, temperature=t) for t in (1.0, 0.0)}
    save(model, tok, out, prov)
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    return prov


def complete(model, tok, prompts, max_new_tokens: int, temperature: float = 1.0, seed: int = 0,
             slots: int = 64) -> list[tuple[str, bool]]:
    """Completions of question strings (chat-formatted) through :class:`dsh.engine.Engine`: (text, stopped)."""
    from .engine import Engine
    from .records import chat_prompt

    ids = [tok(chat_prompt(tok, q), add_special_tokens=False)["input_ids"] for q in prompts]
    eng = Engine(model, [tok.eos_token_id], slots=min(slots, len(ids)), max_len=max(map(len, ids)) + max_new_tokens,
                 bucket=32, cuda_graphs=False, sync_every=8)
    gens = eng.generate(ids, max_new_tokens, temperature=temperature, seed=seed)
    return [(tok.decode(g.text_tokens, skip_special_tokens=True), g.stopped) for g in gens]


def base_report(model, tok, n_per_level: int = 100, temperature: float = 1.0, seed: int = 0) -> dict:
    """The base's accuracy per test level and its check skill (verdict right on given claims) at ``temperature``."""
    import random

    from .parse import parse_response

    qs = lt.test_questions(n_per_level=n_per_level, seed=seed)
    texts = complete(model, tok, [p.question for p in qs], 160, temperature, seed)
    acc = {}
    for p, (t, _) in zip(qs, texts):
        r = parse_response(t, p.a, p.b)
        acc.setdefault(p.level, []).append(r.final_answer == p.answer)
    rng = random.Random(seed)
    checks = [lt.check_example(p, rng) for p in qs]
    ctexts = complete(model, tok, [c.prompt for c in checks], 120, temperature, seed + 1)
    right = {}
    for p, c, (t, _) in zip(qs, checks, ctexts):
        right.setdefault(p.level, []).append(t.strip() == c.text)
    return {"accuracy": {k: sum(x) / len(x) for k, x in acc.items()},
            "check_exact": {k: sum(x) / len(x) for k, x in right.items()}}


def _json(x):
    return json.dumps(x, indent=1, default=str)
