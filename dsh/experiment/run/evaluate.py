"""Evaluation (paper, Appendix "Evaluation Protocol"): one sample per test question at temperature 1.0, or
``samples_per_question`` samples of each (their statistics then resample questions: :mod:`dsh.measure.calibration`).

Writes JSON lines that ``python -m dsh calibrate`` reads as they are: question, answer, response, level, truncated,
prompt_tokens, completion_tokens, index (and sample, with several samples a question; capped, under an attempt
budget). An interrupted evaluation
resumes: records already in the output file are kept and not generated again.

Each question has its own random stream (:func:`question_key`) in the ``dsh`` and ``vllm`` backends, so a
response does not depend on the batch it ran in: an evaluation resumed with another ``batch_size`` matches an
uninterrupted one. The ``hf`` backend seeds each batch (``model.generate`` draws for a whole batch at once):
there, keep the batch size when resuming. Two processes writing the same ``out`` are refused (a lock).

Backends (``backend="auto"`` picks the first that applies): vLLM when it is installed and a GPU is
present; ``dsh`` (:mod:`dsh.llm.engine`: continuous batching over a pre-allocated KV cache, the decoding
step captured in a CUDA graph on GPU) for llama-family models; ``hf`` (``model.generate`` in batches
with left padding, static KV cache on GPU) for any other model. ``dsh bench`` measures them side by side.
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from dataclasses import dataclass
from pathlib import Path

from ...core import store
from ...core import validate as v
from ...core.files import exclusive, read_jsonl, write_jsonl, write_text
from ...llm.complete import complete, complete_hf, complete_vllm, single_token
from ...llm.kernels import KV_CACHE
from ...llm.models import EMBEDDED, fetched, load, model_digest, resolve_model, vllm_available
from ...task.laptop_task import MARKER
from ...task.problems import MAX_PROBLEMS, N_TEST, TEST_LEVELS, parse_level, test_problems

BACKENDS = ("auto", "dsh", "hf", "vllm")
MAX_RESPONSE_TOKENS = 8192    # the paper's maximum response length (Appendix "Model and Training Details")
MAX_SAMPLES = 64              # samples a question


@dataclass(frozen=True)
class EvalSettings:
    """The evaluation protocol (paper, Appendix "Evaluation Protocol"): ``n_per_level`` questions per level,
    ``samples_per_question`` samples each (the paper: one) at ``temperature``, at most ``max_new_tokens`` new tokens
    (a preset may give a :class:`dsh.experiment.run.presets.Budget` instead, derived from its traces),
    ``batch_size`` rows decoded at once, the engine's KV cache in ``kv_cache`` (``float32``, or ``float16``: half the
    bytes the CPU path's attention reads; :class:`dsh.llm.engine.Engine`), and ``attempt_budget``: None (the
    paper's protocol: only the token limit ends a response), or the most attempts a response may hold: it ends
    right after its ``attempt_budget``-th reflection marker (``capped``; the laptop format's marker, one token of the
    model's tokenizer: :data:`dsh.task.laptop_task.MARKER`), its last attempt's answer final. The defaults are the
    paper's; :func:`evaluate` and ``dsh evaluate`` take theirs from here."""

    levels: tuple = tuple(f"{m}x{n}" for m, n in TEST_LEVELS)
    n_per_level: int = N_TEST
    max_new_tokens: int = MAX_RESPONSE_TOKENS
    temperature: float = 1.0
    batch_size: int = 16
    samples_per_question: int = 1
    kv_cache: str = "float32"
    attempt_budget: int | None = None

    def key(self) -> dict:
        """These settings as the records of an evaluation (job keys, summaries) hold them: every field, but
        ``samples_per_question`` only above 1, ``kv_cache`` only when ``float16`` and ``attempt_budget`` only when
        set (the protocol of every evaluation recorded without the field)."""
        s = dataclasses.asdict(self)
        if s["samples_per_question"] == 1:
            del s["samples_per_question"]
        if s["kv_cache"] == "float32":
            del s["kv_cache"]
        if s["attempt_budget"] is None:
            del s["attempt_budget"]
        return s

    def checked(self) -> EvalSettings:
        """These settings with the levels in canonical form (``"3x5"``), or a one-line ValueError naming the field
        and its valid values."""
        levels = self.levels
        if isinstance(levels, str) and levels.strip():      # "3x3" or "3x3,3x5" (the CLI's --eval-set levels=...)
            levels = [x.strip() for x in levels.split(",")]
        if isinstance(levels, str) or not isinstance(levels, (list, tuple)) or not levels:
            raise ValueError(f"levels must be a non-empty list of levels such as ['3x3', '3x5']; got {levels!r}")
        levels = tuple(f"{m}x{n}" for m, n in (parse_level(lv) for lv in levels))
        if len(set(levels)) != len(levels):
            raise ValueError(f"levels must name each level once; got {list(self.levels)!r}")
        v.temperature("temperature", self.temperature)
        v.choice("kv_cache", self.kv_cache, KV_CACHE)
        if self.attempt_budget is not None:
            v.positive_int("attempt_budget", self.attempt_budget)
        n = v.at_most("n_per_level", self.n_per_level, MAX_PROBLEMS, "test problems a level")
        k = v.at_most("samples_per_question", self.samples_per_question, MAX_SAMPLES, "samples a question")
        return dataclasses.replace(self, levels=levels, n_per_level=n, samples_per_question=k,
                                   max_new_tokens=v.at_most("max_new_tokens", self.max_new_tokens, 1_048_576,
                                                            "tokens a response: memory"),
                                   batch_size=v.at_most("batch_size", self.batch_size, 65_536, "rows decoded at once"))


def _done(path: Path) -> dict:
    """The records already in ``path`` by (level, index, sample); a line cut by an interruption is generated again."""
    return {_slot(r): r for r in read_jsonl(path, strict=False) if "level" in r and "index" in r}


def _slot(r: dict) -> tuple:
    """A record's place in the evaluation: (level, index, sample), sample 0 where the record names none."""
    return r.get("level"), r.get("index"), r.get("sample", 0)


def evaluate(model: str = EMBEDDED, out: str = "generations.jsonl", settings: EvalSettings = EvalSettings(),
             seed: int = 0, backend: str = "auto", progress: bool = True) -> Path:
    """Generate ``samples_per_question`` responses per test question of ``settings`` (levels, questions per level,
    temperature, token limit, rows decoded at once: on a GPU capped to what the KV cache can hold) and append them
    to ``out`` (resumable). Each response has its own random stream (:func:`question_key`); the first sample of a
    question is the response an evaluation with one sample a question gives."""
    if not isinstance(settings, EvalSettings):
        raise ValueError(f"settings must be a dsh.experiment.run.evaluate.EvalSettings; got {type(settings).__name__}")
    settings = settings.checked()
    v.length("seed", seed)
    v.choice("backend", backend, BACKENDS)
    if settings.attempt_budget is not None and backend in ("hf", "vllm"):
        raise ValueError(f"attempt_budget needs backend auto or dsh (dsh.llm.engine); got backend {backend!r}")

    out = v.output_path("out", out)             # a bad out fails before the model is looked for (or fetched)
    loc = fetched(model, resolve_model(model))  # a bad or absent model fails here, before anything is written
    v.within_context("max_new_tokens", settings.max_new_tokens, model_context(loc))
    if Path(loc).exists() and Path(loc).resolve() in (out.resolve(), *out.resolve().parents):
        raise ValueError(f"out must lie outside the model folder {loc}")
    n, reps = settings.n_per_level, settings.samples_per_question
    problems = [(settings.levels[k // n], k % n, j, p)
                for k, p in enumerate(test_problems(settings.levels, n, seed)) for j in range(reps)]
    ident = model_identity(model, settings, seed, backend)
    check_own_output(out, ident, problems)
    with exclusive(out, f"out {out} is being written by another dsh evaluate; wait for it or choose another out"):
        fresh = not settings_path(out).is_file()
        had_out = out.exists()
        if fresh:
            write_text(settings_path(out), json.dumps(ident, indent=1))
        try:
            return _evaluate(loc, out, problems, settings, seed, backend, progress)
        except BaseException:
            # a run that fails before its first record (a model that cannot be loaded, an interruption) leaves no
            # settings record behind: it would refuse the next, correct run as "another evaluation"
            if fresh and not (out.is_file() and out.stat().st_size):
                settings_path(out).unlink(missing_ok=True)
                if not had_out and out.is_file():
                    out.unlink()
            raise


def model_context(loc: str) -> int | None:
    """The context length (``max_position_embeddings``) of a local model folder's config; None when unknown."""
    try:
        return int(json.loads((Path(loc) / "config.json").read_text())["max_position_embeddings"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def settings_path(out: Path) -> Path:
    """The settings record beside an evaluation's output: ``<out>.settings.json``."""
    return out.with_name(out.name + ".settings.json")


def model_identity(model: str, settings, seed: int, backend: str = "auto") -> dict:
    """What a generations file is made from: the model by content (:func:`dsh.llm.models.model_digest`: the same
    weights under any path are the same model), the evaluation settings (all but ``batch_size``, which does not
    change a response of the dsh and vLLM backends), the seed and the backend, as JSON reads it back."""
    s = {k: x for k, x in settings.key().items() if k != "batch_size"}
    return json.loads(json.dumps({"model": model_digest(model), "settings": s, "seed": seed, "backend": backend}))


def check_own_output(out: Path, ident: dict, problems) -> None:
    """Refuse (one line) an ``out`` that dsh evaluate did not write with these settings: a non-empty file needs its
    settings record (:func:`settings_path`) to equal ``ident``, and each of its lines to be one of this run's records
    (the last line may be cut by an interruption). Nothing is modified here."""
    rec = settings_path(out)
    if not out.is_file() or not out.stat().st_size:
        if rec.is_file() and store.reusable(rec, ident) is None:
            raise ValueError(f"out {out}: its settings record {rec.name} is of another evaluation; choose another out")
        return
    if not rec.is_file():
        raise ValueError(f"out {out} holds data dsh evaluate did not write (no settings record {rec.name}); "
                         f"choose another out")
    stored = store.read_record(rec)
    if stored is None:
        raise ValueError(f"out {out}: its settings record {rec.name} is not a JSON object; choose another out")
    diff = store.differences(stored, ident)
    if diff:
        raise ValueError(f"out {out} holds an evaluation with other {', '.join(diff)}; resume only continues the same "
                         f"evaluation (choose another out)")
    expected = {(lv, i, j): p.question for lv, i, j, p in problems}
    with open(out, "rb") as f:
        lines = f.read().split(b"\n")
    cut = lines[-1]                     # after the last newline: empty, or a record cut by an interruption
    for k, raw in enumerate(lines[:-1], start=1):
        try:
            r = json.loads(raw)
            key = _slot(r) if isinstance(r, dict) else None
            mine = key in expected and expected[key] == r.get("question") and "response" in r
        except (ValueError, TypeError):    # not JSON, or an unhashable level / index
            mine = False
        if not mine:
            raise ValueError(f"out {out} line {k} is not a record of this evaluation; choose another out")
    if cut and not cut.startswith(b'{"'):
        raise ValueError(f"out {out}: its last line is not a record of this evaluation; choose another out")


def _evaluate(loc, out, problems, settings: EvalSettings, seed, backend, progress) -> Path:
    done = _done(out)
    todo = [(lv, i, j, p) for lv, i, j, p in problems if (lv, i, j) not in done]
    if not todo:
        return out
    if done or (out.is_file() and out.stat().st_size):  # rewrite without a partial last (or first) line before appending
        write_jsonl([done[(lv, i, j)] for lv, i, j, _ in problems if (lv, i, j) in done], out)
    import torch

    if backend == "vllm" and not vllm_available():
        raise ValueError("backend 'vllm' needs the vllm package; choose backend auto, dsh or hf")
    use_vllm = backend == "vllm" or (backend == "auto" and torch.cuda.is_available() and vllm_available()
                                     and settings.attempt_budget is None)
    questions, keys = [p.question for *_, p in todo], [question_key(lv, i, j) for lv, i, j, _ in todo]
    s = settings
    if use_vllm:
        def run(write):
            complete_vllm(loc, questions, s.max_new_tokens, s.temperature, seed, keys, write, progress)
    else:
        from ...llm.engine import supports

        model, tok = load(loc)          # a model that does not load fails here, before the output is touched
        why = supports(model)
        if backend == "dsh" and why:
            raise ValueError(f"backend 'dsh' cannot run {model}: {why}; choose backend auto or hf")
        if settings.attempt_budget is not None and why:
            raise ValueError(f"attempt_budget needs dsh.llm.engine, which cannot run {model}: {why}")
        stop_after = None if settings.attempt_budget is None else (
            single_token(tok, MARKER, "attempt_budget's marker"), settings.attempt_budget)
        if backend == "hf" or why:
            # one seed per batch (model.generate draws for a whole batch): keep the batch size when resuming
            def run(write):
                complete_hf(model, tok, questions, s.max_new_tokens, s.temperature, s.batch_size, lambda j: (
                    seed * 1_000_003 + todo[j][1] + 7919 * zlib.crc32(todo[j][0].encode()) + 104_729 * todo[j][2])
                    % 2 ** 63, write, progress)
        else:
            def run(write):
                complete(model, tok, questions, s.max_new_tokens, s.temperature, seed, s.batch_size, keys, write,
                         progress, kv_cache=s.kv_cache, stop_after=stop_after)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "a") as f:
        def write(j, c):
            lv, i, k, p = todo[j]
            rec = _record(lv, i, p, c.text, c.prompt_tokens, c.completion_tokens, c.truncated)
            if s.attempt_budget is not None:
                rec.update(capped=bool(c.capped), attempt_budget=s.attempt_budget)
            f.write(json.dumps(rec if s.samples_per_question == 1 else {**rec, "sample": k}) + "\n")
            f.flush()

        run(write)
    return out


def question_key(level: str, index: int, sample: int = 0) -> int:
    """A response's random stream in the engine (the question's level and index, the sample's number): the same
    response whatever batch it runs in, so a resumed evaluation matches an uninterrupted one; sample 0 keeps the
    stream of an evaluation with one sample a question."""
    name = level if sample == 0 else f"{level}/{sample}"
    return (zlib.crc32(name.encode()) * 100_003 + index) & 0x7FFFFFFF


def _record(lv, i, p, text, n_prompt, n_completion, truncated):
    return {"question": p.question, "answer": p.answer, "response": text, "level": lv, "index": i,
            "truncated": bool(truncated), "prompt_tokens": int(n_prompt), "completion_tokens": int(n_completion)}
