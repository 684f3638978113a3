"""The paper's hyperparameter tables (``dsh/core/paper_results.yaml``) next to the TRL values the ``paper`` preset
resolves to, with what does not map said plainly (chapter 04 shows it)."""

from __future__ import annotations

from ...core.paper import paper_results
from ...training.train_config import to_trl_config
from ..run.presets import PAPER


def paper_mapping() -> list[dict]:
    """The paper's hyperparameter tables (dsh/core/paper_results.yaml) next to the TRL values the ``paper``
    preset resolves to, with what does not map said plainly."""
    hp = paper_results()["hyperparameters"]
    sft_cfg = PAPER.train_config("sft_reflection", output_dir=f"{PAPER.runs_dir}/sft_reflection")
    sft = to_trl_config(sft_cfg)
    grpo = to_trl_config(PAPER.train_config("grpo", output_dir=f"{PAPER.runs_dir}/grpo"))
    seqs = grpo.per_device_train_batch_size * grpo.gradient_accumulation_steps
    rows = [
        ("SFT", "Optimizer", hp["sft"]["optimizer"], "optim, weight_decay",
         f"{getattr(sft.optim, 'value', sft.optim)}, {sft.weight_decay}", "AdamW with weight decay 0 is Adam"),
        ("SFT", "Batch size", hp["sft"]["batch_size"], "per_device_train_batch_size x gradient_accumulation_steps x GPUs",
         sft.per_device_train_batch_size * sft.gradient_accumulation_steps, "on one GPU"),
        ("SFT", "Learning rate", hp["sft"]["learning_rate"], "learning_rate, lr_scheduler_type",
         f"{sft.learning_rate}, {getattr(sft.lr_scheduler_type, 'value', sft.lr_scheduler_type)}",
         "the schedule is not printed; LLaMA-Factory's default (cosine) is used"),
        ("SFT", "Epochs", hp["sft"]["epochs"], "num_train_epochs", sft.num_train_epochs, ""),
        ("SFT", "Training examples", hp["sft"]["training_examples"], "dsh n_train", sft_cfg.n_train, ""),
        ("GRPO", "Learning rate", hp["grpo"]["learning_rate"], "learning_rate (constant, wd 0.01, clip 1.0: verl defaults)",
         grpo.learning_rate, ""),
        ("GRPO", "Train batch size (prompts)", hp["grpo"]["train_batch_size"], "generation_batch_size / num_generations",
         grpo.generation_batch_size // grpo.num_generations, "TRL counts completions: generation_batch_size = 4096"),
        ("GRPO", "PPO mini-batch size (prompts)", hp["grpo"]["ppo_mini_batch_size"],
         "per_device x gradient_accumulation / num_generations", seqs // grpo.num_generations,
         "4 optimizer steps per rollout batch, as in verl"),
        ("GRPO", "Rollouts per query (n)", hp["grpo"]["rollouts_per_query"], "num_generations", grpo.num_generations, ""),
        ("GRPO", "KL loss coefficient", hp["grpo"]["kl_loss_coef"], "beta", grpo.beta, "KL in the loss, as verl's use_kl_loss"),
        ("GRPO", "KL loss type", hp["grpo"]["kl_loss_type"], "(k3 estimator), use_bias_correction_kl",
         f"k3, {grpo.use_bias_correction_kl}", "TRL 1.16 defaults to a bias-corrected k3; off matches verl"),
        ("GRPO", "Max prompt length", hp["grpo"]["max_prompt_length"], "(none)", "-",
         "no TRL option; every prompt here is under 40 tokens"),
        ("GRPO", "Max response length", hp["grpo"]["max_response_length"], "max_completion_length",
         grpo.max_completion_length, ""),
        ("GRPO", "Total epochs", hp["grpo"]["total_epochs"], "num_train_epochs", grpo.num_train_epochs, ""),
        ("GRPO", "Gradient checkpointing", hp["grpo"]["gradient_checkpointing"], "gradient_checkpointing",
         grpo.gradient_checkpointing, ""),
        ("GRPO", "(not printed) clip ratio", "-", "epsilon", grpo.epsilon, "verl's default 0.2"),
        ("GRPO", "(not printed) loss aggregation", "-", "loss_type", grpo.loss_type, "verl's token-mean"),
        ("GRPO", "Sampling temperature (evaluation protocol)", paper_results()["evaluation"]["temperature"],
         "temperature, top_p, top_k", f"{grpo.temperature}, {grpo.top_p}, {grpo.top_k}", "rollouts at temperature 1"),
    ]
    return [dict(zip(("stage", "hyperparameter", "paper value", "TRL field", "TRL value", "note"), r)) for r in rows]
