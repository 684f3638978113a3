"""Gradient attribution in the laptop models: the laptop segmentation, the split on cases whose answer is
known, the length-law fit against known truth, the study end to end on the shipped base."""

import gzip
import json
import random
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

from dsh.experiment.run import attribution_fits as af
from dsh.experiment.run import attribution_study as st
from dsh.experiment.run import presets, steps
from dsh.llm import attribution as at
from dsh.llm.models import load
from dsh.measure.length_law import bootstrap_coverage, loglog_slope, mutual_inclusion, slope_verdict
from dsh.task import laptop_task as lt


@pytest.fixture(scope="module")
def base():
    model, tok = load(str(presets.LAPTOP.model))
    return model, tok


def _two_attempts(seed=0, level="1x4"):
    rng = random.Random(seed)
    while True:             # a multiplier of 1 admits no wrong attempt the check catches: draw again
        p = lt.draw(level, rng)
        t = lt.trace_from_attempts(p, [lt.wrong_attempt(p.a, p.b, rng)])
        if t is not None and t.decisions == ("RESAMPLE", "STOP"):
            return p, t.text


def test_laptop_parts_cover_the_response_in_order_and_name_each_writer():
    p, text = _two_attempts()
    parts = at.laptop_parts(text)
    assert [k for *_, k in parts] == ["attempt", "check", "decision", "decision", "attempt", "check", "decision"]
    assert parts[0][0] == 0 and parts[-1][1] == len(text)
    assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
    got = {k: [text[s:e] for s, e, kk in parts if kk == k] for k in ("attempt", "decision")}
    assert all(x.endswith(".") and "The answer is" in x for x in got["attempt"])
    assert got["decision"] == [lt.FAILS, f"\n{lt.MARKER}\n", lt.PASSES]
    cut = text[: text.index(lt.PASSES) - 3]                     # cut inside the second check: no second decision
    assert [k for *_, k in at.laptop_parts(cut)][-1] == "other"
    assert at.laptop_parts(text + "\n12") [-1][2] == "other"     # stray text after a passing verdict
    one = text.split("\nCheck")[0]                               # the first attempt alone
    assert at.laptop_parts(one) == [(0, len(one), "attempt")]    # one unchecked attempt: its STOP is the end of turn
    assert [k for *_, k in at.laptop_parts(one + "\n12")] == ["other"]


def test_segment_laptop_masks_tokens_by_part_and_adds_the_stop(base):
    _, tok = base
    p, text = _two_attempts(1)
    seg = at.segment_laptop(tok, p.question, text)
    ids = seg.input_ids[1:]
    masks = (seg.sample_mask, seg.check_mask, seg.decision_mask)
    assert not any((a & b).any() for i, a in enumerate(masks) for b in masks[i + 1:])      # disjoint
    assert int(sum(m.sum() for m in masks)) == len(tok(text, add_special_tokens=False)["input_ids"]) + 1
    assert tok.decode(ids[seg.decision_mask]) == f"{lt.FAILS}\n{lt.MARKER}\n{lt.PASSES}" + tok.eos_token
    attempts = [text[s:e] for s, e, k in at.laptop_parts(text) if k == "attempt"]
    assert seg.attempt_lengths == [len(tok(a, add_special_tokens=False)["input_ids"]) for a in attempts]
    assert tok.decode(ids[seg.sample_mask]) == "".join(attempts)
    # one unchecked attempt that stops: the end-of-turn token is pi_d's STOP, its only decision token
    one = text.split("\nCheck")[0]
    seg1 = at.segment_laptop(tok, p.question, one)
    assert tok.decode(seg1.input_ids[1:][seg1.decision_mask]) == tok.eos_token and not seg1.check_mask.any()
    assert tok.decode(seg1.input_ids[1:][seg1.sample_mask]) == one and len(seg1.attempt_lengths) == 1
    with pytest.raises(ValueError, match="no decision"):
        at.segment_laptop(tok, p.question, one, stopped=False)          # cut at the token limit: no STOP
    cut = at.segment_laptop(tok, p.question, text, stopped=False)       # cut right after the verdict: no end of turn
    assert int(cut.decision_mask.sum()) == int(seg.decision_mask.sum()) - 1
    stray = text.replace("\nThe answer is", f"\n{lt.PASSES}\nThe answer is", 1)   # a verdict before any answer
    with pytest.raises(ValueError, match="attempt holds a verdict"):
        at.segment_laptop(tok, p.question, stray)


class _FrozenAt(torch.nn.Module):
    """A policy whose logits at the masked target positions do not depend on the parameters."""

    def __init__(self, model, frozen):
        super().__init__()
        self.model, self.frozen = model, frozen

    def forward(self, input_ids):
        logits = self.model(input_ids=input_ids).logits
        keep = torch.cat([self.frozen, torch.zeros(1, dtype=torch.bool)])[None, :, None]
        return type("Out", (), {"logits": torch.where(keep, logits.detach(), logits)})()
def _gram64(parts: dict) -> torch.Tensor:
    """The Gram matrix of a trajectory's part gradients (attempt, check, decision) in float64."""
    v = torch.stack([parts[k] for k in ("attempt", "check", "decision")]).double()
    return v @ v.T


def test_packed_passes_give_each_trajectorys_part_gradients(base):
    """Several trajectories packed in one row give each trajectory's part gradients of every objective, as one
    trajectory at a time does (Gram matrices against float64 ones of that route's vectors; the reward's vectors
    themselves), the tied embedding included; with the model as its own reference no KL gradient."""
    from dsh.llm.packed_gradients import packed_part_grams

    model, tok = base
    ref = load(str(presets.LAPTOP.model))[0]
    with torch.no_grad():
        for q in ref.parameters():
            q.mul_(0.97)
    segs = [at.segment_laptop(tok, p.question, text) for p, text in (_two_attempts(k, lv) for k, lv in
                                                                    ((1, "1x3"), (2, "1x5"), (3, "1x2")))]
    one = _two_attempts(4, "1x4")[0]
    body, res = lt.attempt_text(one.a, one.b)
    segs.append(at.segment_laptop(tok, one.question, f"{body}\n{lt.ANSWER}{res}."))     # no check: an empty part
    adv = [0.7, -1.3, 0.0, 2.0]
    obj = ("reward", "kl_reward", "kl_k3", "sft", "dft")
    got = packed_part_grams(model, ref, segs, obj, adv, 1.5, keep=("reward",))
    assert model.config._attn_implementation == ref.config._attn_implementation == "sdpa"       # put back
    for seg, a, g in zip(segs, adv, got):
        want = at.all_part_gradients(model, ref, seg, obj, a, 1.5)
        for o in obj:
            w = _gram64(want[o])
            assert g["gram"][o].shape == (3, 3)
            # float rounding, which the KL terms' weights (functions of log pi - log pi_ref) magnify
            assert float((g["gram"][o].double() - w).abs().max()) <= 1e-4 * float(w.abs().max()) + 1e-12, o
        assert all(float((g["vectors"]["reward"][k] - want["reward"][k]).norm())
                   <= 1e-4 * float(want["reward"][k].norm()) + 1e-12 for k in want["reward"])
        assert float((g["k1"] - at.token_kl(model, ref, seg, 1.5)).abs().max()) < 1e-4
    assert float(got[3]["gram"]["sft"][1].abs().max()) == 0 and float(got[3]["gram"]["sft"][0, 0]) > 0  # no check
    assert float(got[2]["gram"]["reward"].abs().max()) == 0 and float(got[2]["gram"]["sft"][0, 0]) > 0   # A = 0
    emb = model.get_input_embeddings().weight
    assert model.get_output_embeddings().weight is emb                # tied: both terms land in one matrix
    alone = packed_part_grams(model, model, segs[:1], ("sft", "kl_k3"), [1.0])[0]
    assert float(alone["gram"]["kl_k3"].abs().max()) == 0 and float(alone["k1"].abs().max()) == 0
    for bad, match in (({"objectives": ("kl",)}, "objectives"), ({"keep": ("reward",), "objectives": ("sft",)}, "keep"),
                       ({"segs": []}, "segs"), ({"advantages": [1.0]}, "advantages"),
                       ({"advantages": [1.0, float("nan"), 1.0, 1.0]}, "advantages")):
        kw = {"segs": segs, "objectives": obj, "advantages": adv, **bad}
        with pytest.raises(ValueError, match=match):
            packed_part_grams(model, ref, kw.pop("segs"), kw.pop("objectives"), kw.pop("advantages"), **kw)


def test_a_study_loads_its_models_on_the_cpu_even_where_cuda_is_there(tmp_path, monkeypatch):
    """The segments' ids are CPU tensors and the packed kernels the CPU's: a study asks for its models on the CPU
    (load's default is CUDA where it is available, in bfloat16)."""
    asked = []

    def on_cpu_only(model, *args, device=None, **kw):
        asked.append(device)
        raise RuntimeError("stop here")

    monkeypatch.setattr(st, "load", on_cpu_only)
    base = str(presets.LAPTOP.model)
    with pytest.raises(RuntimeError, match="stop here"):
        st.run_study(base, base, tmp_path / "s.json.gz", st.StudySettings(levels=("1x2",), prompts_per_level=1))
    assert asked == ["cpu"] and not (tmp_path / "s.json.gz").exists()
    elsewhere = torch.nn.Linear(1, 1, device="meta")            # a model on another device: one line, named
    with pytest.raises(ValueError, match="^model must be on the CPU .*got meta$"):
        st.attribute_groups(elsewhere, elsewhere, None, [], st.OBJECTIVES)


def test_a_studys_rows_are_the_same_by_either_gradient_route(base):
    """attribute_groups' rows and group rows from packed passes equal those formed one trajectory at a time (norms
    and cosines to float rounding; every other field exactly)."""
    model, tok = base
    ref = load(str(presets.LAPTOP.model))[0]
    with torch.no_grad():
        for q in ref.parameters():
            q.mul_(0.98)
    samples = []
    for k, lv in enumerate(("1x2", "1x3", "1x4")):
        p, text = _two_attempts(10 + k, lv)
        samples += [{"question": p.question, "level": lv, "prompt": k, "response": r, "stopped": True, "reward": x,
                     "advantage": a} for r, x, a in ((text, 1.0, 1.0), (text.split("\nCheck")[0], 0.0, -1.0))]
    samples.append({**samples[0], "response": "", "prompt": 9})                     # left out: counted alike
    a = st.attribute_groups(model, ref, tok, samples, st.OBJECTIVES, 1.0, packed=False)
    b = st.attribute_groups(model, ref, tok, samples, st.OBJECTIVES, 1.0, packed=True)
    assert a[2]["skipped"] == b[2]["skipped"] == 1 and len(a[0]) == len(b[0]) == 6 and len(a[1]) == len(b[1]) == 3

    def close(x, y, where):
        if isinstance(x, dict):
            assert x.keys() == y.keys(), where
            for k in x:
                close(x[k], y[k], f"{where}.{k}")
        elif isinstance(x, float) and where.split(".")[-1] in ("attempt", "check", "decision", "stage", "cosine"):
            assert y == pytest.approx(x, rel=1e-4, abs=2e-5), where
        elif isinstance(x, float):
            assert y == pytest.approx(x, rel=1e-4, abs=1e-5), where
        else:
            assert x == y, where
    for i, (x, y) in enumerate(zip(a[0] + a[1], b[0] + b[1])):
        close(x, y, f"row {i}")
    assert np.allclose(a[2]["sum"], b[2]["sum"], atol=1e-4) and a[2]["n"] == b[2]["n"]
    assert st._packs([type("S", (), {"input_ids": torch.zeros(n)})() for n in (900, 900, 900, 3000, 10)], 2048) == \
        [[0, 1], [2], [3], [4]]


@pytest.mark.slow   # several seconds: make check leaves it out, make test runs it
def test_split_on_cases_whose_answer_is_known(base):
    model, tok = base
    p, text = _two_attempts(2)
    seg = at.segment_laptop(tok, p.question, text)
    # the parts add up to the gradient over all the response's tokens, computed directly
    for o in ("reward", "sft", "dft", "kl_k3", "kl_reward"):
        ref = load(str(presets.LAPTOP.model))[0]
        with torch.no_grad():
            for q in ref.parameters():
                q.mul_(0.97)
        g = at.part_gradients(model, ref, seg, o, 0.7)
        terms = at.objective_terms(model, ref, seg, o, 0.7)
        allm = seg.sample_mask | seg.check_mask | seg.decision_mask
        direct = torch.autograd.grad(terms[allm].sum(), list(model.parameters()))
        direct = torch.cat([d.flatten() for d in direct])
        diff = g["attempt"] + g["check"] + g["decision"] - direct
        assert float(diff.norm()) <= 1e-4 * float(direct.norm()) and float(direct.norm()) > 0, o   # float32 sums
        # one forward pass for every objective (the study's route) gives each part as the objective's own pass
        shared = at.all_part_gradients(model, ref, seg, ("sft", o, "kl_k1"), 0.7)[o]
        assert set(shared) == set(g) and all(float((shared[k] - g[k]).norm()) <= 1e-5 * float(g[k].norm()) + 1e-12
                                             for k in g), o
    # the surrogate reward of one trajectory is its SFT loss times -A, part by part (so its per-trajectory
    # attempt / decision ratio is the SFT loss's: chapter 08)
    rew, sft = at.part_gradients(model, model, seg, "reward", 0.7), at.part_gradients(model, model, seg, "sft")
    assert all(float((rew[k] + 0.7 * sft[k]).norm()) <= 1e-5 * float(rew[k].norm()) and float(rew[k].norm()) > 0
               for k in rew)
    # a reference equal to the policy: the KL terms give no gradient at all
    same = load(str(presets.LAPTOP.model))[0]
    for o in ("kl_k3", "kl_reward"):
        g = at.part_gradients(model, same, seg, o)
        assert all(float(x.abs().max()) == 0 for x in g.values()), o
    # decision tokens that do not depend on the parameters: no decision gradient for any objective
    frozen = _FrozenAt(model, seg.decision_mask)
    for o in ("reward", "sft", "dft"):
        g = at.part_gradients(frozen, model, seg, o)
        assert float(g["decision"].abs().max()) == 0 and float(g["attempt"].norm()) > 0
    # a one-token attempt: its part is the gradient of that token's log-probability (times the advantage)
    one = at.Segmented(seg.input_ids, torch.zeros_like(seg.sample_mask), seg.decision_mask, [1], seg.check_mask)
    k = int(seg.sample_mask.nonzero()[0, 0])
    one.sample_mask[k] = True
    g = at.part_gradients(model, model, one, "reward", -2.0)
    lp = torch.log_softmax(model(input_ids=seg.input_ids[None]).logits[0, k], -1)[seg.input_ids[k + 1]]
    want = torch.cat([d.flatten() for d in torch.autograd.grad(-2.0 * lp, list(model.parameters()))])
    assert float((g["attempt"] - want).norm()) <= 1e-5 * float(want.norm())
@pytest.mark.slow   # several seconds: make check leaves it out, make test runs it
def test_length_law_recovers_a_known_slope_with_its_stated_coverage():
    rng = np.random.default_rng(0)
    hits, n_rep = 0, 200
    for rep in range(n_rep):
        L = rng.uniform(10, 100, 120)
        ratio = 3.0 * L ** 0.8 * np.exp(rng.normal(0, 0.4, L.size))
        f = loglog_slope(L, ratio, n_boot=400, seed=rep)
        hits += f["ci"][0] <= 0.8 <= f["ci"][1]
    assert 0.88 <= hits / n_rep <= 0.99, hits
    f = loglog_slope([10, 20, 40, 80, -1, np.nan], [1, 2, 4, 8, 5, 5])
    assert f["n"] == 4 and f["span"] == pytest.approx(8) and f["slope"] == pytest.approx(1)
    assert loglog_slope([5, 5, 5], [1, 2, 3])["slope"] is None
    assert slope_verdict([0.7, 1.2], 1.0) == "holds" and slope_verdict([1.6, 2.0], 1.0) == "fails"
    assert slope_verdict([0.2, 1.2], 1.0) == "cannot tell" and slope_verdict([None, None], 0.0) == "cannot tell"
    with pytest.raises(ValueError, match="same length"):
        loglog_slope([1, 2], [1])


@pytest.mark.slow   # ~12 s: make check leaves it out, make test runs it
def test_cluster_bootstrap_covers_where_resampling_trajectories_does_not():
    """Trajectories come 8 to a question and share what the question adds to their ratio: resampling them one by one
    (the pairs bootstrap) covers the true slope about half the time, resampling questions about 95 %."""
    got = bootstrap_coverage(n_rep=200, seed=1)
    assert got["pairs"] < 0.7 and 0.88 <= got["questions"] <= 0.99, got
    # with nothing shared by a question's samples both resamplings cover
    alone = bootstrap_coverage(n_rep=100, question_sd=0.0, seed=2)
    assert alone["pairs"] >= 0.88 and alone["questions"] >= 0.88, alone
    with pytest.raises(ValueError, match="question_sd and sample_sd"):
        bootstrap_coverage(question_sd=-1)
    f = loglog_slope([10, 20, 40, 80, 80], [1, 2, 4, 8, 9], clusters=["a", "a", "b", "c", "c"])
    assert f["clusters"] == 3 and f["n"] == 5
    with pytest.raises(ValueError, match="clusters must give one label per pair"):
        loglog_slope([10, 20, 40], [1, 2, 4], clusters=["a"])


def test_study_on_the_shipped_base_writes_what_it_measured(tmp_path):
    base = str(presets.LAPTOP.model)
    settings = st.StudySettings(levels=("1x2", "1x5"), prompts_per_level=1, group=3, max_new_tokens=120,
                                min_signal=0)
    r = st.run_study(base, base, tmp_path / "a.json.gz", settings)
    with gzip.open(tmp_path / "a.json.gz", "rb") as f:         # gzipped, compact JSON: the record returned
        assert json.loads(f.read()) == json.loads(json.dumps(r))
    assert r["objectives"] == ["reward", "sft", "dft"]           # reference = the model: no KL terms
    assert len(r["trajectories"]) + r["kl_positions"]["skipped"] == 6 == r["samples"] and r["rounds"] == 1
    assert sum(r["kl_positions"]["skipped_why"].values()) == r["kl_positions"]["skipped"]
    # the base answers and stops: its end of turn is the decision (no check written)
    assert r["trajectories"] and all(t["checks"] == 0 and t["tokens"]["decision"] == 1 for t in r["trajectories"])
    assert set(r["fits"]) == {f"{o} / {p}" for o in ("reward", "sft", "dft", "reward_group", "kl_immediate")
                              for p in ("decision", "stage")}
    one = st.run_study(base, base, tmp_path / "one.json.gz", settings, packed=False)   # one trajectory at a time
    assert r["gradients"] == "packed" and one["gradients"] == "per trajectory"
    assert [t["L"] for t in one["trajectories"]] == [t["L"] for t in r["trajectories"]]
    for a, b in zip(r["trajectories"], one["trajectories"]):          # the two routes agree to float rounding
        for o, g in a["grad"].items():
            if g is not None:
                assert all(abs(g[k] - b["grad"][o][k]) <= 1e-3 * abs(g[k]) + 1e-9 for k in ("attempt", "decision"))
    with pytest.raises(ValueError, match="^packed must be true or false"):
        st.run_study(base, base, tmp_path / "b.json.gz", settings, packed="yes")
    for bad, match in ((dict(levels=("2x2",)), "levels"), (dict(group=1), "group"), (dict(temperature=0), "temp"),
                       (dict(objectives=("kl",)), "objectives"), (dict(prompts_per_level=0), "prompts_per_level"),
                       (dict(min_signal=-1), "min_signal"), (dict(max_rounds=0), "max_rounds")):
        with pytest.raises(ValueError, match=match):
            st.run_study(base, base, tmp_path / "b.json.gz", st.StudySettings(**bad))
    for name in ("b.txt", "b.json"):                            # a plain .json name is refused too
        with pytest.raises(ValueError, match=r"^out must name a \.json\.gz file"):
            st.run_study(base, base, tmp_path / name, settings)
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(ValueError, match="^out cannot be written: .*a_file is a file"):     # before any sampling
        st.run_study(base, base, tmp_path / "a_file" / "b.json.gz", settings)
    assert not (tmp_path / "b.json.gz").exists()


@pytest.mark.slow
def test_rounds_add_new_questions_until_every_fit_holds_enough_trajectories(base):
    model, tok = base
    one = st.StudySettings(levels=("1x2", "1x3"), prompts_per_level=1, group=3, max_new_tokens=60)
    objectives = ("reward", "sft", "dft")          # the base against itself: no KL terms
    first = st.sample_groups(model, tok, one)
    assert st.sample_groups(model, tok, one) == first                                   # seeded
    got = st.study_rounds(model, model, tok, replace(one, min_signal=10 ** 6, max_rounds=3), objectives)
    assert got["rounds"] == 3 and got["samples"] == 18
    assert sorted({t["prompt"] for t in got["trajectories"]}) <= list(range(6))         # a cluster per question
    assert st.questions(one, 3)[:2] == st.questions(one)
    alone = st.study_rounds(model, model, tok, replace(one, min_signal=0, max_rounds=3), objectives)
    assert alone["rounds"] == 1 and alone["samples"] == 6                               # 0 needed: one round
    rows0, _, _ = st.attribute_groups(model, model, tok, first, objectives, one.temperature)
    assert alone["trajectories"] == rows0 == [t for t in got["trajectories"] if t["prompt"] < 2]
    # the rule counts what the fits take: every objective against the decision and the stage, no group fit
    counts = st.fit_counts(got["trajectories"], objectives)
    f = af.fits(got["trajectories"], got["groups"], objectives)
    assert set(counts) == {f"{o} / {a}" for o in objectives for a in ("decision", "stage")}
    assert all(counts[k] == f[k]["n"] for k in counts)
    assert st.counted_terms(("reward", "kl_k3"))[-2:] == ["kl_immediate / decision", "kl_immediate / stage"]
    least = min(counts.values())
    assert st.enough(got["trajectories"], objectives, least) and not st.enough(got["trajectories"], objectives, least + 1)
    n = st.decision_count(tok, first)
    assert n["decision"] + sum(n["left_out"].values()) == 6 and n["signal"] <= n["decision"]
    empty = {**first[0], "response": "", "stopped": True}     # the end of turn as the first token: named as such
    assert st.decision_count(tok, [empty]) == {"decision": 0, "signal": 0, "left_out": {"empty response": 1}}


@pytest.mark.slow
def test_a_study_continued_from_its_first_rounds_equals_one_drawn_whole(tmp_path):
    base = str(presets.LAPTOP.model)
    s = st.StudySettings(levels=("1x2", "1x4"), prompts_per_level=1, group=3, max_new_tokens=80, min_signal=10 ** 6,
                         max_rounds=1)
    short = st.run_study(base, base, tmp_path / "short.json.gz", s)
    whole = st.run_study(base, base, tmp_path / "whole.json.gz", replace(s, max_rounds=3))
    cont = st.run_study(base, base, tmp_path / "cont.json.gz", replace(s, max_rounds=3), previous=short)
    assert short["rounds"] == 1 and whole["rounds"] == cont["rounds"] == 3 and cont["samples"] == whole["samples"]
    for k in ("trajectories", "groups", "fits", "settings", "objectives"):
        assert cont[k] == whole[k], k
    assert np.allclose(cont["kl_positions"]["n"], whole["kl_positions"]["n"])
    assert cont["resumed"]["rounds"] == 1 and "resumed" not in whole
    assert st.counts_after(whole, 1) == st.fit_counts(short["trajectories"], short["objectives"])     # its first round
    assert st.counts_after(whole, 3) == st.fit_counts(whole["trajectories"], whole["objectives"])
    with pytest.raises(ValueError, match=r"rounds must be 1 \.\.\. 3"):
        st.counts_after(whole, 4)
    w = (short["weights"], short["reference_weights"])
    obj = tuple(short["objectives"])
    s3 = replace(s, max_rounds=3)
    assert st.resume_point(short, s3, obj, w) == 1
    assert st.resume_point(dict(short, method=1), s3, obj, w) is None                  # another split
    assert st.resume_point(short, replace(s3, group=2), obj, w) is None                # other settings
    assert st.resume_point(short, s3, obj, ("x", "y")) is None                         # other weights
    assert st.resume_point(whole, s, obj, w) is None                                    # more rounds than allowed
    assert short["gradients"] == st.GRADIENTS == "packed"
    assert st.resume_point({k: x for k, x in short.items() if k != "gradients"}, s3, obj, w) is None  # one at a time
    # a study whose rule would have stopped before its last round is not this study's first rounds
    assert st.resume_point(whole, replace(s3, min_signal=0, max_rounds=4), obj, w) is None
    with pytest.raises(ValueError, match="previous must be"):
        st.run_study(base, base, tmp_path / "bad.json.gz", replace(s3, group=2), previous=short)
    assert not (tmp_path / "bad.json.gz").exists()


def test_cluster_median_resamples_questions_and_covers_a_known_median():
    from dsh.measure.length_law import cluster_median

    rng = np.random.default_rng(3)
    hits = 0
    for rep in range(100):      # 40 questions x 8 samples, each question shifting its samples: true median 0
        x = np.repeat(rng.normal(0, 1, 40), 8) + rng.normal(0, 0.2, 320)
        m = cluster_median(x, np.repeat(np.arange(40), 8), n_boot=300, seed=rep)
        hits += m["ci"][0] <= 0 <= m["ci"][1]
        assert m["ci"][0] <= m["median"] <= m["ci"][1]
    assert 0.88 <= hits / 100 <= 1.0, hits
    assert cluster_median([np.nan], ["a"])["median"] is None
    with pytest.raises(ValueError, match="clusters must give one label per value"):
        cluster_median([1, 2], ["a"])


def _study(arm, step, rows, validation=None):
    return {"arm": arm, "step": step, "validation": validation, "trajectories": rows,
            "fits": {"kl_k3 / decision": {"n": 5, "span": 2.0, "slope": 1.0, "ci": [0.8, 1.2], "predicted": 1.0,
                                          "verdict": "holds", "silent": 0}}}


def test_dynamics_table_weighs_the_kl_by_beta_and_counts_only_trajectories_with_an_advantage():
    from dsh.experiment import report

    rows = [{"prompt": i, "grad": {"reward": None if i == 0 else {"attempt": 10.0 * i, "decision": 1.0},
                                   "kl_k3": {"attempt": 100.0, "decision": 4.0 * i}}} for i in range(5)]
    val = {"p_s": 0.5, "p_s_ci": [0.4, 0.6], "p_d_given_correct": 0.9, "p_d_given_wrong": 0.3,
           "p_d_given_wrong_ci": [0.2, 0.4]}
    t = report.dynamics_table({"a": _study("rl-s0", 80, rows, val), "b": _study("rl-s0", 0, rows[:1])},
                              {"rl-s0": 0.01}).set_index("step")
    assert list(t.index) == [0, 80]                                    # ordered by step
    assert t.loc[80, "reward attempt"] == 25.0                         # median of 10, 20, 30, 40: no advantage, no row
    assert t.loc[80, "kl_k3 attempt"] == pytest.approx(1.0) and t.loc[80, "kl_k3 decision"] == pytest.approx(0.08)
    assert (t.loc[80, "p_s"], t.loc[80, "p_s low"], t.loc[80, "p_dW high"]) == (0.5, 0.4, 0.4)
    assert t.loc[0, "reward attempt"] is None or np.isnan(t.loc[0, "reward attempt"])
    assert np.isnan(t.loc[0, "p_s"]) and t.loc[80, "trajectories"] == 5


def test_reproduction_asks_each_slope_inside_the_others_interval():
    from dsh.experiment import report

    def one(slope, lo, hi):
        return {"fits": {"kl_k3 / decision": {"n": 9, "span": 2.0, "slope": slope, "ci": [lo, hi], "predicted": 1.0,
                                              "verdict": "cannot tell", "silent": 0},
                         "sft / decision": {"n": 0, "span": None, "slope": None, "ci": [None, None],
                                            "predicted": None, "verdict": None, "silent": 0}}}

    assert report.reproduction(one(1.0, 0.5, 1.5), one(1.2, 0.9, 1.6)).reproduced.tolist() == [True]
    assert report.reproduction(one(1.0, 0.5, 1.5), one(1.4, 1.1, 1.8)).reproduced.tolist() == [False]   # 1.0 < 1.1
    assert report.reproduction(one(1.0, 0.9, 1.1), one(1.4, 0.5, 1.8)).reproduced.tolist() == [False]   # 1.4 > 1.1
    assert len(report.reproduction(one(1.0, 0.5, 1.5), one(1.0, 0.5, 1.5))) == 1        # a term without a slope: out
    r = report.reproduction(one(1.0, 0.5, 1.5), one(1.2, 0.9, 1.6))
    assert r.chance.iloc[0] == pytest.approx(mutual_inclusion([0.5, 1.5], [0.9, 1.6]))
    miss = report.reproduction(one(1.0, 0.9, 1.1), one(1.4, 0.5, 1.8))
    c = report.reproduction_count([r, miss])
    p = [mutual_inclusion([0.5, 1.5], [0.9, 1.6]), mutual_inclusion([0.9, 1.1], [0.5, 1.8])]
    assert c["reproduced"] == 1 and c["slopes"] == 2 and c["expected"] == pytest.approx(sum(p))
    assert c["high"] - c["expected"] == pytest.approx(1.96 * sum(x * (1 - x) for x in p) ** 0.5)
    with pytest.raises(ValueError, match="tables must be"):
        report.reproduction_count([])
    # the same fits in two sets of studies: disjoint where the intervals do not meet
    both = report.compare_fits({"m": one(1.0, 0.9, 1.1)}, {"m": one(1.4, 1.2, 1.8)}, ("a", "b"))
    assert both.disjoint.tolist() == [True] and list(both.index) == [("m", "kl_k3")]
    assert both["slope (b)"].iloc[0] == 1.4 and "pairs (a)" in both
    assert report.compare_fits({"m": one(1.0, 0.9, 1.3)}, {"m": one(1.4, 1.2, 1.8)}).disjoint.tolist() == [False]
    assert report.compare_fits({"m": one(1.0, 0.9, 1.1)}, {"x": one(1.4, 1.2, 1.8)}).empty     # no shared study
    for kw, match in ((dict(labels=("a", "a")), "labels"), (dict(against="check"), "against")):
        with pytest.raises(ValueError, match=match):
            report.compare_fits({"m": one(1.0, 0.9, 1.1)}, {"m": one(1.4, 1.2, 1.8)}, **kw)


def test_mutual_inclusion_is_the_rate_at_which_two_estimates_of_one_slope_reproduce():
    """Against known truth: pairs of normal estimates of one slope with standard errors s0 and s1 and their 95 %
    intervals; the share in which each lies inside the other's interval matches the formula."""
    rng = np.random.default_rng(0)
    z = 1.959963984540054
    for s0, s1 in ((0.3, 0.3), (0.2, 0.5), (0.5, 0.1)):
        a, b = rng.normal(1.0, s0, 200_000), rng.normal(1.0, s1, 200_000)
        inside = (np.abs(a - b) <= z * s1) & (np.abs(a - b) <= z * s0)
        p = mutual_inclusion([1 - z * s0, 1 + z * s0], [1 - z * s1, 1 + z * s1])
        assert abs(inside.mean() - p) < 4 * np.sqrt(p * (1 - p) / a.size), (s0, s1, inside.mean(), p)
    assert mutual_inclusion([0, 1], [5, 6]) == pytest.approx(0.8342, abs=1e-4)     # equal widths: 1 slope in 6 missed
    for bad, match in ((([1, 0], [0, 1]), "ci0"), (([0, 1], [0, float("nan")]), "ci1"), (([0, 1], [0]), "ci1")):
        with pytest.raises(ValueError, match=match):
            mutual_inclusion(*bad)
    with pytest.raises(ValueError, match="level"):
        mutual_inclusion([0, 1], [0, 1], level=1.0)


def test_joint_cluster_slopes_resample_the_fits_together():
    """One column is loglog_slope's cluster bootstrap (the same draws when every fit holds every cluster); fits on the
    same pairs move together (correlation 1), fits on independent noise over the same clusters do not."""
    from dsh.measure.length_law import joint_cluster_slopes, loglog_slope

    rng = np.random.default_rng(3)
    q = np.repeat(np.arange(200), 4)                                  # 200 questions, 4 trajectories each
    L = rng.integers(5, 60, q.size).astype(float)
    noise = rng.normal(0, 0.4, q.size) + rng.normal(0, 0.3, 200)[q]  # within- and between-question noise
    y1, y2 = L ** 1.0 * np.exp(noise), L ** 0.2 * np.exp(rng.normal(0, 0.4, q.size))
    keys, boots = joint_cluster_slopes({"a": (L, y1, q), "b": (L, y2, q), "a again": (L, y1, q)}, 2000, seed=5)
    assert keys == ["a", "a again", "b"]
    one = loglog_slope(L, y1, n_boot=2000, seed=5, clusters=q)
    assert np.quantile(boots[:, 0], [0.025, 0.975]) == pytest.approx(one["ci"], abs=1e-9)
    c = np.corrcoef(boots.T)
    assert c[0, 1] == pytest.approx(1.0) and abs(c[0, 2]) < 0.25     # chance correlation of 200 questions: ~0.07
    assert abs(np.nanmean(boots[:, 2]) - 0.2) < 0.1 and abs(np.nanmean(boots[:, 0]) - 1.0) < 0.15
    for bad, match in (({}, "series must map"), ({"a": (L, y1)}, "must be \\(lengths"),
                       ({"a": (L, y1[:5], q)}, "of one length")):
        with pytest.raises(ValueError, match=match):
            joint_cluster_slopes(bad)


def test_reproduction_count_with_correlated_slopes_matches_simulated_repeats():
    """Against known truth: K slopes estimated with correlated normal errors (two blocks, r = 0.8 within, 0 between)
    and known standard errors; many independent pairs of runs, each slope's 95 % intervals compared as reproduction()
    does. The count's mean, 95 % range and the chance that all reproduce match reproduction_count given the
    correlation; without it the range is narrower than the truth's."""
    from dsh.experiment import report

    z = 1.959963984540054
    keys = pd.MultiIndex.from_tuples([(f"t{k}", "decision") for k in range(6)], names=["term", "against"])
    r = np.kron(np.eye(2), np.full((3, 3), 0.8)) + 0.2 * np.eye(6)
    corr = pd.DataFrame(r, index=keys, columns=keys)
    s0, s1 = np.array([0.2, 0.3, 0.25, 0.2, 0.4, 0.3]), np.array([0.25, 0.3, 0.2, 0.2, 0.3, 0.35])
    rng = np.random.default_rng(11)
    n = 100_000
    a = rng.multivariate_normal(np.ones(6), r * np.outer(s0, s0), n)
    b = rng.multivariate_normal(np.ones(6), r * np.outer(s1, s1), n)
    hit = (np.abs(a - b) <= z * s0) & (np.abs(a - b) <= z * s1)
    counts = hit.sum(1)
    table = pd.DataFrame({"low (t0)": 1 - z * s0, "high (t0)": 1 + z * s0, "low (t1)": 1 - z * s1,
                          "high (t1)": 1 + z * s1, "reproduced": True}, index=keys)
    table["chance"] = [mutual_inclusion([lo0, hi0], [lo1, hi1]) for lo0, hi0, lo1, hi1 in
                       table[["low (t0)", "high (t0)", "low (t1)", "high (t1)"]].itertuples(index=False)]
    got = report.reproduction_count([table, table], [corr, (corr, corr)], draws=200_000, seed=2)
    truth = counts + rng.permutation(counts)                          # two independent tables
    assert got["expected"] == pytest.approx(truth.mean(), abs=0.04)
    lo, hi = np.quantile(truth, [0.025, 0.975])
    assert abs(got["low"] - lo) <= 1 and abs(got["high"] - hi) <= 1
    p_all = hit.all(1).mean() ** 2
    assert got["p_all"] == pytest.approx(p_all, abs=0.01) and got["range_by"].startswith("correlated")
    alone = report.reproduction_count([table, table])
    assert alone["high"] - alone["low"] < got["high"] - got["low"] and alone["p_all"] < p_all / 2
    eye = pd.DataFrame(np.eye(6), index=keys, columns=keys)
    flat = report.reproduction_count([table, table], [eye, eye], draws=200_000)
    assert flat["p_all"] == pytest.approx(alone["p_all"], abs=0.005)
    assert abs(flat["low"] - alone["low"]) <= 1 and abs(flat["high"] - alone["high"]) <= 1
    for bad, match in (([corr], "one entry per table"), ([corr, "x"], "correlations\\[i\\] must be"),
                       ([corr, corr.iloc[:3, :3]], "lacks the table's slopes")):
        with pytest.raises(ValueError, match=match):
            report.reproduction_count([table, table], bad)


def test_slope_correlation_of_a_committed_study():
    """Every fit with a slope, once; symmetric with a unit diagonal; SFT (no reflection) writes a check in 2 of its
    2,635 trajectories, so its SFT-loss fits against the decision and against the stage are nearly one fit."""
    from pathlib import Path

    from dsh.core.files import read_json

    study = read_json(Path(__file__).parents[1] / "book/results/laptop-wide/attribution/sft-s0.json.gz")
    c = af.slope_correlation(study, n_boot=300)
    fitted = {tuple(k.split(" / ")) for k, f in study["fits"].items() if f["slope"] is not None}
    assert set(c.index) == set(c.columns) == fitted
    assert np.allclose(c.to_numpy(), c.to_numpy().T) and np.allclose(np.diag(c), 1)
    assert sum(t["checks"] > 0 for t in study["trajectories"]) == 2
    assert c.loc[("sft", "decision"), ("sft", "stage")] > 0.99
    with pytest.raises(ValueError, match="study must be a study record"):
        af.slope_correlation({"fits": {}})


def test_bad_attribution_overrides_are_one_line_before_any_work(tmp_path):
    from dsh.experiment.run import pipeline

    for bad, fragment in (({"prompts": 3}, "attribution_overrides must be one of levels"),
                          ({"seed": 3}, "attribution_overrides must be one of levels"),
                          ({"group": 1}, "group must be an integer >= 2"),
                          ({"levels": "2x2"}, "levels must be laptop levels 1xN"),
                          ([1], "attribution_overrides must be a dict")):
        with pytest.raises(ValueError, match=fragment):
            pipeline.run_pipeline("laptop", results_dir=str(tmp_path / "r"), runs_dir=str(tmp_path / "w"),
                                  attribution_overrides=bad, progress=False)
        assert not (tmp_path / "r").exists() and not (tmp_path / "w").exists()
    with pytest.raises(ValueError, match="preset 'ci' runs no attribution study"):
        pipeline.run_pipeline("ci", results_dir=str(tmp_path / "r"), runs_dir=str(tmp_path / "w"),
                              attribution_overrides={"group": 3}, progress=False)
    assert steps.study_settings(presets.LAPTOP, {"levels": "1x3"}).levels == ("1x3",)


def test_the_pipeline_step_reuses_a_study_only_of_the_same_method_settings_and_weights(tmp_path):
    from dsh.core.files import write_json_gz
    from dsh.experiment.run.steps import Clock, attribution_stage

    base = str(presets.LAPTOP.model)
    s = st.StudySettings(levels=("1x2",), prompts_per_level=1, group=2, max_new_tokens=60, min_signal=0)
    first = attribution_stage(base, base, tmp_path, "base", s, tmp_path, Clock(False))
    path = tmp_path / "base.json.gz"
    assert first["method"] == st.METHOD and path.is_file()
    stamp = path.read_bytes()
    reused = attribution_stage(base, base, tmp_path, "base", s, tmp_path, Clock(False))
    assert reused == json.loads(json.dumps(first))                                             # read back
    assert path.read_bytes() == stamp
    write_json_gz(path, dict(first, method=1, trajectories=[]))             # another split: computed again
    again = attribution_stage(base, base, tmp_path, "base", s, tmp_path, Clock(False))
    assert again["method"] == st.METHOD and again["trajectories"] == first["trajectories"] and "resumed" not in again
    write_json_gz(path, dict(first, method=2, settings=dict(first["settings"], max_rounds=4)))
    taken = attribution_stage(base, base, tmp_path, "base", s, tmp_path, Clock(False))   # method 2: its rounds taken
    assert taken["resumed"] == {"rounds": 1, "method": 2, "commit": first["commit"], "date": first["date"],
                                "wall_s": first["wall_s"]}
    assert {k: taken[k] for k in ("trajectories", "fits", "rounds", "samples")} == \
        {k: first[k] for k in ("trajectories", "fits", "rounds", "samples")} and taken["settings"] == first["settings"]
    other = attribution_stage(base, base, tmp_path, "base", replace(s, group=3), tmp_path, Clock(False))
    assert len(other["trajectories"]) + other["kl_positions"]["skipped"] == 3                  # new settings


def test_the_censoring_robust_fit_recovers_a_known_slope_and_its_own_span():
    """Trajectories whose log(|g_attempt| / |g_decision|) = 1.0 * log L + noise on 6 levels (L 10 ... 80: 8x), a
    fifth of them with a silent decision that is largest where the ratio is largest (censoring that biases a fit which
    drops them): the per-level medians with silent = +inf recover the slope, and the span is the levels' own."""
    import math
    import random

    from dsh.experiment.run.attribution_fits import SILENT, robust_fit

    rng = random.Random(0)
    rows = []
    for k, L in enumerate((10, 15, 22, 33, 50, 80)):
        for i in range(60):
            y = math.log(L) + rng.gauss(0, 0.3)
            silent = y > math.log(L) + 0.25 and rng.random() < 0.6     # the high ratios go silent
            attempt = 50.0
            decision = attempt * SILENT / 10 if silent else attempt / math.exp(y)
            rows.append({"level": f"1x{k + 1}", "L": L, "prompt": 100 * k + i // 8,
                         "grad": {"kl_k3": {"attempt": attempt, "decision": decision}},
                         "kl": {"attempt": 1.0, "decision": 0.1}})
    r = robust_fit({"trajectories": rows}, "kl_k3", n_boot=300)
    assert r["ci"][0] <= 1.0 <= r["ci"][1] and abs(r["slope"] - 1.0) < 0.1, r
    assert r["span"] == pytest.approx(8.0) and r["levels"] == [f"1x{k}" for k in range(1, 7)] and r["silent"] > 30
    # more than half silent on a level: its median is +inf, the level is named, not fitted
    for t in rows:
        if t["level"] == "1x6":
            t["grad"]["kl_k3"]["decision"] = 0.0
    r = robust_fit({"trajectories": rows}, "kl_k3", n_boot=100)
    assert r["censored_levels"] == ["1x6"] and "1x6" not in r["levels"] and r["span"] == pytest.approx(5.0)


def test_the_excess_over_sft_is_one_for_a_kl_to_go_and_zero_for_a_balanced_term():
    """A term whose attempt/decision ratio is the SFT loss's times L (the theorem's KL-to-go) has excess slope 1, one
    whose ratio is the SFT loss's times a constant 0; the decision's per-token k1 per level is read back as given."""
    import random

    from dsh.experiment.run.attribution_fits import decision_kl_by_level, excess_fit

    rng = random.Random(1)
    rows = []
    for k, L in enumerate((10, 20, 40, 80)):
        for i in range(40):
            sft_ratio = L * rng.uniform(0.5, 2.0)          # a sum of L scores against one
            noise = rng.uniform(0.9, 1.1)
            rows.append({"level": f"1x{k + 1}", "L": L, "prompt": 10 * k + i // 8, "tokens": {"attempt": L, "decision": 1},
                         "kl": {"attempt": 0.1 * L, "decision": 0.01 * (k + 1)},
                         "grad": {"sft": {"attempt": sft_ratio, "decision": 1.0},
                                  "kl_reward": {"attempt": sft_ratio * L * noise, "decision": 1.0},
                                  "kl_k3": {"attempt": 3 * sft_ratio * noise, "decision": 1.0}}})
    up, flat = excess_fit({"trajectories": rows}, "kl_reward"), excess_fit({"trajectories": rows}, "kl_k3")
    assert up["ci"][0] < 1 < up["ci"][1] and abs(up["slope"] - 1) < 0.05
    assert flat["ci"][0] < 0 < flat["ci"][1] and abs(flat["slope"]) < 0.05
    per = decision_kl_by_level({"trajectories": rows}, n_boot=50)
    assert [round(x["decision"]["median"], 4) for x in per.values()] == [0.01, 0.02, 0.03, 0.04]
    assert all(x["attempt"]["median"] == pytest.approx(0.1) and x["n"] == 40 for x in per.values())
