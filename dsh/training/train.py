"""Training: SFT, SFT with reflection, DFT and GRPO through TRL, one trainer per method.

:class:`~dsh.training.train_config.TrainConfig` holds every knob (a dataclass, as TRL's configs) and maps to TRL's
``SFTConfig`` / ``GRPOConfig``; :mod:`dsh.experiment.run.presets` supplies each preset's values; the task it names
(:mod:`dsh.measure.tasks`) writes the training data and gives the GRPO reward; :func:`train` runs it and leaves a run
directory (:mod:`dsh.training.run_dir` checks it before a run starts or resumes):

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
import logging
import time
from pathlib import Path

from ..core import validate as v
from ..core.files import exclusive, readable, write_text, writing
from ..core.paths import repo_relative
from ..core.provenance import git_commit, hardware
from ..llm.complete import single_token
from ..llm.models import fetched, load, model_digest, resolve_model, weights_digest
from ..measure import tasks
from ..task.records import chat_length
from . import validation
from .laptop_base import corpus_of
from .loss_mask import has_segments, token_records
from .own_attempts import own_attempts
from .rollout import engine_unsuitable
from .run_dir import CHECKPOINT, TOTALS, check_checkpoint, check_run_dir, clear_run, foreign_inside, last_checkpoint, trim_logs
from .train_config import TrainConfig, checked_config, to_trl_config


# ------------------------------------------------------------------------------------------------
# Data and reward
# ------------------------------------------------------------------------------------------------
def build_dataset(cfg: TrainConfig) -> list[dict]:
    """Training records for the method, written by ``cfg``'s task (:mod:`dsh.measure.tasks`; the paper's 20,000
    problems by default, the test problems held out); reflection traces that begin with the starting model's own
    attempts get them from :func:`dsh.training.own_attempts.own_attempts`."""
    task = tasks.get(checked_config(cfg).task)
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


def _metrics_callback(path: Path):
    from transformers import TrainerCallback

    class JsonlMetrics(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            if logs and state.is_world_process_zero:
                with open(path, "a") as f:
                    f.write(json.dumps({"step": state.global_step, **{k: float(x) if isinstance(x, (int, float)) else x
                                                                      for k, x in logs.items()}}) + "\n")

    return JsonlMetrics()


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


def _sft_trainer(cfg: TrainConfig, trl_cfg, model, tok, ds, peft_config, callbacks):
    """TRL's SFTTrainer for sft, sft_reflection and dft (the data and ``loss_type`` differ; right padding)."""
    from trl import SFTTrainer

    tok.padding_side = "right"
    return SFTTrainer(model=model, args=trl_cfg, train_dataset=ds, processing_class=tok, peft_config=peft_config,
                      callbacks=callbacks)


def budget_stop(cfg: TrainConfig, tok) -> tuple | None:
    """The engine's ``stop_after`` for ``cfg.attempt_budget``: (the task's one-token reflection marker, the budget);
    None without a budget; a one-line ValueError when the task has no such marker or the tokenizer splits it."""
    if cfg.attempt_budget is None:
        return None
    marker = tasks.get(cfg.task).budget_marker
    if marker is None:
        raise ValueError(f"attempt_budget needs a task with a one-token reflection marker (laptop_task); got task "
                         f"{cfg.task!r}")
    return single_token(tok, marker, "attempt_budget's marker"), cfg.attempt_budget


def _grpo_trainer(cfg: TrainConfig, trl_cfg, model, tok, ds, peft_config, callbacks):
    """TRL's GRPOTrainer with the correctness reward, rollouts from ``cfg.generation_backend``
    (:class:`dsh.training.grpo_trainer.EngineGRPOTrainer`)."""
    from .grpo_trainer import EngineGRPOTrainer

    trainer = EngineGRPOTrainer(model=model, reward_funcs=[task_reward(cfg.task)], args=trl_cfg, train_dataset=ds,
                                processing_class=tok, peft_config=peft_config, callbacks=callbacks)
    trainer.rollout_backend = cfg.generation_backend
    trainer.rollout_kv_cache = cfg.rollout_kv_cache
    trainer.stop_after = budget_stop(cfg, tok)
    trainer.padding_free = cfg.padding_free
    trainer.update_precision = cfg.update_precision
    trainer.scoring_precision = cfg.scoring_precision
    if cfg.padding_free and getattr(trainer, "ref_model", None) is not None:
        from ..llm.packing import register

        trainer.ref_model.set_attn_implementation(register(cfg.packed_attention))
    if cfg.generation_backend == "dsh":
        why = engine_unsuitable(trainer)
        if why:
            raise ValueError(f"generation_backend 'dsh' cannot be used: {why}; use 'auto' or 'trl'")
    if trainer.stop_after is not None and (cfg.generation_backend == "trl" or engine_unsuitable(trainer)):
        raise ValueError("attempt_budget needs the rollouts of dsh.llm.engine (generation_backend dsh or auto): "
                         f"here {engine_unsuitable(trainer) or 'generation_backend trl'}")
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


class _NoTokenCount(logging.Filter):
    """Drops transformers' "Tried to track the number of tokens seen" warning: GRPO's steps carry no ``input_ids``
    (its rollouts are counted by dsh: ``rollouts``, ``real_tokens``), so transformers repeats it at every step."""

    def filter(self, record) -> bool:
        return "Tried to track the number of tokens seen" not in record.getMessage()


def quiet_trainer(trainer, progress: bool) -> None:
    """The trainer's console output as dsh wants it: transformers' per-step token-count warning dropped, and with
    ``progress`` off its progress bar and printed log lines too (the logs still reach ``metrics.jsonl``)."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    log = logging.getLogger("transformers.trainer")
    if not any(isinstance(f, _NoTokenCount) for f in log.filters):
        log.addFilter(_NoTokenCount())
    if not progress:
        for cb in (ProgressCallback, PrinterCallback):
            trainer.remove_callback(cb)


@contextlib.contextmanager
def _no_bars():
    """transformers' progress bars (loading and writing weights) off inside, as they were after."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


@contextlib.contextmanager
def _fused(cfg: TrainConfig, trainer):
    """With ``packed_attention`` fused (which TrainConfig allows only with padding-free rows), the policy's and the
    reference's decoder layers on :func:`dsh.llm.fused_layers.fused_layers`' C paths for the duration; otherwise
    nothing."""
    if cfg.packed_attention != "fused":
        yield
        return
    from ..llm.fused_layers import fused_layers

    models = [trainer.model] + [m for m in [getattr(trainer, "ref_model", None)] if m is not None and m is not trainer.model]
    with contextlib.ExitStack() as stack:
        for m in models:
            stack.enter_context(fused_layers(m))
        yield


def train(cfg: TrainConfig, progress: bool = True) -> dict:
    """Run one training job (the method's trainer: :data:`TRAINERS`) and return its summary (also written to
    ``summary.json``); the run directory keeps ``final/`` (and its checkpoints with ``keep_checkpoints``).
    ``progress``: the start line, the trainer's progress bar and its printed log lines (off: warnings and errors
    only; what is trained and written is the same)."""
    checked_config(cfg)
    if not isinstance(progress, bool):
        raise ValueError(f"progress must be true or false, got {progress!r}")
    v.output_path("output_dir", cfg.output_dir, kind="folder")    # before the model is read or TRL imported
    loc = fetched(cfg.model, resolve_model(cfg.model))   # fails fast on a bad or absent model before any work
    trl_cfg = to_trl_config(cfg)
    digest = model_digest(loc)                     # the starting model by content: what a resume must continue from
    check_run_dir(cfg, digest)
    if progress:
        print(f"dsh: train {cfg.method} from {repo_relative(cfg.model)} into {repo_relative(cfg.output_dir)} (seed "
              f"{cfg.seed}, trust_remote_code={cfg.trust_remote_code})", flush=True)
    # one process a run folder: a second one would interleave its steps and checkpoints with the first's
    with exclusive(Path(cfg.output_dir), f"output_dir {cfg.output_dir} is being trained by another dsh process; "
                   f"wait for it or choose another output_dir"):
        with contextlib.nullcontext() if progress else _no_bars():
            return _train(cfg, loc, trl_cfg, digest, progress)


def _train(cfg: TrainConfig, loc: str, trl_cfg, digest: str, progress: bool = True) -> dict:
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
        return _train_in(cfg, run, trl_cfg, model, tok, records, resume_from, loc, digest, progress)
    except BaseException:
        if new and last_checkpoint(run) is None:   # failed or stopped before its first checkpoint: nothing to resume,
            with contextlib.suppress(ValueError):  # and nothing left that would refuse the next try (only dsh's files)
                clear_run(run)
        raise


def _train_in(cfg: TrainConfig, run: Path, trl_cfg, model, tok, records, resume_from, loc: str, digest: str,
              progress: bool = True) -> dict:
    import shutil

    import torch
    from datasets import Dataset

    from ..llm.thread_stable import trl_lm_head

    if cfg.resume:          # the killed run's logs past its checkpoint (all of them when there is none) are logged again
        trim_logs(run, int(Path(resume_from).name.split("-")[-1]) if resume_from else -1)
    (run / "run_config.json").write_text(json.dumps(
        {"dsh": dataclasses.asdict(cfg), "resolved_model": loc, "model_digest": digest, "trl": trl_cfg.to_dict()},
        indent=1, default=str))
    packed = cfg.padding_free
    if packed:
        from ..llm.packing import register

        model.set_attn_implementation(register(cfg.packed_attention))
    rows = token_records(tok, records) if has_segments(records) else records   # partly learned completions
    holder = []
    callbacks = [_metrics_callback(run / "metrics.jsonl"), _totals_callback(holder, resume_from)]
    if cfg.validation_every:
        callbacks.append(validation.make_callback(
            tok, tasks.get(cfg.task).validation_questions(cfg.train_levels, cfg.validation_per_level), cfg.task,
            cfg.validation_every, cfg.temperature, cfg.validation_max_new_tokens or cfg.max_completion_length,
            run / "validation.jsonl", seed=cfg.seed, kv_cache=cfg.rollout_kv_cache, stop_after=budget_stop(cfg, tok)))
    trainer = TRAINERS[cfg.method](cfg, trl_cfg, model, tok, Dataset.from_list(rows), _lora(cfg), callbacks)
    holder.append(trainer)
    quiet_trainer(trainer, progress)
    cut = example_truncation(records, tok, cfg.max_length) if cfg.method != "grpo" else None
    if cut and cut["rate"] and cut["rate"] > 0.01:
        print(f"dsh: warning: {cut['over']} of {cut['n']} training examples ({100 * cut['rate']:.1f} %) are longer "
              f"than max_length={cfg.max_length}", flush=True)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    with writing(run), trl_lm_head(), _fused(cfg, trainer):   # a full disk: one line naming the run folder; the
        out = trainer.train(resume_from_checkpoint=resume_from)     # head thread-stable; the layers' C paths
    wall = time.time() - t0
    with writing(run / "final"):
        _save_final(trainer, tok, cfg, run, packed)
    summary = _summary(cfg, trl_cfg, trainer, out, wall, resume_from, records, packed, cut)
    summary["final_weights"] = f"sha256:{weights_digest(run / 'final')}"   # what final/ holds: a reuse checks it
    (run / "summary.json").write_text(json.dumps(summary, indent=1))
    if not cfg.keep_checkpoints:  # a finished run needs only final/ (a 7B checkpoint with Adam is ~100 GB)
        for ck in run.iterdir():
            if ck.is_dir() and CHECKPOINT.fullmatch(ck.name) and not foreign_inside(ck, "checkpoint"):
                shutil.rmtree(ck, ignore_errors=True)     # only a checkpoint that holds nothing but the trainer's
    return summary
