"""The engine's CPU path: every row decoded one token a step through the C kernels of :mod:`dsh.llm.kernels`.

On a GPU the engine prefills prompts in one pass and replays CUDA graphs; on 2 CPU cores the costs are different
(measured, README "Performance"): a small model's linear layers run near the matmul peak at 256 rows, torch's
batched attention reads the cache of every row up to the longest at a fraction of the memory bandwidth, and rows
that have finished, or that wait for a refill, take matmul time for nothing. :class:`KernelDecoder` therefore

- feeds the prompt through the decoding step itself, one token a step (the same FLOPs as a prefill, none of its
  padding), so a freed slot is refilled at the next step, not when an eighth of the slots is free; the longest
  prompts start first (longer questions have longer answers here, so the batch drains on short rows);
- computes only the rows in flight: the batch is the active rows, compacted whenever a row finishes, each row
  holding the index of its cache slot (the cache itself never moves);
- runs attention, RoPE with the cache write, RMSNorm, the gated activation and the sampling in C, and the q/k/v
  and gate/up projections as one matrix product each (weights concatenated from the live weights at the start of
  every :meth:`generate`, so that a training step before it is seen), each product by torch or by oneDNN, whichever
  is faster among those equal to torch's bit for bit (:mod:`dsh.llm.products`).

It samples exactly as :class:`dsh.llm.engine.Engine` does: the counted uniforms of (seed, the row's key, the token's
index, the vocabulary index) (:func:`dsh.llm.streams.counted_uniform`, bit for bit), in the Gumbel-max form of the
draw from softmax(logits / T); greedy is the argmax. A completion depends on its prompt, seed and key only.
"""

from __future__ import annotations

import torch

from . import kernels
from .products import Products


def attention_shape(model) -> tuple:
    """``(heads, kv_heads, head_dim, scaling)`` of a llama-family model's attention (its modules' values first, then its
    config's)."""
    cfg, attn = model.config, model.model.layers[0].self_attn
    heads = cfg.num_attention_heads
    head_dim = getattr(attn, "head_dim", None) or cfg.hidden_size // heads
    return (heads, getattr(cfg, "num_key_value_heads", None) or heads, head_dim,
            getattr(attn, "scaling", head_dim ** -0.5))


def fused_projections(layer) -> tuple:
    """A llama-family decoder layer's ((q/k/v weight, bias), (gate/up weight, bias)): the projections that read the
    same input concatenated into one matrix product each, from the live weights (bias None when none has one)."""
    def cat(mods):
        w = torch.cat([m.weight.detach() for m in mods])
        if all(m.bias is None for m in mods):
            return w, None
        return w, torch.cat([m.bias.detach() if m.bias is not None else torch.zeros(m.weight.shape[0]) for m in mods])

    return (cat([layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj]),
            cat([layer.mlp.gate_proj, layer.mlp.up_proj]))


class KernelDecoder:
    """Decoder of a llama-family float32 model on the CPU (see the module docstring): ``slots`` rows at once, at most
    ``max_len`` prompt + completion tokens a row, the host looking at the rows every ``sync_every`` steps, its KV
    cache in ``kv_dtype`` (float32, or float16 where :func:`dsh.llm.kernels.half_cache` holds)."""

    def __init__(self, model, eos_token_ids: list, slots: int, max_len: int, sync_every: int = 1,
                 kv_dtype=torch.float32):
        lib = kernels.load()
        if lib is None:
            raise ValueError(f"the C kernels are unavailable: {kernels.why_not}")
        self.lib, self.model = lib, model
        self.layers = list(model.model.layers)
        self.H, self.KV, self.D, self.scaling = attention_shape(model)
        self.silu = getattr(model.config, "hidden_act", None) == "silu"
        self.slots, self.max_len, self.sync_every = slots, max_len, sync_every
        self.M = -(-max_len // kernels.TILE) * kernels.TILE              # whole key tiles
        with torch.no_grad():
            cos, sin = model.model.rotary_emb(torch.zeros(1), torch.arange(self.M)[None])
        self.cos, self.sin = cos[0].float().contiguous(), sin[0].float().contiguous()
        L, T = len(self.layers), kernels.TILE
        # not zeroed (0.9 s for the 0.8 GB of a 700-question evaluation): a row writes every position before it reads
        # it, and the attention reads nothing beyond a row's length (a tile's tail is loaded but never used)
        self.k_cache = torch.empty(L, slots, self.M // T, self.KV, self.D, T, dtype=kv_dtype)  # keys, tiles transposed
        self.v_cache = torch.empty(L, slots, self.M, self.KV, self.D, dtype=kv_dtype)
        self.eos = torch.tensor(sorted(set(eos_token_ids)))
        self.fused = None
        self.stop_after = None
        self.product_log = None       # a list: every product of the next generate appends (rows, flops, seconds)

    def _fuse(self):
        """Per layer: (q/k/v weight, bias), (gate/up weight, bias), from the live weights; the products' weights
        prepared for :class:`dsh.llm.products.Products`."""
        self.products = Products(self.slots, self.product_log)
        fused = [fused_projections(ly) for ly in self.layers]
        for (w_qkv, _), (w_gu, _) in fused:
            self.products.prepare(w_qkv)
            self.products.prepare(w_gu)
        for ly in self.layers:
            for lin in (ly.self_attn.o_proj, ly.mlp.down_proj):
                self.products.prepare(lin.weight.detach(), residual=lin.bias is None)
        head = self.model.lm_head
        self.head = (head.weight.detach(), None if head.bias is None else head.bias.detach())
        self.products.prepare(self.head[0])
        return fused

    def _residual(self, x, linear, a):
        """``x + linear(a)``: one addmm when the layer has no bias."""
        if linear.bias is None:
            return self.products.add_linear(x, a, linear.weight.detach())
        return x + self.products.linear(a, linear.weight.detach(), linear.bias.detach())

    def _norm(self, x, norm):
        return kernels.rms_norm(self.lib, x, norm.weight, norm.variance_epsilon, torch.empty_like(x))

    def _logits(self, s):
        """The logits ``[A, V]`` after feeding token ``s.tok`` at position ``s.pos`` of every active row."""
        lib, A = self.lib, s.tok.shape[0]
        x = self.model.model.embed_tokens(s.tok)
        lens = torch.where(s.done, 0, s.pos + 1)                 # positions each row attends (0: a finished row)
        o = torch.empty(A, self.H, self.D)
        for i, layer in enumerate(self.layers):
            (w_qkv, b_qkv), (w_gu, b_gu) = self.fused[i]
            qkv = self.products.linear(self._norm(x, layer.input_layernorm), w_qkv, b_qkv)
            kernels.attend(lib, qkv, self.cos, self.sin, s.pos, lens, s.slot, self.k_cache[i], self.v_cache[i], o,
                           self.KV, self.M, self.scaling)
            x = self._residual(x, layer.self_attn.o_proj, o.view(A, -1))
            gu = self.products.linear(self._norm(x, layer.post_attention_layernorm), w_gu, b_gu)
            if self.silu:
                act = kernels.silu_mul(lib, gu, torch.empty(A, gu.shape[1] // 2))
            else:
                gate, up = gu.chunk(2, dim=-1)
                act = layer.mlp.act_fn(gate) * up
            x = self._residual(x, layer.mlp.down_proj, act)
        return self.products.linear(self._norm(x, self.model.model.norm), *self.head).float().contiguous()

    def _step(self, s, inv_temp: float, greedy: bool):
        """Feed one token to every active row; rows past their prompt record the token sampled after it."""
        new, logp = kernels.sample_tokens(self.lib, self._logits(s), s.key, s.n_gen, inv_temp, greedy,
                                          torch.empty_like(s.tok), torch.empty(s.tok.shape[0]))
        live = ~s.done
        gen = live & (s.pos + 1 >= s.plen)                       # this step's output is a completion token
        at = s.n_gen.clamp(max=self.out.shape[1] - 1)
        self.out[s.slot, at] = torch.where(gen, new, self.out[s.slot, at])
        self.out_logp[s.slot, at] = torch.where(gen, logp, self.out_logp[s.slot, at])
        s.n_gen += gen
        ended = gen & (new[:, None] == self.eos[None]).any(-1)
        s.stopped |= ended
        s.done |= ended | (gen & (s.n_gen >= s.limit))
        if self.stop_after is not None:
            hit = gen & (new == self.stop_after[0])
            s.marks += hit
            cap = hit & ~ended & (s.marks >= self.stop_after[1])
            s.capped |= cap
            s.done |= cap
        s.pos += live
        nxt = self.prompt_buf[s.slot, s.pos.clamp(max=self.prompt_buf.shape[1] - 1)]
        s.tok = torch.where(gen, new, nxt)

    @torch.no_grad()
    def generate(self, prompts, keys, max_new_tokens: int, temperature: float, on_finish, on_step=None,
                 stop_after=None):
        """Complete ``prompts`` (validated token-id lists) with the rows' stream ``keys``; ``on_finish(i, tokens,
        stopped, logprobs, capped)`` is called as prompt ``i`` finishes (``logprobs``: each token's log-probability
        under the distribution it was drawn from; ``capped``: ended by ``stop_after``, a checked ``(token_id, n)``
        or None, as in :meth:`dsh.llm.engine.Engine.generate`); ``on_step(started, tokens)``, when given, after
        every block of steps: the rows started and the tokens written so far (progress)."""
        self.stop_after = stop_after
        if not prompts:
            return
        self.fused = self._fuse()
        self.out = torch.zeros(self.slots, max_new_tokens, dtype=torch.long)
        self.out_logp = torch.zeros(self.slots, max_new_tokens)
        self.prompt_buf = torch.zeros(self.slots, max(map(len, prompts)), dtype=torch.long)
        inv_temp, greedy = (1.0 / temperature if temperature > 0 else 1.0), temperature == 0
        # longest prompts first (popped from the end): in this task a longer question has a longer answer, so the
        # last rows to finish are short ones and the batch drains quickly; a completion does not depend on when its
        # row starts (its stream is its key's)
        waiting = sorted(range(len(prompts)), key=lambda j: (len(prompts[j]), -j))
        free = list(range(self.slots))[::-1]
        s = _Rows.empty()
        owner: list = []                                         # prompt index of each active row
        started = finished_tokens = 0
        try:
            while waiting or owner:
                if owner:
                    done = s.done.tolist()
                    if any(done):
                        keep = [r for r, d in enumerate(done) if not d]
                        n_gen, stopped, slot = s.n_gen.tolist(), s.stopped.tolist(), s.slot.tolist()
                        capped = s.capped.tolist()
                        for r, d in enumerate(done):
                            if d:
                                on_finish(owner[r], self.out[slot[r], :n_gen[r]].tolist(), bool(stopped[r]),
                                          self.out_logp[slot[r], :n_gen[r]].tolist(), bool(capped[r]))
                                free.append(slot[r])
                                finished_tokens += n_gen[r]
                        s = s.select(keep)
                        owner = [owner[r] for r in keep]
                take = []
                while waiting and free:
                    take.append((waiting.pop(), free.pop()))
                if take:
                    for j, slot in take:
                        self.prompt_buf[slot, :len(prompts[j])] = torch.tensor(prompts[j])
                    s = s.join(_Rows.admit([prompts[j] for j, _ in take], [slot for _, slot in take],
                                           [keys[j] for j, _ in take], max_new_tokens))
                    owner += [j for j, _ in take]
                    started += len(take)
                if not owner:
                    break
                for _ in range(self.sync_every):
                    self._step(s, inv_temp, greedy)
                if on_step is not None:
                    on_step(started, finished_tokens + int(s.n_gen.sum()))
        finally:
            self.fused = None


class _Rows:
    """The active rows' state, one entry per row (tensors of equal length)."""

    FIELDS = ("slot", "tok", "pos", "plen", "n_gen", "limit", "key", "done", "stopped", "capped", "marks")

    def __init__(self, **t):
        for k in self.FIELDS:
            setattr(self, k, t[k])

    @classmethod
    def empty(cls):
        z = torch.zeros(0, dtype=torch.long)
        return cls(**{k: (z.bool() if k in ("done", "stopped", "capped") else z) for k in cls.FIELDS})

    @classmethod
    def admit(cls, prompts, slots, keys, limit):
        n = len(prompts)
        long = lambda xs: torch.tensor(xs, dtype=torch.long)  # noqa: E731
        return cls(slot=long(slots), tok=long([p[0] for p in prompts]), pos=torch.zeros(n, dtype=torch.long),
                   plen=long([len(p) for p in prompts]), n_gen=torch.zeros(n, dtype=torch.long),
                   limit=torch.full((n,), limit, dtype=torch.long), key=long(keys),
                   done=torch.zeros(n, dtype=torch.bool), stopped=torch.zeros(n, dtype=torch.bool),
                   capped=torch.zeros(n, dtype=torch.bool), marks=torch.zeros(n, dtype=torch.long))

    def select(self, rows):
        idx = torch.tensor(rows, dtype=torch.long)
        return _Rows(**{k: getattr(self, k)[idx] for k in self.FIELDS})

    def join(self, other):
        return _Rows(**{k: torch.cat([getattr(self, k), getattr(other, k)]) for k in self.FIELDS})
