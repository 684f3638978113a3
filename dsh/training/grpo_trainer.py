"""``EngineGRPOTrainer``: TRL's ``GRPOTrainer`` with its rollouts sampled by :class:`dsh.llm.engine.Engine` and,
with ``padding_free``, its rounds split into steps of similar length and its log-probability passes packed
(:mod:`dsh.training.rollout` explains both and holds the helpers). Importing this module imports TRL."""

from __future__ import annotations

import contextlib
import time

import torch
import torch.nn.functional as F
from trl import GRPOTrainer

from ..llm.engine import Engine
from ..llm.scale import fit_slots
from .rollout import MULTIMODAL, engine_unsuitable, length_sorted_steps


class EngineGRPOTrainer(GRPOTrainer):
    """GRPOTrainer sampling its completions with dsh.llm.engine (module docstring)."""

    _engine = None
    rollout_backend = "dsh"      # dsh, auto (dsh where possible, else TRL's path) or trl
    rollout_kv_cache = "float32"  # the engine's KV cache dtype (float16: half the bytes its CPU attention reads)
    stop_after = None            # (token id, n): a rollout ends right after its n-th such token (an attempt budget)
    padding_free = False         # length-sorted steps and packed log-probability passes (module docstring)
    update_precision = "float32"  # bfloat16: the decoder layers' products in the update pass (bfloat16_layers)
    scoring_precision = "float32"  # bfloat16: the same in the reference model's pass (the KL term's log-probabilities)
    generation_seconds = 0.0     # wall time spent generating rollouts (for dsh bench)
    scoring_seconds = 0.0        # wall time of the reference and old-policy log-probabilities
    update_seconds = 0.0         # wall time of the training steps (forward, backward, optimizer)

    def _prepare_inputs(self, generation_batch):
        if not (self.padding_free and self.model.training) or any(
                k in generation_batch[0] for k in ("image", "images")):
            return super()._prepare_inputs(generation_batch)
        every = self.args.steps_per_generation * self.num_iterations
        if self._step % every == 0 or self._buffered_inputs is None:
            g0, s0, t0 = self.generation_seconds, self.scoring_seconds, time.perf_counter()
            batch = self._generate_and_score_completions(generation_batch)
            gen = torch.Generator().manual_seed(int(self.args.seed) * 1_000_003 + self._step)
            self._buffered_inputs = length_sorted_steps(batch, self.args.steps_per_generation, gen)
            m = self._metrics["train"]
            m["time/rollout_s"].append(self.generation_seconds - g0)
            m["time/scoring_s"].append(self.scoring_seconds - s0)
            m["time/round_s"].append(time.perf_counter() - t0)
        return self._buffered_inputs[self._step % self.args.steps_per_generation]

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep,
                                           batch_size=None, compute_entropy=False, compute_aux_loss=False,
                                           **multimodal):
        t0 = time.perf_counter()
        try:
            old = self._old_logps_from_sampler(model, input_ids.shape[0], logits_to_keep)
            if old is not None:
                return old, None, None
            grad = torch.is_grad_enabled()
            low = (self.update_precision == "bfloat16" and grad) or (
                self.scoring_precision == "bfloat16" and not grad and model is not self.model)
            with bfloat16_layers(model) if low else contextlib.nullcontext():
                if not self.padding_free or any(multimodal.get(k) is not None for k in MULTIMODAL):
                    return super()._get_per_token_logps_and_entropies(
                        model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                        compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **multimodal)
                return self._packed_logps(model, input_ids, attention_mask, logits_to_keep, batch_size,
                                          compute_entropy, compute_aux_loss)
        finally:
            if not torch.is_grad_enabled():
                self.scoring_seconds += time.perf_counter() - t0

    def _packed_logps(self, model, input_ids, attention_mask, keep, batch_size, compute_entropy, compute_aux):
        """TRL's log-probabilities (and entropies) of the last ``keep`` tokens of each row (left-padded prompt,
        right-padded completion), computed on packed rows: chunks of ``batch_size`` rows of similar completion
        length, each chunk's tokens without padding in one row, positions restarting at each sequence (attention
        within a sequence: :mod:`dsh.llm.packing`); padding positions hold 0."""
        n, width = input_ids.shape
        prompt = width - keep
        lengths = attention_mask[:, prompt:].sum(1).tolist()
        order = sorted(range(n), key=lambda i: lengths[i])
        size = batch_size or n
        rows_lp, rows_ent, aux = [None] * n, [None] * n, []
        for start in range(0, n, size):
            idx = order[start:start + size]
            seqs = [input_ids[i][attention_mask[i].bool()] for i in idx]
            ids = torch.cat(seqs)[None]
            pos = torch.cat([torch.arange(len(x), device=ids.device) for x in seqs])[None]
            labels = torch.cat([torch.cat([torch.full((len(x) - lengths[i],), -100, device=ids.device), x[-lengths[i]:]])
                                if lengths[i] else torch.full((len(x),), -100, device=ids.device)
                                for i, x in zip(idx, seqs)])[None]
            with self.accelerator.autocast():
                out = model(input_ids=ids, position_ids=pos, labels=labels, fused_lm_head=True,
                            **({"output_router_logits": True} if compute_aux else {}))
            at = 0
            for i, x in zip(idx, seqs):
                c = lengths[i]
                first = at + len(x) - c - 1         # log p of token j sits at j - 1 (shifted labels)
                rows_lp[i] = F.pad(out.log_probs[0, first:first + c], (0, keep - c))
                if compute_entropy:
                    rows_ent[i] = F.pad(out.entropy[0, first:first + c], (0, keep - c))
                at += len(x)
            if compute_aux:
                aux.append(out.aux_loss)
        return (torch.stack(rows_lp), torch.stack(rows_ent) if compute_entropy else None,
                torch.stack(aux).mean() if compute_aux else None)

    def training_step(self, *args, **kwargs):
        g0, s0, t0 = self.generation_seconds, self.scoring_seconds, time.perf_counter()
        out = super().training_step(*args, **kwargs)
        # the step's own time: a round's sampling and scoring happen inside its first step
        dt = time.perf_counter() - t0 - (self.generation_seconds - g0) - (self.scoring_seconds - s0)
        self.update_seconds += dt
        self._metrics["train"]["time/update_s"].append(dt)
        return out

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations,
                              has_tool_images=False):
        t0 = time.perf_counter()
        try:
            return self._rollouts(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        finally:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.generation_seconds += time.perf_counter() - t0

    def _rollouts(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images):
        if self.rollout_backend == "trl":
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations,
                                                 has_tool_images)
        why = engine_unsuitable(self)
        if images is not None and any(im is not None for im in images):
            why = "the prompts hold images"
        if why:
            if self.rollout_backend == "dsh":
                raise ValueError(f"generation_backend 'dsh' cannot be used: {why}; use 'auto' or 'trl'")
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations,
                                                 has_tool_images)
        model = self.accelerator.unwrap_model(self.model)
        max_len = max(map(len, prompt_ids)) + self.max_completion_length
        eng = self._engine
        if eng is None or eng.max_len < max_len:  # built once: its CUDA graphs are reused every step
            bucket = 128
            max_len = -(-max_len // bucket) * bucket   # room for slightly longer prompts later
            slots = fit_slots(model, len(prompt_ids), max_len)
            self._engine = eng = Engine(model, self.eos_token_ids, slots=slots, max_len=max_len, bucket=bucket,
                                        kv_cache=self.rollout_kv_cache)
        # seed=None: the trainer's RNG stream (seeded by TRL from args.seed) drives the samples
        gens = eng.generate(prompt_ids, self.max_completion_length, temperature=self.temperature, seed=None,
                            stop_after=self.stop_after)
        # the CPU path samples in float32 from the same weights TRL scores with; on CUDA (bfloat16 autocast) the
        # two would differ by rounding, so TRL's own pass is kept there. With a float16 KV cache the tokens were drawn
        # from the distribution of half-rounded keys and values: its log-probabilities are the old policy's, the
        # distribution the round was sampled from (what the importance ratio divides by)
        self._sampled_logps = [g.logprobs for g in gens] if eng.attention == "kernels" else None
        return [g.tokens for g in gens], None

    def _old_logps_from_sampler(self, model, n, keep):
        """The old policy's log-probabilities of this round's completions as the engine drew them (the weights
        did not change since), instead of TRL's extra forward pass over the round: used once per round, for the
        pass TRL makes when a round feeds several steps (``steps_per_generation > 1``)."""
        sampled, self._sampled_logps = getattr(self, "_sampled_logps", None), None
        every = self.args.steps_per_generation * self.num_iterations
        if (sampled is None or len(sampled) != n or model is not self.model or self.use_vllm
                or self.args.gradient_accumulation_steps % every == 0 or torch.is_grad_enabled()):
            return None
        out = torch.zeros(n, keep)
        for i, lp in enumerate(sampled):
            out[i, :min(keep, len(lp))] = torch.tensor(lp[:keep])
        return out.to(next(model.parameters()).device)


@contextlib.contextmanager
def bfloat16_layers(model):
    """Inside it, every decoder layer of ``model`` (a module whose class name ends in ``DecoderLayer``) runs under
    CPU autocast to bfloat16: its matrix products take bfloat16 inputs and accumulate in float32, their outputs
    bfloat16 (the residual sums, norms and attention stay float32: :mod:`dsh.llm.packing` attends in float32); the
    embedding, the final norm and the LM head, outside the layers, stay float32, so log-probabilities are computed
    from float32 logits. Gradients flow back to the float32 weights. On leaving, the layers are as before."""
    layers = [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
    if not layers:
        raise ValueError(f"update_precision bfloat16 needs a model with decoder layers; {type(model).__name__} has none")
    for layer in layers:
        layer.forward = _autocast(layer.forward)
    try:
        yield layers
    finally:
        for layer in layers:
            del layer.forward             # the class's forward again


def _autocast(forward):
    def run(*args, **kwargs):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return forward(*args, **kwargs)
    return run
