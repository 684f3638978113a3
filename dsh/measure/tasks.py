"""The tasks an experiment can run, each one object that says everything the stack above asks of it: which
problems train and which test questions are held out, how a training trace is written, the reward, and how the
faithfulness of a decision to its check is measured. :class:`dsh.training.train_config.TrainConfig`'s ``task`` names one;
training data, the GRPO reward, ``calibrate_stage`` and the report ask it (:func:`get`) instead of branching on
its name.

- ``traces`` (:class:`TracesTask`): the paper's task (:mod:`dsh.task.traces`): the multiplication traces of
  Appendix E on the paper's levels, checks by casting out nines and elevens, faithfulness read by
  :mod:`dsh.measure.faithfulness`.
- ``laptop_task`` (:class:`LaptopTask`): the 1xN ladder for tiny from-scratch models (:mod:`dsh.task.laptop_task`),
  its computed nines check; a response read with only the attempts' stated answers as candidates (its check
  question restates the answer: :func:`dsh.task.laptop_task.read_response`) for calibration and the reward;
  faithfulness read by :func:`dsh.task.laptop_task.faithfulness`; its own settings
  (``TrainConfig.task_options``): ``check`` (``computed`` or ``verdict``: the imitated-check control) and
  ``attempts`` (``own``: reflection traces begin with the starting model's own sampled attempts; ``injected``:
  the generator's slips), ``loss`` (``all``, or ``no_wrong_attempts``: reflection SFT learns nothing from the
  wrong attempts' tokens, only the checks, verdicts, markers and right attempts; records then carry
  ``segment_texts`` / ``segment_loss``, read by :mod:`dsh.training.loss_mask`), ``wrong`` (the injected wrong
  attempts: ``slips`` in the arithmetic, or ``slips_and_miscopies``: half of them miscopy the multiplicand, so that
  the check question must be copied from the question, not from the attempt), ``replay`` (``base_corpus``: the
  training traces mixed 1:1 with examples of the starting model's own pre-training corpus, so that fine-tuning on a
  few levels keeps the base's skills at every length).

The registry sits at the top of the measurement layer: it joins how data are written (:mod:`dsh.task`) with how
responses are read and measured (:mod:`dsh.measure`), so that everything that trains, evaluates or reports can
ask it. Sampling a model (the ``own`` attempts) is not a task's job: training passes the attempts in.
"""

from __future__ import annotations

import random

from ..core import validate as v
from ..task import laptop_task as lt
from ..task.parse import DEFAULT_MARKERS, operands, parse_response, truth_value
from ..task.problems import draw_problems, make_splits, parse_level, test_problems
from ..task.records import prompt_records, sft_records
from ..task.traces import TraceConfig
from .faithfulness import summarize

STYLE_OF = {"sft": "no_reflection", "sft_reflection": "reflection", "dft": "reflection"}
VALIDATION_SEED = 7     # the validation questions' draw (apart from the test questions' and every training set's)


class Task:
    """What the experiment asks of a task (module docstring). ``options``: the task's own settings and their
    allowed values (the first is the default); ``faithfulness_keys``: the shares its :meth:`faithfulness` reports,
    counted over ``faithfulness_count`` items."""

    name = ""
    about = ""
    options: dict = {}
    faithfulness_keys: tuple = ()
    faithfulness_count = ""
    agreement_counts: str | None = None     # the faithfulness key holding verdict-vs-check 2x2 counts, if any
    budget_marker: str | None = None        # the one-token reflection marker an attempt budget counts, if any

    def wants_replay(self, cfg) -> bool:
        """Whether training mixes in examples of the starting model's corpus (:meth:`with_replay`)."""
        return False

    def settings(self, task_options: dict | None) -> dict:
        """The task's settings: its defaults with ``task_options`` applied (a one-line ValueError naming a bad one)."""
        if task_options is not None and not isinstance(task_options, dict):
            raise ValueError(f"task_options must be a mapping of the task's settings; got {task_options!r}")
        out = {k: allowed[0] for k, allowed in self.options.items()}
        for k, x in (task_options or {}).items():
            if k not in self.options:
                valid = ", ".join(self.options) or "none"
                raise ValueError(f"task_options: {k!r} is not a setting of task {self.name!r} (valid: {valid})")
            v.choice(f"task_options[{k!r}]", x, self.options[k])
            out[k] = x
        return out

    @staticmethod
    def style(cfg) -> str | None:
        """The trace style of a training config's method (None for GRPO: prompts only)."""
        if cfg.method == "grpo":
            return None
        return cfg.dft_style if cfg.method == "dft" else STYLE_OF[cfg.method]

    def training_problems(self, cfg) -> list:
        """The training problems of ``cfg`` (any object with a TrainConfig's data fields), test questions held out."""
        raise NotImplementedError

    def wants_own_attempts(self, cfg) -> bool:
        """Whether :meth:`records` needs the starting model's own attempts at the problems."""
        return False

    def records(self, cfg, problems, attempts=None) -> list[dict]:
        """Training records (TRL's conversational prompt/completion; prompts only for GRPO) of ``problems``."""
        raise NotImplementedError

    @staticmethod
    def parse(text, a=None, b=None, markers=DEFAULT_MARKERS):
        """A response read into attempts (candidates) and decisions: :func:`dsh.task.parse.parse_response`'s
        reading of the paper's format; a task whose responses restate their answers elsewhere reads them its way."""
        return parse_response(text, a, b, markers)

    def reward(self, response: str, answer, question: str | None = None) -> float:
        """The paper's binary reward R(tau) = 1[final answer correct], the final answer read by :meth:`parse` (for
        the paper's format this is :func:`dsh.task.parse.is_correct`); anything unreadable is not correct."""
        want = truth_value(answer)
        return float(want is not None and self.parse(response, *operands(question)).final_answer == want)

    def faithfulness(self, records) -> dict:
        """Decision faithfulness of evaluation records: ``{"overall": {...}, "by_level": {level: {...}}}``."""
        raise NotImplementedError

    def held_out(self) -> frozenset:
        """The test questions as (a, b) pairs, in both operand orders: what no training or validation set holds."""
        pairs = {(p.a, p.b) for p in test_problems()}
        return frozenset(pairs | {(b, a) for a, b in pairs})

    def validation_questions(self, levels, n_per_level: int) -> list:
        """Fixed validation questions: ``n_per_level`` of each level, drawn with :data:`VALIDATION_SEED`, none of
        the test questions in either order (what training measures its progress on, never the test ladder)."""
        v.positive_int("n_per_level", n_per_level)
        held = self.held_out()
        return [p for lv in levels for p in draw_problems(lv, n_per_level, seed=VALIDATION_SEED, exclude=held)]


class TracesTask(Task):
    name = "traces"
    about = "the paper's multiplication traces (dsh.task.traces) on the paper's levels"
    faithfulness_keys = ("has_check", "arithmetic_right", "verdict_follows", "verdict_true", "decision_follows",
                         "verdict_true_wrong")
    faithfulness_count = "attempts"

    def training_problems(self, cfg) -> list:
        return make_splits(n_train=cfg.n_train, train_levels=cfg.train_levels, n_test=100, seed=cfg.seed)["train"]

    def records(self, cfg, problems, attempts=None) -> list[dict]:
        style = self.style(cfg)
        if style is None:
            return prompt_records(problems)
        tc = TraceConfig(granularity=cfg.granularity, style=style, retry_fraction=cfg.retry_fraction,
                         max_attempts=cfg.max_attempts, checks=cfg.checks)
        return sft_records(problems, tc, seed=cfg.seed)

    def faithfulness(self, records) -> dict:
        return summarize(records)


class LaptopTask(Task):
    name = "laptop_task"
    about = "the 1xN ladder for tiny from-scratch models (dsh.task.laptop_task), a computed nines check"
    options = {"check": lt.CHECK_STYLES, "attempts": ("own", "injected"), "loss": ("all", "no_wrong_attempts"),
               "wrong": ("slips", "slips_and_miscopies"), "replay": ("none", "base_corpus")}
    MISCOPY_FRACTION = {"slips": 0.0, "slips_and_miscopies": 0.5}
    faithfulness_keys = ("verdict_follows_check", "check_exact", "verdict_right", "resample_after_fail")
    faithfulness_count = "checks"
    agreement_counts = "follows_counts"
    budget_marker = lt.MARKER

    def training_problems(self, cfg) -> list:
        rng = random.Random(f"laptop-train-{cfg.seed}")
        exclude, problems = lt.held_out(both_orders=True), []   # the test questions in either order
        levels = [f"{m}x{n}" for m, n in map(parse_level, cfg.train_levels)]
        while len(problems) < cfg.n_train:
            p = lt.draw(levels[len(problems) % len(levels)], rng)
            if (p.a, p.b) not in exclude:
                problems.append(p)
        return problems

    def wants_own_attempts(self, cfg) -> bool:
        return self.style(cfg) == "reflection" and self.settings(cfg.task_options)["attempts"] == "own"

    def records(self, cfg, problems, attempts=None) -> list[dict]:
        style = self.style(cfg)
        if style is None:
            return prompt_records(problems)
        settings = self.settings(cfg.task_options)
        check, masked = settings["check"], settings["loss"] == "no_wrong_attempts"
        out = []
        for i, p in enumerate(problems):
            if attempts is not None:
                t = lt.trace_from_attempts(p, attempts[i], cfg.max_attempts, check=check)
                if t is None:
                    continue
            else:
                t = lt.trace(p, style, retry_fraction=cfg.retry_fraction, max_attempts=cfg.max_attempts,
                             seed=cfg.seed + i, check=check, miscopy_fraction=self.MISCOPY_FRACTION[settings["wrong"]])
            out.append(self._record(p, t, masked))
        return out

    @staticmethod
    def _record(p, t, masked: bool) -> dict:
        """The training record of trace ``t`` (its prompt and text) for problem ``p``; ``masked``: with the segments
        :mod:`dsh.training.loss_mask` reads (no loss on the wrong attempts' tokens; a trace without segments is
        learned whole)."""
        rec = {"prompt": [{"role": "user", "content": t.prompt}],
               "completion": [{"role": "assistant", "content": t.text}], "answer": str(p.answer), "level": p.level}
        if masked:
            segs = t.segments or ((t.text, True),)
            rec["segment_texts"], rec["segment_loss"] = [x for x, _ in segs], [bool(y) for _, y in segs]
        return rec

    def held_out(self) -> frozenset:
        return lt.held_out(both_orders=True)

    def wants_replay(self, cfg) -> bool:
        return self.settings(cfg.task_options)["replay"] == "base_corpus"

    def with_replay(self, cfg, records: list[dict], corpus: dict) -> list[dict]:
        """``records`` mixed 1:1 with examples of the starting model's own pre-training corpus (``corpus``: its
        ``levels``, ``weights``, ``check_levels``, ``check_fraction``, ``slip_rate``; slipped attempts included), drawn
        apart from it (stream ``replay``, the run's seed) with the test questions held out, then shuffled: fine-tuning
        on a few levels alone erases the base's skills beyond them (chapter 07's design table)."""
        try:
            levels, weights = tuple(corpus["levels"]), tuple(corpus["weights"])
            extra = lt.base_corpus(levels, weights, len(records), corpus["check_fraction"], seed=cfg.seed,
                                   exclude=self.held_out(), check_levels=corpus.get("check_levels"),
                                   slip_rate=corpus.get("slip_rate", 0.0), stream="replay", with_problems=True)
        except (KeyError, TypeError) as e:
            raise ValueError(f"task_options replay=base_corpus: the starting model's corpus description lacks "
                             f"{e}; it needs levels, weights, check_fraction") from None
        masked = self.settings(cfg.task_options)["loss"] == "no_wrong_attempts"
        out = list(records) + [self._record(p, t, masked) for p, t in extra]
        random.Random(f"replay-order-{cfg.seed}").shuffle(out)
        return out

    @staticmethod
    def parse(text, a=None, b=None, markers=DEFAULT_MARKERS):
        """Candidates are the attempts' stated answers only, the check lines pi_d's input, and the format's own
        marker (``Let me recompute.``) the only one, whatever ``markers`` says
        (:func:`dsh.task.laptop_task.read_response`)."""
        return lt.read_response(text, a, b)

    def faithfulness(self, records) -> dict:
        f = lt.faithfulness(records)
        return {"overall": f.get("overall"), "by_level": {lv: x for lv, x in f.items() if lv != "overall"}}


TASKS = {t.name: t for t in (TracesTask(), LaptopTask())}
NAMES = tuple(TASKS)


def get(name: str) -> Task:
    """The task named ``name`` (one of :data:`NAMES`); a one-line ValueError otherwise."""
    v.choice("task", name, NAMES)
    return TASKS[name]
