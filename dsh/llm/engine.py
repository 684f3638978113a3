"""Fast sampling for decoder-only models: the pi_theta that writes attempts, sampled many rows at a time.

``model.generate`` decodes a small model such as the embedded SmolLM2-135M slowly on a GPU: every decoding step
launches hundreds of small kernels from Python, so a step costs ~70-90 ms whatever the batch (measured on an H100;
README, "Which engine runs where"). :class:`Engine` is a small decode loop that removes that cost and the waste:

- a KV cache allocated once, ``[layers, slots, kv_heads, max_len, head_dim]``, one slot per row;
- continuous batching: a row that finishes frees its slot, which is refilled with a waiting prompt (prompts are
  prefilled in one forward pass, right-padded, causal);
- attention that reads only the used part of the cache (the smallest length bucket that holds every active row) and
  groups query heads over their key/value head without copying KV;
- sampling on the device (exponential race = categorical sampling; argmax when greedy), and the stop test (end-of-turn
  tokens, per-row token limit, and optionally the n-th occurrence of one token: ``stop_after``) on the device too, so
  the host looks at the rows only every ``sync_every`` steps;
- on CUDA, the one-token step of each length bucket captured once in a CUDA graph and replayed;
- on the CPU (float32 models), :class:`dsh.llm.kernel_engine.KernelDecoder`: prompts fed through the decoding step,
  only the rows in flight computed, attention and the small operations in C (:mod:`dsh.llm.kernels`).
  ``attention="torch"`` keeps the path above on the CPU too (``dsh bench`` compares the two).

The layers themselves are the model's own modules (its projections, norms, MLP, rotary table and ``lm_head``), so
the weights are shared with the model: a training step that updates them in place is seen by the next generation
(GRPO rollouts need no weight copy). Supported: decoder layers of the llama family (``llama``, ``qwen2``,
``mistral`` without sliding window, ``qwen3``); :func:`supports` says whether a model qualifies, and callers fall
back to ``model.generate`` otherwise.

Exactness: greedy decoding returns the same tokens as ``model.generate`` (tests, on the embedded model); sampling
draws each token from softmax(logits / temperature), with no top-k/top-p filter (the paper's protocol: temperature 1,
top_p 1), which the tests compare with ``model.generate`` by token frequencies. Randomness is counted, not drawn: the
uniform behind token ``t`` of a row is a hash of (seed, the row's key, t, vocabulary index), so a prompt's completion
depends on its seed and key only - not on the batch it shares, the slot it lands in, or how many rows run at once
(``dsh evaluate`` keys rows by question, so an interrupted evaluation resumed with another batch size continues with
the same responses).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from ..core import validate as v
from . import kernels
from .kernel_engine import KernelDecoder, attention_shape
from .request import checked_request, checked_stop_after
from .streams import counted_uniform

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral", "qwen3")
ATTENTION = ("auto", "kernels", "torch")
KV_CACHE = kernels.KV_CACHE         # the CPU path's KV cache dtype (Engine's kv_cache)


def supports(model) -> str | None:
    """None when :class:`Engine` can run ``model``; otherwise a one-line reason."""
    cfg = getattr(model, "config", None)
    mt = getattr(cfg, "model_type", None)
    if mt not in SUPPORTED_MODEL_TYPES:
        return f"model_type {mt!r} is not one of {', '.join(SUPPORTED_MODEL_TYPES)}"
    if getattr(cfg, "use_sliding_window", False) or (mt == "mistral" and getattr(cfg, "sliding_window", None)):
        return "sliding-window attention is not supported"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
        return "the model has no .model.layers / .model.rotary_emb (not a plain causal LM)"
    if getattr(inner.rotary_emb, "rope_type", "default") == "dynamic":
        return "dynamic RoPE scaling depends on the sequence length and is not supported"
    if hasattr(model, "peft_config"):
        return "a peft model: merge the adapter first"
    return None


def kernels_unsuitable(model, attention: str = "auto") -> str | None:
    """Why the CPU path (:mod:`dsh.llm.kernel_engine`) cannot run ``model`` (None when it can)."""
    if attention == "torch":
        return "attention='torch' was asked for"
    p = next(model.parameters())
    if p.device.type != "cpu":
        return f"the model is on {p.device.type}; the kernels run on the CPU"
    if p.dtype != torch.float32:
        return f"the model is {p.dtype}; the kernels are float32"
    if hasattr(model.model.layers[0].self_attn, "q_norm"):
        return "per-head q/k norms (qwen3) are not in the kernels"
    return kernels.unavailable()


class _Progress:
    """The generation bar: rows finished out of all, with the rows started and the tokens written so far in its
    postfix (redrawn at most twice a second), so that a long first batch shows movement before any row ends."""

    def __init__(self, total: int):
        from tqdm import tqdm

        self.bar = tqdm(total=total, desc="generate", unit="row")
        self.shown = 0.0

    def step(self, started: int, tokens: int) -> None:
        now = time.monotonic()
        if now - self.shown >= 0.5:
            self.shown = now
            self.bar.set_postfix(started=started, tokens=tokens)

    def finished(self, n: int) -> None:
        self.bar.update(n)

    def close(self) -> None:
        self.bar.close()


@dataclass
class Generation:
    """One generated row: ``tokens`` (the completion, with the end-of-turn token when it stopped on one),
    ``stopped`` (True when an end-of-turn token ended it, False when the token limit did), ``logprobs`` (each token's
    log-probability under the softmax(logits / T) it was drawn from; T = 1 when greedy), ``capped`` (True when
    :meth:`Engine.generate`'s ``stop_after`` ended it: its last token is the n-th occurrence of the stop token)."""

    tokens: list
    stopped: bool
    logprobs: list | None = None
    capped: bool = False

    @property
    def text_tokens(self) -> list:
        """The completion without its end-of-turn token."""
        return self.tokens[:-1] if self.stopped else self.tokens


class Engine:
    """Continuous-batching decoder over a model's own layers (see the module docstring).

    ``slots``: rows decoded at once; ``max_len``: prompt + completion tokens a row may hold;
    ``bucket``: granularity (tokens) of the attention length; ``cuda_graphs``: capture the decode
    step on CUDA (None: when the model is on CUDA); ``sync_every``: decoding steps between two looks
    of the host at the rows (None: 16, and 1 on the kernel path, where a look costs microseconds);
    ``prefill_tokens``: padded tokens per prefill forward pass; ``attention``: ``kernels`` (the CPU path
    of :mod:`dsh.llm.kernel_engine`), ``torch`` (batched matmuls over a length bucket, the GPU path) or
    ``auto`` (kernels where they apply and build). :attr:`attention` says which runs, :attr:`why_torch` why
    the kernels do not. ``kv_cache``: the CPU path's cache dtype, ``float32`` (the default: every sample equals the
    torch path's up to float rounding) or ``float16`` (keys and values rounded to half as they are stored: half the
    bytes the attention reads; refused where :func:`dsh.llm.kernels.half_cache` does not hold)."""

    def __init__(self, model, eos_token_ids, slots: int = 64, max_len: int = 2048, bucket: int = 128,
                 cuda_graphs: bool | None = None, sync_every: int | None = None, prefill_tokens: int = 16384,
                 attention: str = "auto", kv_cache: str = "float32"):
        why = supports(model)
        if why:
            raise ValueError(f"model is not supported by dsh.llm.engine: {why}")
        v.choice("attention", attention, ATTENTION)
        v.choice("kv_cache", kv_cache, KV_CACHE)
        self.slots = v.positive_int("slots", slots)
        self.max_len = v.positive_int("max_len", max_len)
        self.bucket = v.positive_int("bucket", bucket)
        if sync_every is not None:
            v.positive_int("sync_every", sync_every)
        self.prefill_tokens = v.positive_int("prefill_tokens", prefill_tokens)
        eos = [int(eos_token_ids)] if isinstance(eos_token_ids, int) else [int(t) for t in (eos_token_ids or ())]
        if not eos:
            raise ValueError("eos_token_ids must name at least one end-of-turn token id")
        self.model = model
        inner = model.model
        self.layers = list(inner.layers)
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.n_heads, self.n_kv, self.head_dim, self.scaling = attention_shape(model)
        self.group = self.n_heads // self.n_kv
        if cuda_graphs is None:
            cuda_graphs = self.device.type == "cuda"
        if cuda_graphs and self.device.type != "cuda":
            raise ValueError("cuda_graphs must be False (or None) for a model that is not on CUDA")
        self.cuda_graphs = bool(cuda_graphs)
        self.why_torch = kernels_unsuitable(model, attention)
        if attention == "kernels" and self.why_torch:
            raise ValueError(f"attention 'kernels' cannot run this model: {self.why_torch}; use 'auto' or 'torch'")
        self.attention = "torch" if self.why_torch else "kernels"
        self.sync_every = sync_every or (1 if self.attention == "kernels" else 16)
        if kv_cache == "float16" and (self.attention != "kernels" or not kernels.half_cache(kernels.load())):
            raise ValueError("kv_cache 'float16' needs the CPU path's kernels with half floats in hardware (F16C); "
                             f"here: {self.why_torch or 'no F16C or no _Float16 in the compiler'}; use 'float32'")
        self.kv_cache = kv_cache
        if self.attention == "kernels":
            self._cpu = KernelDecoder(model, eos, self.slots, self.max_len, self.sync_every,
                                      torch.float16 if kv_cache == "float16" else torch.float32)
            return
        self._cpu = None
        dev = self.device
        with torch.no_grad():
            pos = torch.arange(self.max_len, device=dev)[None]
            cos, sin = inner.rotary_emb(torch.zeros(1, device=dev, dtype=self.dtype), pos)
        self.cos, self.sin = cos[0], sin[0]                                 # [max_len, head_dim]
        shape = (len(self.layers), self.slots, self.n_kv, self.max_len, self.head_dim)
        self.k_cache = torch.zeros(shape, device=dev, dtype=self.dtype)
        self.v_cache = torch.zeros(shape, device=dev, dtype=self.dtype)
        B = self.slots
        self.eos = torch.tensor(sorted(set(eos)), device=dev)
        self.rows = torch.arange(B, device=dev)
        self.tok = torch.zeros(B, dtype=torch.long, device=dev)            # last token of each row
        self.pos = torch.zeros(B, dtype=torch.long, device=dev)            # its position
        self.done = torch.ones(B, dtype=torch.bool, device=dev)            # finished or empty slot
        self.stopped = torch.zeros(B, dtype=torch.bool, device=dev)        # ended by an end-of-turn token
        self.capped = torch.zeros(B, dtype=torch.bool, device=dev)         # ended by stop_after
        self.marks = torch.zeros(B, dtype=torch.long, device=dev)          # stop tokens written so far
        self.stop_tok = torch.full((), -1, dtype=torch.long, device=dev)   # stop_after's token (-1: none)
        self.stop_n = torch.ones((), dtype=torch.long, device=dev)         # and its count
        self.n_gen = torch.zeros(B, dtype=torch.long, device=dev)          # tokens generated so far
        self.limit = torch.ones(B, dtype=torch.long, device=dev)           # max new tokens of the row
        self.out = torch.zeros(B, self.max_len, dtype=torch.long, device=dev)
        self.out_logp = torch.zeros(B, self.max_len, dtype=torch.float32, device=dev)
        self.key = torch.zeros(B, dtype=torch.long, device=dev)            # each row's random stream
        self.vocab = None                                                  # arange(V), made at first use
        self.inv_temp = torch.ones((), dtype=torch.float32, device=dev)    # 0: greedy
        self.greedy = torch.ones((), dtype=torch.bool, device=dev)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._pool = None

    # -------------------------------------------------------------------------------------------
    # model pieces
    # -------------------------------------------------------------------------------------------
    def _qkv(self, layer, h, cos, sin):
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        a = layer.self_attn
        B, S, _ = h.shape
        q = a.q_proj(h).view(B, S, -1, self.head_dim)
        k = a.k_proj(h).view(B, S, -1, self.head_dim)
        if hasattr(a, "q_norm"):  # qwen3
            q, k = a.q_norm(q), a.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        val = a.v_proj(h).view(B, S, -1, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, k, val

    def _block(self, layer, x, attn_out):
        x = x + layer.self_attn.o_proj(attn_out)
        return x + layer.mlp(layer.post_attention_layernorm(x))

    def _sample(self, logits, key, step):
        """Next tokens from ``logits [R, V]``: argmax when greedy, else a draw from
        softmax(logits / T) by the exponential race argmax(p_i / E_i), E_i = -log U_i ~ Exp(1), with
        U_i = :func:`counted_uniform` of (the row's ``key``, its token index ``step``, i); with the chosen
        tokens' log-probabilities under softmax(logits / T)."""
        logits = logits.float()
        logp = torch.log_softmax(logits * self.inv_temp, dim=-1)
        if self.vocab is None or self.vocab.numel() != logits.shape[-1]:
            self.vocab = torch.arange(logits.shape[-1], device=logits.device)
        u = counted_uniform(key, step, self.vocab)   # in (0, 1): E > 0, no division by zero
        race = logp.exp() / -torch.log(u)
        new = torch.where(self.greedy, logits.argmax(-1), race.argmax(-1))
        return new, logp.gather(-1, new[:, None])[:, 0]

    # -------------------------------------------------------------------------------------------
    # prefill: new prompts into free slots
    # -------------------------------------------------------------------------------------------
    @torch.no_grad()
    def _prefill(self, slot_ids: list, prompts: list, limits: list, keys: list):
        dev = self.device
        n, P = len(prompts), max(map(len, prompts))
        ids = torch.zeros(n, P, dtype=torch.long, device=dev)
        for r, pr in enumerate(prompts):
            ids[r, :len(pr)] = torch.as_tensor(pr, device=dev)
        lens = torch.tensor([len(pr) for pr in prompts], device=dev)
        slots = torch.tensor(slot_ids, device=dev)
        x = self.model.model.embed_tokens(ids)
        cos, sin = self.cos[:P][None], self.sin[:P][None]
        for i, layer in enumerate(self.layers):
            h = layer.input_layernorm(x)
            q, k, val = self._qkv(layer, h, cos, sin)
            self.k_cache[i, slots, :, :P] = k
            self.v_cache[i, slots, :, :P] = val
            if self.group > 1:
                k, val = k.repeat_interleave(self.group, 1), val.repeat_interleave(self.group, 1)
            o = torch.nn.functional.scaled_dot_product_attention(q, k, val, is_causal=True, scale=self.scaling)
            x = self._block(layer, x, o.transpose(1, 2).reshape(n, P, -1))
        last = self.model.model.norm(x[torch.arange(n, device=dev), lens - 1])
        self.key[slots] = torch.tensor(keys, dtype=torch.long, device=dev)
        first, first_logp = self._sample(self.model.lm_head(last), self.key[slots],
                                         torch.zeros(n, dtype=torch.long, device=dev))
        lim = torch.tensor(limits, device=dev)
        is_eos = (first[:, None] == self.eos[None]).any(-1)
        self.out[slots, 0] = first
        self.out_logp[slots, 0] = first_logp
        self.tok[slots] = first
        self.pos[slots] = lens
        self.n_gen[slots] = 1
        self.limit[slots] = lim
        hit = first == self.stop_tok
        cap = hit & ~is_eos & (self.stop_n <= 1)
        self.stopped[slots] = is_eos
        self.marks[slots] = hit.long()
        self.capped[slots] = cap
        self.done[slots] = is_eos | cap | (lim <= 1)

    # -------------------------------------------------------------------------------------------
    # decode: one token for every slot, attention over the first `length` cache positions
    # -------------------------------------------------------------------------------------------
    def _step(self, length: int):
        B, G, D = self.slots, self.group, self.head_dim
        live = ~self.done
        pos = self.pos.clamp(max=self.max_len - 1)
        x = self.model.model.embed_tokens(self.tok)[:, None]                   # [B, 1, hidden]
        cos, sin = self.cos[pos][:, None], self.sin[pos][:, None]
        visible = torch.arange(length, device=self.device)[None] <= pos[:, None]   # [B, length]
        mask = visible[:, None, None, :]
        for i, layer in enumerate(self.layers):
            h = layer.input_layernorm(x)
            q, k, val = self._qkv(layer, h, cos, sin)                          # q [B, H, 1, D]
            self.k_cache[i, self.rows, :, pos] = k[:, :, 0]
            self.v_cache[i, self.rows, :, pos] = val[:, :, 0]
            K = self.k_cache[i, :, :, :length]                                 # [B, KV, length, D], a view
            V = self.v_cache[i, :, :, :length]
            s = torch.matmul(q.reshape(B, self.n_kv, G, D), K.transpose(-1, -2)).float() * self.scaling
            s = s.masked_fill(~mask, float("-inf"))
            o = torch.matmul(torch.softmax(s, dim=-1).to(V.dtype), V)          # [B, KV, G, D]
            x = self._block(layer, x, o.reshape(B, 1, -1))
        new, logp = self._sample(self.model.lm_head(self.model.model.norm(x[:, 0])), self.key, self.n_gen)
        idx = self.n_gen.clamp(max=self.max_len - 1)
        self.out[self.rows, idx] = torch.where(live, new, self.out[self.rows, idx])
        self.out_logp[self.rows, idx] = torch.where(live, logp, self.out_logp[self.rows, idx])
        self.n_gen += live.long()
        ended = live & (new[:, None] == self.eos[None]).any(-1)
        hit = live & (new == self.stop_tok)
        self.marks += hit.long()
        cap = hit & ~ended & (self.marks >= self.stop_n)
        self.stopped |= ended
        self.capped |= cap
        self.done |= ended | cap | (live & (self.n_gen >= self.limit))
        self.pos += live.long()
        self.tok.copy_(torch.where(live, new, self.tok))

    def _run_step(self, length: int):
        if not self.cuda_graphs:
            return self._step(length)
        g = self._graphs.get(length)
        if g is None:
            try:
                g = self._capture(length)
            except RuntimeError as e:  # pragma: no cover - CUDA only: a failed capture must not end a long run
                import warnings

                warnings.warn(f"dsh.llm.engine: CUDA graph capture failed ({str(e).splitlines()[0][:200]}); "
                              f"decoding without graphs", stacklevel=2)
                self.cuda_graphs = False
                return self._step(length)
        g.replay()

    def _capture(self, length: int):  # pragma: no cover - CUDA only
        state = [self.tok, self.pos, self.done, self.stopped, self.capped, self.marks, self.n_gen, self.out,
                 self.out_logp]
        saved = [t.clone() for t in state]
        rng = torch.cuda.get_rng_state(self.device)
        try:
            return self._capture_from(length, state, saved, rng)
        except RuntimeError:
            torch.cuda.synchronize(self.device)
            for t, s in zip(state, saved):   # the warm-up may have advanced the rows: undo it
                t.copy_(s)
            torch.cuda.set_rng_state(rng, self.device)
            raise

    def _capture_from(self, length, state, saved, rng):  # pragma: no cover - CUDA only
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up outside the graph (allocator, cuBLAS handles)
                self._step(length)
        torch.cuda.current_stream(self.device).wait_stream(side)
        for t, s in zip(state, saved):
            t.copy_(s)
        torch.cuda.set_rng_state(rng, self.device)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self._pool):
            self._step(length)
        self._pool = g.pool()
        self._graphs[length] = g
        return g

    def _generate_cpu(self, prompts, keys, max_new_tokens, temperature, progress, callback, was_training,
                      stop_after):
        results: list = [None] * len(prompts)
        bar = _Progress(len(prompts)) if progress else None

        def finish(i, tokens, stopped, logprobs, capped):
            results[i] = gen = Generation(tokens=tokens, stopped=stopped, logprobs=logprobs, capped=capped)
            if callback is not None:
                callback(i, gen)
            if bar is not None:
                bar.finished(1)

        try:
            self._cpu.generate(prompts, keys, max_new_tokens, temperature, finish,
                               on_step=bar.step if bar is not None else None, stop_after=stop_after)
        finally:
            if bar is not None:
                bar.close()
            self.model.train(was_training)
        return results

    def log_products(self, log: list | None, attention: list | None = None) -> None:
        """CPU path (``dsh bench``): every matrix product of the next :meth:`generate` calls appends ``(rows, flops,
        seconds)`` to the list ``log``, every step in C ``(rows, cache bytes, seconds)`` of its attention to the list
        ``attention`` (every row's attended keys and values, all layers; in parts, the threads' mean); None: neither."""
        if self._cpu is None or not all(x is None or isinstance(x, list) for x in (log, attention)):
            raise ValueError("log_products needs the CPU path (attention 'kernels') and a list or None as log and attention")
        self._cpu.product_log, self._cpu.attention_log = log, attention

    def plan(self) -> None:
        """CPU path: decide how the decoding step takes its products at every row count up to ``slots`` now (kept per
        machine, :mod:`dsh.llm.decisions`), not as a :meth:`generate` first meets each (``dsh bench`` times those)."""
        if self._cpu is not None:
            self._cpu.plan()

    # -------------------------------------------------------------------------------------------
    # the public loop
    # -------------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompts, max_new_tokens: int, temperature: float = 1.0, seed: int | None = 0,
                 progress: bool = False, callback=None, keys=None, stop_after=None) -> list[Generation]:
        """Complete every prompt (a list of token-id lists); returns one :class:`Generation` per
        prompt, in order. ``temperature`` 0 is greedy. ``callback(i, generation)`` is called as each
        row finishes (rows finish out of order). ``seed``: the base of every row's random stream (None:
        drawn from torch's generator); ``keys``: one integer per prompt naming its stream (default: its
        position), so that a prompt keeps its completion whatever else runs beside it. ``stop_after``:
        ``(token_id, n)`` ends a row right after it writes ``token_id`` for the n-th time (``capped``), e.g. an
        attempt budget; None: only end-of-turn tokens and the token limit end rows."""
        prompts, max_new_tokens, keys = checked_request(prompts, max_new_tokens, temperature, seed, keys, self.max_len)
        stop_after = checked_stop_after(stop_after)
        was_training = self.model.training
        self.model.eval()
        if self._cpu is not None:
            return self._generate_cpu(prompts, keys, max_new_tokens, temperature, progress, callback, was_training,
                                      stop_after)
        self.stop_tok.fill_(-1 if stop_after is None else stop_after[0])
        self.stop_n.fill_(1 if stop_after is None else stop_after[1])
        self.greedy.fill_(temperature == 0)
        self.inv_temp.fill_(1.0 / temperature if temperature > 0 else 1.0)
        self.done.fill_(True)
        results: list = [None] * len(prompts)
        owner = [-1] * self.slots                 # prompt index held by each slot
        bound = [0] * self.slots                  # upper bound of each slot's position
        waiting = list(range(len(prompts)))[::-1]
        bar = _Progress(len(prompts)) if progress else None
        started = written = 0
        try:
            while waiting or any(o >= 0 for o in owner):
                free = [s for s in range(self.slots) if owner[s] < 0]
                busy = self.slots - len(free)
                if waiting and free and (busy == 0 or len(free) >= max(1, self.slots // 8)):
                    take, longest = [], 0
                    while waiting and len(take) < len(free):
                        longest = max(longest, len(prompts[waiting[-1]]))
                        if take and (len(take) + 1) * longest > self.prefill_tokens:
                            break
                        take.append(waiting.pop())
                    use = free[:len(take)]
                    self._prefill(use, [prompts[j] for j in take], [max_new_tokens] * len(take),
                                  [keys[j] for j in take])
                    for s, j in zip(use, take):
                        owner[s], bound[s] = j, len(prompts[j])
                    started += len(take)
                active = [s for s in range(self.slots) if owner[s] >= 0]
                length = min(self.max_len, math.ceil((max(bound[s] for s in active) + self.sync_every + 1)
                                                     / self.bucket) * self.bucket)
                for _ in range(self.sync_every):
                    self._run_step(length)
                for s in active:
                    bound[s] += self.sync_every
                written += len(active) * self.sync_every      # at most: a row that stopped writes no more
                if bar is not None:
                    bar.step(started, written)
                done = self.done.tolist()
                finished = [s for s in active if done[s]]
                if finished:
                    n_gen, stopped, capped = self.n_gen.tolist(), self.stopped.tolist(), self.capped.tolist()
                    width = max(n_gen[s] for s in finished)          # up to the longest done row, not the limit
                    rows, logps = self.out[finished, :width].tolist(), self.out_logp[finished, :width].tolist()
                    for s, row, lp in zip(finished, rows, logps):
                        gen = Generation(tokens=row[:n_gen[s]], stopped=bool(stopped[s]), logprobs=lp[:n_gen[s]],
                                         capped=bool(capped[s]))
                        results[owner[s]] = gen
                        if callback is not None:
                            callback(owner[s], gen)
                        owner[s] = -1
                    if bar is not None:
                        bar.finished(len(finished))
        finally:
            if bar is not None:
                bar.close()
            self.model.train(was_training)
        return results
