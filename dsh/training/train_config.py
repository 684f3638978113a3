"""``TrainConfig``: every knob of a training run (a dataclass with help on every field, as TRL's configs), its
checks and bounds, and its mapping to TRL's ``SFTConfig`` / ``GRPOConfig`` (:func:`to_trl_config`, no model loaded)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..core import settings as typed_settings
from ..core import validate as v
from ..llm.kernels import KV_CACHE
from ..llm.models import EMBEDDED, vllm_available
from ..measure import tasks
from ..task.arithmetic import CHECKS
from ..task.problems import parse_level
from ..task.traces import GRANULARITIES

METHODS = ("sft", "sft_reflection", "dft", "grpo")
PACKED_ATTENTION = ("torch", "kernels", "fused")     # TrainConfig.packed_attention (dsh.llm.packing.PATHS)
UPDATE_PRECISIONS = ("float32", "bfloat16")     # TrainConfig.update_precision (dsh.training.grpo_trainer)


def _field(default, help: str):
    """A dataclass field with its help text (as TRL's configs carry theirs; ``dsh train --help`` lists them)."""
    return field(default=default, metadata={"help": help})


MAX_STEPS = 1_000_000


MAX_TOKENS = 1_048_576      # a sequence's tokens: beyond the context of any model this project trains


MAX_EPOCHS = 1_000


# upper bounds of TrainConfig's sizes (field -> bound, what it protects), in the one-line error
LIMITS = {"n_train": (1_000_000, "training problems built in memory"),
          "max_steps": (MAX_STEPS, "optimizer steps: time"),
          "logging_steps": (MAX_STEPS, "steps"), "save_steps": (MAX_STEPS, "steps"),
          "validation_every": (MAX_STEPS, "steps"),
          "per_device_train_batch_size": (65_536, "sequences a micro-batch: memory"),
          "gradient_accumulation_steps": (65_536, "micro-batches a step: time"),
          "generation_batch_size": (1_048_576, "completions a rollout round: memory"),
          "num_generations": (1_024, "completions a prompt: memory"),
          "max_completion_length": (MAX_TOKENS, "tokens a rollout: memory"),
          "max_length": (MAX_TOKENS, "tokens an example: memory"),
          "validation_max_new_tokens": (MAX_TOKENS, "tokens a validation answer: memory"),
          "validation_per_level": (100_000, "validation questions a level: time"),
          "max_attempts": (100, "attempts a reflection trace"),
          "lora_r": (65_536, "LoRA rank"), "lora_alpha": (1_048_576, "LoRA alpha"),
          "seed": (2 ** 32 - 1, "numpy and torch seeds")}


@dataclass
class TrainConfig:
    """One training run. Batch sizes count sequences (completions for GRPO), as in TRL."""

    method: str = _field("sft", "sft, sft_reflection, dft or grpo (one trainer each)")
    model: str = _field(EMBEDDED, "the starting model: 'embedded' (SmolLM2-135M-Instruct), a Hugging Face id, a local "
                        "folder or a finished run directory")
    output_dir: str = _field("runs/run", "the run directory: checkpoints, final/, metrics.jsonl, summary.json")
    seed: int = _field(0, "seed of the training data, the initialisation of new weights and the trainer")
    # data
    task: str = _field("traces", "the task (dsh.measure.tasks): traces (the paper's, dsh.task.traces) or laptop_task "
                       "(the 1xN ladder for the tiny from-scratch models, dsh.task.laptop_task)")
    task_options: dict = field(default_factory=dict, metadata={
        "help": "the task's own settings (laptop_task: check computed|verdict, attempts own|injected, loss "
        "all|no_wrong_attempts); {}: its defaults"})
    n_train: int = _field(20_000, "training problems (SFT examples, GRPO prompts)")
    train_levels: tuple = _field(("4x5", "5x4"), "levels the training problems are drawn from, e.g. 4x5,5x4")
    granularity: str = _field("digit", "how finely a trace writes the arithmetic (dsh.task.traces.GRANULARITIES)")
    retry_fraction: float = _field(0.5, "reflection traces: share whose first attempt is wrong")
    max_attempts: int = _field(3, "reflection traces: attempts at most")
    checks: tuple = _field(("nines", "elevens"), "the checks a reflection trace computes (dsh.task.arithmetic.CHECKS)")
    dft_style: str = _field("reflection", "traces used by DFT: reflection or no_reflection")
    max_length: int | None = _field(2048, "SFT: examples are truncated to this many tokens (None: no limit)")
    padding_free: bool = _field(False, "SFT: pack each micro-batch into one row, attention per example "
                                "(dsh.llm.packing); TRL then truncates nothing (max_length: memory only). GRPO: "
                                "rollout rounds split into steps of similar completion length, every log-probability "
                                "pass on packed rows (dsh.training.rollout)")
    rollout_kv_cache: str = _field("float32", "GRPO rollouts and the validation along a run: the engine's KV cache "
                                   "dtype on the CPU (float16: half the bytes its attention reads, ~1.2x the rollouts' "
                                   "tokens/s; keys and values rounded to half; dsh.llm.engine.Engine)")
    packed_attention: str = _field("torch", "padding_free on the CPU: attention over the packed rows by one causal "
                                   "torch call per example (torch) or by dsh's C kernels, every example and head in "
                                   "one call (kernels: 2-4x faster at the tiny model's head size, equal up to float "
                                   "rounding; dsh.llm.packed_attention), or fused: kernels, and the decoder layers' "
                                   "RMS norms, rotary embedding and SwiGLU in C too, forward and backward (for the "
                                   "policy and the reference; equal up to float rounding; dsh.llm.fused_layers)")
    update_precision: str = _field("float32", "GRPO on the CPU: the matrix products of the decoder layers in the "
                                   "update's pass (the policy's log-probabilities with gradients) in float32, or in "
                                   "bfloat16 under CPU autocast (~3x float32's products where the CPU has AVX512_BF16), with "
                                   "packed_attention fused the attention's products too (dsh.llm.packed_attention); "
                                   "weights, optimizer state, norms, softmax, the LM head and every pass without "
                                   "gradients (reference, old policy, validation, rollouts) stay float32 unless "
                                   "scoring_precision says otherwise")
    scoring_precision: str = _field("float32", "GRPO on the CPU: the reference model's log-probabilities (the KL "
                                    "term's) in float32, or with its decoder layers' products in bfloat16 as "
                                    "update_precision does (float32 logits; the KL term moves by the rounding)")
    # optimization
    learning_rate: float = _field(1e-5, "peak learning rate")
    lr_scheduler_type: str = _field("cosine", "transformers scheduler: cosine, constant, linear ...")
    warmup_ratio: float = _field(0.0, "fraction of the steps spent warming up (TRL: warmup_steps in [0, 1))")
    weight_decay: float = _field(0.0, "AdamW weight decay")
    max_grad_norm: float = _field(1.0, "gradient clipping norm")
    optim: str = _field("adamw_torch", "transformers optimizer name")
    per_device_train_batch_size: int = _field(8, "sequences per micro-batch (completions for GRPO)")
    gradient_accumulation_steps: int = _field(1, "micro-batches per optimizer step")
    num_train_epochs: float = _field(1.0, "passes over the training data (max_steps > 0 takes precedence)")
    max_steps: int = _field(-1, "optimizer steps (-1: from num_train_epochs)")
    gradient_checkpointing: bool = _field(False, "recompute activations in the backward pass (less memory, slower)")
    bf16: bool | None = _field(None, "bfloat16 training (None: on when CUDA is available)")
    # LoRA (peft)
    lora: bool = _field(False, "train a LoRA adapter (peft) instead of every weight")
    lora_r: int = _field(16, "LoRA rank")
    lora_alpha: int = _field(32, "LoRA scaling alpha")
    lora_dropout: float = _field(0.05, "LoRA dropout")
    lora_target_modules: str = _field("all-linear", "modules LoRA adapts")
    # GRPO
    num_generations: int = _field(8, "GRPO: completions per prompt (the group)")
    max_completion_length: int = _field(1024, "GRPO: tokens a rollout may write (a clipped rollout gets reward 0)")
    temperature: float = _field(1.0, "GRPO: sampling temperature of the rollouts")
    attempt_budget: int | None = _field(None, "GRPO rollouts and the validation along a run: the most attempts a "
                                        "response may hold; it ends right after that many reflection markers, its "
                                        "last answer final (the task's one-token marker; dsh evaluate's "
                                        "attempt_budget). None: only the token limit ends a rollout")
    beta: float = _field(0.001, "GRPO: KL coefficient (0: no reference model)")
    epsilon: float = _field(0.2, "GRPO: clip range of the importance ratio")
    loss_type: str = _field("dapo", "GRPO: loss aggregation (TRL loss_type; dapo is verl's token-mean)")
    use_bias_correction_kl: bool = _field(False, "GRPO: TRL's bias-corrected k3 estimator (off matches verl)")
    generation_batch_size: int | None = _field(None, "GRPO: completions per rollout round (None: one optimizer step's); "
                                               "a multiple of per_device_train_batch_size, the round feeding "
                                               "generation_batch_size / per_device_train_batch_size steps")
    cache_implementation: str | None = _field("auto", "GRPO with model.generate: KV cache; auto: static on GPU, "
                                              "default on CPU")
    use_vllm: bool | None = _field(None, "GRPO: rollouts through vLLM (None: on when vLLM is installed and CUDA is "
                                   "available)")
    generation_backend: str = _field("auto", "GRPO rollouts: dsh (dsh.llm.engine), trl (model.generate), or auto "
                                     "(vLLM when in use, else dsh where the model allows, else trl)")
    vllm_mode: str = _field("colocate", "GRPO with vLLM: colocate or server")
    # validation along the run (dsh.training.validation)
    validation_every: int = _field(0, "measure p_s, p_dC, p_dW on the task's validation questions before the first "
                                   "step, every this many optimizer steps and after the last (validation.jsonl); "
                                   "0: never")
    validation_per_level: int = _field(25, "validation questions a training level (drawn apart from the test "
                                       "questions, the same at every measurement)")
    validation_max_new_tokens: int | None = _field(None, "validation answers: token limit (None: "
                                                   "max_completion_length); sampled at temperature")
    # run
    logging_steps: int = _field(1, "log metrics every this many steps")
    save_steps: int = _field(50, "save a checkpoint every this many steps")
    save_total_limit: int | None = _field(2, "checkpoints kept while training (None: all)")
    keep_checkpoints: bool = _field(False, "False: delete checkpoints once the run has finished")
    resume: bool = _field(False, "continue from the last checkpoint in output_dir")
    report_to: tuple = _field(("tensorboard",), "logging integrations (tensorboard, ...; empty: none)")
    trust_remote_code: bool = _field(False, "allow a Hugging Face model's own code")

    def __post_init__(self):
        v.choice("method", self.method, METHODS)
        for name, kinds in typed_settings.field_types(TrainConfig).items():   # a real bool, never the text "False"
            if bool in kinds and not (isinstance(getattr(self, name), bool)
                                      or (getattr(self, name) is None and type(None) in kinds)):
                raise ValueError(f"{name} must be true or false{' or None' if type(None) in kinds else ''}; "
                                 f"got {getattr(self, name)!r}")
        if not isinstance(self.model, str) or not self.model.strip():
            raise ValueError(f"model must be 'embedded', a Hugging Face id, a local path or a run directory; got {self.model!r}")
        if not isinstance(self.output_dir, str) or not self.output_dir.strip():
            raise ValueError(f"output_dir must be a folder path; got {self.output_dir!r}")
        v.length("seed", self.seed)
        tasks.get(self.task).settings(self.task_options)
        self.task_options = dict(self.task_options)
        v.positive_int("n_train", self.n_train)
        self.train_levels = tuple(self.train_levels)
        if not self.train_levels:
            raise ValueError("train_levels must name at least one level such as '4x5'")
        for lv in self.train_levels:
            parse_level(lv)
        v.choice("granularity", self.granularity, GRANULARITIES)
        v.probability("retry_fraction", self.retry_fraction)
        v.positive_int("max_attempts", self.max_attempts)
        self.checks = tuple(self.checks) if isinstance(self.checks, (list, tuple)) else self.checks
        if not isinstance(self.checks, tuple) or not self.checks or set(self.checks) - set(CHECKS):
            raise ValueError(f"checks must be a non-empty subset of {', '.join(CHECKS)}; got {self.checks!r}")
        v.choice("dft_style", self.dft_style, ("reflection", "no_reflection"))
        if self.max_length is not None:
            v.positive_int("max_length", self.max_length)
        for name in ("learning_rate", "max_grad_norm", "num_train_epochs", "temperature"):
            if v.real(name, getattr(self, name)) <= 0:
                raise ValueError(f"{name} must be a positive number, got {getattr(self, name)!r}")
        for name in ("warmup_ratio", "weight_decay", "beta", "epsilon", "lora_dropout"):
            if v.real(name, getattr(self, name)) < 0:
                raise ValueError(f"{name} must be a number >= 0, got {getattr(self, name)!r}")
        v.choice("lr_scheduler_type", self.lr_scheduler_type,
                 ("linear", "cosine", "constant", "constant_with_warmup", "cosine_with_min_lr"))
        v.choice("optim", self.optim, ("adamw_torch", "adamw_torch_fused", "adafactor", "sgd", "adamw_8bit"))
        for name in ("per_device_train_batch_size", "gradient_accumulation_steps", "lora_r", "lora_alpha",
                     "num_generations", "max_completion_length", "logging_steps", "save_steps"):
            v.positive_int(name, getattr(self, name))
        for name, (bound, why) in LIMITS.items():      # sizes beyond any run this project makes: a typo, refused
            x = getattr(self, name)
            if isinstance(x, int) and not isinstance(x, bool) and x > bound:
                raise ValueError(f"{name} must be an integer of at most {bound:,} ({why}); got {x:,}")
        if v.real("num_train_epochs", self.num_train_epochs) > MAX_EPOCHS:
            raise ValueError(f"num_train_epochs must be a number in (0, {MAX_EPOCHS}] (passes over the data: time); "
                             f"got {self.num_train_epochs!r}")
        if not isinstance(self.max_steps, int) or isinstance(self.max_steps, bool) or (self.max_steps < 1 and self.max_steps != -1):
            raise ValueError(f"max_steps must be a positive integer or -1 (use num_train_epochs), got {self.max_steps!r}")
        v.choice("loss_type", self.loss_type, ("grpo", "dapo", "dr_grpo", "bnpo"))
        v.choice("vllm_mode", self.vllm_mode, ("colocate", "server"))
        v.choice("cache_implementation", self.cache_implementation, ("auto", "static", "dynamic", None))
        v.choice("generation_backend", self.generation_backend, ("auto", "dsh", "trl"))
        v.length("validation_every", self.validation_every)
        v.positive_int("validation_per_level", self.validation_per_level)
        if self.validation_max_new_tokens is not None:
            v.positive_int("validation_max_new_tokens", self.validation_max_new_tokens)
        if not isinstance(self.padding_free, bool):
            raise ValueError(f"padding_free must be true or false, got {self.padding_free!r}")
        v.choice("packed_attention", self.packed_attention, PACKED_ATTENTION)
        if self.packed_attention != "torch" and not self.padding_free:
            raise ValueError(f"packed_attention {self.packed_attention!r} attends over packed rows: it needs "
                             "padding_free=true (or packed_attention=torch)")
        v.choice("rollout_kv_cache", self.rollout_kv_cache, KV_CACHE)
        v.choice("update_precision", self.update_precision, UPDATE_PRECISIONS)
        v.choice("scoring_precision", self.scoring_precision, UPDATE_PRECISIONS)
        for k, what in (("update_precision", "update"), ("scoring_precision", "reference scoring")):
            if getattr(self, k) != "float32" and self.method != "grpo":
                raise ValueError(f"{k} applies to GRPO's {what}; method {self.method!r} needs float32, got "
                                 f"{getattr(self, k)!r}")
        self._check_sampling()
        self.report_to = tuple(self.report_to or ())
        for r in self.report_to:
            v.choice("report_to", r, ("tensorboard", "wandb", "trackio"))

    def _check_sampling(self):
        """GRPO's group and round sizes, and the attempt budget (GRPO's alone)."""
        if self.attempt_budget is not None:
            v.positive_int("attempt_budget", self.attempt_budget)
            if self.method != "grpo":
                raise ValueError(f"attempt_budget applies to GRPO's rollouts; method {self.method!r} samples none "
                                 f"(leave it None)")
        if self.method == "grpo":
            if self.num_generations < 2:
                raise ValueError("num_generations must be an integer >= 2 for GRPO (advantages are relative to the group)")
            gen = self.generation_batch_size or self.per_device_train_batch_size * self.gradient_accumulation_steps
            if gen % self.num_generations:
                raise ValueError(f"generation_batch_size must be a multiple of num_generations={self.num_generations}; "
                                 f"got {gen}")
            if isinstance(self.n_train, int) and self.n_train * self.num_generations < gen:   # TRL would run 0 steps
                raise ValueError(f"n_train must be at least {-(-gen // self.num_generations)} for GRPO: one rollout "
                                 f"round draws {gen} completions, {self.num_generations} a prompt; got {self.n_train}")
        if self.generation_batch_size is not None:
            v.positive_int("generation_batch_size", self.generation_batch_size)


FIELDS = tuple(f.name for f in dataclasses.fields(TrainConfig))


def fields_help(width: int = 100) -> str:
    """Every :class:`TrainConfig` field with its default and help text, one per line (``dsh train --help``)."""
    import textwrap

    lines = []
    for f in dataclasses.fields(TrainConfig):
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default   # a field's factory
        head = f"  {f.name} (default {default!r})"
        lines += textwrap.wrap(f.metadata.get("help", ""), width, initial_indent=head + ": ",
                               subsequent_indent=" " * 6) or [head]
    return "\n".join(lines)


def cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        return False


def checked_config(cfg) -> TrainConfig:
    """``cfg`` checked to be a :class:`TrainConfig`."""
    if not isinstance(cfg, TrainConfig):
        raise ValueError(f"cfg must be a dsh.training.train_config.TrainConfig, got {type(cfg).__name__}")
    return cfg


def to_trl_config(cfg: TrainConfig):
    """The TRL configuration (``SFTConfig`` or ``GRPOConfig``) for ``cfg``; loads no model."""
    checked_config(cfg)
    from trl import GRPOConfig, SFTConfig

    cuda = cuda_available()
    bf16 = cuda if cfg.bf16 is None else cfg.bf16
    common = dict(
        output_dir=cfg.output_dir, seed=cfg.seed, learning_rate=cfg.learning_rate,
        lr_scheduler_type=cfg.lr_scheduler_type, warmup_steps=float(cfg.warmup_ratio), weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.max_grad_norm, optim=cfg.optim, per_device_train_batch_size=cfg.per_device_train_batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps, num_train_epochs=cfg.num_train_epochs,
        max_steps=cfg.max_steps, activation_checkpointing=cfg.gradient_checkpointing, bf16=bf16,
        use_cpu=not cuda, save_steps=cfg.save_steps,
        logging_steps=min(cfg.logging_steps, cfg.max_steps) if cfg.max_steps > 0 else cfg.logging_steps,  # >= 1 loss
        save_total_limit=cfg.save_total_limit, report_to=list(cfg.report_to), disable_tqdm=False,
        include_num_input_tokens_seen=True,  # TensorBoard events go to output_dir/runs/
    )
    if cfg.method != "grpo":
        return SFTConfig(**common, max_length=None if cfg.padding_free else cfg.max_length,
                         padding_free=cfg.padding_free, loss_type="dft" if cfg.method == "dft" else "nll",
                         completion_only_loss=True)
    cache = cfg.cache_implementation
    if cache == "auto":
        cache = "static" if cuda else None

    use_vllm = (cuda and vllm_available()) if cfg.use_vllm is None else cfg.use_vllm
    return GRPOConfig(
        **common, num_generations=cfg.num_generations, max_completion_length=cfg.max_completion_length,
        temperature=cfg.temperature, top_p=1.0, top_k=0, beta=cfg.beta, epsilon=cfg.epsilon,
        loss_type=cfg.loss_type, use_bias_correction_kl=cfg.use_bias_correction_kl,
        generation_batch_size=cfg.generation_batch_size, cache_implementation=cache if not use_vllm else None,
        use_vllm=use_vllm, vllm_mode=cfg.vllm_mode, scale_rewards="group", log_completions=False,
    )
