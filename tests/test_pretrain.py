"""Training from scratch (dsh.training.pretrain, dsh.training.laptop_base): packing, determinism under a seed, exact resume after an
interruption, and the base command's bad input."""


import pytest

from dsh.llm.tiny import TinyConfig, build_tokenizer, make_model
from dsh.task import laptop_task as lt
from dsh.training.pretrain import PretrainConfig, encode, pack, pretrain

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
    # the packing is seeded: the same seed packs the same rows, another seed another order
    assert pack(_rows(tok), 200, seed=0) == rows and pack(_rows(tok), 200, seed=1) != rows


def test_bad_settings_are_one_line_errors(tmp_path):
    with pytest.raises(ValueError, match="tokens must be"):
        PretrainConfig(tokens=0)
    with pytest.raises(ValueError, match="lr must be"):
        PretrainConfig(lr=5)
    with pytest.raises(ValueError, match="heads must divide"):
        TinyConfig(d_model=100, heads=3)
    from dsh.training.laptop_base import build_base

    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep")
    with pytest.raises(ValueError, match="out must be a new or empty folder"):
        build_base(tmp_path / "full")
    assert (tmp_path / "full" / "x").read_text() == "keep"
    (tmp_path / "a_file").write_text("x")
    tok = build_tokenizer()
    with pytest.raises(ValueError, match="^out cannot be written: .*a_file is a file"):     # before any step
        pretrain(make_model(tok, SMALL), tok, _rows(tok, n=4), tmp_path / "a_file" / "w")


@pytest.mark.slow
def test_the_base_command_reproduces_a_model_bit_for_bit(tmp_path):
    """`python -m dsh base` (dsh.training.laptop_base.build_base) on a short run, twice with the same seed: the same weights;
    another seed: other weights."""
    from dsh.training.laptop_base import BaseSpec, build_base

    spec = BaseSpec(model=SMALL, train=PretrainConfig(tokens=15_000, tokens_per_batch=512, warmup_steps=2, seed=0),
                    n_examples=1500, pack_length=256, report_n=3, curve_every=10, curve_n=2)
    import dataclasses

    p1 = build_base(tmp_path / "a", spec, progress=False)
    build_base(tmp_path / "b", spec, progress=False)
    build_base(tmp_path / "c", dataclasses.replace(spec, train=dataclasses.replace(spec.train, seed=1)),
               progress=False)
    a, b, c = ((tmp_path / x / "model.safetensors").read_bytes() for x in "abc")
    assert a == b and a != c
    assert p1["train"]["tokens"] >= 0.95 * 15_000 and p1["report"]["temperature 1.0"]["accuracy"]   # the budget, to a step
    steps = [e["step"] for e in p1["skill_curve"]]       # the learning curve: every curve_every steps and the last
    assert steps == sorted(set(steps)) and steps[0] == 10 and steps[-1] == p1["train"]["steps"]
    assert set(p1["skill_curve"][0]) >= {"accuracy", "check_exact", "check_copies", "check_verdict", "tokens"}
    assert not (tmp_path / ".a.work").exists()
    from dsh.llm.models import load

    m, tok = load(str(tmp_path / "a"))
    assert tok.get_vocab() == build_tokenizer().get_vocab()


@pytest.mark.slow
def test_the_shipped_base_has_its_skills_and_decays_beyond_them():
    """The committed base loads as a Hugging Face model with the tokenizer dsh builds and is what ``python -m dsh
    base`` makes by default (its recorded spec); its recorded test report (T=1): checks exact and their copies right
    on >= 98 % of the levels it answers on, >= 90 % accuracy on the easiest level, accuracy > 0 on >= 4 levels and
    < 50 % on >= 2, the low ones beyond its answer levels; a fresh evaluation of 30 questions a level agrees with the
    record within sampling error."""
    import dataclasses
    import json

    from dsh.llm.models import load
    from dsh.training.laptop_base import SHIPPED_BASE, BaseSpec, base_report, decays_like_the_papers_base

    prov = json.loads((SHIPPED_BASE / "dsh_provenance.json").read_text())
    # the fields added since it was trained (a graded corpus, a continued base) at their defaults
    assert {"slip_rate": 0.0, "init": None, **prov["spec"]} == json.loads(json.dumps(dataclasses.asdict(BaseSpec())))
    r = prov["report"]["temperature 1.0"]
    answered = [lv for lv in r["accuracy"] if lv in prov["spec"]["levels"]]
    assert len(answered) == 4 and all(r[k][lv] >= 0.98 for k in ("check_exact", "check_copies") for lv in answered)
    assert decays_like_the_papers_base(r["accuracy"])
    assert all(a < 0.5 for lv, a in r["accuracy"].items() if lv not in answered)
    m, tok = load(str(SHIPPED_BASE))
    assert tok.get_vocab() == build_tokenizer().get_vocab()
    fresh = base_report(m, tok, n_per_level=30, temperature=1.0, seed=3)["accuracy"]
    for lv, a in r["accuracy"].items():
        se = max(0.05, (a * (1 - a) / 30) ** 0.5)
        assert abs(fresh[lv] - a) < 4.5 * se, (lv, fresh[lv], a)


@pytest.mark.slow
def test_no_test_question_is_in_the_shipped_base_corpus_in_either_order():
    """The shipped base's corpus, rebuilt from its recorded spec, holds none of the test questions (100 a level
    of the test ladder, seed 0) in either operand order, in its answers or its checks."""
    import json
    import re

    from dsh.training.laptop_base import SHIPPED_BASE

    spec = json.loads((SHIPPED_BASE / "dsh_provenance.json").read_text())["spec"]
    corpus = lt.base_corpus(spec["levels"], spec["weights"], spec["n_examples"], spec["check_fraction"],
                            seed=spec["train"]["seed"], exclude=lt.held_out(both_orders=True),
                            check_levels=spec["check_levels"])
    pairs = {tuple(map(int, re.search(r"(\d+) \* (\d+)", t.prompt).groups())) for t in corpus}
    test = lt.held_out()
    assert len(corpus) == spec["n_examples"] and not pairs & test and not pairs & {(b, a) for a, b in test}
    # the corpus does reach every level the ladder tests (checks) and the reversed orders (answers)
    assert {f"{len(str(a))}x{len(str(b))}" for a, b in pairs} >= set(lt.TEST_LEVELS)


class _Planted:
    """A pickle that writes a file when it is loaded (an attacker's state.pt)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (_touch, (self.path,))


def _touch(path):
    with open(path, "w") as f:
        f.write("pwned")
    return {}


def test_a_planted_or_corrupt_state_is_refused_and_never_run(tmp_path):
    """A state.pt that is a pickle of code is refused in one line and the code never runs (the file it would write
    does not appear); a corrupt one is refused the same way, naming the folder; both are left in place."""
    import torch

    tok = build_tokenizer()
    rows = pack(_rows(tok, n=20), 200, seed=0)
    marker = tmp_path / "ran.txt"
    work = tmp_path / "w"
    work.mkdir()
    torch.save({"model": _Planted(marker)}, work / "state.pt")
    before = (work / "state.pt").read_bytes()
    with pytest.raises(ValueError, match=r"^out .*w holds a state.pt that dsh did not write or cannot read"):
        _train(tmp_path, "w", rows, tok)
    assert not marker.exists() and (work / "state.pt").read_bytes() == before
    (work / "state.pt").write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match=r"holds a state.pt that dsh did not write or cannot read \(\w+"):
        _train(tmp_path, "w", rows, tok)
    torch.save({"step": 3}, work / "state.pt")          # a plain file of another shape
    with pytest.raises(ValueError, match=r"\(not a dsh pretraining state\)"):
        _train(tmp_path, "w", rows, tok)


KILL_POINTS = ("mid-training, after a periodic save", "during a state save", "during the final report",
               "during the write of train_stats.json", "during the model's save")


@pytest.fixture(scope="module")
def uninterrupted_base(tmp_path_factory):
    from dsh.training.laptop_base import BaseSpec, build_base

    spec = BaseSpec(model=SMALL, train=PretrainConfig(tokens=6_000, tokens_per_batch=512, warmup_steps=2, seed=0,
                                                      save_every=4),
                    n_examples=600, pack_length=256, report_n=2, curve_every=5, curve_n=1)
    root = tmp_path_factory.mktemp("base_whole")
    prov = build_base(root / "a", spec, progress=False)
    return spec, root / "a", prov


def _without_times(prov: dict) -> dict:
    out = {k: x for k, x in prov.items() if k not in ("wall_seconds", "provenance")}
    out["train"] = {k: x for k, x in prov["train"].items() if k not in ("seconds", "tokens_per_s")}
    out["loss_curve"] = [row[:3] for row in prov["loss_curve"]]      # (step, tokens, loss); its 4th is the time
    return out


@pytest.mark.slow
@pytest.mark.parametrize("point", KILL_POINTS)
def test_a_base_killed_at_five_points_resumes_to_the_same_bytes(tmp_path, monkeypatch, uninterrupted_base, point):
    """`dsh base` (build_base) interrupted at each point (a KeyboardInterrupt where a kill would land, with
    what a kill leaves there: a cut temporary, a cut file), then run again: the model folder's files are byte for
    byte an uninterrupted run's (its provenance without times), a run killed after training trains no step again,
    the work folder is gone, a user's file in it stays."""
    import json

    import torch

    from dsh.training import laptop_base
    from dsh.training import pretrain as pt

    spec, whole, prov_whole = uninterrupted_base
    prov_whole = json.loads(json.dumps(prov_whole))          # as the file holds it (lists for tuples)
    out = tmp_path / "b"
    (tmp_path / ".b.work" / "mine").mkdir(parents=True)
    (tmp_path / ".b.work" / "mine" / "notes.txt").write_text("keep me")
    calls = {"n": 0}

    def nth(k):
        calls["n"] += 1
        return calls["n"] == k

    if point == "mid-training, after a periodic save":
        real = pt.collate
        monkeypatch.setattr(pt, "collate", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt) if nth(7) else real(*a))
    elif point == "during a state save":
        real_save = torch.save

        def cut(obj, path, *a, **k):
            if nth(2):
                with open(path, "wb") as f:
                    f.write(b"\x80cut")
                raise KeyboardInterrupt
            return real_save(obj, path, *a, **k)
        monkeypatch.setattr(torch, "save", cut)
    elif point == "during the final report":
        real_report = laptop_base.base_report
        monkeypatch.setattr(laptop_base, "base_report", lambda m, t, n_per_level, **k: (_ for _ in ()).throw(
            KeyboardInterrupt) if n_per_level == spec.report_n else real_report(m, t, n_per_level=n_per_level, **k))
    elif point == "during the write of train_stats.json":
        def cut_stats(path, text):
            (path.parent / f".{path.name}.cut.tmp").write_text(text[:10])
            raise KeyboardInterrupt
        monkeypatch.setattr(pt, "write_text", cut_stats)
    else:
        real_model_save = laptop_base.save

        def cut_model(model, tok, folder, prov):
            real_model_save(model, tok, folder, prov)
            (folder / "model.safetensors").write_bytes(b"cut short")
            raise KeyboardInterrupt
        monkeypatch.setattr(laptop_base, "save", cut_model)
    with pytest.raises(KeyboardInterrupt):
        laptop_base.build_base(out, spec, progress=False)
    assert not out.exists()
    monkeypatch.undo()
    if point not in KILL_POINTS[:2]:     # killed after training: the finished state is found, no step trains again
        real_pretrain = laptop_base.pretrain
        monkeypatch.setattr(laptop_base, "pretrain", lambda *a, **k: real_pretrain(*a, **{**k, "stop_after": 0}))
    prov = laptop_base.build_base(out, spec, progress=False)
    monkeypatch.undo()
    assert not (tmp_path / ".b.saving").exists()
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in whole.iterdir())
    for p in whole.iterdir():
        if p.name != "dsh_provenance.json":
            assert p.read_bytes() == (out / p.name).read_bytes(), p.name
    assert _without_times(json.loads((out / "dsh_provenance.json").read_text())) == _without_times(prov_whole)
    assert _without_times(json.loads(json.dumps(prov))) == _without_times(prov_whole)
    assert sorted(p.name for p in (tmp_path / ".b.work").iterdir()) == ["mine"]
    assert (tmp_path / ".b.work" / "mine" / "notes.txt").read_text() == "keep me"


def test_a_saved_model_is_readable_like_any_file_the_user_writes(tmp_path):
    """transformers writes model.safetensors through a private temporary (mode 0600): dsh's saves give every file the
    mode of a plain open (0666 less the umask), so a model in a shared folder is readable by its other users."""
    import os
    import stat

    from dsh.llm.tiny import save

    tok = build_tokenizer()
    folder = save(make_model(tok, SMALL, seed=0), tok, tmp_path / "m", {"what": "test"})
    umask = os.umask(0)
    os.umask(umask)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o666 & ~umask}, modes
