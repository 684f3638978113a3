"""Issue 30, item 2: measurements for a base that learns its skills well and decays because the test ladder goes
beyond its answer levels. Run from the project root:

    .venv/bin/python book/results/laptop/design/base_design.py speed          # tokens/s of candidate shapes
    .venv/bin/python book/results/laptop/design/base_design.py train NAME D L H FFN TOKENS

``train`` trains a base (answers on 1x2 ... 1x5 in both orders, checks on 1x2 ... 1x8 in both orders, the test
questions left out in both orders) without early stopping and logs the validation report (not the test questions)
every 500 steps, as JSON lines in logs/base_NAME.jsonl. Nothing here reads the test questions' answers.

Historical, as run (with the code of commit 814b318): it logs through pretrain's old ``stop_rule`` hook (a rule that
never stops), which the ``monitor`` hook replaced afterwards; check out 814b318 to run it again. The shipped base is
made by ``python -m dsh base``.
"""

import json
import sys
import time
from pathlib import Path

import torch

from dsh.llm.tiny import TinyConfig, build_tokenizer, make_model, n_params
from dsh.task import laptop_task as lt
from dsh.training.laptop_base import VALIDATION_SEED, base_report
from dsh.training.pretrain import PretrainConfig, encode, pack, pretrain

ANSWER_LEVELS = ("1x2", "1x3", "1x4", "1x5", "2x1", "3x1", "4x1", "5x1")
CHECK_LEVELS = ("1x2", "1x3", "1x4", "1x5", "1x6", "1x7", "1x8", "2x1", "3x1", "4x1", "5x1", "6x1", "7x1", "8x1")
LOGS = Path(__file__).parent / "logs"


def rows_for(tok, n_examples=100_000, check_fraction=0.4, seed=0):
    corpus = lt.base_corpus(ANSWER_LEVELS, (1,) * len(ANSWER_LEVELS), n_examples, check_fraction, seed=seed,
                            exclude=lt.held_out(both_orders=True), check_levels=CHECK_LEVELS)
    return pack(encode(tok, [(t.prompt, t.text) for t in corpus]), 768, seed=seed)


def speed():
    tok = build_tokenizer()
    rows = rows_for(tok, 20_000)
    for d, layers, heads, ffn in ((128, 4, 4, 384), (192, 4, 4, 576), (256, 4, 4, 768), (256, 6, 4, 768)):
        model = make_model(tok, TinyConfig(d, layers, heads, ffn))
        cfg = PretrainConfig(tokens=10**9, save_every=10**6)
        work = Path(f"/tmp/p/speed-{d}-{layers}")
        import shutil
        shutil.rmtree(work, ignore_errors=True)
        t0 = time.time()
        pretrain(model, tok, rows, work, cfg, progress=False, stop_after=40)
        st = torch.load(work / "state.pt", weights_only=False)
        print(json.dumps({"shape": [d, layers, heads, ffn], "params": n_params(model), "steps": st["step"],
                          "tokens": st["tokens"], "seconds": round(time.time() - t0, 1),
                          "tokens_per_s": round(st["tokens"] / (time.time() - t0))}), flush=True)


def train(name, d, layers, heads, ffn, tokens):
    tok = build_tokenizer()
    rows = rows_for(tok)
    model = make_model(tok, TinyConfig(int(d), int(layers), int(heads), int(ffn)))
    log = LOGS / f"base_{name}.jsonl"

    def rule(m, step):
        r = base_report(m, tok, n_per_level=50, temperature=1.0, seed=VALIDATION_SEED)
        with log.open("a") as f:
            f.write(json.dumps({"step": step, "time": round(time.time() - t0, 1), **r}) + "\n")
        return None

    t0 = time.time()
    cfg = PretrainConfig(tokens=int(float(tokens)), save_every=500)
    stats = pretrain(model, tok, rows, Path(f"/tmp/p/base-{name}.work"), cfg, progress=False, stop_rule=rule,
                     rule_every=500)
    model.eval()
    out = {"final": True, "params": n_params(model), "train": {k: stats[k] for k in ("steps", "tokens", "seconds",
                                                                                          "tokens_per_s")}}
    out["validation_T1"] = base_report(model, tok, n_per_level=100, temperature=1.0, seed=VALIDATION_SEED)
    with log.open("a") as f:
        f.write(json.dumps(out) + "\n")
    model.save_pretrained(f"/tmp/p/base-{name}")
    tok.save_pretrained(f"/tmp/p/base-{name}")


if __name__ == "__main__":
    {"speed": speed, "train": train}[sys.argv[1]](*sys.argv[2:])
