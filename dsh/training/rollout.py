"""GRPO rollouts through :mod:`dsh.llm.engine`: TRL's ``GRPOTrainer`` with its generation step replaced.

TRL 1.16 generates rollouts without vLLM through ``model.generate`` with ``disable_compile=True``
(so even ``cache_implementation="static"`` runs uncompiled): on a small model that path is bound by
kernel launches (the book's appendix "Engineering notes").
:class:`dsh.training.grpo_trainer.EngineGRPOTrainer` overrides ``GRPOTrainer._generate_single_turn`` to sample
the completions with an :class:`dsh.llm.engine.Engine` built once over the model being trained. The engine reads
the live weights (an optimizer step updates them in place), so no weight copy happens between steps.

Everything else is TRL's: the prompts arrive already repeated ``num_generations`` times, the
completions are returned as token-id lists that end with the end-of-turn token when the model wrote
one (what TRL's own path returns), and rewards, advantages, the clipped loss and the KL term are
computed by TRL as before.

With ``TrainConfig.padding_free`` two changes to how TRL feeds the model remove its padding: TRL pads every
completion of a rollout round to the round's longest and splits the round into optimizer steps at random, so a
step of short completions pays for the longest one, and its attention runs over a padding mask. Here (1) a round is
split into steps of similar length (sorted by completion length, cut into ``steps_per_generation`` consecutive
slices, the slices' order shuffled with the trainer's seed) and each step's padding columns are dropped; (2) every
log-probability pass (reference, old policy, the training step's) packs its sequences into one row without padding,
attention causal within each sequence (:mod:`dsh.llm.packing`). The values are TRL's up to float rounding (a test
compares them); with ``loss_type="dapo"`` every token of a round keeps its weight (TRL normalises by the round's token
count), only the order in which tokens enter the steps changes.

When a round feeds several optimizer steps, TRL computes the old policy's log-probabilities with an extra forward
pass over the round; here they are the log-probabilities the engine drew the tokens with (the same weights, the same
softmax(logits / T); vLLM-based trainers do the same), so the pass is skipped (CPU path only: on CUDA the engine and
TRL's bfloat16 scoring would differ by rounding).

Each round logs its time split: ``time/rollout_s`` (sampling), ``time/scoring_s`` (reference and old-policy
log-probabilities), ``time/round_s`` and, per step, ``time/update_s`` (forward, backward and optimizer step).

The engine samples from softmax(logits / temperature) with no top-k or top-p filter; a configuration that asks
for a filter (``top_p < 1``, ``top_k > 0``, ``min_p``, a repetition penalty), for vLLM, or for a model the engine
does not support falls back to TRL's path.
"""

from __future__ import annotations

BACKENDS = ("auto", "dsh", "trl")
# the per-token fields of a generation batch (completion columns), trimmed with completion_ids
PER_TOKEN = ("completion_ids", "completion_mask", "old_per_token_logps", "ref_per_token_logps",
             "sampling_per_token_logps", "tool_mask", "importance_sampling_ratio")
MULTIMODAL = ("pixel_values", "image_grid_thw", "pixel_attention_mask", "spatial_shapes", "image_sizes",
              "token_type_ids", "mm_token_type_ids", "image_position_ids", "num_images", "num_tiles")


def length_sorted_steps(batch: dict, steps: int, generator) -> list[dict]:
    """A rollout round (TRL's generation batch: tensors and lists along the first dimension) as ``steps`` optimizer
    steps of similar completion length: rows sorted by completion length, cut into ``steps`` consecutive slices of
    equal size, the slices in an order drawn from ``generator``; each slice's per-token fields (:data:`PER_TOKEN`)
    cut to its longest completion."""
    n = batch["completion_ids"].shape[0]
    if n % steps:
        raise ValueError(f"a rollout round of {n} completions does not split into {steps} equal steps")
    import torch

    lengths = batch["completion_mask"].sum(1)
    order = torch.sort(lengths, stable=True).indices
    size = n // steps
    out = []
    for k in torch.randperm(steps, generator=generator).tolist():
        idx = order[k * size:(k + 1) * size]
        width = max(1, int(lengths[idx].max()))
        part = {}
        for key, val in batch.items():
            if val is None or (isinstance(val, torch.Tensor) and val.ndim == 0):
                part[key] = val
            elif isinstance(val, torch.Tensor):
                part[key] = val[idx]
                if key in PER_TOKEN and val.ndim == 2 and val.shape[1] == batch["completion_ids"].shape[1]:
                    part[key] = part[key][:, :width]
            else:
                part[key] = [val[i] for i in idx.tolist()]
        out.append(part)
    return out


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
