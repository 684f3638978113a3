"""Per-trajectory part gradients of many trajectories from one packed forward pass.

:func:`dsh.llm.attribution.all_part_gradients` takes, for one trajectory, one forward pass and one backward pass per
(weighting, part): twelve passes over ~150 tokens each. :func:`packed_part_grams` packs several trajectories into one
row (attention never crosses their boundaries: :mod:`dsh.llm.packing`) and asks autograd only for the gradients of
the layers' *outputs*, one pass per (weighting, part) over every trajectory at once (a token's loss reaches only its
own trajectory's positions). Each trajectory's weight gradients are then formed from its own rows, as autograd forms
them for a whole batch:

- a linear layer ``Y = X W^T``: ``dW = dY_b^T X_b`` over trajectory b's rows;
- an RMS norm ``Y = w * x / rms(x)``: ``dw = sum over b's rows of dY * x / rms(x)``;
- the embedding ``E = W[ids]``: ``dW[v] = the sum of dE over b's positions holding token v`` (the tied output head's
  linear term added to the same matrix).

What the attribution reads of them, the parts' norms and their inner products, is kept as each objective's Gram
matrix over the parts; the gradient vectors themselves only for the objectives asked for (the reward's, which a
group sums). In real arithmetic this equals the per-trajectory route; in float32 the two agree to rounding (a test
compares them).
"""

from __future__ import annotations

import torch

from ..core import validate as v
from .attribution import OBJECTIVES, Segmented, target_logps, token_weights

PARTS = ("attempt", "check", "decision")


def _capture(model):
    """Forward hooks that keep every linear layer's, RMS norm's and embedding's input and output; returns the list
    they fill (``(module, kind, input, output)``) and the hook handles."""
    got, handles = [], []
    for mod in model.modules():
        kind = ("linear" if isinstance(mod, torch.nn.Linear) else "embedding" if isinstance(mod, torch.nn.Embedding)
                else "norm" if type(mod).__name__.endswith("RMSNorm") else None)
        if kind is not None:
            handles.append(mod.register_forward_hook(lambda m, i, o, k=kind: got.append((m, k, i[0], o))))
    return got, handles


def _norm_input(mod, x):
    """x / rms(x) of an RMS norm's input, as the norm computes it (in float32, back to the input's dtype)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + mod.variance_epsilon)
    return h.to(x.dtype)


class _Packed:
    """Trajectories packed in one row: token ids, positions restarting at 0, the next token of every position and
    whether it has one (a trajectory's last position has none), each position's trajectory, each trajectory's rows."""

    def __init__(self, segs: list[Segmented]):
        lens = [len(s.input_ids) for s in segs]
        starts = [0]
        for n in lens:
            starts.append(starts[-1] + n)
        self.spans = list(zip(starts, starts[1:]))
        self.ids = torch.cat([s.input_ids for s in segs])
        self.pos = torch.cat([torch.arange(n) for n in lens])
        self.nxt = torch.cat([self.ids[1:], self.ids[:1]])
        self.valid = torch.ones(len(self.ids), dtype=torch.bool)
        self.valid[torch.tensor(starts[1:]) - 1] = False
        self.seg_of = torch.repeat_interleave(torch.arange(len(segs)), torch.tensor(lens))

    def logps(self, model, temperature: float):
        """log pi(next token) at every position (0 where there is none; logits divided by ``temperature``)."""
        logits = model(input_ids=self.ids[None], position_ids=self.pos[None]).logits[0]
        return target_logps(logits, self.nxt, temperature) * self.valid


def _forward(model, ref_model, row: _Packed, temperature: float):
    """The policy's log-probabilities (with their graph, every layer's input and output captured) and the
    reference's (no graph) over a packed row, both through the packed attention kernels, the models' attention put
    back after."""
    from .packing import register

    name = register("kernels")
    before = [m.config._attn_implementation for m in (model, ref_model)]
    got, handles = _capture(model)
    try:
        for m in (model, ref_model):
            m.set_attn_implementation(name)
        lp = row.logps(model, temperature)
        for h in handles:                               # the reference may be the model itself
            h.remove()
        with torch.no_grad():
            lp_ref = row.logps(ref_model, temperature)
    finally:
        for h in handles:
            h.remove()
        for m, was in zip((model, ref_model), before):
            m.set_attn_implementation(was)
    return lp, lp_ref, got


def _output_gradients(lp_all, lp, lp_ref, got, segs, row: _Packed, weightings, advantages) -> list:
    """Per (weighting, part), in that order: the gradient of every captured layer output of the packed row's
    weighted log-probabilities over that part's tokens (the score: weight 1; an objective: its
    :func:`dsh.llm.attribution.token_weights`, trajectory by trajectory)."""
    masks = {"attempt": [s.sample_mask for s in segs], "decision": [s.decision_mask for s in segs],
             "check": [s.check_mask if s.check_mask is not None else torch.zeros_like(s.sample_mask) for s in segs]}
    outputs = [o for _, _, _, o in got]
    deltas = []
    for w in weightings:
        per = [torch.ones_like(x) if w == "score" else token_weights(x, r, s, w, a)
               for x, r, s, a in zip(lp, lp_ref, segs, advantages)]
        for k in PARTS:
            g = torch.zeros(len(row.ids))
            for (a, e), x, m in zip(row.spans, per, masks[k]):
                g[a:e - 1] = x * m.to(x.dtype)
            deltas.append(torch.autograd.grad(lp_all, outputs, grad_outputs=g, retain_graph=True, allow_unused=True))
    return deltas


def _layout(model, got) -> tuple[dict, int, dict]:
    """Each trainable parameter's place in the flat vector (offset, size, shape), the vector's length, and how many
    captured modules use each (the tied embedding: two)."""
    offsets, n = {}, 0
    for p in model.parameters():
        if p.requires_grad:
            offsets[id(p)] = (n, p.numel(), p.shape)
            n += p.numel()
    uses = {}
    for mod, _, _, _ in got:
        if id(mod.weight) in offsets:
            uses[id(mod.weight)] = uses.get(id(mod.weight), 0) + 1
    if set(uses) != set(offsets):
        raise RuntimeError("a trainable parameter of the model is in no linear layer, RMS norm or embedding: "
                           "packed_part_grams cannot form its gradient")
    return offsets, n, uses


def _weight_grams(model, got, deltas, row: _Packed, keep_at: list[int]):
    """Per trajectory and weighting, the Gram matrix of its parts' weight gradients (each formed from the
    trajectory's own rows; the combinations come as consecutive runs of ``len(PARTS)``, one run a weighting:
    ``[B, weightings, parts, parts]``) and the flat vectors of the combinations ``keep_at``; a parameter two modules
    share (the tied embedding) once both terms are in."""
    B, C, P = len(row.spans), len(deltas), len(PARTS)
    offsets, n, uses = _layout(model, got)
    gram = torch.zeros(B, C // P, P, P)
    kept = torch.empty(B, len(keep_at), n) if keep_at else None     # every parameter's slice is written once
    partial = {}                                        # a shared parameter's sum so far: per trajectory [C, *shape]
    for j, (mod, kind, x, out) in enumerate(got):
        p = mod.weight
        if id(p) not in offsets:
            continue
        o0, size, shape = offsets[id(p)]
        xs = (_norm_input(mod, x[0]) if kind == "norm" else x[0]).detach()
        d = torch.stack([torch.zeros_like(out[0]) if dl[j] is None else dl[j][0] for dl in deltas], 1)  # [N, C, out]
        if kind == "norm":
            per = torch.zeros(B, C, size).index_add_(0, row.seg_of, d * xs[:, None])
        elif kind == "linear":                          # [d_b of every combination]^T x_b = [C * out, in]
            per = [torch.mm(d[a:e].reshape(e - a, -1).T, xs[a:e]).view(C, *shape) for a, e in row.spans]
        else:
            per = [torch.zeros(C, *shape).index_add_(1, row.ids[a:e], d[a:e].transpose(0, 1)) for a, e in row.spans]
        if id(p) in partial:
            per = [u + w for u, w in zip(partial.pop(id(p)), per)]
        uses[id(p)] -= 1
        if uses[id(p)]:
            partial[id(p)] = per
            continue
        for b in range(B):
            flat = per[b].reshape(C, -1)
            blocks = flat.view(C // P, P, -1)
            gram[b] += torch.bmm(blocks, blocks.transpose(1, 2))
            if keep_at:
                kept[b, :, o0:o0 + size] = flat[keep_at]
    return gram, kept


def packed_part_grams(model, ref_model, segs: list[Segmented], objectives, advantages, temperature: float = 1.0,
                      keep=()) -> list[dict]:
    """For every trajectory of ``segs`` (each with its own advantage, from ``advantages``) and every objective
    (:data:`dsh.llm.attribution.OBJECTIVES`), the Gram matrix ``G[i, j] = g_i . g_j`` of the gradients of its
    parts (``i, j`` over :data:`PARTS`: attempt, check, decision; the gradients those of
    :func:`dsh.llm.attribution.all_part_gradients`, a part with no tokens zero), from one forward pass of the policy
    and one of the reference over all of them packed in one row. Returns per trajectory ``{"gram": {objective: 3 x 3
    tensor}, "vectors": {objective: {part: flat gradient}} for the objectives in keep, "k1": log(pi / pi_ref) of
    its targets}`` (:func:`dsh.llm.attribution.token_kl`, from the same passes). The models' attention is switched to
    the packed kernels for the call (:func:`dsh.llm.packing.register`) and put back after."""
    objectives, keep = tuple(objectives), tuple(keep)
    for o in objectives:
        v.choice("objectives[i]", o, OBJECTIVES)
    for o in keep:
        v.choice("keep[i]", o, objectives)
    if not isinstance(segs, list) or not segs or not all(isinstance(s, Segmented) for s in segs):
        raise ValueError("segs must be a non-empty list of Segmented trajectories (dsh.llm.attribution.segment_laptop)")
    advantages = [v.real("advantages[i]", a) for a in advantages]
    if len(advantages) != len(segs):
        raise ValueError(f"advantages must hold one number per trajectory ({len(segs)}), got {len(advantages)}")
    row = _Packed(segs)
    lp_all, lp_ref_all, got = _forward(model, ref_model, row, temperature)
    lp = [lp_all[a:e - 1].detach() for a, e in row.spans]
    lp_ref = [lp_ref_all[a:e - 1] for a, e in row.spans]
    # the weightings: the score (the reward is A x the score, the SFT loss -1 x it) and each other objective's
    weightings = ["score"] if ("reward" in objectives or "sft" in objectives) else []
    weightings += [o for o in objectives if o not in ("reward", "sft")]
    combos = [(w, k) for w in weightings for k in PARTS]
    deltas = _output_gradients(lp_all, lp, lp_ref, got, segs, row, weightings, advantages)
    del lp_all
    keep_w = {"score" if o in ("reward", "sft") else o for o in keep}
    keep_at = [i for i, (w, _) in enumerate(combos) if w in keep_w]
    gram, kept = _weight_grams(model, got, deltas, row, keep_at)
    at = {c: i for i, c in enumerate(combos)}
    w_at = {w: i for i, w in enumerate(weightings)}
    out = []
    for b in range(len(segs)):
        res = {"gram": {}, "vectors": {}, "k1": lp[b] - lp_ref[b]}
        for o in objectives:
            w, scale = ("score", advantages[b]) if o == "reward" else ("score", -1.0) if o == "sft" else (o, 1.0)
            res["gram"][o] = scale * scale * gram[b, w_at[w]]
            if o in keep:
                res["vectors"][o] = {k: scale * kept[b, keep_at.index(at[(w, k)])] for k in PARTS}
        out.append(res)
    return out
