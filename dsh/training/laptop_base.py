"""The laptop experiment's base model: a tiny ``LlamaForCausalLM`` trained from scratch on two CPU cores on the
task of :mod:`dsh.task.laptop_task`, produced by one command (``python -m dsh base``) and shipped with the package
(``dsh/assets/laptop-base``) so that the book and the tests start from it offline.

The settings below were chosen from measurements on the 2-core project machine (chapter 04's design table).
"""

from __future__ import annotations

import json
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..core import validate as v
from ..core.files import write_text
from ..core.provenance import provenance
from ..llm.models import cache_dir, load, resolve_model
from ..llm.tiny import TinyConfig, build_tokenizer, make_model, n_params, save
from ..task import laptop_task as lt
from ..task.parse import parse_response
from ..task.records import chat_prompt
from .pretrain import PretrainConfig, encode, pack, pretrain

SHIPPED_BASE = Path(__file__).resolve().parent.parent / "assets" / "laptop-base"
# the base's levels (both operand orders) and their weights: longer multiplicands are rarer, so the base's skill
# decays along the ladder like the paper's pretrained model (74 % on 3x3 down to 1 % on 3x9)
BASE_LEVELS = ("1x2", "1x3", "1x4", "1x5", "1x6", "1x7", "1x8", "2x1", "3x1", "4x1", "5x1", "6x1", "7x1", "8x1")
BASE_WEIGHTS = (4, 4, 4, 4, 1, 0.5, 0.25, 4, 4, 4, 4, 1, 0.5, 0.25)
VALIDATION_SEED = 7       # the stopping rule's questions (drawn apart from the test questions)


@dataclass(frozen=True)
class BaseSpec:
    """Everything that determines the shipped base: shape, corpus and optimisation."""

    model: TinyConfig = field(default_factory=TinyConfig, metadata={"help": "the transformer's shape"})
    train: PretrainConfig = field(default_factory=lambda: PretrainConfig(tokens=8_000_000),
                                  metadata={"help": "optimisation"})
    n_examples: int = field(default=100_000, metadata={"help": "distinct examples in the corpus"})
    check_fraction: float = field(default=0.4, metadata={"help": "share of 'Check a * b = c.' examples"})
    pack_length: int = field(default=768, metadata={"help": "examples are packed into rows of this many tokens"})
    stop_early: bool = field(default=True, metadata={"help": "end at the first check where the base looks like the "
                                                             "paper's (see stop_rule)"})
    rule_every: int = field(default=250, metadata={"help": "steps between two checks of the stopping rule"})
    report_n: int = field(default=100, metadata={"help": "test questions a level in the provenance's report"})
    levels: tuple = field(default=BASE_LEVELS, metadata={"help": "levels of the corpus"})
    weights: tuple = field(default=BASE_WEIGHTS, metadata={"help": "relative frequency of each level"})


def build_base(out, spec: BaseSpec = BaseSpec(), progress: bool = True) -> dict:
    """Train the base from scratch into ``out`` (a model folder with tokenizer and ``dsh_provenance.json``);
    resumable after a kill (same ``out``, same spec). Returns the provenance."""
    import torch

    if not isinstance(spec, BaseSpec):
        raise ValueError(f"spec must be a dsh.training.laptop_base.BaseSpec, got {type(spec).__name__}")
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
    rule = (lambda m, step: stop_rule(m, tok)) if spec.stop_early else None
    stats = pretrain(model, tok, rows, work, spec.train, progress=progress, stop_rule=rule,
                     rule_every=spec.rule_every)
    prov = {"what": "dsh laptop base: LlamaForCausalLM trained from scratch", "spec": asdict(spec),
            "parameters": n_params(model), "corpus_tokens": sum(len(r[0]) for r in rows), "packed_rows": len(rows),
            "train": {k: stats[k] for k in ("steps", "tokens", "seconds", "tokens_per_s", "final_loss_ema")},
            "stopped_early": stats["stopped_early"], "rule_log": stats["rule_log"],
            "loss_curve": stats["curve"], "wall_seconds": round(time.time() - t0, 1),
            "torch_threads": torch.get_num_threads(), "cpu": platform.processor() or platform.machine()}

    prov["provenance"] = provenance()
    model.eval()
    prov["report"] = {f"temperature {t}": base_report(model, tok, n_per_level=spec.report_n, temperature=t)
                      for t in (1.0, 0.0)}
    save(model, tok, out, prov)
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    return prov


def stop_rule(model, tok, n_per_level: int = 50) -> dict | None:
    """The base's stopping rule, stated before any run: on validation questions (not the test questions) at
    temperature 1, the easiest level is answered >= 90 %, at least 4 levels > 0 and at least 2 levels < 50 %
    (the paper's base: 74 % on 3x3 down to 1 % on 3x9), and the check skill gives the right verdict >= 90 % of
    the time. Returns the measurements when all hold, else None."""
    r = base_report(model, tok, n_per_level=n_per_level, temperature=1.0, seed=VALIDATION_SEED)
    acc = [r["accuracy"][lv] for lv in lt.TEST_LEVELS]
    verdict = sum(r["check_verdict"].values()) / len(r["check_verdict"])
    ok = acc[0] >= 0.9 and sum(a > 0 for a in acc) >= 4 and sum(a < 0.5 for a in acc) >= 2 and verdict >= 0.9
    return {"validation": r} if ok else None


def own_attempts(model: str, problems, k: int = 2, seed: int = 0, max_new_tokens: int = 160) -> list[list]:
    """``k`` attempts of ``model`` (a model folder) at each problem, sampled at temperature 1 as no-reflection
    answers: per problem the list of ``(body, answer)`` pairs that parse (:func:`dsh.task.laptop_task.split_attempt`).
    The reflection traces built on them (:func:`dsh.task.laptop_task.trace_from_attempts`) show the model its own
    first attempts, not injected slips (measured: SFT on injected slips taught the model to slip)."""
    import hashlib

    v.positive_int("k", k)
    loc = Path(resolve_model(model))
    h = hashlib.sha256()
    for f in sorted(loc.glob("*.safetensors")):
        h.update(f.read_bytes())
    h.update(json.dumps([[p.a, p.b] for p in problems] + [k, seed, max_new_tokens]).encode())
    cached = cache_dir() / "laptop-attempts" / f"{h.hexdigest()[:32]}.json"   # the same samples for SFT, DFT
    if cached.is_file():
        return [[tuple(a) for a in row] for row in json.loads(cached.read_text())]
    m, tok = load(str(loc))
    outs = complete(m, tok, [p.question for p in problems for _ in range(k)], max_new_tokens, 1.0, seed)
    got = [lt.split_attempt(t) for t, _ in outs]
    result = [[a for a in got[i * k:(i + 1) * k] if a is not None] for i in range(len(problems))]

    write_text(cached, json.dumps(result))
    return result


def complete(model, tok, prompts, max_new_tokens: int, temperature: float = 1.0, seed: int = 0,
             slots: int = 64) -> list[tuple[str, bool]]:
    """Completions of question strings (chat-formatted) through :class:`dsh.llm.engine.Engine`: (text, stopped)."""
    from ..llm.engine import Engine

    ids = [tok(chat_prompt(tok, q), add_special_tokens=False)["input_ids"] for q in prompts]
    eng = Engine(model, [tok.eos_token_id], slots=min(slots, len(ids)), max_len=max(map(len, ids)) + max_new_tokens,
                 bucket=32, cuda_graphs=False)
    gens = eng.generate(ids, max_new_tokens, temperature=temperature, seed=seed)
    return [(tok.decode(g.text_tokens, skip_special_tokens=True), g.stopped) for g in gens]


def base_report(model, tok, n_per_level: int = 100, temperature: float = 1.0, seed: int = 0) -> dict:
    """The base's accuracy per test level and its check skill (verdict right on given claims) at ``temperature``."""
    import random

    qs = lt.test_questions(n_per_level=n_per_level, seed=seed)
    if seed == VALIDATION_SEED:
        test = lt.held_out()
        qs = [p for p in qs if (p.a, p.b) not in test]
    texts = complete(model, tok, [p.question for p in qs], 160, temperature, seed)
    acc = {}
    for p, (t, _) in zip(qs, texts):
        r = parse_response(t, p.a, p.b)
        acc.setdefault(p.level, []).append(r.final_answer == p.answer)
    rng = random.Random(seed)
    checks = [lt.check_example(p, rng) for p in qs]
    ctexts = complete(model, tok, [c.prompt for c in checks], 120, temperature, seed + 1)
    right, verdict = {}, {}
    for p, c, (t, _) in zip(qs, checks, ctexts):
        right.setdefault(p.level, []).append(t.strip() == c.text)
        verdict.setdefault(p.level, []).append(t.strip().endswith(lt.PASSES) == (c.decisions[0] == "STOP"))
    share = lambda d: {k: sum(x) / len(x) for k, x in d.items()}  # noqa: E731
    return {"accuracy": share(acc), "check_exact": share(right), "check_verdict": share(verdict)}
