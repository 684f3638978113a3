"""Gradient attribution inside a real transformer (beyond the paper, which shows it on a toy).

For a response split into sampling tokens (the attempts) and decision tokens (each RESAMPLE marker span
and the end-of-turn token that stops), compute with autograd, restricted to each part:

- ``reward``: the surrogate-reward gradient ``A * sum_t grad log pi(t)`` (one advantage for every token);
- ``kl_reward``: the KL penalty in the reward (Theorem 3.2's setting): ``sum_t grad log pi(t) * Q_t`` with
  the trajectory's k1 KL-to-go ``Q_t = sum_{t' >= t} log(pi/pi_ref)(t')``;
- ``kl_k1`` / ``kl_k3``: the KL penalty in the loss (GRPO, verl): ``sum_t grad k(t)`` with
  k1 = log(pi/pi_ref) and k3 = r - log r - 1, r = pi_ref/pi;
- ``sft``: ``-sum_t grad log pi(t)``; ``dft``: ``-sum_t sg(pi(t)) grad log pi(t)`` (Appendix D).

Reported: the norm of each part over all parameters and per parameter group, and the cosine between the
sampling and the decision part.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core import validate as v
from ..task.parse import decision_spans, operands
from ..task.problems import draw_problems
from ..task.records import chat_prompt
from ..task.traces import TraceConfig, make_trace

OBJECTIVES = ("reward", "kl_reward", "kl_k1", "kl_k3", "sft", "dft")
GROUPS = ("embeddings", "attention", "mlp", "norm", "head")


def param_group(name: str) -> str:
    if "embed" in name:
        return "embeddings"
    if "attn" in name or "attention" in name:
        return "attention"
    if "mlp" in name:
        return "mlp"
    if "lm_head" in name:
        return "head"
    return "norm"


@dataclass(frozen=True)
class Segmented:
    """Token ids of prompt + response + end of turn, and masks over the predicted positions."""

    input_ids: torch.Tensor       # (T,)
    sample_mask: torch.Tensor     # (T-1,) bool, over targets input_ids[1:]
    decision_mask: torch.Tensor   # (T-1,) bool
    attempt_lengths: list         # sampling tokens per attempt (approximately: between decisions)


def segment(tokenizer, question: str, response: str, end_of_turn: str | None = None) -> Segmented:
    """Tokenize and split the response tokens into sampling and decision tokens."""
    if not isinstance(question, str) or not isinstance(response, str) or not response:
        raise ValueError("question and response must be non-empty strings")
    prompt = chat_prompt(tokenizer, question)
    eot = end_of_turn if end_of_turn is not None else (tokenizer.eos_token or "")
    p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    enc = tokenizer(response, add_special_tokens=False, return_offsets_mapping=True)
    r_ids, offs = enc["input_ids"], enc["offset_mapping"]
    e_ids = tokenizer(eot, add_special_tokens=False)["input_ids"] if eot else []
    a, b = operands(question)
    spans = decision_spans(response, a, b)
    is_dec = [any(s < e2 and s2 < e for s2, e2 in spans) for s, e in offs]
    ids = p_ids + r_ids + e_ids
    n = len(ids) - 1
    smask = torch.zeros(n, dtype=torch.bool)
    dmask = torch.zeros(n, dtype=torch.bool)
    start = len(p_ids) - 1  # target index of the first response token
    lengths, cur = [], 0
    for i, d in enumerate(is_dec):
        (dmask if d else smask)[start + i] = True
        if d:
            if cur:
                lengths.append(cur)
            cur = 0
        else:
            cur += 1
    lengths.append(cur)
    for j in range(len(e_ids)):
        dmask[start + len(r_ids) + j] = True
    return Segmented(torch.tensor(ids), smask, dmask, lengths)


def _token_logps(model, ids):
    logits = model(input_ids=ids[None]).logits[0, :-1]
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    return torch.log_softmax(logits, -1).gather(-1, ids[1:, None])[:, 0]


def objective_terms(model, ref_model, seg: Segmented, objective: str, advantage: float = 1.0) -> torch.Tensor:
    """Per-target-token terms whose gradient, summed over a segment, is that segment's gradient."""
    v.choice("objective", objective, OBJECTIVES)
    lp = _token_logps(model, seg.input_ids)
    if objective in ("reward", "sft", "dft"):
        if objective == "reward":
            return advantage * lp
        if objective == "sft":
            return -lp
        return -lp.detach().exp() * lp
    with torch.no_grad():
        lp_ref = _token_logps(ref_model, seg.input_ids)
    k1 = lp - lp_ref
    if objective == "kl_k1":
        return k1
    if objective == "kl_k3":
        r = torch.exp(lp_ref - lp)
        return r - torch.log(r) - 1
    # kl_reward: score times the KL-to-go over the response (prompt positions carry no penalty)
    resp = (seg.sample_mask | seg.decision_mask).float()
    d = (k1.detach() * resp)
    togo = torch.flip(torch.cumsum(torch.flip(d, [0]), 0), [0])
    return lp * togo


@dataclass(frozen=True)
class Attribution:
    objective: str
    norm_sample: float
    norm_decision: float
    ratio: float
    cosine: float
    groups: dict          # group -> (norm_sample, norm_decision)
    n_sample_tokens: int
    n_decision_tokens: int
    mean_attempt_length: float


def _flat_grads(model, loss, params):
    grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]


def attribute(model, ref_model, seg: Segmented, objective: str, advantage: float = 1.0) -> Attribution:
    """Sampling- and decision-part gradients of one objective on one trajectory."""
    names, params = zip(*[(n, p) for n, p in model.named_parameters() if p.requires_grad])
    terms = objective_terms(model, ref_model, seg, objective, advantage)
    gs = _flat_grads(model, terms[seg.sample_mask].sum(), params)
    gd = _flat_grads(model, terms[seg.decision_mask].sum(), params)
    vs = torch.cat([g.flatten() for g in gs])
    vd = torch.cat([g.flatten() for g in gd])
    ns, nd = float(vs.norm()), float(vd.norm())
    cos = float(vs @ vd / (vs.norm() * vd.norm())) if ns > 0 and nd > 0 else float("nan")
    groups = {}
    for n, a, b in zip(names, gs, gd):
        k = param_group(n)
        s0, d0 = groups.get(k, (0.0, 0.0))
        groups[k] = (s0 + float(a.pow(2).sum()), d0 + float(b.pow(2).sum()))
    groups = {k: (x ** 0.5, y ** 0.5) for k, (x, y) in groups.items()}
    return Attribution(objective, ns, nd, ns / nd if nd > 0 else float("inf"), cos, groups,
                       int(seg.sample_mask.sum()), int(seg.decision_mask.sum()),
                       sum(seg.attempt_lengths) / max(len(seg.attempt_lengths), 1))


def length_sweep(model, ref_model, tokenizer, levels=("1x1", "2x2", "3x3", "4x4"), per_level: int = 1,
                 objectives=("reward", "kl_reward", "kl_k3"), granularity: str = "compact", seed: int = 0,
                 checks=("nines",), progress: bool = True) -> list[dict]:
    """Attribution ratios against the attempt length L_k, varied through the operand sizes of
    two-attempt reflection traces (the first attempt wrong, then RESAMPLE, then the right one and STOP).
    With ``checks=("nines",)`` only errors that casting out nines detects are drawn (digit, carry)."""
    from tqdm import tqdm

    v.positive_int("per_level", per_level)
    for o in objectives:
        v.choice("objectives[i]", o, OBJECTIVES)
    weights = {"digit": 1.0, "carry": 1.0} if "elevens" not in checks else {"digit": 1.0, "carry": 1.0, "shift": 1.0}
    cfg = TraceConfig(granularity=granularity, style="reflection", retry_fraction=1.0, max_attempts=2,
                      checks=tuple(checks), error_weights=weights)
    jobs = [(lv, p) for lv in levels for p in draw_problems(lv, per_level, seed=seed)]
    rows = []
    for lv, p in tqdm(jobs, desc="attribution", disable=not progress):
        t = make_trace(p, cfg, seed=seed)
        seg = segment(tokenizer, p.question, t.text)
        for o in objectives:
            a = attribute(model, ref_model, seg, o)
            rows.append({"level": lv, "objective": o, "L": a.mean_attempt_length, "ratio": a.ratio,
                         "norm_sample": a.norm_sample, "norm_decision": a.norm_decision, "cosine": a.cosine,
                         "n_sample_tokens": a.n_sample_tokens, "n_decision_tokens": a.n_decision_tokens,
                         **{f"ratio_{g}": (x / y if y > 0 else float("nan")) for g, (x, y) in a.groups.items()}})
    return rows
