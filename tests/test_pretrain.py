"""Training from scratch (dsh.pretrain, dsh.laptop): packing, determinism under a seed, exact resume after an
interruption, and the base command's bad input."""

import random

import pytest

from dsh import laptop_task as lt
from dsh.pretrain import PretrainConfig, encode, pack, pretrain
from dsh.tiny import TinyConfig, build_tokenizer, make_model

SMALL = TinyConfig(d_model=32, layers=1, heads=2, ffn=64, max_positions=256)


def _rows(tok, n=120, seed=0):
    corpus = lt.base_corpus(("1x2", "1x3"), (1, 1), n, seed=seed)
    return encode(tok, [(t.prompt, t.text) for t in corpus])


def test_pack_keeps_every_example_and_masks_prompts():
    tok = build_tokenizer()
    rows = _rows(tok)
    packed = pack(rows, 200, seed=1)
    assert all(len(ids) <= 200 and len(ids) == len(lab) for ids, lab in packed)
    assert sum(len(ids) for ids, _ in packed) == sum(len(s) for s, _ in rows)
    assert sum(x != -100 for _, lab in packed for x in lab) == sum(len(s) - k for s, k in rows)
    assert sum(ids.count(tok.eos_token_id) for ids, _ in packed) == len(rows)
    assert len(packed) < len(rows)
    with pytest.raises(ValueError, match="length must be at least"):
        pack(rows, 10)


def _train(tmp_path, name, rows, tok, stop_after=None, cfg=None):
    import torch

    torch.manual_seed(0)
    model = make_model(tok, SMALL, seed=3)
    cfg = cfg or PretrainConfig(tokens=12_000, tokens_per_batch=512, warmup_steps=2, save_every=1000, seed=3)
    stats = pretrain(model, tok, rows, tmp_path / name, cfg, progress=False, stop_after=stop_after)
    return model, stats


@pytest.mark.slow
def test_same_seed_same_model_and_exact_resume(tmp_path):
    tok = build_tokenizer()
    rows = pack(_rows(tok), 200, seed=0)
    a, sa = _train(tmp_path, "a", rows, tok)
    b, sb = _train(tmp_path, "b", rows, tok)
    assert sa["final_loss_ema"] < sa["curve"][0][2]            # it learned
    sd_a, sd_b = a.state_dict(), b.state_dict()
    assert all((sd_a[k] == sd_b[k]).all() for k in sd_a)       # same seed, same weights
    _, none = _train(tmp_path, "c", rows, tok, stop_after=7)   # "killed" after 7 steps, state kept
    assert none is None and (tmp_path / "c" / "state.pt").is_file()
    c, sc = _train(tmp_path, "c", rows, tok)                    # resumed
    sd_c = c.state_dict()
    assert sc["steps"] == sa["steps"]
    assert all((sd_a[k] == sd_c[k]).all() for k in sd_a)       # bit-identical to the uninterrupted run
    other = PretrainConfig(tokens=12_000, tokens_per_batch=512, warmup_steps=2, save_every=1000, seed=4)
    _train(tmp_path, "d", rows, tok, stop_after=3)
    with pytest.raises(ValueError, match="holds a run with other settings"):
        _train(tmp_path, "d", rows, tok, cfg=other)
    assert random.Random(0).random() == random.Random(0).random()


def test_bad_settings_are_one_line_errors(tmp_path):
    with pytest.raises(ValueError, match="tokens must be"):
        PretrainConfig(tokens=0)
    with pytest.raises(ValueError, match="lr must be"):
        PretrainConfig(lr=5)
    with pytest.raises(ValueError, match="heads must divide"):
        TinyConfig(d_model=100, heads=3)
    from dsh.laptop import build_base

    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep")
    with pytest.raises(ValueError, match="out must be a new or empty folder"):
        build_base(tmp_path / "full")
    assert (tmp_path / "full" / "x").read_text() == "keep"
