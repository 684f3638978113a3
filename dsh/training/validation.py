"""p_s, p_dC and p_dW measured along a training run, on fixed validation questions.

The paper compares its stages before and after RL (one difference per stage). Claim (ii) is about how RL *moves*
pi_sample and pi_d, so the laptop experiment measures the two along the run: before the first optimizer step, every
``validation_every`` steps and after the last, the model being trained answers the same validation questions
(:meth:`dsh.measure.tasks.Task.validation_questions`: the run's training levels, none of the test questions in
either order), sampled at the rollouts' temperature with the same counted streams each time (so that two
checkpoints differ only by their weights), and the answers are calibrated as the evaluation calibrates them
(:func:`dsh.measure.calibration.calibrate`, the task's reading of a response): accuracy with its 95 % interval and
p_s, p_dC, p_dW with their bootstrap intervals (the paper's Eq. 8 estimators). One JSON line per measurement goes to
``run_dir/validation.jsonl``; a resumed run appends to it from where it stopped (a step is measured once).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..core.files import read_jsonl
from ..llm.complete import complete
from ..measure import tasks
from ..measure.calibration import calibrate

KEYS = ("n", "observed_accuracy", "ci_low", "ci_high", "p_s", "p_s_ci", "p_d_given_correct", "p_d_given_correct_ci",
        "p_d_given_wrong", "p_d_given_wrong_ci", "n_correct_candidates", "n_wrong_candidates")


def measure(model, tok, questions, task: str, temperature: float, max_new_tokens: int, seed: int = 0,
            kv_cache: str = "float32", stop_after=None) -> dict:
    """One validation measurement of ``model``: its answers to ``questions`` (:class:`dsh.task.problems.Problem`)
    sampled at ``temperature`` with at most ``max_new_tokens`` new tokens (streams of ``seed``), calibrated as
    ``task`` reads them: the overall block's accuracy, p_s, p_dC, p_dW with intervals (:data:`KEYS`), and the share
    of answers cut at the token limit (and, with ``stop_after``, the rollouts' attempt budget as
    :func:`dsh.llm.complete.complete` takes it, the share ended by it: ``capped``). ``kv_cache``: the engine's KV
    cache dtype (the rollouts')."""
    import torch

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            outs = complete(model, tok, [p.question for p in questions], max_new_tokens, temperature, seed,
                            rows=max(1, min(256, len(questions))), kv_cache=kv_cache, stop_after=stop_after)
    finally:
        model.train(was_training)
    recs = [{"question": p.question, "answer": str(p.answer), "response": c.text, "level": p.level,
             "truncated": c.truncated, "capped": c.capped,
             **({"attempt_budget": stop_after[1]} if stop_after else {})} for p, c in zip(questions, outs)]
    overall = calibrate(recs, seed=seed, parse=tasks.get(task).parse)["overall"]
    row = {**{k: overall.get(k) for k in KEYS}, "truncated": sum(r["truncated"] for r in recs) / len(recs)}
    if stop_after is not None:
        row["capped"] = sum(r["capped"] for r in recs) / len(recs)
    return row


def read_log(path) -> list[dict]:
    """The measurements in a run's ``validation.jsonl`` (empty when there is none), one per step."""
    # one line a step, in step order: the callback measures a step once and a resume first drops the killed run's
    # lines past its checkpoint (dsh.training.run_dir.trim_logs)
    return read_jsonl(path, what="path") if Path(path).is_file() else []


def make_callback(tok, questions, task: str, every: int, temperature: float, max_new_tokens: int, path,
                  seed: int = 0, kv_cache: str = "float32", stop_after=None):
    """A ``transformers.TrainerCallback`` measuring (:func:`measure`, KV cache in ``kv_cache``, ``stop_after``) at
    step 0, every
    ``every`` optimizer steps and at the last step, appending to ``path`` (steps already there are not measured again:
    a resumed run)."""
    from transformers import TrainerCallback

    path = Path(path)

    class ValidationProbe(TrainerCallback):
        def _measure(self, state, model):
            if not state.is_world_process_zero or state.global_step in {r["step"] for r in read_log(path)}:
                return
            row = {"step": state.global_step, **measure(model, tok, questions, task, temperature, max_new_tokens,
                                                        seed, kv_cache, stop_after)}
            with path.open("a") as f:
                f.write(json.dumps(row) + "\n")

        def on_train_begin(self, args, state, control, model=None, **kw):
            if state.global_step == 0:      # a resumed run measured its start already: no point at the resume step
                self._measure(state, model)

        def on_step_end(self, args, state, control, model=None, **kw):
            if state.global_step % every == 0 or state.global_step >= state.max_steps:
                self._measure(state, model)

    return ValidationProbe()
