"""The engine's CPU path (dsh.llm.kernel_engine over the C kernels of dsh.llm.kernels) against model.generate and
against the engine's torch path: the same greedy tokens on the shipped laptop base, samples from softmax(logits / T),
completions that do not depend on the batch, log-probabilities that equal a teacher-forced forward pass, the
rows' bookkeeping in C against its tensor form, and the torch path where the kernels cannot run."""

import math

import pytest
import torch
from tiny_llamas import gqa_llama
from transformers import LlamaConfig, LlamaForCausalLM

from dsh.core import provenance
from dsh.llm import kernels, models
from dsh.llm.engine import Engine, kernels_unsuitable
from dsh.llm.kernel_engine import ROW_FIELDS
from dsh.task import laptop_task as lt
from dsh.task.records import chat_prompt
from dsh.training.laptop_base import SHIPPED_BASE

pytestmark = pytest.mark.slow   # loads the shipped base (make check leaves it out)


@pytest.fixture(scope="module")
def base():
    m, tok = models.load(str(SHIPPED_BASE))
    return m.eval(), tok


@pytest.fixture(scope="module")
def gqa():
    """A 2-layer llama, 4 query heads over 2 key/value heads, head size 6 (not a multiple of the 16-wide tiles),
    peaked logits."""
    return gqa_llama(head_scale=40.0)


def _prompts(tok, n_per_level):
    return [tok(chat_prompt(tok, p.question), add_special_tokens=False)["input_ids"]
            for p in lt.test_questions(n_per_level=n_per_level)]


def test_the_kernels_build_and_run_here():
    assert kernels.load() is not None, kernels.why_not


def test_greedy_equals_generate_on_the_shipped_base(base):
    """Every token of every row equals model.generate's: fails for a wrong RoPE position, a key written to the wrong
    tile or slot, a GQA grouping, a prompt fed wrongly, or a refilled slot that sees its predecessor's cache."""
    m, tok = base
    prompts = _prompts(tok, 3)                                         # 21 questions, 1x2 ... 1x8, 10-16 tokens
    tok.padding_side = "left"
    enc = tok([tok.decode(p) for p in prompts], return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        o = m.generate(**enc, max_new_tokens=80, do_sample=False, pad_token_id=tok.pad_token_id,
                       eos_token_id=tok.eos_token_id)
    ref = []
    for row in o[:, enc["input_ids"].shape[1]:].tolist():
        cut = row.index(tok.eos_token_id) + 1 if tok.eos_token_id in row else len(row)
        ref.append(row[:cut])
    eng = Engine(m, [tok.eos_token_id], slots=8, max_len=16 + 80)      # 21 prompts through 8 slots: refills
    assert eng.attention == "kernels"
    eng._cpu.k_cache.fill_(float("nan"))                               # the cache is not zeroed: no position may
    eng._cpu.v_cache.fill_(float("nan"))                               # be read before its row wrote it
    got = eng.generate(prompts, 80, temperature=0)
    assert [g.tokens for g in got] == ref
    assert all(g.stopped == (g.tokens[-1] == tok.eos_token_id) for g in got)


def test_greedy_equals_generate_with_projection_biases():
    """A tiny Qwen2 (biases on q/k/v, grouped-query attention): the fused projection carries the biases."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(1)
    m = Qwen2ForCausalLM(Qwen2Config(vocab_size=16, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                     eos_token_id=15, pad_token_id=0, bos_token_id=1, use_sliding_window=False)).eval()
    with torch.no_grad():
        for layer in m.model.layers:
            layer.self_attn.q_proj.bias.normal_()
            layer.self_attn.v_proj.bias.normal_()
        m.lm_head.weight.mul_(20.0)
    prompts = [[1, 2, 3, 4], [5, 6, 7, 8]]
    with torch.no_grad():
        o = m.generate(torch.tensor(prompts), attention_mask=torch.ones(2, 4, dtype=torch.long), max_new_tokens=12,
                       do_sample=False, pad_token_id=0, eos_token_id=15)
    ref = [r[4:r.index(15, 4) + 1] if 15 in r[4:] else r[4:] for r in o.tolist()]
    eng = Engine(m, [15], slots=2, max_len=16)
    assert eng.attention == "kernels"
    assert [g.tokens for g in eng.generate(prompts, 12, temperature=0)] == ref
    assert eng.generate([], 4) == []


HALF = kernels.half_cache(kernels.load())
half = pytest.mark.skipif(not HALF, reason="no half floats in hardware here")


@pytest.mark.parametrize("attention,kv_cache", [("kernels", "float32"), ("torch", "float32"),
                                                pytest.param("kernels", "float16", marks=half)])
def test_sampling_follows_the_models_distribution(gqa, attention, kv_cache):
    """First-token frequencies of 3000 rows against the exact softmax(logits / T) (chi-square), on each path and
    with the CPU path's float16 KV cache; a temperature of 3 is detected by the same statistic."""
    prompt, n, T = [1, 5, 7, 2], 3000, 0.8
    eng = Engine(gqa, [11], slots=256, max_len=16, attention=attention, kv_cache=kv_cache)
    rows = [g.tokens for g in eng.generate([prompt] * n, 2, temperature=T, seed=1)]
    with torch.no_grad():
        p = torch.softmax(gqa(torch.tensor([prompt])).logits[0, -1] / T, -1)
    obs = torch.bincount(torch.tensor([r[0] for r in rows]), minlength=12).float()
    keep = p * n >= 5
    dof = int(keep.sum()) - 1
    assert dof >= 2, p
    bound = dof + 4 * math.sqrt(2 * dof) + 6
    assert (((obs - n * p) ** 2) / (n * p))[keep].sum().item() < bound, (obs, n * p)
    hot = [g.tokens for g in eng.generate([prompt] * n, 1, temperature=3.0, seed=1)]
    obs = torch.bincount(torch.tensor([r[0] for r in hot]), minlength=12).float()
    assert (((obs - n * p) ** 2) / (n * p))[keep].sum().item() > bound


def test_a_completion_does_not_depend_on_its_batch(gqa):
    """The same prompt and key give the same completion alone, among other prompts, and through fewer slots."""
    others = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [3, 3], [2]] * 6
    target = [5, 6, 7]
    alone = Engine(gqa, [11], slots=4, max_len=40).generate([target], 30, seed=3, keys=[99])[0]
    crowd = Engine(gqa, [11], slots=16, max_len=40).generate(others + [target], 30, seed=3,
                                                             keys=list(range(len(others))) + [99])[-1]
    narrow = Engine(gqa, [11], slots=3, max_len=40).generate([target] + others, 30, seed=3,
                                                             keys=[99] + list(range(len(others))))[0]
    assert alone.tokens == crowd.tokens == narrow.tokens
    assert len(alone.tokens) > 3


def test_kernels_and_torch_paths_draw_the_same_tokens(gqa):
    """The two paths use the same counted uniforms (the kernel's Gumbel-max form of the same draw): with float32
    rounding apart, the completions agree; at least 95 % of 200 rows identical."""
    prompts = [[1 + i % 9, 2 + i % 7, 3] for i in range(200)]
    a = Engine(gqa, [11], slots=32, max_len=40, attention="kernels").generate(prompts, 20, seed=5)
    b = Engine(gqa, [11], slots=32, max_len=40, attention="torch").generate(prompts, 20, seed=5)
    same = sum(x.tokens == y.tokens for x, y in zip(a, b))
    assert same >= 190, same


@pytest.mark.parametrize("attention", ["kernels", "torch"])
def test_logprobs_are_the_models(base, attention):
    """Each token's log-probability as returned equals log_softmax(logits / T) of a teacher-forced forward pass."""
    m, tok = base
    prompts = _prompts(tok, 1)
    T = 0.7
    gens = Engine(m, [tok.eos_token_id], slots=4, max_len=16 + 60, attention=attention).generate(
        prompts, 60, temperature=T, seed=2)
    for p, g in zip(prompts, gens):
        with torch.no_grad():
            logits = m(torch.tensor([p + g.tokens])).logits[0, len(p) - 1:-1]
        want = torch.log_softmax(logits / T, -1).gather(-1, torch.tensor(g.tokens)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(g.logprobs), want, atol=2e-4), (g.logprobs[:5], want[:5])


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(3, 1, 8), (6, 3, 8), (5, 5, 8), (3, 1, 16), (6, 3, 32),
                                                     (5, 5, 32)])
def test_head_counts_that_are_not_whole_groups_of_four(heads, kv_heads, head_dim):
    """The attention kernel computes the scores of four query heads at a time (padding heads repeat the last one)
    and, where the head size is whole vectors of 16, the values' sums eight (head, 16 dimensions) pieces at a time
    (the last block repeating the last piece): with 3, 5 or 6 query heads over 1, 3 or 5 key/value heads, head sizes
    8, 16 and 32, the kernel path's log-probabilities equal a teacher-forced forward pass and its greedy tokens equal
    model.generate's (fails for a padding head or piece written into a real one, or a query head reading the wrong
    key/value head)."""
    torch.manual_seed(heads)
    cfg = LlamaConfig(vocab_size=12, hidden_size=head_dim * heads, intermediate_size=40, num_hidden_layers=2,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=128,
                      eos_token_id=11, pad_token_id=0, bos_token_id=1)
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        m.lm_head.weight.mul_(20.0)
    prompts = [[1 + i % 9, 2 + i % 7, 3, 4 + i % 5][: 2 + i % 3] for i in range(12)]
    eng = Engine(m, [11], slots=5, max_len=70, attention="kernels")
    for g, p in zip(eng.generate(prompts, 60, temperature=0.9, seed=4), prompts):
        with torch.no_grad():
            logits = m(torch.tensor([p + g.tokens])).logits[0, len(p) - 1:-1]
        want = torch.log_softmax(logits / 0.9, -1).gather(-1, torch.tensor(g.tokens)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(g.logprobs), want, atol=2e-4), (g.logprobs[:5], want[:5])
    greedy = eng.generate(prompts, 40, temperature=0.0)
    for g, p in zip(greedy, prompts):
        with torch.no_grad():
            o = m.generate(torch.tensor([p]), max_new_tokens=40, do_sample=False, pad_token_id=0, eos_token_id=11)
        assert g.tokens == o[0, len(p):].tolist()


def test_the_torch_path_where_the_kernels_cannot_run(gqa, monkeypatch):
    assert kernels_unsuitable(gqa) is None
    assert kernels_unsuitable(gqa, "torch") == "attention='torch' was asked for"
    assert "float32" in kernels_unsuitable(gqa.to(torch.float64))
    gqa.to(torch.float32)
    monkeypatch.setenv("DSH_KERNELS", "0")
    eng = Engine(gqa, [11], slots=2, max_len=16)
    assert eng.attention == "torch" and eng.why_torch == "turned off by DSH_KERNELS=0"
    with pytest.raises(ValueError, match="^attention 'kernels' cannot run this model: turned off by DSH_KERNELS=0"):
        Engine(gqa, [11], attention="kernels")
    with pytest.raises(ValueError, match="^attention must be one of auto, kernels, torch"):
        Engine(gqa, [11], attention="fast")


def test_the_kernels_are_built_for_the_architecture_dsh_kernels_march_names(tmp_path, monkeypatch):
    """DSH_KERNELS_MARCH builds the kernels for another architecture than this CPU's (an AVX2 host's summation order
    on an AVX-512 one), cached apart from the native build; an architecture the compiler does not know is no
    kernels and the reason, as a missing compiler is."""
    if "avx2" not in provenance.cpu_flags():
        pytest.skip("needs an x86 CPU with AVX2")
    monkeypatch.setenv("DSH_CACHE", str(tmp_path / "cache"))
    built = {}
    for march in ("native", "x86-64-v3"):
        monkeypatch.setattr(kernels, "_lib", None)
        monkeypatch.setattr(kernels, "why_not", None)
        monkeypatch.setenv("DSH_KERNELS_MARCH", march)
        assert kernels.load() is not None, kernels.why_not
        built[march] = set((tmp_path / "cache" / "kernels").glob("*.so")) - set().union(*built.values())
    assert all(len(x) == 1 for x in built.values())
    assert provenance.hardware()["kernels_march"] == "x86-64-v3"
    monkeypatch.setattr(kernels, "_lib", None)
    monkeypatch.setattr(kernels, "why_not", None)
    monkeypatch.setenv("DSH_KERNELS_MARCH", "no-such-cpu")
    assert kernels.load() is None and "could not be built" in kernels.why_not


def test_no_kernels_without_a_compiler_or_a_writable_cache(tmp_path, monkeypatch):
    """A machine without a working C compiler (or with an unwritable cache) gets the reason and the torch path."""
    monkeypatch.setattr(kernels, "_lib", None)
    monkeypatch.setattr(kernels, "why_not", None)
    monkeypatch.setenv("DSH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    assert kernels.load() is None and "could not be built" in kernels.why_not and "no-such-cc" in kernels.why_not
    assert kernels.unavailable() == kernels.why_not
    monkeypatch.setattr(kernels, "why_not", None)
    monkeypatch.setenv("CC", "cc")
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("DSH_CACHE", str(tmp_path / "file"))               # a file where the folder should be
    assert kernels.load() is None and "could not be built" in kernels.why_not



@half
def test_a_float16_cache_keeps_greedy_completions_and_says_where_they_differ(base):
    """The float16 KV cache (keys and values rounded to half as they are stored) against the float32 cache's greedy
    completions of the test ladder (model.generate's: test_greedy_equals_generate_on_the_shipped_base): where a
    completion differs, the test names the prompt and how far apart the two best logits were at its first differing
    position (a flip needs them within the rounding's reach)."""
    m, tok = base
    prompts = _prompts(tok, 4)                                         # 28 questions, 1x2 ... 1x8
    f32 = Engine(m, [tok.eos_token_id], slots=8, max_len=16 + 120).generate(prompts, 120, temperature=0)
    eng = Engine(m, [tok.eos_token_id], slots=8, max_len=16 + 120, kv_cache="float16")
    assert eng._cpu.k_cache.dtype == eng._cpu.v_cache.dtype == torch.float16
    eng._cpu.k_cache.fill_(float("nan"))                               # no position read before it is written
    eng._cpu.v_cache.fill_(float("nan"))
    f16 = eng.generate(prompts, 120, temperature=0)
    differ = []
    for p, a, b in zip(prompts, f32, f16):
        if a.tokens != b.tokens:
            k = next(i for i, (x, y) in enumerate(zip(a.tokens + [None], b.tokens + [None])) if x != y)
            with torch.no_grad():
                top = torch.topk(m(torch.tensor([p + a.tokens[:k]])).logits[0, -1], 2).values
            differ.append((tok.decode(p), k, round(float(top[0] - top[1]), 4)))
    # a flip needs the two best logits within the rounding's reach: half keeps 11 bits (relative 5e-4)
    print("float16 cache, greedy completions that differ:", differ or "none")
    assert len(differ) <= 1 and all(gap < 0.05 for *_, gap in differ), differ
    assert sum(len(g.tokens) for g in f16) > 28 * 20


@half
def test_a_float16_cache_draws_the_float32_caches_tokens(gqa):
    """With the same counted uniforms, completions with a float16 cache agree with the float32 cache's on at least
    95 % of 200 rows (its distribution: test_sampling_follows_the_models_distribution)."""
    prompts = [[1 + i % 9, 2 + i % 7, 3] for i in range(200)]
    a = Engine(gqa, [11], slots=32, max_len=40).generate(prompts, 20, seed=5)
    b = Engine(gqa, [11], slots=32, max_len=40, kv_cache="float16").generate(prompts, 20, seed=5)
    assert sum(x.tokens == y.tokens for x, y in zip(a, b)) >= 190


def test_a_float16_cache_is_refused_where_it_cannot_run(gqa, monkeypatch):
    """One line naming kv_cache and its valid values, before any cache is allocated."""
    with pytest.raises(ValueError, match=r"kv_cache must be one of float32, float16"):
        Engine(gqa, [11], slots=4, max_len=16, kv_cache="bfloat16")
    with pytest.raises(ValueError, match=r"kv_cache 'float16' needs the CPU path's kernels"):
        Engine(gqa, [11], slots=4, max_len=16, attention="torch", kv_cache="float16")
    monkeypatch.setattr(kernels, "half_cache", lambda lib: False)
    with pytest.raises(ValueError, match=r"kv_cache 'float16' needs .*use 'float32'"):
        Engine(gqa, [11], slots=4, max_len=16, kv_cache="float16")


def _advance_in_torch(new, logp, st, out, out_logp, prompt, eos, stop):
    """The rows' bookkeeping after a step written as tensor operations (the reference for kernels.advance_rows)."""
    slot, pos, plen, n_gen, limit, done, stopped, capped, marks = (st[ROW_FIELDS.index(f)].clone() for f in (
        "slot", "pos", "plen", "n_gen", "limit", "done", "stopped", "capped", "marks"))
    done, stopped, capped = done.bool(), stopped.bool(), capped.bool()
    live = ~done
    gen = live & (pos + 1 >= plen)
    at = n_gen.clamp(max=out.shape[1] - 1)
    out[slot, at] = torch.where(gen, new, out[slot, at])
    out_logp[slot, at] = torch.where(gen, logp, out_logp[slot, at])
    n_gen += gen
    ended = gen & (new[:, None] == eos[None]).any(-1)
    stopped |= ended
    done |= ended | (gen & (n_gen >= limit))
    if stop is not None:
        hit = gen & (new == stop[0])
        marks += hit
        cap = hit & ~ended & (marks >= stop[1])
        capped |= cap
        done |= cap
    pos += live
    tok = torch.where(gen, new, prompt[slot, pos.clamp(max=prompt.shape[1] - 1)])
    lens = torch.where(done, 0, pos + 1)
    return dict(slot=slot, tok=tok, pos=pos, plen=plen, n_gen=n_gen, limit=limit, key=st[ROW_FIELDS.index("key")],
                done=done.long(), stopped=stopped.long(), capped=capped.long(), marks=marks, lens=lens)


@pytest.mark.parametrize("stop", [None, (3, 2)])
def test_the_rows_bookkeeping_in_c_equals_its_tensor_form(stop):
    """kernels.advance_rows on random rows (in their prompt, past it, at their limit, done, at the stop token)
    against the same rules as tensor operations: every field, the completions written and the count of done rows."""
    lib = kernels.load()
    g = torch.Generator().manual_seed(0)
    A, slots, W, P = 40, 48, 6, 5
    seen = torch.zeros(4, dtype=torch.long)   # rows that wrote a token, ended on an end token, were capped, are done

    def r(lo, hi):
        return torch.randint(lo, hi, (A,), generator=g)

    for trial in range(30):
        plen = r(1, P + 1)
        st = torch.stack([torch.randperm(slots, generator=g)[:A], r(0, 8), (plen - 2 + r(0, 4)).clamp(min=0), plen,
                          r(0, W + 1), r(1, W + 2), r(0, 99), (r(0, 5) == 0).long(), r(0, 2) * 0, r(0, 2) * 0, r(0, 3),
                          r(0, 9)])
        new, logp = r(0, 8), torch.randn(A, generator=g)
        out, out_logp = torch.randint(0, 8, (slots, W), generator=g), torch.randn(slots, W, generator=g)
        prompt, eos = torch.randint(0, 8, (slots, P), generator=g), torch.tensor([5, 7])
        want = _advance_in_torch(new, logp, st, out2 := out.clone(), out_logp2 := out_logp.clone(), prompt, eos, stop)
        seen += torch.stack([(want["n_gen"] > st[ROW_FIELDS.index("n_gen")]).sum(), want["stopped"].sum(),
                             want["capped"].sum(), want["done"].sum()])
        n_done = kernels.advance_rows(lib, new, logp, st, out, out_logp, prompt, eos, *(stop or (-1, 0)))
        for f in ROW_FIELDS:
            assert torch.equal(st[ROW_FIELDS.index(f)], want[f]), (trial, f)
        assert torch.equal(out, out2) and torch.equal(out_logp, out_logp2), trial
        assert n_done == int(want["done"].sum()), trial
    assert (seen[[0, 1, 3]] > 0).all() and (seen[2] > 0) == (stop is not None), seen
