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
- runs attention, RoPE with the cache write, RMSNorm, the gated activation, the sampling and the rows' bookkeeping
  in C, and the q/k/v and gate/up projections as one matrix product each (weights concatenated from the live
  weights at the start of every :meth:`generate`, so that a training step before it is seen), each product by torch
  or by oneDNN, whichever is faster among those equal to torch's bit for bit (:mod:`dsh.llm.products`);
- takes the whole step, from the embedding to the rows' bookkeeping, in one C call (``decode_step``) at every row
  count where no product is split and torch's ``sgemm_``, called from C (:mod:`dsh.llm.blas`), gives torch's bits
  for each (checked once per machine; where the step in Python would take oneDNN's product, that one has the same
  bits): the same operations in the same order as the step in Python, without
  its ~40 calls from Python a step (~0.45 ms of a 3.4 ms step at 256 rows on the 2-core machine; 1.1-1.2x end to end
  there, outputs identical: README, "Performance"); where MKL's product from a weight packed once a generate gives
  the same bits at a row count (checked once per machine), the C step takes that one (the evaluation ~1.05x, sampling
  unchanged, alternating in one process). Other row counts, a bias, another activation, a torch without ``sgemm_``,
  or ``c_step = False``: the step in Python;
- on two threads or more, cuts that C step's rows into as many parts, each part's whole step on one thread (one
  parallel region a step: no thread waits between the step's operations, and each product runs on one thread over
  rows its core's cache holds), at every row count where each product's parts give its product over all rows bit for
  bit (checked once per machine, :func:`dsh.llm.products.parts_agree`); the same completions. On the 2-core AMD
  Zen 4, alternating in one process (256 rows x 200 tokens of the sampling bench): the step's products 2.49 ms a step
  in parts against 2.82-2.89 ms over all rows, sampling 1.05-1.11x (README, "Performance"). ``c_parts = False``:
  every C step over all rows. Where every product is the panel product (below), whose rows do not depend on their
  neighbours, the parts are cut to equal costs rather than equal row counts: a row costs its attended positions plus
  :attr:`KernelDecoder.row_cost`, its products' time in positions, which the C step learns from the parts' times (the
  rows admitted last, at the end, attend fewest positions). ``c_balance = False``: equal row counts;
- takes each product of that C step by its own panel product (``panel_product`` in C, AVX-512: each output one chain
  of fused multiply-adds, in the chunks MKL sums) at every row count where it gives torch's bits (checked once per
  machine, :func:`dsh.llm.products.panels_agree`; at the laptop base's shapes on the AMD Zen 4, from 8 rows on, 9
  rows aside), since it skips MKL's copies and scaling around its kernel: 110-114 GFLOP/s a core against MKL's 92-97
  alone at 128 rows; sampling (256 prompts, up to 200 tokens, float16 cache) 1.14x (1.05-1.27x), its C steps 1.19x
  (12 alternations in one process), on another day 1.20x (1.02-1.29x, 8 alternations), the same completions.
  ``c_panels = False``: the library's products;
- runs the generate loop itself in C where every step may be a C step (:mod:`dsh.llm.step_loop`): the steps, each
  done row's tokens copied out and its slot freed, each waiting prompt started in a free slot, the same rows in the
  same order as this loop in Python, the host taking the finished rows a few times a second. On the 2-core AMD Zen 4
  (the sampling bench's 1024 prompts, 256 slots, 200 tokens, float16 cache; 10 alternations in one process, a fresh
  engine each, its row counts decided ahead): 1.10x (0.91-1.55x), the same completions. ``c_loop = False``: a return
  to Python after every step.

It samples exactly as :class:`dsh.llm.engine.Engine` does: the counted uniforms of (seed, the row's key, the token's
index, the vocabulary index) (:func:`dsh.llm.streams.counted_uniform`, bit for bit), in the Gumbel-max form of the
draw from softmax(logits / T); greedy is the argmax. A completion depends on its prompt, seed and key only.
"""

from __future__ import annotations

import contextlib
import ctypes

import numpy as np
import torch

from . import blas, decisions, kernels, step_loop
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


def _weights(linear) -> tuple:
    """A linear layer's (weight, bias or None), detached from the live parameters."""
    return linear.weight.detach(), None if linear.bias is None else linear.bias.detach()


def _step_products(layers, head) -> list:
    """The step's products in its order, each ``(kind, (weight, bias))``: per layer (:meth:`KernelDecoder._fuse`'s
    tuples) the fused q/k/v (``linear``), the output projection into the residual (``addmm``), the fused gate/up
    (``linear``) and the down projection into the residual (``addmm``); then the LM head (``linear``)."""
    return [(k, wb) for ly in layers for k, wb in zip(("linear", "addmm") * 2, (ly[1], ly[2], ly[4], ly[5]))] + [
        ("linear", head)]


def _norm_of(norm) -> tuple:
    """An RMS norm's (weight, eps)."""
    return norm.weight.detach(), norm.variance_epsilon


ROW_FIELDS = ("slot", "tok", "pos", "plen", "n_gen", "limit", "key", "done", "stopped", "capped", "marks", "lens")
_ROW = {f: i for i, f in enumerate(ROW_FIELDS)}
_FINISH = [_ROW[f] for f in ("n_gen", "stopped", "slot", "capped")]   # what a finished row hands on


class StepModel(ctypes.Structure):
    """The C step's view of the model and its buffers (``step_model`` in ``cpu_kernels.c``, field for field)."""
    _fields_ = ([(f, ctypes.c_int64) for f in ("L", "N", "F", "H", "KV", "D", "M", "V", "half")]
                + [("scale", ctypes.c_float), ("final_eps", ctypes.c_float)]
                + [(f, ctypes.c_void_p) for f in ("embed", "final_norm", "head", "cos", "sin", "eps", "layers",
                                                  "packed", "panels", "x", "normed", "qkv", "att", "gu", "act",
                                                  "logits", "new_logp", "new_tok", "row_cost")])


class KernelDecoder:
    """Decoder of a llama-family float32 model on the CPU (see the module docstring): ``slots`` rows at once, at most
    ``max_len`` prompt + completion tokens a row, the host looking at the rows every ``sync_every`` steps, its KV
    cache in ``kv_dtype`` (float32, or float16 where :func:`dsh.llm.kernels.half_cache` holds)."""
    ROWS, N_GEN = len(ROW_FIELDS), _ROW["n_gen"]

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
        self.fused = self.bufs = None
        self.stop_after = None
        self.product_log = None       # a list: every product of the next generate appends (rows, flops, seconds)
        self.attention_log = None     # a list: every C step of the next generate appends (rows, cache bytes, seconds)
        self.c_step = True            # whole steps in C where :meth:`way_in_c` holds (False: every step in Python)
        self.c_parts = True           # the C step's rows in parts, one a thread, where :meth:`way_in_c` allows it (an int:
        #                               that many parts, however many threads; False: every C step over all rows)
        self.c_panels = True          # the C step's own products where they give torch's bits (False: the library's)
        self.c_balance = True         # the C step's parts cut to equal costs where its products allow any cut (False:
        #                               equal row counts); the cost of a row's products in attended positions, learnt
        self.row_cost = torch.tensor([64.0], dtype=torch.float64)   # as the steps run (kept across generates)
        self.c_loop = True            # the generate loop in C where every step may be (dsh.llm.step_loop; False: in
        #                               Python, a return from C every step)
        self.c_model = None
        self.ways, self._c_key = None, None   # way_in_c's decisions (step_loop.ways_table), kept while what they
        #                                       depend on (_c_key) stays the same

    def _fuse(self) -> list:
        """Per layer, from the live weights: its input norm's (weight, eps), the fused q/k/v (weight, bias), the
        output projection's (weight, bias), the post-attention norm's (weight, eps), the fused gate/up (weight, bias),
        the down projection's (weight, bias) and the MLP's activation (None: SiLU, in C); every product's weight
        prepared for :class:`dsh.llm.products.Products`."""
        self.products = Products(self.slots, self.product_log)
        layers = []
        for ly in self.layers:
            qkv, gu = fused_projections(ly)
            o, down = (_weights(lin) for lin in (ly.self_attn.o_proj, ly.mlp.down_proj))
            self.products.prepare(qkv[0])
            self.products.prepare(gu[0])
            self.products.prepare(o[0])
            self.products.prepare(down[0])
            layers.append((_norm_of(ly.input_layernorm), qkv, o, _norm_of(ly.post_attention_layernorm), gu, down,
                           None if self.silu else ly.mlp.act_fn))
        self.head = _weights(self.model.lm_head)
        self.products.prepare(self.head[0])
        self.final_norm = _norm_of(self.model.model.norm)
        self.c_model = self._c_model(layers)
        if self.c_model is not None:
            key = (tuple((k, tuple(w.shape)) for k, w in self.c_products), torch.get_num_threads(), self.c_parts,
                   self.c_panels, bool(self._packed), bool(self._panels), self.lib.build)
            if key != self._c_key:   # what way_in_c's decisions depend on (every check is per shape and row count)
                self.ways, self._c_key = step_loop.ways_table(self.slots, len(self.c_products)), key
        return layers

    def _c_model(self, layers):
        """The C step's :class:`StepModel` over this generate's weights and buffers, or None where the C step cannot
        take the model's step (a bias, another activation or embedding, no ``sgemm_`` from torch, turned off)."""
        emb = self.model.model.embed_tokens
        weights = [w for ly in layers for w in (ly[1], ly[2], ly[4], ly[5])] + [self.head]
        weights.append((emb.weight, None))
        if not (self.c_step and blas.address() is not None and self.silu and type(emb) is torch.nn.Embedding
                and emb.max_norm is None
                and all(b is None and w.dtype == torch.float32 and w.is_contiguous() for w, b in weights)):
            return None
        packed_fns = blas.packed_addresses()
        self.lib.set_sgemm(blas.address(), packed_fns[2] if packed_fns else None, blas.local_threads_address())
        self.c_products = [(k, w) for k, (w, _) in _step_products(layers, self.head)]
        # each weight packed by MKL once a generate (its products at row counts where that gives torch's bits)
        self._packed = [blas.pack(w, self.slots) for _, w in self.c_products] if packed_fns else []
        # and in panels for the step's own product (at row counts where it gives torch's bits)
        self._panels = [kernels.panel_pack(self.lib, w) for _, w in self.c_products] if (
            self.c_panels and kernels.has_panels(self.lib)) else []
        addr = [t.data_ptr() for i, ly in enumerate(layers)
                for t in (ly[0][0], ly[1][0], ly[2][0], ly[3][0], ly[4][0], ly[5][0], self.k_cache[i], self.v_cache[i])]
        self._keep = (torch.tensor(addr, dtype=torch.int64),
                      torch.tensor([e for ly in layers for e in (ly[0][1], ly[3][1])], dtype=torch.float32),
                      torch.empty(len(self.c_products) + 1, dtype=torch.float64), emb.weight.detach(),
                      torch.tensor([p.data_ptr() for p in self._packed] or [0] * len(self.c_products), dtype=torch.int64),
                      torch.tensor([p.data_ptr() for p in self._panels] or [0] * len(self.c_products), dtype=torch.int64))
        N, HD, F = self.model.config.hidden_size, self.H * self.D, layers[0][4][0].shape[0] // 2
        buf = {name: self._buffer(name, self.slots, cols).data_ptr() for name, cols in (
            ("x", N), ("normed", N), ("qkv", (self.H + 2 * self.KV) * self.D), ("attended", HD), ("gate_up", 2 * F),
            ("activated", F), ("logits", self.head[0].shape[0]), ("new_logp", 1))}
        self.new_tok = torch.empty(self.slots, dtype=torch.long)
        return StepModel(L=len(layers), N=N, F=F, H=self.H, KV=self.KV, D=self.D, M=self.M, V=self.head[0].shape[0],
                         half=int(self.k_cache.element_size() == 2), scale=self.scaling, final_eps=self.final_norm[1],
                         embed=self._keep[3].data_ptr(), final_norm=self.final_norm[0].data_ptr(),
                         head=self.head[0].data_ptr(), cos=self.cos.data_ptr(), sin=self.sin.data_ptr(),
                         eps=self._keep[1].data_ptr(), layers=self._keep[0].data_ptr(),
                         packed=self._keep[4].data_ptr(), panels=self._keep[5].data_ptr(), x=buf["x"],
                         normed=buf["normed"], qkv=buf["qkv"], att=buf["attended"], gu=buf["gate_up"],
                         act=buf["activated"], logits=buf["logits"], new_logp=buf["new_logp"],
                         new_tok=self.new_tok.data_ptr(), row_cost=self.row_cost.data_ptr() if self.c_balance else None)

    def way_in_c(self, A: int):
        """Whether a step of ``A`` rows runs in C: each of its products may be taken through ``sgemm_`` there
        (:meth:`dsh.llm.products.Products.in_c`); then (a true value) ``(parts, ways)``: how it takes each product (an
        int64 per product, ``decode_step``'s way: 0 ``sgemm_``; 1 the weight packed by MKL,
        :meth:`dsh.llm.products.Products.packed`; a chunk >= 2: the step's own panel product,
        :meth:`dsh.llm.products.Products.panels`, preferred where it gives torch's bits) and in how many parts of the
        rows, one a thread (torch's thread count where every product's parts give its bits,
        :meth:`dsh.llm.products.Products.in_parts` (the panel product's rows depend on their own row alone), else 1:
        the products' threads over all rows); else None. Decided once per row count, and kept (in :attr:`ways`, the
        table the loop in C reads) while the products' shapes, the threads and the settings they depend on stay the
        same."""
        t = self.ways
        if t[A, 0] < 0:
            way = None
            if all(self.products.in_c(k, w, A) for k, w in self.c_products):
                packed = [bool(self._packed) and self.products.packed(k, w, A) for k, w in self.c_products]
                chunks = [self.products.panels(k, w, A) if self._panels else 0 for k, w in self.c_products]
                parts = (torch.get_num_threads() if self.c_parts is True else int(self.c_parts)) if self.c_parts else 1
                if parts > 1 and not (A >= parts and all(c or self.products.in_parts(k, w, A, parts, p)
                                                         for (k, w), p, c in zip(self.c_products, packed, chunks))):
                    parts = 1
                way = (parts, [c or int(p) for p, c in zip(packed, chunks)])
            step_loop.set_way(t, A, way)
        return (int(t[A, 0]), torch.from_numpy(t[A, 1:])) if t[A, 0] > 0 else None

    def plan(self) -> None:
        """Decide now how the step takes its products at every row count ``1 .. slots``, in C (:meth:`way_in_c`) or in
        Python (:class:`dsh.llm.products.Products`), each decision kept on disk (:mod:`dsh.llm.decisions`), so that a
        later generate finds them made instead of making each as its rows first come to that count (all of them: 0.7 s
        at 256 slots for the laptop base, on a machine and kernels' build that had met none)."""
        with self._prepared():
            # each product's way in the Python step (a product with a bias: torch's product, no way to decide)
            ways = [(k, w) for k, (w, b) in _step_products(self.fused, self.head) if b is None]
            for A in range(1, self.slots + 1):
                for k, w in ways:                # where C does not take A
                    self.products.in_c(k, w, A)
                if self.c_model is not None:
                    self.way_in_c(A)

    @contextlib.contextmanager
    def _prepared(self):
        """The model's weights fused for one call (:meth:`_fuse`: :attr:`fused`, :attr:`bufs` and, for the step in C,
        :attr:`c_model`), dropped after it, and the products' new decisions written for later processes (a worker
        exits unflushed)."""
        self.bufs = {}
        self.fused = self._fuse()
        try:
            yield
        finally:
            self.fused = self.bufs = self.c_model = None
            decisions.flush()

    def _step_in_c(self, s, inv_temp: float, greedy: bool, stop_tok: int, stop_n: int, parts: int, ways) -> int:
        """:meth:`_step` as one C call (``decode_step``) in ``parts`` parts of the rows, each product taken as ``ways``
        says (:meth:`way_in_c`), each product's seconds logged where :attr:`product_log` asks for them and the attention's
        (its cache bytes read: every row's attended positions' keys and values in every layer) where
        :attr:`attention_log` does (in parts: averaged over the threads, which take their parts at once)."""
        A, times = s.state.shape[1], self._keep[2]
        timed = self.product_log is not None or self.attention_log is not None
        if timed:
            times.zero_()
            positions = int(s.np[_ROW["lens"]].sum())        # attended by this step (the step moves them on)
        n_done = self.lib.decode_step(ctypes.byref(self.c_model), s.state.data_ptr(), A, inv_temp, int(greedy),
                                      self.out.data_ptr(), self.out_logp.data_ptr(), self.out.shape[1],
                                      self.prompt_buf.data_ptr(), self.prompt_buf.shape[1], self.eos.data_ptr(),
                                      self.eos.numel(), stop_tok, stop_n, ways.data_ptr(),
                                      times.data_ptr() if timed else None, parts)
        if self.product_log is not None:
            self.product_log += [(A, 2 * A * w.numel(), t) for (_, w), t in zip(self.c_products, times.tolist())]
        if self.attention_log is not None:
            per_position = len(self.layers) * 2 * self.KV * self.D * self.k_cache.element_size()
            self.attention_log.append((A, positions * per_position, float(times[-1])))
        return n_done

    def _residual(self, x, a, weights):
        """``x + a @ w.T (+ b)``: one addmm into ``x`` when the layer has no bias."""
        w, b = weights
        if b is None:
            return self.products.add_linear(x, a, w)
        return x + self.products.linear(a, w, b)

    def _buffer(self, name: str, A: int, cols: int):
        """The first ``A`` rows of this generate's ``[slots, cols]`` buffer ``name`` (made at its first use): the
        step's intermediate results land at the same addresses every step instead of fresh allocations (measured
        5-15 us less a product after the attention has swept the caches, 256 rows)."""
        buf = self.bufs.get(name)
        if buf is None:
            buf = self.bufs[name] = torch.empty(self.slots, cols)
        return buf[:A]

    def _norm(self, x, norm):
        return kernels.rms_norm(self.lib, x, norm[0], norm[1], self._buffer("normed", x.shape[0], x.shape[1]))

    def _linear(self, x, weights, name: str):
        w, b = weights
        return self.products.linear(x, w, b, out=self._buffer(name, x.shape[0], w.shape[0]))

    def _logits(self, s):
        """The logits ``[A, V]`` after feeding token ``s.tok`` at position ``s.pos`` of every active row."""
        lib, A = self.lib, s.tok.shape[0]
        x = self.model.model.embed_tokens(s.tok)
        o = self._buffer("attended", A, self.H * self.D).view(A, self.H, self.D)
        for i, (norm_in, qkv_w, o_w, norm_post, gu_w, down_w, act_fn) in enumerate(self.fused):
            qkv = self._linear(self._norm(x, norm_in), qkv_w, "qkv")
            kernels.attend(lib, qkv, self.cos, self.sin, s.pos, s.lens, s.slot, self.k_cache[i], self.v_cache[i], o,
                           self.KV, self.M, self.scaling)
            x = self._residual(x, o.view(A, -1), o_w)
            gu = self._linear(self._norm(x, norm_post), gu_w, "gate_up")
            if act_fn is None:
                act = kernels.silu_mul(lib, gu, self._buffer("activated", A, gu.shape[1] // 2))
            else:
                gate, up = gu.chunk(2, dim=-1)
                act = act_fn(gate) * up
            x = self._residual(x, act, down_w)
        return self._linear(self._norm(x, self.final_norm), self.head, "logits").float().contiguous()

    def _step(self, s, inv_temp: float, greedy: bool) -> int:
        """Feed one token to every active row; rows past their prompt record the token sampled after it
        (:func:`dsh.llm.kernels.advance_rows`). Returns how many rows are done."""
        stop_tok, stop_n = self.stop_after if self.stop_after is not None else (-1, 0)
        if self.c_model is not None and (way := self.way_in_c(s.state.shape[1])) is not None:
            return self._step_in_c(s, inv_temp, greedy, stop_tok, stop_n, *way)
        new, logp = kernels.sample_tokens(self.lib, self._logits(s), s.key, s.n_gen, inv_temp, greedy,
                                          torch.empty_like(s.tok), torch.empty(s.tok.shape[0]))
        return kernels.advance_rows(self.lib, new, logp, s.state, self.out, self.out_logp, self.prompt_buf, self.eos,
                                    stop_tok, stop_n)

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
        with self._prepared():
            self.out = torch.zeros(self.slots, max_new_tokens, dtype=torch.long)
            self.out_logp = torch.zeros(self.slots, max_new_tokens)
            self.prompt_buf = torch.zeros(self.slots, max(map(len, prompts)), dtype=torch.long)
            self.out_np, self.out_logp_np = self.out.numpy(), self.out_logp.numpy()
            self.prompt_np = self.prompt_buf.numpy()
            inv_temp, greedy = (1.0 / temperature if temperature > 0 else 1.0), temperature == 0
            # longest prompts first (popped from the end): in this task a longer question has a longer answer, so the
            # last rows to finish are short ones and the batch drains quickly; a completion does not depend on when its
            # row starts (its stream is its key's)
            waiting = sorted(range(len(prompts)), key=lambda j: (len(prompts[j]), -j))
            free = list(range(self.slots))[::-1]
            width = self.prompt_buf.shape[1]
            table = (np.array([p + [0] * (width - len(p)) for p in prompts], dtype=np.int64),
                     np.array([len(p) for p in prompts], dtype=np.int64),
                     np.array(keys, dtype=np.int64))          # every prompt padded, its length and stream key
            if self.c_model is not None and self.c_loop and self.sync_every == 1 and self.product_log is None \
                    and self.attention_log is None:
                return step_loop.generate_in_c(self, table, waiting, max_new_tokens, inv_temp, greedy, on_finish,
                                               on_step)
            s = _Rows.empty()
            owner: list = []                                     # prompt index of each active row
            started = finished_tokens = n_done = 0
            while waiting or owner:
                if n_done:
                    s, owner, freed, written = self._retire(s, owner, on_finish)
                    free += freed
                    finished_tokens += written
                take = []
                while waiting and free:
                    take.append((waiting.pop(), free.pop()))
                if take:
                    s = self._admit(s, take, table, max_new_tokens)
                    owner += [j for j, _ in take]
                    started += len(take)
                if not owner:
                    break
                for _ in range(self.sync_every):
                    n_done = self._step(s, inv_temp, greedy)
                if on_step is not None:
                    on_step(started, finished_tokens + int(s.np[_ROW["n_gen"]].sum()))

    def python_step(self, state, inv_temp: float, greedy: bool) -> int:
        """:meth:`_step` on the rows ``state`` (``[len(ROW_FIELDS), A]``, :class:`_Rows`' layout) in place."""
        return self._step(_Rows(state), inv_temp, greedy)

    def _retire(self, s, owner: list, on_finish):
        """Hand each done row of ``s`` to ``on_finish`` (its tokens and log-probabilities, all rows' read at once) and
        drop them: the rows left, their owners, the slots freed and the tokens the done rows wrote. The rows' state is
        read through numpy: small torch operations right after a C step take ~35 us each here (cold caches); the
        retirements of the sampling bench's 256 rows 20-26 ms a generate against 30-34 ms through torch."""
        st = s.np
        done = st[_ROW["done"]] != 0
        ended, keep = np.flatnonzero(done), np.flatnonzero(~done)
        n_gen, stopped, slot, capped = st[_FINISH][:, ended].tolist()
        width = max(n_gen, default=0)                              # read up to the longest done row, not the limit
        tokens, logps = self.out_np[slot, :width].tolist(), self.out_logp_np[slot, :width].tolist()
        for r, n, stop, cap, toks, lps in zip(ended.tolist(), n_gen, stopped, capped, tokens, logps):
            on_finish(owner[r], toks[:n], bool(stop), lps[:n], bool(cap))
        return _Rows.of(st[:, keep]), [owner[r] for r in keep.tolist()], slot, sum(n_gen)

    def _admit(self, s, take: list, table: tuple, limit: int):
        """``s`` with the prompts of ``take`` (``(prompt index, slot)`` pairs) as new rows at position 0 of their
        prompts (each attends one position at its first step), their prompts written into their slots' rows of the
        prompt buffer; ``table``: every prompt padded, its length and its stream key (numpy arrays)."""
        js, slots = (np.fromiter((t[i] for t in take), np.int64, len(take)) for i in (0, 1))
        padded, lengths, keys = table
        self.prompt_np[slots] = padded[js]
        new = np.zeros((len(ROW_FIELDS), len(take)), dtype=np.int64)
        for field, values in (("slot", slots), ("tok", padded[js, 0]), ("plen", lengths[js]), ("limit", limit),
                              ("key", keys[js]), ("lens", 1)):
            new[_ROW[field]] = values
        return _Rows.of(np.concatenate([s.np, new], axis=1))


class _Rows:
    """The active rows' state: ``state [len(ROW_FIELDS), A]`` (int64, contiguous; ``np``: the same memory as a numpy
    array), one row of :data:`ROW_FIELDS` each (``done``, ``stopped``, ``capped``: 0 or 1; ``lens``: the positions a
    row attends at the next step, 0 once done), read as attributes (``rows.pos``: a contiguous view); rows leave and
    join as arrays (:meth:`KernelDecoder._retire`, :meth:`KernelDecoder._admit`)."""

    def __init__(self, state):
        self.state = state
        self.np = state.numpy()

    def __getattr__(self, name):
        if name in _ROW:
            return self.state[_ROW[name]]
        raise AttributeError(name)

    @classmethod
    def of(cls, array):
        """The rows of a numpy array ``[len(ROW_FIELDS), A]``."""
        return cls(torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64)))

    @classmethod
    def empty(cls):
        return cls(torch.zeros(len(ROW_FIELDS), 0, dtype=torch.long))
