"""Training: SFT, SFT with reflection, DFT and GRPO through TRL, one trainer per method.

``TrainConfig`` holds every knob (a dataclass, as TRL's configs); :mod:`dsh.experiment.run.presets` supplies each
preset's values; the task it names (:mod:`dsh.measure.tasks`) writes the training data and gives the GRPO reward;
:func:`to_trl_config` maps a TrainConfig to TRL's
``SFTConfig`` / ``GRPOConfig`` without loading a model; :func:`train` runs it and leaves a run directory:

    run_dir/run_config.json   resolved configuration (and the TRL one)
    run_dir/metrics.jsonl     one JSON object per logging step
    run_dir/validation.jsonl  p_s, p_dC, p_dW along the run (validation_every > 0; dsh.training.validation)
    run_dir/runs/             TensorBoard events
    run_dir/checkpoint-N/     checkpoints (resume continues from the last one; deleted when the run
                              finishes unless keep_checkpoints)
    run_dir/final/            the final model (LoRA merged), loadable with dsh.llm.models.load(run_dir)
    run_dir/summary.json      wall time, steps, first/last loss, tokens/s, peak memory, hardware, commit
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..core import settings as typed_settings
from ..core import validate as v
from ..core.files import exclusive, readable, write_text, writing
from ..core.paths import repo_relative
from ..core.provenance import git_commit, hardware
from ..llm.models import EMBEDDED, MODEL_FILES, fetched, load, model_digest, resolve_model, vllm_available, weights_digest
from ..measure import tasks
from ..task.arithmetic import CHECKS
from ..task.problems import parse_level
from ..task.records import chat_length
from ..task.traces import GRANULARITIES
from . import validation
from .laptop_base import corpus_of
from .loss_mask import has_segments, token_records
from .own_attempts import own_attempts
from .rollout import engine_unsuitable

METHODS = ("sft", "sft_reflection", "dft", "grpo")


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
        self.report_to = tuple(self.report_to or ())
        for r in self.report_to:
            v.choice("report_to", r, ("tensorboard", "wandb", "trackio"))


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


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        return False


def _config(cfg) -> TrainConfig:
    """``cfg`` checked to be a :class:`TrainConfig`."""
    if not isinstance(cfg, TrainConfig):
        raise ValueError(f"cfg must be a dsh.training.train.TrainConfig, got {type(cfg).__name__}")
    return cfg


def to_trl_config(cfg: TrainConfig):
    """The TRL configuration (``SFTConfig`` or ``GRPOConfig``) for ``cfg``; loads no model."""
    _config(cfg)
    from trl import GRPOConfig, SFTConfig

    cuda = _cuda()
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


# ------------------------------------------------------------------------------------------------
# Data and reward
# ------------------------------------------------------------------------------------------------
def build_dataset(cfg: TrainConfig) -> list[dict]:
    """Training records for the method, written by ``cfg``'s task (:mod:`dsh.measure.tasks`; the paper's 20,000
    problems by default, the test problems held out); reflection traces that begin with the starting model's own
    attempts get them from :func:`dsh.training.own_attempts.own_attempts`."""
    task = tasks.get(_config(cfg).task)
    problems = task.training_problems(cfg)
    attempts = None
    if task.wants_own_attempts(cfg):
        attempts = own_attempts(resolve_model(cfg.model), problems, k=max(1, cfg.max_attempts - 1), seed=cfg.seed)
    records = task.records(cfg, problems, attempts)
    if task.wants_replay(cfg) and records and "completion" in records[0]:
        records = task.with_replay(cfg, records, corpus_of(resolve_model(cfg.model)))
    return records


def task_reward(task_name: str):
    """TRL reward function of a task: its reward (the paper's R(tau) = 1[final answer correct]) of each completion."""
    task = tasks.get(task_name)

    def correctness_reward(completions, answer, question=None, **kwargs) -> list[float]:
        return [task.reward(c[-1]["content"] if isinstance(c, list) else str(c), answer[i],
                            question[i] if question is not None else None) for i, c in enumerate(completions)]

    return correctness_reward


# ------------------------------------------------------------------------------------------------
# Running
# ------------------------------------------------------------------------------------------------
def last_checkpoint(run_dir) -> Path | None:
    """The newest complete checkpoint: one with its trainer_state.json and dsh's totals (:data:`TOTALS`, written
    last; a checkpoint of a run made before they existed does not count, so such a run starts over)."""
    cks = [p for p in Path(run_dir).glob("checkpoint-*") if p.name.split("-")[-1].isdigit()
           and (p / "trainer_state.json").is_file() and (p / TOTALS).is_file()]
    return max(cks, key=lambda p: int(p.name.split("-")[-1])) if cks else None


def _metrics_callback(path: Path):
    from transformers import TrainerCallback

    class JsonlMetrics(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            if logs and state.is_world_process_zero:
                with open(path, "a") as f:
                    f.write(json.dumps({"step": state.global_step, **{k: float(x) if isinstance(x, (int, float)) else x
                                                                      for k, x in logs.items()}}) + "\n")

    return JsonlMetrics()


TOTALS = "dsh_totals.json"   # in each checkpoint: the run's loss sum and real tokens up to it (a resume reads them)


def _totals_callback(holder: list, resume_from):
    """Keep a resumed run's totals equal to an uninterrupted run's: each checkpoint records the sum of the step losses
    and TRL's count of real tokens so far (:data:`TOTALS`); a run resumed from it starts its sums there (the trainer's
    own restart at 0 for this call). ``holder[0]`` is the trainer, set once it exists."""
    from transformers import TrainerCallback

    class RunTotals(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            trainer = holder[0]
            totals = Path(resume_from) / TOTALS if resume_from else None
            if totals is not None and totals.is_file():
                import torch

                prior = json.loads(totals.read_text())
                # transformers starts these at 0 (and the last logged step at the resumed one) each call: the loss
                # summed so far, the float32 sum not yet logged, the step logged last, as they were at the checkpoint
                trainer._total_loss_scalar = prior["loss_sum"]
                trainer._tr_loss = torch.tensor(prior["pending"], dtype=torch.float32, device=args.device)
                trainer._globalstep_last_logged = prior["last_logged"]
                if hasattr(trainer, "_total_train_tokens") and prior.get("real_tokens") is not None:
                    trainer._total_train_tokens = prior["real_tokens"]  # TRL's SFT counter too (GRPO's is in state)

        def on_save(self, args, state, control, **kw):
            trainer = holder[0]
            ck = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if state.is_world_process_zero and ck.is_dir():
                write_text(ck / TOTALS, json.dumps({"loss_sum": trainer._total_loss_scalar,
                                                    "pending": trainer._tr_loss.item(),
                                                    "last_logged": trainer._globalstep_last_logged,
                                                    "steps": state.global_step,
                                                    "real_tokens": getattr(trainer, "_total_train_tokens", None)}))

    return RunTotals()


def example_truncation(records, tok, max_length) -> dict:
    """Share of SFT records (prompt + completion, chat template applied as TRL does) longer than
    ``max_length`` tokens: what truncation cuts (or, padding-free, what exceeds the memory bound)."""
    import numpy as np

    if max_length is None or not records or "completion" not in records[0]:
        return {"what": "training examples longer than max_length", "rate": 0.0 if records else None,
                "limit": max_length, "over": 0, "n": len(records)}
    n = np.array([chat_length(tok, r["prompt"] + r["completion"]) for r in records])
    return {"what": "training examples longer than max_length", "rate": float(np.mean(n > max_length)),
            "limit": max_length, "over": int(np.sum(n > max_length)),
            "n": len(records), "max_tokens": int(n.max()), "p99_tokens": float(np.percentile(n, 99))}


def grpo_diagnostics(log_history) -> dict:
    """What GRPO's logs say about its signal and its budget: the share of rollouts clipped at
    ``max_completion_length`` (mean and at the first step), the share of groups whose rewards all agree
    (no learning signal) at the first step and on average, and the mean reward at the first and last step."""
    rows = [h for h in log_history if "frac_reward_zero_std" in h]
    if not rows:
        return {}
    get = lambda k: [h[k] for h in rows if k in h]  # noqa: E731
    clipped, zero, reward = get("completions/clipped_ratio"), get("frac_reward_zero_std"), get("reward")
    mean = lambda x: float(sum(x) / len(x)) if x else None  # noqa: E731
    return {"clipped_rate": mean(clipped), "clipped_rate_first": clipped[0] if clipped else None,
            "zero_std_groups_first": zero[0], "zero_std_groups_mean": mean(zero),
            "reward_first": reward[0] if reward else None, "reward_last": reward[-1] if reward else None,
            "steps_logged": len(rows)}


def _real_tokens(trainer) -> int | None:
    """Non-padding tokens the trainer saw (TRL logs them as ``num_tokens``), or None."""
    logged = [h["num_tokens"] for h in trainer.state.log_history if "num_tokens" in h]
    return int(logged[-1]) if logged else None


CHECKPOINT = re.compile(r"checkpoint-\d+")    # the trainer's checkpoint folders: the only ones dsh deletes
LOGS = ("metrics.jsonl", "validation.jsonl")    # one JSON line per step, written as the run goes


def trim_logs(run: Path, step: int) -> None:
    """Drop the lines of ``run``'s step logs (:data:`LOGS`) after ``step`` (the checkpoint a resume continues from),
    and a line the kill cut short: the resumed run logs those steps again, so a curve holds each step once. Each file
    is replaced whole."""
    for name in LOGS:
        path = run / name
        if not path.is_file():
            continue
        keep = []
        for x in path.read_text().splitlines():
            try:
                row = json.loads(x)
            except ValueError:                     # a line cut by the kill
                continue
            if isinstance(row, dict) and row.get("step", 0) <= step:
                keep.append(x)
        write_text(path, "".join(x + "\n" for x in keep))


# what `train` writes in a run folder (the trainer's model card, logs, settings, summary, final model, checkpoints,
# TensorBoard events): the only names `clear_run` removes
RUN_FILES = ("run_config.json", "summary.json", "README.md", "training_args.bin") + LOGS
RUN_FOLDERS = ("final", "runs")
# inside final/ and checkpoint-N/: a saved model (dsh.llm.models.MODEL_FILES) and, in a checkpoint, its trainer's
# state (transformers, TRL, DeepSpeed) and dsh's totals; inside runs/: TensorBoard's event files
INSIDE = {"final": re.compile(MODEL_FILES),
          "checkpoint": re.compile(MODEL_FILES + r"|optimizer\.pt|scheduler\.pt|scaler\.pt|rng_state(_\d+)?\.pth"
                                   r"|trainer_state\.json|training_args\.bin|" + TOTALS.replace(".", r"\.") +
                                   r"|latest|zero_to_fp32\.py|global_step\d+/[^/]+"        # DeepSpeed
                                   r"|(pytorch_model_fsdp|optimizer)_\d+/[^/]+"),                 # FSDP
          "runs": re.compile(r"([^/]+/)+events\.out\.tfevents\.[^/]+")}


def _foreign_inside(folder: Path, kind: str) -> list[str]:
    """The files below ``folder`` (a run's final/, checkpoint-N/ or runs/) that ``train`` does not write there, as
    paths relative to ``folder``; a link counts as foreign (dsh writes none)."""
    pattern = INSIDE[kind]
    out = []
    for f in sorted(folder.rglob("*")):
        rel = f.relative_to(folder).as_posix()
        if f.is_symlink() or (f.is_file() and not pattern.fullmatch(rel)) or not (f.is_file() or f.is_dir()):
            out.append(rel)
    return out


def run_foreign_files(run_dir) -> list[str]:
    """The paths in ``run_dir`` that :func:`train` does not write (all of its names when it holds no
    ``run_config.json``, i.e. is no dsh run; none for an empty or missing folder), looking into ``final/``, the
    checkpoints and ``runs/`` too: a file of the user's anywhere below a run folder is named here (``final/mine.txt``)
    and so is never deleted with it."""
    run = Path(run_dir)
    names = sorted(p.name for p in run.iterdir()) if run.is_dir() else []
    if names and "run_config.json" not in names:
        return names
    out = []
    for n in names:
        p = run / n
        if p.is_symlink():
            out.append(n)
        elif n in RUN_FILES and p.is_file():
            continue
        elif (n in RUN_FOLDERS or CHECKPOINT.fullmatch(n)) and p.is_dir():
            out += [f"{n}/{x}" for x in _foreign_inside(p, "checkpoint" if CHECKPOINT.fullmatch(n) else n)]
        else:
            out.append(n)
    return out


def clear_run(run_dir) -> None:
    """Remove the dsh run in ``run_dir`` (finished or interrupted) so that it can be trained afresh: only what
    :func:`train` writes there (:data:`RUN_FILES`, :data:`RUN_FOLDERS`, checkpoints), then the folder itself. A
    folder that is not a dsh run (no ``run_config.json``) or that holds anything else is refused in one line that
    names what it holds, before anything is removed. A missing folder is nothing to do."""
    import shutil

    run = Path(run_dir)
    if not run.exists():
        return
    if not run.is_dir():
        raise ValueError(f"run folder {run} is a file; choose a folder")
    names = sorted(p.name for p in run.iterdir())
    if names and "run_config.json" not in names:
        raise ValueError(f"run folder {run} is not a dsh run (no run_config.json; it holds {', '.join(names[:3])}"
                         f"{' ...' if len(names) > 3 else ''}); nothing was removed")
    foreign = run_foreign_files(run)
    if foreign:
        raise ValueError(f"run folder {run} holds files dsh train did not write ({', '.join(foreign[:3])}"
                         f"{' ...' if len(foreign) > 3 else ''}); move them or choose another folder; nothing was "
                         f"removed")
    for n in names:
        p = run / n
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    run.rmdir()


def check_checkpoint(ck: Path) -> Path:
    """The checkpoint ``ck`` that a resume will read, refused in one line naming the file when one of its files
    cannot be read safely: a cut or damaged ``model.safetensors`` / ``optimizer.pt`` / ``scheduler.pt``, or a
    pickle that torch's weights-only loader refuses (a planted object would run code under a plain loader). The
    ``.pt``/``.pth`` files are opened as the trainer opens them (weights only, transformers' allowed globals; memory
    mapped, so a large optimizer state is not read twice)."""
    import torch
    from safetensors import safe_open
    from transformers.trainer_pt_utils import safe_globals

    for f in sorted(ck.iterdir()):
        try:
            if f.name.endswith(".safetensors"):
                with safe_open(str(f), "pt") as h:
                    h.keys()
            elif f.suffix in (".pt", ".pth") and f.name != "training_args.bin":
                with safe_globals():
                    torch.load(f, map_location="cpu", weights_only=True, mmap=True)
        except Exception as e:  # noqa: BLE001 - any unreadable file gets the same one-line refusal
            import pickle

            why = ("objects beyond tensors and plain values, refused by the weights-only loader"
                   if isinstance(e, pickle.UnpicklingError) else str(e).strip().splitlines()[0][:120] or "empty")
            raise ValueError(f"checkpoint {ck}: {f.name} cannot be read safely ({type(e).__name__}: {why}); delete "
                             f"{ck} to resume from the checkpoint before it, or train afresh (--fresh, or another "
                             f"output_dir)") from None
    return ck


def check_run_dir(cfg: TrainConfig, digest: str | None = None) -> Path:
    """The run directory, refused when it already holds a run and ``resume`` is off, or, with ``resume``, when it
    holds files but is not a dsh run (no ``run_config.json``) or another run (:func:`resume_mismatch`; ``digest``:
    the starting model's, when the caller has it). Nothing is created here."""
    run = Path(_config(cfg).output_dir)
    if run.exists() and not run.is_dir():
        raise ValueError(f"output_dir {run} is a file; choose a folder")
    v.output_path("output_dir", run, kind="folder")     # no parent of it a file
    full = run.is_dir() and any(run.iterdir())
    if full and not cfg.resume:
        raise ValueError(f"output_dir {run} already holds a run; pass resume=True to continue it or choose "
                         f"another output_dir")
    if full and cfg.resume and not (run / "run_config.json").is_file():
        raise ValueError(f"output_dir {run} is not a dsh run (no run_config.json); resume continues only a dsh run")
    # a resumed run rotates and deletes its checkpoints and rewrites final/: a file of the user's inside them would
    # go (one beside them, at the run folder's top, is never touched and stays)
    foreign = [f for f in run_foreign_files(run) if "/" in f] if full else []
    if foreign:
        raise ValueError(f"output_dir {run} holds files dsh train did not write ({', '.join(foreign[:3])}"
                         f"{' ...' if len(foreign) > 3 else ''}); move them or choose another output_dir")
    if full and cfg.resume:
        differ = resume_mismatch(run, cfg, digest)
        if differ:
            raise ValueError(f"output_dir {run} holds a run with other settings ({differ}); resume continues only "
                             f"the same run: choose another output_dir or the run's own settings")
    return run


def resume_mismatch(run: Path, cfg: TrainConfig, digest: str | None = None) -> str:
    """What differs between the run in ``run`` (its ``run_config.json``) and ``cfg``, as ``field: was -> now`` (empty
    when nothing does): every field but ``output_dir`` and ``resume``, the starting model compared by content
    (:func:`dsh.llm.models.model_digest`: the same weights under a relative, an absolute or another path are the
    same model; other weights in the same folder are not), for a run from before digests as the folder it resolves
    to. ``digest``: the starting model's :func:`~dsh.llm.models.model_digest` when the caller has it (computed here
    otherwise: one read of the weights)."""
    try:
        stored = json.loads((run / "run_config.json").read_text())
        was = stored["dsh"]
    except (OSError, ValueError, KeyError, TypeError):
        return "run_config.json unreadable"
    now = json.loads(json.dumps(dataclasses.asdict(cfg), default=str))
    out = []
    for k in sorted(set(was) | set(now)):
        if k in ("output_dir", "resume", "model") or was.get(k) == now.get(k):
            continue
        out.append(f"{k}: {was.get(k)!r} -> {now.get(k)!r}")
    before, after = stored.get("resolved_model"), resolve_model(cfg.model)
    if stored.get("model_digest") is not None:      # by content: the same weights under any path, other weights never
        digest = digest or model_digest(after)
        if digest != stored["model_digest"]:
            out.append(f"model: {before!r} ({stored['model_digest'][:19]}) -> {after!r} ({digest[:19]})")
        return "; ".join(out)
    same = before == after or (before is not None and Path(before).exists() and Path(after).exists()
                               and Path(before).resolve() == Path(after).resolve())   # a run from before digests
    if not same:
        out.append(f"model: {before!r} -> {after!r}")
    return "; ".join(out)


def _sft_trainer(cfg: TrainConfig, trl_cfg, model, tok, ds, peft_config, callbacks):
    """TRL's SFTTrainer for sft, sft_reflection and dft (the data and ``loss_type`` differ; right padding)."""
    from trl import SFTTrainer

    tok.padding_side = "right"
    return SFTTrainer(model=model, args=trl_cfg, train_dataset=ds, processing_class=tok, peft_config=peft_config,
                      callbacks=callbacks)


def _grpo_trainer(cfg: TrainConfig, trl_cfg, model, tok, ds, peft_config, callbacks):
    """TRL's GRPOTrainer with the correctness reward, rollouts from ``cfg.generation_backend``
    (:class:`dsh.training.grpo_trainer.EngineGRPOTrainer`)."""
    from .grpo_trainer import EngineGRPOTrainer

    trainer = EngineGRPOTrainer(model=model, reward_funcs=[task_reward(cfg.task)], args=trl_cfg, train_dataset=ds,
                                processing_class=tok, peft_config=peft_config, callbacks=callbacks)
    trainer.rollout_backend = cfg.generation_backend
    trainer.padding_free = cfg.padding_free
    if cfg.padding_free and getattr(trainer, "ref_model", None) is not None:
        from ..llm.packing import register

        trainer.ref_model.set_attn_implementation(register())
    if cfg.generation_backend == "dsh":
        why = engine_unsuitable(trainer)
        if why:
            raise ValueError(f"generation_backend 'dsh' cannot be used: {why}; use 'auto' or 'trl'")
    return trainer


TRAINERS = {"sft": _sft_trainer, "sft_reflection": _sft_trainer, "dft": _sft_trainer, "grpo": _grpo_trainer}


def _lora(cfg: TrainConfig):
    if not cfg.lora:
        return None
    from peft import LoraConfig

    return LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=cfg.lora_target_modules, task_type="CAUSAL_LM")


def _save_final(trainer, tok, cfg: TrainConfig, run: Path, packed: bool) -> None:
    """The trained model (LoRA merged, standard attention) and its tokenizer (left padding) into ``run/final``."""
    m = trainer.model
    if cfg.lora:
        m = m.merge_and_unload()
    if packed:
        m.set_attn_implementation("sdpa")
    m.save_pretrained(run / "final", safe_serialization=True)
    tok.padding_side = "left"
    tok.save_pretrained(run / "final")
    readable(run / "final")


def _summary(cfg: TrainConfig, trl_cfg, trainer, out, wall: float, resume_from, records, packed: bool, cut) -> dict:
    import torch

    logs = [h for h in trainer.state.log_history if "loss" in h]
    ntok = trainer.state.num_input_tokens_seen or None
    return {
        "method": cfg.method, "model": cfg.model, "global_step": trainer.state.global_step,
        # over every step of the run, resumed or not (transformers' own is over this call's steps only)
        "wall_s": round(wall, 2), "train_loss": trainer._total_loss_scalar / max(trainer.state.global_step, 1)
        if resume_from else out.training_loss,
        "first_loss": logs[0]["loss"] if logs else None, "last_loss": logs[-1]["loss"] if logs else None,
        "resumed_from": resume_from, "tokens_seen": ntok,
        "tokens_per_s": ((ntok - (getattr(trainer, "_initial_num_input_tokens_seen", 0) or 0)) / wall) if ntok else None,
        "peak_gpu_memory_gb": (torch.cuda.max_memory_allocated() / 2 ** 30) if torch.cuda.is_available() else None,
        "hardware": hardware(), "commit": git_commit(), "n_records": len(records),
        "padding_free": packed,
        "generation_backend": (("dsh" if getattr(trainer, "_engine", None) is not None else
                                "vllm" if trl_cfg.use_vllm else "trl") if cfg.method == "grpo" else None),
        "real_tokens": _real_tokens(trainer),
        "generation_s": getattr(trainer, "generation_seconds", None),
        "scoring_s": getattr(trainer, "scoring_seconds", None),
        "update_s": getattr(trainer, "update_seconds", None),
        "rollouts": (trainer.state.global_step * cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps
                     if cfg.method == "grpo" else None),
        "truncation": cut if cut is not None else {"what": "rollouts clipped at max_completion_length",
                                                   "limit": cfg.max_completion_length,
                                                   **grpo_diagnostics(trainer.state.log_history)},
    }


def train(cfg: TrainConfig) -> dict:
    """Run one training job (the method's trainer: :data:`TRAINERS`) and return its summary (also written to
    ``summary.json``); the run directory keeps ``final/`` (and its checkpoints with ``keep_checkpoints``)."""
    _config(cfg)
    v.output_path("output_dir", cfg.output_dir, kind="folder")    # before the model is read or TRL imported
    loc = fetched(cfg.model, resolve_model(cfg.model))   # fails fast on a bad or absent model before any work
    trl_cfg = to_trl_config(cfg)
    digest = model_digest(loc)                     # the starting model by content: what a resume must continue from
    check_run_dir(cfg, digest)
    print(f"dsh: train {cfg.method} from {repo_relative(cfg.model)} into {repo_relative(cfg.output_dir)} (seed "
          f"{cfg.seed}, trust_remote_code={cfg.trust_remote_code})", flush=True)
    # one process a run folder: a second one would interleave its steps and checkpoints with the first's
    with exclusive(Path(cfg.output_dir), f"output_dir {cfg.output_dir} is being trained by another dsh process; "
                   f"wait for it or choose another output_dir"):
        return _train(cfg, loc, trl_cfg, digest)


def _train(cfg: TrainConfig, loc: str, trl_cfg, digest: str) -> dict:
    import torch

    run = check_run_dir(cfg, digest)               # again, now that no other process can change it
    resume_from = str(check_checkpoint(last_checkpoint(run))) if cfg.resume and last_checkpoint(run) else None
    if cfg.resume and resume_from is None:
        print(f"dsh: nothing to resume in {run} (no checkpoint); training from the start", flush=True)
    records = build_dataset(cfg)
    model, tok = load(loc, dtype=torch.bfloat16 if trl_cfg.bf16 else torch.float32,
                      trust_remote_code=cfg.trust_remote_code)   # refuses weights that do not cover the model
    new = not run.is_dir() or not any(run.iterdir())
    run.mkdir(parents=True, exist_ok=True)         # nothing is written before the model has loaded
    try:
        return _train_in(cfg, run, trl_cfg, model, tok, records, resume_from, loc, digest)
    except BaseException:
        if new and last_checkpoint(run) is None:   # failed or stopped before its first checkpoint: nothing to resume,
            with contextlib.suppress(ValueError):  # and nothing left that would refuse the next try (only dsh's files)
                clear_run(run)
        raise


def _train_in(cfg: TrainConfig, run: Path, trl_cfg, model, tok, records, resume_from, loc: str, digest: str) -> dict:
    import shutil

    import torch
    from datasets import Dataset

    if cfg.resume:          # the killed run's logs past its checkpoint (all of them when there is none) are logged again
        trim_logs(run, int(Path(resume_from).name.split("-")[-1]) if resume_from else -1)
    (run / "run_config.json").write_text(json.dumps(
        {"dsh": dataclasses.asdict(cfg), "resolved_model": loc, "model_digest": digest, "trl": trl_cfg.to_dict()},
        indent=1, default=str))
    packed = cfg.padding_free
    if packed:
        from ..llm.packing import register

        model.set_attn_implementation(register())
    rows = token_records(tok, records) if has_segments(records) else records   # partly learned completions
    holder = []
    callbacks = [_metrics_callback(run / "metrics.jsonl"), _totals_callback(holder, resume_from)]
    if cfg.validation_every:
        callbacks.append(validation.make_callback(
            tok, tasks.get(cfg.task).validation_questions(cfg.train_levels, cfg.validation_per_level), cfg.task,
            cfg.validation_every, cfg.temperature, cfg.validation_max_new_tokens or cfg.max_completion_length,
            run / "validation.jsonl", seed=cfg.seed))
    trainer = TRAINERS[cfg.method](cfg, trl_cfg, model, tok, Dataset.from_list(rows), _lora(cfg), callbacks)
    holder.append(trainer)
    cut = example_truncation(records, tok, cfg.max_length) if cfg.method != "grpo" else None
    if cut and cut["rate"] and cut["rate"] > 0.01:
        print(f"dsh: warning: {cut['over']} of {cut['n']} training examples ({100 * cut['rate']:.1f} %) are longer "
              f"than max_length={cfg.max_length}", flush=True)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    with writing(run):            # checkpoints: a full disk is one line naming the run folder
        out = trainer.train(resume_from_checkpoint=resume_from)
    wall = time.time() - t0
    with writing(run / "final"):
        _save_final(trainer, tok, cfg, run, packed)
    summary = _summary(cfg, trl_cfg, trainer, out, wall, resume_from, records, packed, cut)
    summary["final_weights"] = f"sha256:{weights_digest(run / 'final')}"   # what final/ holds: a reuse checks it
    (run / "summary.json").write_text(json.dumps(summary, indent=1))
    if not cfg.keep_checkpoints:  # a finished run needs only final/ (a 7B checkpoint with Adam is ~100 GB)
        for ck in run.iterdir():
            if ck.is_dir() and CHECKPOINT.fullmatch(ck.name) and not _foreign_inside(ck, "checkpoint"):
                shutil.rmtree(ck, ignore_errors=True)     # only a checkpoint that holds nothing but the trainer's
    return summary
