"""dsh.llm.engine against model.generate: the same greedy tokens on the embedded model, the same sampling
distribution on a tiny model, reproducible from its seed, and clear errors."""

import dataclasses
import json
import math

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from dsh.experiment.run import evaluate
from dsh.llm import models
from dsh.llm.engine import Engine, supports
from dsh.llm.scale import kv_bytes_per_token
from dsh.measure import calibration
from dsh.task import problems, records

pytestmark = pytest.mark.slow   # loads or trains the embedded model (make check leaves it out)


@pytest.fixture(scope="module")
def embedded():
    return models.load("embedded")


@pytest.fixture(scope="module")
def tiny():
    """A 2-layer llama with grouped-query attention (4 heads over 2 KV heads) and peaked logits."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=12, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, eos_token_id=11,
                      pad_token_id=0, bos_token_id=1)
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        m.lm_head.weight.mul_(60.0)  # far from uniform, so a wrong distribution shows
    return m


def _hf_greedy(model, tok, prompts, max_new):
    eos = set(model.generation_config.eos_token_id)
    enc = tok([tok.decode(p) for p in prompts], return_tensors="pt", padding=True, add_special_tokens=False)
    assert [x[m.bool()].tolist() for x, m in zip(enc["input_ids"], enc["attention_mask"])] == prompts
    with torch.no_grad():
        o = model.generate(**enc, max_new_tokens=max_new, do_sample=False, pad_token_id=tok.pad_token_id)
    out = []
    for row in o[:, enc["input_ids"].shape[1]:].tolist():
        seq = []
        for t in row:
            seq.append(t)
            if t in eos:
                break
        out.append(seq)
    return out


def test_greedy_equals_generate_on_the_embedded_model(embedded):
    """Fails if any cache write, RoPE position, GQA grouping, the length buckets or the refilling of
    freed slots were wrong: every token of every row must equal model.generate's."""
    model, tok = embedded
    qs = [p.question for p in problems.test_problems(["2x2", "3x3", "3x7"], 2, 0)]
    prompts = [tok(records.chat_prompt(tok, q))["input_ids"] for q in qs]
    prompts[1] = prompts[1] + tok(" Show each digit.")["input_ids"]          # unequal prompt lengths
    ref = _hf_greedy(model, tok, prompts, 40)
    eng = Engine(model, model.generation_config.eos_token_id, slots=4, max_len=160, bucket=16, sync_every=5)
    got = eng.generate(prompts, 40, temperature=0)                             # 6 prompts through 4 slots
    assert [g.tokens for g in got] == ref
    assert all(g.stopped == (g.tokens[-1] in model.generation_config.eos_token_id) for g in got)


def _frequencies(rows, position, vocab):
    c = torch.zeros(vocab)
    for r in rows:
        if len(r) > position:
            c[r[position]] += 1
    return c


def test_sampling_follows_the_models_distribution(tiny):
    """Token frequencies of the engine against the exact first-token distribution and against
    model.generate's third tokens (two-sample chi-square); fails for a wrong temperature, a sampler
    that favours the argmax, or KV positions that drift."""
    prompt, n, T = [1, 5, 7, 2], 3000, 0.8
    eng = Engine(tiny, [11], slots=256, max_len=16, bucket=8, sync_every=2)
    rows = [g.tokens for g in eng.generate([prompt] * n, 3, temperature=T, seed=1)]
    with torch.no_grad():
        p = torch.softmax(tiny(torch.tensor([prompt])).logits[0, -1] / T, -1)
    obs = _frequencies(rows, 0, 12)
    keep = p * n >= 5
    chi2 = (((obs - n * p) ** 2) / (n * p))[keep].sum().item()
    dof = int(keep.sum()) - 1
    assert dof >= 2, p
    assert chi2 < dof + 4 * math.sqrt(2 * dof) + 6, (obs, n * p)
    torch.manual_seed(2)
    with torch.no_grad():
        o = tiny.generate(torch.tensor([prompt] * n), max_new_tokens=3, do_sample=True, temperature=T, top_k=0,
                          top_p=1.0, pad_token_id=0, eos_token_id=11)
    ref = [r[4:] for r in o.tolist()]
    a, b = _frequencies(rows, 2, 12), _frequencies(ref, 2, 12)
    both = (a + b) >= 10
    chi2 = (((a - b) ** 2) / (a + b))[both].sum().item()
    dof = int(both.sum()) - 1
    assert dof >= 2
    assert chi2 < dof + 4 * math.sqrt(2 * dof) + 6, (a, b)
    # a too-high temperature is detected by the same statistic
    hot = [g.tokens for g in eng.generate([prompt] * n, 1, temperature=3.0, seed=1)]
    obs = _frequencies(hot, 0, 12)
    assert (((obs - n * p) ** 2) / (n * p))[keep].sum().item() > dof + 4 * math.sqrt(2 * dof) + 6


def test_same_seed_same_outputs_and_limits(tiny):
    eng = Engine(tiny, [11], slots=8, max_len=24, bucket=8, sync_every=3)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]] * 5
    a = eng.generate(prompts, 10, seed=7)
    b = eng.generate(prompts, 10, seed=7)
    c = eng.generate(prompts, 10, seed=8)
    assert [g.tokens for g in a] == [g.tokens for g in b]
    assert [g.tokens for g in a] != [g.tokens for g in c]
    for g in a:
        assert 1 <= len(g.tokens) <= 10
        assert g.stopped == (g.tokens[-1] == 11) and 11 not in g.tokens[:-1]
        assert len(g.text_tokens) == len(g.tokens) - g.stopped
        assert g.stopped or len(g.tokens) == 10


# the shipped laptop base in make test, the embedded 135M model in make test-all (~20-60 s each)
MODELS = [pytest.param("laptop", id="laptop-base"), pytest.param("embedded", id="embedded", marks=pytest.mark.full)]


def _model_and_levels(which):
    from dsh.training.laptop_base import SHIPPED_BASE

    return (str(SHIPPED_BASE), ["1x2", "1x3"]) if which == "laptop" else ("embedded", None)


@pytest.mark.parametrize("which", MODELS)
def test_evaluate_backends_agree_when_greedy(tmp_path, which):
    import json

    model, levels = _model_and_levels(which)
    outs = {}
    for backend in ("dsh", "hf"):
        settings = evaluate.EvalSettings(levels=levels[1:] if levels else ["3x3"], n_per_level=3, temperature=0.0,
                                         max_new_tokens=20, batch_size=2)    # one level: records sorted by index
        path = evaluate.evaluate(model, out=str(tmp_path / f"{backend}.jsonl"), settings=settings, backend=backend,
                                 progress=False)
        outs[backend] = sorted((json.loads(x) for x in path.read_text().splitlines()), key=lambda r: r["index"])
    assert outs["dsh"] == outs["hf"]


def test_bad_input(tiny):
    with pytest.raises(ValueError, match="^model is not supported by dsh.llm.engine: model_type 'gpt2'"):
        Engine(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=10)), [0])
    assert supports(tiny) is None
    with pytest.raises(ValueError, match="^eos_token_ids must name at least one"):
        Engine(tiny, [])
    with pytest.raises(ValueError, match="^slots must be an integer >= 1"):
        Engine(tiny, [11], slots=0)
    with pytest.raises(ValueError, match="^cuda_graphs must be False"):
        Engine(tiny, [11], cuda_graphs=True)
    eng = Engine(tiny, [11], slots=2, max_len=8)
    with pytest.raises(ValueError, match="^max_len=8 is too small for prompt 0"):
        eng.generate([[1, 2, 3]], 6)
    with pytest.raises(ValueError, match="^temperature must be a number >= 0"):
        eng.generate([[1]], 2, temperature=-1)
    with pytest.raises(ValueError, match="^prompts must be non-empty"):
        eng.generate([[]], 2)
    assert kv_bytes_per_token(tiny) == 2 * 2 * 2 * 8 * 4       # layers x (k, v) x kv heads x head_dim x fp32


@pytest.mark.parametrize("which", MODELS)
def test_a_resumed_evaluation_with_another_batch_size_gives_the_same_responses(tmp_path, which):
    """Per-question random streams: an evaluation killed part-way and resumed with a different batch size
    writes the same responses as an uninterrupted one."""
    model, levels = _model_and_levels(which)
    settings = evaluate.EvalSettings(levels=levels or ["1x1", "2x2"], n_per_level=3, max_new_tokens=16,
                                     temperature=1.0)
    kw = dict(seed=5, backend="dsh", progress=False)
    whole = tmp_path / "whole.jsonl"
    evaluate.evaluate(model, out=str(whole), settings=dataclasses.replace(settings, batch_size=4), **kw)
    part = tmp_path / "part.jsonl"
    evaluate.evaluate(model, out=str(part), settings=dataclasses.replace(settings, batch_size=2), **kw)
    lines = part.read_text().splitlines()
    part.write_text("\n".join(lines[:2]) + "\n" + lines[2][:25])      # killed while writing the third record
    evaluate.evaluate(model, out=str(part), settings=dataclasses.replace(settings, batch_size=3), **kw)
    by_q = lambda path: {(r["level"], r["index"]): r["response"]
                         for r in map(json.loads, path.read_text().splitlines())}
    assert len(by_q(whole)) == 6 and by_q(part) == by_q(whole)
    assert len(set(by_q(whole).values())) > 1                          # the streams differ between questions


def test_several_samples_a_question_keep_the_first_and_resume_and_calibrate_by_question(tmp_path):
    """samples_per_question=3: each question's first sample is the response of the one-sample evaluation, the others
    come from their own streams; a kill mid-record resumes to the same file; the calibration counts every response,
    resamples questions (``questions``, design effects) and one-sample records carry none of it."""
    model, levels = _model_and_levels("laptop")
    one = evaluate.EvalSettings(levels=levels or ["1x1", "2x2"], n_per_level=3, max_new_tokens=80, temperature=2.0)
    three = dataclasses.replace(one, samples_per_question=3)
    kw = dict(seed=5, backend="dsh", progress=False)
    single, triple, part = tmp_path / "one.jsonl", tmp_path / "three.jsonl", tmp_path / "part.jsonl"
    evaluate.evaluate(model, out=str(single), settings=one, **kw)
    evaluate.evaluate(model, out=str(triple), settings=three, **kw)
    evaluate.evaluate(model, out=str(part), settings=dataclasses.replace(three, batch_size=2), **kw)
    lines = part.read_text().splitlines()
    part.write_text("\n".join(lines[:4]) + "\n" + lines[4][:25])
    evaluate.evaluate(model, out=str(part), settings=three, **kw)
    read = lambda path: list(map(json.loads, path.read_text().splitlines()))  # noqa: E731
    ones, threes = read(single), read(triple)
    by = lambda recs: {(r["level"], r["index"], r.get("sample", 0)): r["response"] for r in recs}  # noqa: E731
    assert len(threes) == 18 and by(read(part)) == by(threes)
    assert "sample" not in ones[0] and {r["sample"] for r in threes} == {0, 1, 2}
    assert {k[:2]: x for k, x in by(threes).items() if k[2] == 0} == {k[:2]: x for k, x in by(ones).items()}
    questions = {k[:2] for k in by(threes)}
    assert any(len({by(threes)[(*q, j)] for j in range(3)}) > 1 for q in questions)   # the other samples: new draws
    got = calibration.calibrate(threes, n_bootstrap=5)["overall"]
    assert got["n"] == 18 and got["questions"] == 6 and set(got["design_effects"]) == {"accuracy", "p_s", "p(F->T)"}
    assert "questions" not in calibration.calibrate(ones, n_bootstrap=5)["overall"]
    with pytest.raises(ValueError, match="^samples_per_question must be"):
        evaluate.evaluate(model, out=str(tmp_path / "x.jsonl"), settings=dataclasses.replace(one, samples_per_question=0),
                          **kw)
    assert not (tmp_path / "x.jsonl").exists()


@pytest.mark.parametrize("attention,sync_every", [("kernels", 2), ("kernels", 1), ("torch", 2)])
def test_progress_reports_rows_started_and_tokens_before_rows_finish(tiny, attention, sync_every, monkeypatch):
    """evaluate's bar counted finished rows only (0/1 for 90 s): the bar's postfix now shows the rows started and
    the tokens written, block by block (the loop in Python every sync_every steps; the loop in C at each return, here
    after every step); the tokens reach what the rows wrote (the torch path counts at most)."""
    from dsh.llm import engine as engine_module
    from dsh.llm import step_loop

    seen = []

    class Recorder:
        def __init__(self, total):
            self.done = 0

        def step(self, started, tokens):
            seen.append((started, tokens, self.done))

        def finished(self, n):
            self.done += n

        def close(self):
            pass

    monkeypatch.setattr(engine_module, "_Progress", Recorder)
    monkeypatch.setattr(step_loop, "SECONDS", 0.0)
    eng = Engine(tiny, [11], slots=4, max_len=40, bucket=8, sync_every=sync_every, attention=attention)
    prompts = [[1, 2, 3], [1, 4], [1, 5, 6, 7], [1, 8], [1, 9, 10], [1, 2]]
    out = eng.generate(prompts, 20, temperature=1.0, seed=0, progress=True)
    # movement before any row ends: the loop in Python looks after its first steps, before it hands a row on; the
    # loop in C hands on the rows done at a step before it returns, so some return comes before any row has ended
    if sync_every > 1:
        assert seen and seen[0][2] == 0 and seen[0][0] > 0 and seen[0][1] > 0
    assert seen and seen[0][0] > 0 and any(t > 0 and d == 0 for _, t, d in seen)
    assert [s for s, _, _ in seen] == sorted(s for s, _, _ in seen) and seen[-1][0] == len(prompts)
    assert [t for _, t, _ in seen] == sorted(t for _, t, _ in seen)
    written = sum(len(g.tokens) for g in out)
    assert (seen[-1][1] == written) if attention == "kernels" else (seen[-1][1] >= written)
