"""Per-segment gradients in a (tiny) transformer against brute force and finite differences."""

import pytest
import torch

from dsh.llm import attribution as at
from dsh.llm import models
from dsh.task import problems, traces

pytestmark = pytest.mark.slow   # loads or trains the embedded model (make check leaves it out)


@pytest.fixture(scope="module")
def tiny():
    from transformers import LlamaConfig, LlamaForCausalLM

    _, tok = models.load("embedded")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).double()
    ref = LlamaForCausalLM(cfg).double()
    for m in list(model.modules()) + list(ref.modules()):   # RMSNorm computes in float32: keep all in float64
        if type(m).__name__ == "LlamaRMSNorm":
            m.forward = (lambda mod: lambda x: mod.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)
                                                                             + mod.variance_epsilon))(m)
    p = problems.Problem(12, 7)
    t = traces.make_trace(p, traces.TraceConfig(granularity="compact", retry_fraction=1.0, max_attempts=2), seed=0)
    return model, ref, tok, at.segment(tok, p.question, t.text), t


def test_segmentation(tiny):
    _, _, tok, seg, t = tiny
    dec = tok.decode(seg.input_ids[1:][seg.decision_mask])
    assert dec.endswith(tok.eos_token)
    assert dec[: -len(tok.eos_token)].strip() in traces.GENERATOR_MARKERS
    resp = tok.decode(seg.input_ids[1:][seg.sample_mask | seg.decision_mask])
    assert resp.replace(tok.eos_token, "").strip().startswith("Attempt 1")
    assert not (seg.sample_mask & seg.decision_mask).any()
    assert len(seg.attempt_lengths) == 2 and min(seg.attempt_lengths) > 20


@pytest.mark.parametrize("objective", ["reward", "kl_reward", "kl_k3", "dft"])
def test_segment_gradient_equals_sum_of_token_gradients(tiny, objective):
    model, ref, _, seg, _ = tiny
    params = [p for p in model.parameters()]
    terms = at.objective_terms(model, ref, seg, objective)
    g_seg = torch.autograd.grad(terms[seg.decision_mask].sum(), params, retain_graph=True, allow_unused=True)
    brute = [torch.zeros_like(p) for p in params]
    for i in torch.nonzero(seg.decision_mask)[:, 0].tolist():
        gi = torch.autograd.grad(terms[i], params, retain_graph=True, allow_unused=True)
        brute = [b + (torch.zeros_like(b) if g is None else g) for b, g in zip(brute, gi)]
    for a, b in zip(g_seg, brute):
        assert torch.allclose(torch.zeros_like(b) if a is None else a, b, rtol=1e-9, atol=1e-9)


def test_finite_difference_of_the_sampling_part(tiny):
    model, ref, _, seg, _ = tiny
    params = [p for p in model.parameters()]
    f = lambda: at.objective_terms(model, ref, seg, "kl_k3")[seg.sample_mask].sum()  # noqa: E731
    g = torch.autograd.grad(f(), params, allow_unused=True)
    torch.manual_seed(1)
    direction = [torch.randn_like(p) for p in params]
    analytic = sum(float((gi * d).sum()) for gi, d in zip(g, direction) if gi is not None)
    eps = 1e-5
    with torch.no_grad():
        for p, d in zip(params, direction):
            p.add_(eps * d)
        up = float(f())
        for p, d in zip(params, direction):
            p.sub_(2 * eps * d)
        down = float(f())
        for p, d in zip(params, direction):
            p.add_(eps * d)
    assert analytic == pytest.approx((up - down) / (2 * eps), rel=1e-5)


def test_attribute_report(tiny):
    model, ref, _, seg, _ = tiny
    a = at.attribute(model, ref, seg, "reward")
    k1 = at.attribute(model, ref, seg, "kl_k1")
    sft = at.attribute(model, ref, seg, "sft")
    assert a.norm_sample == pytest.approx(k1.norm_sample)       # grad k1 = grad log pi, token by token
    assert a.norm_decision == pytest.approx(sft.norm_decision)  # SFT = the reward part with A = -1
    assert a.cosine == pytest.approx(sft.cosine)
    assert a.n_sample_tokens == int(seg.sample_mask.sum()) and a.n_decision_tokens == int(seg.decision_mask.sum())
    assert set(a.groups) <= set(at.GROUPS) and "attention" in a.groups and "head" in a.groups
    assert -1 <= a.cosine <= 1 and a.ratio > 0
    total = sum(x ** 2 for x, _ in a.groups.values()) ** 0.5
    assert total == pytest.approx(a.norm_sample, rel=1e-9)


def test_bad_objective(tiny):
    model, ref, _, seg, _ = tiny
    with pytest.raises(ValueError, match="^objective must be one of reward, kl_reward"):
        at.attribute(model, ref, seg, "ppo")
    with pytest.raises(ValueError, match="^question and response must be non-empty strings"):
        at.segment(models.load("embedded")[1], "Calculate 1 * 2.", "")
