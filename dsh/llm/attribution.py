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

import re
from dataclasses import dataclass

import torch

from ..core import validate as v
from ..task import laptop_task as lt
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
    check_mask: torch.Tensor | None = None   # (T-1,) bool: the check pi_d reads (laptop format), else None


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


_LAPTOP_ANSWER = re.compile(r"The answer is \d+\.")
_LAPTOP_VERDICT = re.compile(re.escape(lt.PASSES) + "|" + re.escape(lt.FAILS))
_LAPTOP_MARKER = re.compile(r"\n" + re.escape(lt.MARKER) + r"\n?")


def laptop_parts(response: str) -> list[tuple[int, int, str]]:
    """Character spans of a laptop response (:mod:`dsh.task.laptop_task`) by who writes them: ``attempt``
    (pi_sample: the steps and ``The answer is N.``), ``check`` (the check question and the check up to its verdict:
    what pi_d reads), ``decision`` (pi_d: the verdict, and the marker line that starts a new attempt). A response
    that ends right after an answer with no check of it ends with that attempt (its STOP is the end-of-turn token,
    :func:`segment_laptop`: the task's one-attempt form, which the SFT data teach). Text after the last verdict
    that is not a marker, or after the last answer that is neither checked nor the end (a cut or stray response),
    is ``other``. Spans cover the response in order."""
    out, pos = [], 0
    while pos < len(response):
        ans = _LAPTOP_ANSWER.search(response, pos)
        ver = _LAPTOP_VERDICT.search(response, ans.end()) if ans else None
        if ver is None:
            if ans is not None and ans.end() == len(response):
                out.append((pos, ans.end(), "attempt"))      # an unchecked last attempt: STOP follows
            else:
                out.append((pos, len(response), "other"))
            break
        out += [(pos, ans.end(), "attempt"), (ans.end(), ver.start(), "check"), (ver.start(), ver.end(), "decision")]
        pos = ver.end()
        mark = _LAPTOP_MARKER.match(response, pos)
        if mark is None:
            if pos < len(response):
                out.append((pos, len(response), "other"))
            break
        out.append((pos, mark.end(), "decision"))
        pos = mark.end()
    return [x for x in out if x[1] > x[0]]


def segment_laptop(tokenizer, question: str, response: str, stopped: bool = True) -> Segmented:
    """Tokenize a laptop response after its chat prompt and mark its targets by :func:`laptop_parts`: attempt tokens
    (``sample_mask``), check tokens (``check_mask``), decision tokens (``decision_mask``: the verdicts, the markers,
    and the end-of-turn token when the response stopped (``stopped``: it ended by itself, not at the token limit)
    right after a verdict or right after an unchecked answer, i.e. STOP). A token belongs to the part of its first
    character; ``other`` tokens are in no mask. ``attempt_lengths``: tokens of each attempt. Raises ValueError for
    a response with no decision (no verdict, and no STOP right after an answer) and for one whose attempt holds a
    verdict (a check written before any answer: not the task's form, and its check tokens would count as
    pi_sample's)."""
    if not isinstance(question, str) or not isinstance(response, str) or not response:
        raise ValueError("question and response must be non-empty strings")
    parts = laptop_parts(response)
    if any(k == "attempt" and _LAPTOP_VERDICT.search(response, s, e) for s, e, k in parts):
        raise ValueError("an attempt holds a verdict (a check written before any answer)")
    ls, le, lk = parts[-1]
    stops = bool(stopped) and tokenizer.eos_token_id is not None and \
        (lk == "attempt" or (lk == "decision" and _LAPTOP_VERDICT.fullmatch(response, ls, le) is not None))
    if not stops and not any(k == "decision" for _, _, k in parts):
        raise ValueError("response holds no decision (no verdict after a stated answer, no STOP after an answer)")
    p_ids = tokenizer(chat_prompt(tokenizer, question), add_special_tokens=False)["input_ids"]
    enc = tokenizer(response, add_special_tokens=False, return_offsets_mapping=True)
    r_ids, offs = enc["input_ids"], enc["offset_mapping"]
    e_ids = [tokenizer.eos_token_id] if stops else []
    ids = p_ids + r_ids + e_ids
    masks = {k: torch.zeros(len(ids) - 1, dtype=torch.bool) for k in ("attempt", "check", "decision")}
    start = len(p_ids) - 1
    lengths, cur, prev = [], 0, None
    for i, (a, _) in enumerate(offs):
        kind = next(k for s, e, k in parts if s <= a < e)
        if kind in masks:
            masks[kind][start + i] = True
        if kind == "attempt":
            cur += 1
        elif prev == "attempt":
            lengths.append(cur)
            cur = 0
        prev = kind
    if cur:
        lengths.append(cur)
    for j in range(len(e_ids)):
        masks["decision"][start + len(r_ids) + j] = True
    return Segmented(torch.tensor(ids), masks["attempt"], masks["decision"], lengths, masks["check"])


def target_logps(logits, targets, temperature: float = 1.0):
    """log pi(target) at each position of ``logits [T, V]`` (float32 at least), the logits divided by
    ``temperature`` first (as TRL's GRPO scores rollouts sampled at that temperature)."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    return torch.log_softmax(logits, -1).gather(-1, targets[:, None])[:, 0]


def _token_logps(model, ids, temperature: float = 1.0):
    """log pi(token | prefix) of every target token of ``ids`` (:func:`target_logps`)."""
    return target_logps(model(input_ids=ids[None]).logits[0, :-1], ids[1:], temperature)


def objective_terms(model, ref_model, seg: Segmented, objective: str, advantage: float = 1.0,
                    temperature: float = 1.0) -> torch.Tensor:
    """Per-target-token terms whose gradient, summed over a segment, is that segment's gradient (log-probabilities
    at ``temperature``, the policy's and the reference's alike)."""
    v.choice("objective", objective, OBJECTIVES)
    lp = _token_logps(model, seg.input_ids, temperature)
    if objective in ("reward", "sft", "dft"):
        if objective == "reward":
            return advantage * lp
        if objective == "sft":
            return -lp
        return -lp.detach().exp() * lp
    with torch.no_grad():
        lp_ref = _token_logps(ref_model, seg.input_ids, temperature)
    k1 = lp - lp_ref
    if objective == "kl_k1":
        return k1
    if objective == "kl_k3":
        r = torch.exp(lp_ref - lp)
        return r - torch.log(r) - 1
    return lp * kl_to_go(k1.detach(), seg)     # kl_reward: score times the KL-to-go


def kl_to_go(k1, seg: Segmented) -> torch.Tensor:
    """The trajectory's k1 KL-to-go Q_t = sum_{t' >= t} k1(t') over the response's targets (prompt positions carry
    no penalty)."""
    resp = (seg.sample_mask | seg.decision_mask | (seg.check_mask if seg.check_mask is not None else False)).float()
    return torch.flip(torch.cumsum(torch.flip(k1 * resp, [0]), 0), [0])


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


def _flat_grads(model, loss, params, grad_outputs=None):
    grads = torch.autograd.grad(loss, params, grad_outputs=grad_outputs, retain_graph=True, allow_unused=True)
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


def part_gradients(model, ref_model, seg: Segmented, objective: str, advantage: float = 1.0,
                   temperature: float = 1.0) -> dict:
    """The gradient of one objective on one trajectory restricted to each part, as one flat vector over the
    trainable parameters per part: ``attempt`` (``sample_mask``), ``decision`` and, where the segmentation has one,
    ``check``. The parts' vectors add up to the gradient over those tokens."""
    params = [p for p in model.parameters() if p.requires_grad]
    terms = objective_terms(model, ref_model, seg, objective, advantage, temperature)
    masks = {"attempt": seg.sample_mask, "decision": seg.decision_mask}
    if seg.check_mask is not None:
        masks["check"] = seg.check_mask
    out = {}
    for k, m in masks.items():
        gs = _flat_grads(model, terms[m].sum(), params) if bool(m.any()) else [torch.zeros_like(p) for p in params]
        out[k] = torch.cat([g.flatten() for g in gs]).detach()
    return out


def token_weights(lp, lp_ref, seg: Segmented, objective: str, advantage: float = 1.0) -> torch.Tensor:
    """Per-token weights w_t (detached) such that the gradient of ``objective`` over any set of target tokens is
    ``sum_t w_t grad log pi(t)`` over that set: every term of :func:`objective_terms` is a function of log pi(t)
    alone (the reference's log-probabilities, the KL-to-go and DFT's weight held fixed). ``reward``: A; ``sft``: -1;
    ``dft``: -pi(t); ``kl_k1``: 1; ``kl_k3``: 1 - pi_ref/pi (the derivative of r - log r - 1 in log pi);
    ``kl_reward``: the k1 KL-to-go Q_t. ``lp_ref`` may be None for the first three."""
    v.choice("objective", objective, OBJECTIVES)
    lp = lp.detach()
    if objective == "reward":
        return torch.full_like(lp, float(advantage))
    if objective == "sft":
        return -torch.ones_like(lp)
    if objective == "dft":
        return -lp.exp()
    if objective == "kl_k1":
        return torch.ones_like(lp)
    if objective == "kl_k3":
        return 1 - torch.exp(lp_ref - lp)
    return kl_to_go(lp - lp_ref, seg)


def all_part_gradients(model, ref_model, seg: Segmented, objectives, advantage: float = 1.0,
                       temperature: float = 1.0) -> dict:
    """:func:`part_gradients` of several objectives on one trajectory from one forward pass of the policy (and one
    of the reference, for the KL terms): each part's gradient is one backward pass of log pi with the objective's
    :func:`token_weights` on that part's tokens. ``reward`` and ``sft`` share one pass per part: the reward's part
    is the score's times A and the SFT loss's the score's times -1 (exact in real arithmetic; in float32 the two
    routes agree to rounding, tested). Returns ``{objective: {part: flat gradient}}``."""
    objectives = tuple(objectives)
    for o in objectives:
        v.choice("objectives[i]", o, OBJECTIVES)
    params = [p for p in model.parameters() if p.requires_grad]
    lp = _token_logps(model, seg.input_ids, temperature)
    lp_ref = None
    if any(o.startswith("kl_") for o in objectives):
        with torch.no_grad():
            lp_ref = _token_logps(ref_model, seg.input_ids, temperature)
    masks = {"attempt": seg.sample_mask, "decision": seg.decision_mask}
    if seg.check_mask is not None:
        masks["check"] = seg.check_mask

    def parts(w):
        return {k: torch.cat([g.flatten() for g in (_flat_grads(model, lp, params, w * m.to(w.dtype)) if bool(m.any())
                                                     else [torch.zeros_like(p) for p in params])])
                for k, m in masks.items()}

    out = {}
    if "reward" in objectives or "sft" in objectives:
        score = parts(torch.ones_like(lp))
        if "reward" in objectives:
            out["reward"] = {k: float(advantage) * g for k, g in score.items()}
        if "sft" in objectives:
            out["sft"] = {k: -g for k, g in score.items()}
    for o in objectives:
        if o not in out:
            out[o] = parts(token_weights(lp, lp_ref, seg, o, advantage))
    return {o: out[o] for o in objectives}


def token_kl(model, ref_model, seg: Segmented, temperature: float = 1.0) -> torch.Tensor:
    """k1 = log(pi / pi_ref) of every target token of ``seg`` (the immediate KL penalty of Theorem 3.2 per token),
    both at ``temperature``."""
    with torch.no_grad():
        return _token_logps(model, seg.input_ids, temperature) - _token_logps(ref_model, seg.input_ids, temperature)


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
