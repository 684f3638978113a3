"""The presets, in one place: a :class:`Preset` holds everything a preset means - the stages of its pipeline and
what each starts from, per-method training overrides, its evaluation settings and the traces its token budgets
are derived from. The CLI, :mod:`dsh.experiment.run.pipeline`, :mod:`dsh.experiment.run.gpu_small`,
:mod:`dsh.experiment.bench.compare` and the chapters take preset names, choices and defaults from here (``NAMES``,
``DEFAULT``, :func:`get`).

- ``ci``: minutes on 2 CPU cores with the embedded model: a handful of steps on short problems.
- ``gpu-small``: the embedded model on one H100, digit-level ``lean`` traces (a 135M model learns only
  digit-level arithmetic), padding-free SFT, GRPO rollouts through :mod:`dsh.llm.engine`; micro-batch and
  accumulation derived from the token budget of an 80 GB GPU (:func:`dsh.llm.scale.batch_for`).
- ``paper``: the paper's hyperparameters (Appendix "Model and Training Details"); the verl -> TRL
  mapping is in the training chapter.

Token budgets (SFT ``max_length``, GRPO ``max_completion_length``, evaluation ``max_new_tokens``) of
``ci`` and ``gpu-small`` are :class:`Budget` entries, derived from the presets' own traces by
:mod:`dsh.training.budgets`; the ``paper`` preset keeps the paper's numbers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ...core import settings
from ...core import validate as v
from ...llm.models import EMBEDDED, GRADED_BASE
from ...llm.scale import GpuBudget, batch_for
from ...task import laptop_task
from ...task.problems import TEST_LEVELS
from ...training.budgets import preset_specs, tokens
from ...training.laptop_base import SHIPPED_BASE
from ...training.train_config import FIELDS, METHODS, TrainConfig
from .attribution_study import StudySettings
from .check_probe import ProbeSettings
from .evaluate import MAX_RESPONSE_TOKENS, EvalSettings


@dataclass(frozen=True)
class Budget:
    """A token budget that is derived, not typed: ``name`` (e.g. ``"sft.max_length"``) names an entry of the
    preset's ``traces`` (the traces it must hold) and of ``dsh/training/budgets.json`` (its value, written by
    ``python -m dsh budgets --write``, checked by a test). :meth:`Preset.train_config` replaces it by the number."""

    name: str


STAGE_LABELS = {"base": "Base", "sft": "SFT (no reflection)", "sft_reflection": "SFT (reflection)",
                "rl": "RL", "dft": "DFT", "sft_verdict": "SFT (reflection, verdict-only checks)",
                "rl_verdict": "RL from verdict-only SFT"}


def stage_label(kind: str) -> str:
    """The label of a stage kind (``rl_beta0.01``: RL at KL coefficient 0.01)."""
    if not isinstance(kind, str):
        raise ValueError(f"kind must be a stage kind such as sft or rl_beta0.1, got {kind!r}")
    if kind.startswith("rl_beta"):
        return f"RL (beta = {kind[len('rl_beta'):]})"
    return STAGE_LABELS.get(kind, kind)


@dataclass(frozen=True)
class Stage:
    """One stage of a pipeline (the paper's Table 1): ``method`` None is the starting model itself;
    ``init`` names the stage whose model it starts from (None: the pipeline's model); ``seed``: the training seed
    (None: the preset's, the stage's name carries none); ``kind``: what it is in the tables (default its name;
    ``sft-s1`` is of kind ``sft``)."""

    name: str                  # base, sft, sft_reflection, rl, dft (with -s<seed> in a seeded plan)
    method: str | None
    init: str | None = None
    overrides: dict = field(default_factory=dict)
    seed: int | None = None
    kind: str | None = None

    def __post_init__(self):
        if self.kind is None:
            object.__setattr__(self, "kind", self.name)

    @property
    def label(self) -> str:
        return stage_label(self.kind) + ("" if self.seed is None else f", seed {self.seed}")

    @property
    def run_name(self) -> str:
        """The run directory's name under a pipeline's runs_dir (the RL stage's run is ``grpo``)."""
        return "grpo" if self.name == "rl" else self.name

    def with_seed(self, seed: int, trained: set) -> Stage:
        """This stage at training seed ``seed``: named ``<name>-s<seed>``, starting from the same seed's run of its
        init stage when that one trains (``trained``: the names of the stages that do)."""
        init = f"{self.init}-s{seed}" if self.init in trained else self.init
        return Stage(f"{self.name}-s{seed}", self.method, init, self.overrides, seed, self.kind)


def _seeds(name: str, seeds) -> tuple:
    seeds = tuple(seeds)
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds):
        raise ValueError(f"{name} must be a list of integers >= 0; got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"{name} must name each seed once; got {seeds!r}")
    return seeds


@dataclass(frozen=True)
class Preset:
    """Everything a preset means. ``training[method]``: overrides of :class:`dsh.training.train_config.TrainConfig`;
    ``stages``: the pipeline; ``evaluation``: :class:`dsh.experiment.run.evaluate.EvalSettings` (its ``max_new_tokens`` may
    be a :class:`Budget`); ``traces``: ``{budget name: TraceSpec}`` that :mod:`dsh.training.budgets` derives budgets
    from; ``batch_from_memory``: a :class:`dsh.llm.scale.GpuBudget` that micro-batch and accumulation are derived
    from (:func:`dsh.llm.scale.batch_for`), None to take them as given;
    ``one_call``: sized for one 10-minute GPU call (``python -m dsh.experiment.run.gpu_small`` runs it);
    ``model``: the model the first stages start from; ``seeds``: the training seeds every training stage runs
    with (None: one run, the stages' names carry no seed); ``ablations``: more stages (templates like ``stages``)
    run with ``ablation_seeds`` (:meth:`plan_stages`); ``probe``: the check probe every evaluated model also answers
    (:mod:`dsh.experiment.run.check_probe`; None: none); ``attribution``: the gradient-attribution study
    (:mod:`dsh.experiment.run.attribution_study`) the pipeline runs on the models of ``attribution_stages`` (each against
    the model its training started from), and once more with another seed of trajectories on those of
    ``attribution_repeats`` (None: no study)."""

    name: str
    about: str
    training: dict
    stages: tuple
    evaluation: EvalSettings
    traces: dict = field(default_factory=dict)
    batch_from_memory: GpuBudget | None = None
    one_call: bool = False
    model: str = EMBEDDED
    seeds: tuple | None = None
    ablations: tuple = ()
    ablation_seeds: tuple = ()
    probe: ProbeSettings | None = None
    attribution: StudySettings | None = None
    attribution_stages: tuple = ()
    attribution_repeats: tuple = ()

    @property
    def task(self) -> str:
        """The task of every training method (:mod:`dsh.measure.tasks`): one per preset."""
        names = {t.get("task", "traces") for t in self.training.values()}
        if len(names) != 1:
            raise ValueError(f"preset {self.name!r} mixes tasks {sorted(names)}; a preset runs one task")
        return names.pop()

    def plan_stages(self, seeds=None, ablation_seeds=None) -> tuple:
        """Every stage the pipeline runs, in order: ``stages`` as they are when no seeds are given (``seeds`` None
        and the preset's None); else the stages without training once, each training stage once per seed
        (:meth:`Stage.with_seed`), then each ablation once per ablation seed (a subset of ``seeds``)."""
        seeds = self.seeds if seeds is None else _seeds("seeds", seeds)
        abl = self.ablation_seeds if ablation_seeds is None else _seeds("ablation_seeds", ablation_seeds)
        if seeds is None:
            if ablation_seeds:
                raise ValueError("ablation_seeds needs seeds: ablations run on some of the training seeds")
            return tuple(self.stages)
        if not seeds:
            raise ValueError("seeds must name at least one seed")
        if set(abl) - set(seeds):
            raise ValueError(f"ablation_seeds must be a subset of seeds {list(seeds)}; got {list(abl)}")
        trained = {s.name for s in (*self.stages, *self.ablations) if s.method}
        out = [s for s in self.stages if s.method is None]
        for k in seeds:
            out += [s.with_seed(k, trained) for s in self.stages if s.method]
        for k in abl:
            out += [s.with_seed(k, trained) for s in self.ablations]
        return tuple(out)

    @property
    def runs_dir(self) -> str:
        """Default folder of the pipeline's training runs."""
        return f"runs/{self.name}"

    @property
    def results_dir(self) -> str:
        """Default folder of the pipeline's results (generations, calibration, summary)."""
        return f"results/{self.name}"

    def stage(self, name: str, seeds=None, ablation_seeds=None) -> Stage:
        """The stage ``name`` of :meth:`plan_stages` (a one-line ValueError naming the valid ones)."""
        plan = self.plan_stages(seeds, ablation_seeds)
        v.choice("stage", name, [s.name for s in plan])
        return next(s for s in plan if s.name == name)

    def budget(self, value):
        """``value`` itself, or the committed number of a :class:`Budget` of this preset."""
        if isinstance(value, Budget):
            return tokens(self.name, value.name)
        return value

    def train_config(self, method: str, **overrides) -> TrainConfig:
        """TrainConfig for ``method`` with ``overrides``; unknown names raise a one-line ValueError listing
        the valid ones, before any model is loaded."""
        v.choice("method", method, METHODS)
        unknown = sorted(set(overrides) - set(FIELDS))
        if unknown:
            raise ValueError(f"unknown field(s) {', '.join(unknown)}; valid fields: {', '.join(FIELDS)}")
        admits_none = {k for k, kinds in settings.field_types(TrainConfig).items() if type(None) in kinds}
        given = settings.typed(TrainConfig, {k: self.budget(x) for k, x in overrides.items()   # None: the preset's,
                                             if x is not None or k in admits_none})             # or a field's None
        values = {**self.training[method], **given}
        values = {k: self.budget(x) for k, x in values.items()}
        values["method"] = method
        values.setdefault("output_dir", f"{self.runs_dir}/{method}")
        cfg = TrainConfig(**values)
        if self.batch_from_memory and not {"per_device_train_batch_size", "gradient_accumulation_steps"} & set(overrides):
            cfg = dataclasses.replace(cfg, **batch_for(cfg, self.batch_from_memory))
        return cfg

    def eval_settings(self, **overrides) -> EvalSettings:
        """The evaluation settings with the token budget resolved and ``overrides`` applied."""
        fields = {f.name for f in dataclasses.fields(EvalSettings)}
        unknown = sorted(set(overrides) - fields)
        if unknown:
            raise ValueError(f"unknown evaluation field(s) {', '.join(unknown)}; valid fields: {', '.join(sorted(fields))}")
        base = dataclasses.replace(self.evaluation, max_new_tokens=self.budget(self.evaluation.max_new_tokens))
        return dataclasses.replace(base, **settings.typed(EvalSettings, overrides, "eval_overrides"))


# ------------------------------------------------------------------------------------------------
# The traces of the derived presets (ci and gpu-small): digit-level ``lean`` steps, one check (casting out
# nines), at most one wrong attempt before the right one. Shorter traces than the paper-style ``digit`` format
# (tables in chapter 04) so that a 3x9 answer fits in ~1,900 tokens and a whole pipeline fits one GPU call.
# ------------------------------------------------------------------------------------------------
TRACES = dict(granularity="lean", checks=("nines",), max_attempts=2, retry_fraction=0.5)
TEST_LEVEL_NAMES = tuple(f"{m}x{n}" for m, n in TEST_LEVELS)


# The paper's Table 1 stages: Base, SFT, SFT with reflection, RL from SFT with reflection, and DFT
PAPER_STAGES = (Stage("base", None), Stage("sft", "sft", "base"), Stage("sft_reflection", "sft_reflection", "base"),
                Stage("rl", "grpo", "sft_reflection"), Stage("dft", "dft", "base"))

# ---- ci ----------------------------------------------------------------------------------------
CI_LEVELS = ("2x2", "2x3")
CI_GRPO_LEVELS = ("1x1",)
CI_EVAL_LEVELS = ("1x1",)     # the CPU preset evaluates on levels whose answers it can afford to generate
_CI_SFT = dict(n_train=24, train_levels=CI_LEVELS, max_steps=4, **TRACES,
               per_device_train_batch_size=2, learning_rate=1e-4, lr_scheduler_type="constant",
               save_steps=2, logging_steps=1, report_to=("tensorboard",))

CI = Preset(
    name="ci", about="minutes on 2 CPU cores: a handful of steps on short problems",
    training={
        "sft": dict(_CI_SFT, max_length=Budget("sft.max_length")),
        "sft_reflection": dict(_CI_SFT, max_length=Budget("sft_reflection.max_length")),
        "dft": dict(_CI_SFT, learning_rate=2e-4, max_length=Budget("dft.max_length")),
        "grpo": dict(n_train=16, train_levels=CI_GRPO_LEVELS, max_steps=2, per_device_train_batch_size=4,
                     num_generations=4, max_completion_length=Budget("grpo.max_completion_length"),
                     learning_rate=1e-5, beta=0.001, lr_scheduler_type="constant", save_steps=1, logging_steps=1),
    },
    stages=PAPER_STAGES,
    evaluation=EvalSettings(levels=CI_EVAL_LEVELS, n_per_level=2, max_new_tokens=Budget("eval.max_new_tokens"),
                            batch_size=8),
    traces=preset_specs(TRACES, CI_LEVELS, CI_GRPO_LEVELS, CI_EVAL_LEVELS),
    one_call=True,
)

# ---- gpu-small ---------------------------------------------------------------------------------
# Batch sizes derived from the token budget of one 80 GB GPU (dsh.llm.scale.batch_for), never typed: the number of
# rows an optimizer step sees is the design choice, the micro-batch follows from memory.
GPU_GB = 80.0
GPU_SFT_ROWS = 32              # examples per optimizer step
GPU_GRPO_ROWS = 64             # completions per optimizer step
GPU_GRPO_GENERATION = 256      # completions per rollout batch (32 prompts x 8): 4 optimizer steps per rollout
GPU_PROMPT_TOKENS = 64         # budget for a chat-formatted question (they take ~40 tokens)
GPU_MEMORY = GpuBudget(gpu_gb=GPU_GB, sft_rows=GPU_SFT_ROWS, grpo_rows=GPU_GRPO_ROWS,
                       grpo_generation=GPU_GRPO_GENERATION, prompt_tokens=GPU_PROMPT_TOKENS)
GPU_TRAIN_LEVELS = ("4x5", "5x4")
GPU_BASE_LEVELS = tuple(f"{m}x{n}" for m in range(2, 6) for n in range(2, 10))   # test range and neighbours


def _gpu_sft(method: str, n_train: int, **extra) -> dict:
    return dict(n_train=n_train, **TRACES, num_train_epochs=1.0, padding_free=True, learning_rate=2e-4,
                lr_scheduler_type="cosine", warmup_ratio=0.02, max_length=Budget(f"{method}.max_length"),
                save_steps=100, logging_steps=10, **extra)


# gpu-small's Base: one epoch of lean digit-level SFT over 2..5 x 2..9 digits (test problems held out), short
# enough that accuracy still decays with length; the run summary says whether it did (design checks).
GPU_BASE = Stage("base", "sft", None, dict(train_levels=GPU_BASE_LEVELS, n_train=9600, max_steps=300, save_steps=100,
                                           max_length=Budget("base.max_length")))

GPU_SMALL = Preset(
    name="gpu-small", about="the embedded model on one H100: the small-scale analogue, one GPU call",
    training={
        "sft": _gpu_sft("sft", 3000, train_levels=GPU_TRAIN_LEVELS),
        "sft_reflection": _gpu_sft("sft_reflection", 3000, train_levels=GPU_TRAIN_LEVELS),
        "dft": _gpu_sft("dft", 3000, train_levels=GPU_TRAIN_LEVELS),
        "grpo": dict(n_train=1024, max_steps=48, train_levels=GPU_TRAIN_LEVELS, **TRACES,
                     num_generations=8, generation_batch_size=GPU_GRPO_GENERATION,
                     max_completion_length=Budget("grpo.max_completion_length"), learning_rate=1e-5,
                     lr_scheduler_type="constant", weight_decay=0.01, beta=0.001, save_steps=16, logging_steps=1),
    },
    stages=(GPU_BASE,) + PAPER_STAGES[1:],
    evaluation=EvalSettings(n_per_level=100, max_new_tokens=Budget("eval.max_new_tokens"), batch_size=512),
    traces=preset_specs(TRACES, GPU_TRAIN_LEVELS, GPU_TRAIN_LEVELS, TEST_LEVEL_NAMES, GPU_BASE_LEVELS),
    batch_from_memory=GPU_MEMORY, one_call=True,
)

# ---- paper -------------------------------------------------------------------------------------
# LLaMA-Factory SFT: Adam, batch 128, lr 1e-5, 4 epochs, 20,000 examples
_PAPER_SFT = dict(n_train=20_000, granularity="compact", optim="adamw_torch", weight_decay=0.0,
                  lr_scheduler_type="cosine", per_device_train_batch_size=4, gradient_accumulation_steps=32,
                  learning_rate=1e-5, num_train_epochs=4.0, gradient_checkpointing=True, max_length=MAX_RESPONSE_TOKENS,
                  save_steps=500)

PAPER_MODEL = "Qwen/Qwen2.5-7B-Instruct"     # the paper's base model ("All experiments use Qwen2.5-7B-Instruct")

PAPER = Preset(
    name="paper", about="the paper's hyperparameters (Appendix \"Model and Training Details\") for a 7B model",
    model=PAPER_MODEL,
    training={
        "sft": _PAPER_SFT, "sft_reflection": dict(_PAPER_SFT), "dft": dict(_PAPER_SFT),
        # verl GRPO: lr 1e-6, 512 prompts x 8 rollouts, PPO mini-batch 128 prompts, KL 0.001 low_var_kl,
        # max prompt 1024, max response 8192, 2 epochs, gradient checkpointing
        "grpo": dict(n_train=20_000, learning_rate=1e-6, lr_scheduler_type="constant", weight_decay=0.01,
                     max_grad_norm=1.0, num_generations=8, generation_batch_size=4096,
                     per_device_train_batch_size=8, gradient_accumulation_steps=128, beta=0.001,
                     use_bias_correction_kl=False, epsilon=0.2, loss_type="dapo",
                     max_completion_length=MAX_RESPONSE_TOKENS,
                     num_train_epochs=2.0, gradient_checkpointing=True, temperature=1.0, save_steps=20),
    },
    stages=PAPER_STAGES,
    evaluation=EvalSettings(),
)

# ---- laptop ------------------------------------------------------------------------------------
# Tiny transformers trained from scratch on 2 CPU cores (dsh.llm.tiny, dsh.task.laptop_task): the paper's stages from the
# shipped base (dsh/assets/laptop-base, made by `python -m dsh base`), fine-tuning on 1x2 ... 1x5 in both orders
# (fine-tuning on 1x4/1x5 alone erased the other levels: chapter 07's design table), evaluation on the 1x2 ... 1x8
# ladder, 1x6 ... 1x8 beyond the fine-tuning data. Every value was chosen from measurements on the
# 2-core machine (chapter 07's design table); token limits cover the longest trace of each ladder (a test checks).
LAPTOP_LEVELS = laptop_task.TRAIN_LEVELS
LAPTOP_EVAL_LEVELS = laptop_task.TEST_LEVELS
# reflection traces (SFT with reflection, DFT): the generator's wrong attempts in half the traces, half of them
# miscopying the multiplicand, none of them learned (chapter 07's design table: with the base's own attempts there are
# none to learn from on 1x2 ... 1x5, and learning injected ones taught the errors)
LAPTOP_REFLECTION = {"attempts": "injected", "loss": "no_wrong_attempts", "wrong": "slips_and_miscopies"}
# padding-free (one packed row a micro-batch, attention per example: dsh.llm.packing): the same batches and the same
# loss up to float rounding as padded ones, 1.2-2x the tokens/s on two cores (README, "Performance")
_LAPTOP_SFT = dict(task="laptop_task", task_options=dict(LAPTOP_REFLECTION), train_levels=LAPTOP_LEVELS, n_train=4000,
                   max_length=1024, max_attempts=3, padding_free=True,
                   retry_fraction=0.5, per_device_train_batch_size=8, learning_rate=3e-4,
                   lr_scheduler_type="cosine", warmup_ratio=0.05, num_train_epochs=1.0, weight_decay=0.0,
                   save_steps=50, logging_steps=5, report_to=(), bf16=False)

# the stages of every seed (the paper's Table 1, DFT before RL so that a seed's runs from the base come first), and
# two experiments beyond the paper on the ablation seeds: the KL ablation (Theorem 3.2 on a real model: RL at other
# KL coefficients; the preset's GRPO uses 0.001, the paper's) and imitated checks (reflection traces whose checks show
# the verdict only, and RL from them: does RL improve pi_d when the decision cannot see correctness?)
LAPTOP_STAGES = (Stage("base", None), Stage("sft", "sft", "base"), Stage("sft_reflection", "sft_reflection", "base"),
                 Stage("dft", "dft", "base"), Stage("rl", "grpo", "sft_reflection"))
KL_BETAS = (0.0, 0.1)   # with the RL arm's 0.001 (the paper's): beta = 0 and two values > 0
KL_ABLATION = tuple(Stage(f"rl_beta{b:g}", "grpo", "sft_reflection", {"beta": b}) for b in KL_BETAS)


def _ablations(reflection: dict) -> tuple:
    """The KL ablation and the imitated-check control (SFT on verdict-only checks with the reflection traces'
    other ``reflection`` settings, and RL from it)."""
    return KL_ABLATION + (
        Stage("sft_verdict", "sft_reflection", "base", {"task_options": {**reflection, "check": "verdict"}}),
        Stage("rl_verdict", "grpo", "sft_verdict"))


LAPTOP_ABLATIONS = _ablations(LAPTOP_REFLECTION)

LAPTOP = Preset(
    name="laptop", about="tiny transformers trained from scratch on 2 CPU cores: every stage, several seeds",
    training={
        "sft": dict(_LAPTOP_SFT), "sft_reflection": dict(_LAPTOP_SFT), "dft": dict(_LAPTOP_SFT),
        # rollout rounds of 256 completions (32 prompts x 8), 8 optimizer steps of 32 each: a round fills the CPU
        # sampler's 256 rows (README, "Performance"); one round per step (32 completions) left it mostly idle.
        # 320 steps: 10,240 rollouts (40 rounds). Temperature 2 and learning rate 2e-4 from chapter 07's sweep on
        # the training prompts (at temperature 1 the reflection-SFT model answers every training prompt right and
        # every prompt beyond wrong: no group has a signal); p_s, p_dC, p_dW measured along the run on validation
        # questions (dsh.training.validation); the evaluation stays at the paper's temperature 1
        "grpo": dict(task="laptop_task", train_levels=LAPTOP_LEVELS, n_train=1280, max_steps=320,
                     per_device_train_batch_size=32, generation_batch_size=256, num_generations=8,
                     max_completion_length=640,
                     learning_rate=2e-4, lr_scheduler_type="constant", weight_decay=0.0, beta=0.001, epsilon=0.2,
                     loss_type="dapo", temperature=2.0, save_steps=16, logging_steps=1, report_to=(), bf16=False,
                     generation_backend="dsh", padding_free=True, validation_every=80, validation_per_level=25),
    },
    stages=LAPTOP_STAGES,
    evaluation=EvalSettings(levels=LAPTOP_EVAL_LEVELS, n_per_level=100, max_new_tokens=768, temperature=1.0,
                            batch_size=256),
    model=str(SHIPPED_BASE), seeds=(0, 1, 2), ablations=LAPTOP_ABLATIONS, ablation_seeds=(0, 1, 2),
    # decision faithfulness with as many wrong answers as right ones (the evaluation's own checks see a handful
    # of wrong answers on the fine-tuning levels): 50 test questions a level, each with a right and a wrong attempt
    probe=ProbeSettings(n_per_level=50),
    # the models of every stage the paper names (seed 0; the verdict-only controls left out), each against
    # the model its training started from; SFT (reflection) and RL once more with another seed of trajectories
    attribution=StudySettings(),
    attribution_stages=("base", "sft-s0", "sft_reflection-s0", "dft-s0", "rl-s0", "rl_beta0-s0", "rl_beta0.1-s0"),
    attribution_repeats=("sft_reflection-s0", "rl-s0"),
)

# ---- laptop-wide ---------------------------------------------------------------------------------
# The length law needs attempts whose lengths span >= 5x; the laptop stages, fine-tuned on 1x2 ... 1x5, write
# attempts whose per-level medians span 2.1-2.4x over 1x1 ... 1x8 (chapter 08). The same stages from the same shipped
# base with one change, fine-tuning (SFT, SFT with reflection, DFT, RL and the KL ablation) on 1x1 ... 1x10 in both
# orders, for the gradient-attribution study alone: seed 0, no verdict-only controls, no check probe; evaluated on
# the laptop ladder as the laptop stages are. The study samples at temperature 1.75: at the rollouts' 2 the attempts of
# SFT (reflection) fine-tuned this way spanned only 4.1-4.4x (book/results/laptop/design/wide_ladder_derisk.json), at 1
# (the first studies) a one-attempt model's STOP was too certain to carry a gradient on most trajectories; 1.75 is the
# highest of 1, 1.25, 1.5, 1.75 at which every stage spanning 5x at 1 still did, a rule fixed before measuring
# (design/wide_study_temperature.py and .json; chapter 08's design table). Otherwise the laptop study's settings.
WIDE_TOP = 10
WIDE_STUDY_T = 1.75   # design/wide_study_temperature.json's choice (the test checks they agree)
LAPTOP_WIDE_LEVELS = tuple(x for n in range(1, WIDE_TOP + 1) for x in ((f"1x{n}",) if n == 1 else (f"1x{n}", f"{n}x1")))
_WIDE = dict(train_levels=LAPTOP_WIDE_LEVELS)
LAPTOP_WIDE = Preset(
    name="laptop-wide", about="the laptop stages fine-tuned on 1x1 ... 1x10: attempts spanning 5x for the length law",
    training={m: {**c, **_WIDE, **({"max_completion_length": 880} if m == "grpo" else {})}   # a 1x10 trace: <= 860
              for m, c in LAPTOP.training.items()},
    stages=LAPTOP_STAGES,
    evaluation=LAPTOP.evaluation,
    model=LAPTOP.model, seeds=(0,), ablations=KL_ABLATION, ablation_seeds=(0,),
    attribution=StudySettings(levels=tuple(f"1x{n}" for n in range(1, WIDE_TOP + 1)), temperature=WIDE_STUDY_T),
    # every stage's study once more with another seed of trajectories: the verdicts rest on the stages that span 5x,
    # whichever they are, each slope reproduced once (the laptop preset repeats two)
    attribution_stages=LAPTOP.attribution_stages, attribution_repeats=LAPTOP.attribution_stages,
)

# ---- laptop-graded -------------------------------------------------------------------------------
# The laptop experiment in the paper's regime: attempts that are sometimes right, at the evaluation's own sampling.
# The graded base (dsh/assets/laptop-graded-base, `python -m dsh base --spec graded`) answers every ladder length
# with slips at a per-digit rate; every fine-tuning stage replays its corpus 1:1 (fine-tuning on a few levels alone
# erased its skills beyond them); GRPO samples its rollouts at temperature 1, as the evaluation does. Fine-tuning
# levels, slip rate and GRPO learning rate were chosen by the rule in book/results/laptop-graded/design/RULE.md on
# validation questions, before any test-ladder run (graded_design.json; chapter 07's design table; a test checks
# that these values are its choice).
GRADED_FT_LEVELS = ("1x2", "2x1", "1x4", "4x1", "1x6", "6x1", "1x8", "8x1")   # 1x3, 1x5, 1x7 lie between them
GRADED_GRPO_LR = 3e-5
GRADED_TOKENS = 1024      # new tokens of an evaluated response and of a rollout (RULE.md, round 2)
GRADED_SAMPLES = 2        # samples a test question: a graded level expects >= 30 wrong first attempts (RULE.md, round 3)
# attempts a response may make: the most 1x8 attempts that fit in GRADED_TOKENS (RULE.md, round 4; round4.json), the
# same in GRPO's rollouts, the validation along its runs and every evaluation
GRADED_ATTEMPT_BUDGET = 4
_GRADED_TASK = {**LAPTOP_REFLECTION, "replay": "base_corpus"}
_GRADED_SFT = {**_LAPTOP_SFT, "train_levels": GRADED_FT_LEVELS, "task_options": dict(_GRADED_TASK)}
GRADED_ABLATIONS = _ablations(_GRADED_TASK)
LAPTOP_GRADED = Preset(
    name="laptop-graded", about="the laptop stages from a base whose attempts are sometimes right, RL at the "
                                "evaluation's temperature",
    training={"sft": dict(_GRADED_SFT), "sft_reflection": dict(_GRADED_SFT), "dft": dict(_GRADED_SFT),
              "grpo": {**LAPTOP.training["grpo"], "train_levels": GRADED_FT_LEVELS,
                       "temperature": LAPTOP.evaluation.temperature,         # rollouts sampled as evaluated
                       "learning_rate": GRADED_GRPO_LR, "max_completion_length": GRADED_TOKENS,
                       "attempt_budget": GRADED_ATTEMPT_BUDGET,
                       # speed only: the rollouts' KV cache in float16, the update's attention in C (round 4),
                       # the update's decoder products in bfloat16 (round 5)
                       "rollout_kv_cache": "float16", "packed_attention": "kernels",
                       "update_precision": "bfloat16"}},
    stages=LAPTOP_STAGES,
    evaluation=dataclasses.replace(LAPTOP.evaluation, max_new_tokens=GRADED_TOKENS,
                                   samples_per_question=GRADED_SAMPLES, attempt_budget=GRADED_ATTEMPT_BUDGET,
                                   kv_cache="float16"),
    model=GRADED_BASE, seeds=(0, 1, 2), ablations=GRADED_ABLATIONS, ablation_seeds=(0, 1, 2),
    probe=LAPTOP.probe,
    # the laptop run's studies at the evaluation's sampling (design/ATTRIBUTION_RULE.md, committed before they ran)
    attribution=StudySettings(temperature=LAPTOP.evaluation.temperature, max_new_tokens=GRADED_TOKENS),
    attribution_stages=LAPTOP.attribution_stages, attribution_repeats=LAPTOP.attribution_repeats,
)

PRESETS = {p.name: p for p in (CI, GPU_SMALL, PAPER, LAPTOP, LAPTOP_WIDE, LAPTOP_GRADED)}
NAMES = tuple(PRESETS)
DEFAULT = CI.name
# {preset: {budget name: the traces it must hold}}: what dsh.training.budgets derives every Budget from
DERIVED = {p.name: p.traces for p in PRESETS.values() if p.traces}


def get(preset) -> Preset:
    """The :class:`Preset` named ``preset`` (a Preset is returned as it is); a one-line ValueError otherwise."""
    if isinstance(preset, Preset):
        return preset
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {', '.join(NAMES)}; got {preset!r}")
    return PRESETS[preset]


def resolve(method: str, preset: str = DEFAULT, **overrides) -> TrainConfig:
    """TrainConfig for ``method`` under ``preset`` with ``overrides`` (:meth:`Preset.train_config`)."""
    return get(preset).train_config(method, **overrides)
