"""GRPO rollouts through :mod:`dsh.llm.engine`: TRL's ``GRPOTrainer`` with its generation step replaced.

TRL 1.16 generates rollouts without vLLM through ``model.generate`` with ``disable_compile=True``
(so even ``cache_implementation="static"`` runs uncompiled): on a small model that path is bound by
kernel launches (the book's appendix "Engineering notes"). :class:`EngineGRPOTrainer` overrides
``GRPOTrainer._generate_single_turn`` to sample the completions with an :class:`dsh.llm.engine.Engine`
built once over the model being trained. The engine reads the live weights (an optimizer step
updates them in place), so no weight copy happens between steps.

Everything else is TRL's: the prompts arrive already repeated ``num_generations`` times, the
completions are returned as token-id lists that end with the end-of-turn token when the model wrote
one (what TRL's own path returns), and rewards, advantages, the clipped loss and the KL term are
computed by TRL as before. The engine samples from softmax(logits / temperature) with no top-k or
top-p filter; a configuration that asks for a filter (``top_p < 1``, ``top_k > 0``, ``min_p``, a
repetition penalty), for vLLM, or for a model the engine does not support falls back to TRL's path.
"""

from __future__ import annotations

BACKENDS = ("auto", "dsh", "trl")


def engine_unsuitable(trainer) -> str | None:
    """Why ``trainer`` (a GRPOTrainer) cannot sample with the engine; None when it can."""
    from ..llm.engine import supports

    if trainer.use_vllm:
        return "vLLM is in use"
    if getattr(trainer, "use_transformers_continuous_batching", False):
        return "transformers continuous batching was asked for"
    if trainer.top_p not in (None, 1.0) or (trainer.top_k or 0) > 0 or trainer.min_p or \
            trainer.repetition_penalty not in (None, 1.0):
        return "a top-p/top-k/min-p filter or a repetition penalty is set"
    if trainer.accelerator.num_processes > 1 or getattr(trainer, "is_deepspeed_enabled", False) or \
            getattr(trainer, "is_fsdp_enabled", False):
        return "distributed training (sharded or replicated weights)"
    return supports(trainer.accelerator.unwrap_model(trainer.model))


def make_trainer_class():
    """``EngineGRPOTrainer``: a ``trl.GRPOTrainer`` whose rollouts come from :class:`dsh.llm.engine.Engine`
    (built here so that importing :mod:`dsh.training.rollout` does not import TRL)."""
    from trl import GRPOTrainer

    class EngineGRPOTrainer(GRPOTrainer):
        """GRPOTrainer sampling its completions with dsh.llm.engine (module docstring)."""

        _engine = None
        rollout_backend = "dsh"      # dsh, auto (dsh where possible, else TRL's path) or trl
        generation_seconds = 0.0     # wall time spent generating rollouts (for dsh bench)

        def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations,
                                  has_tool_images=False):
            import time

            import torch

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
            from ..llm.engine import Engine, fit_slots

            model = self.accelerator.unwrap_model(self.model)
            max_len = max(map(len, prompt_ids)) + self.max_completion_length
            eng = self._engine
            if eng is None or eng.max_len < max_len:  # built once: its CUDA graphs are reused every step
                bucket = 128
                max_len = -(-max_len // bucket) * bucket   # room for slightly longer prompts later
                slots = fit_slots(model, len(prompt_ids), max_len)
                self._engine = eng = Engine(model, self.eos_token_ids, slots=slots, max_len=max_len, bucket=bucket)
            # seed=None: the trainer's RNG stream (seeded by TRL from args.seed) drives the samples
            gens = eng.generate(prompt_ids, self.max_completion_length, temperature=self.temperature, seed=None)
            return [g.tokens for g in gens], None

    return EngineGRPOTrainer
