"""Command line: ``python -m dsh --help``."""

from __future__ import annotations

import argparse
import json
import sys

from . import __version__
from .core import settings
from .core.files import read_jsonl
from .experiment.bench import compare as bench
from .experiment.run.check_probe import ProbeSettings, run_probe
from .experiment.run.evaluate import BACKENDS, EvalSettings, evaluate
from .experiment.run.presets import DEFAULT, DERIVED, NAMES, get, resolve
from .llm.models import EMBEDDED, resolve_model
from .measure import tasks
from .measure.calibration import calibrate, format_table, read_records
from .task.data_files import write_data
from .task.laptop_task import TEST_LEVELS
from .task.parse import DEFAULT_MARKERS
from .task.problems import N_TEST, N_TRAIN
from .task.traces import GRANULARITIES, STYLES, TraceConfig
from .theory.two_stage import predicted_accuracy, simulate
from .training import budgets
from .training.budgets import N_PER_LEVEL
from .training.laptop_base import GRADED_SLIP_RATE, BaseSpec, build_base, graded_spec
from .training.run_dir import clear_run
from .training.train import train
from .training.train_config import METHODS, fields_help, to_trl_config


def _cmd_accuracy(args) -> int:
    acc = predicted_accuracy(args.p_s, args.p_dC, args.p_dW)
    if args.json:
        print(json.dumps({"p_s": args.p_s, "p_dC": args.p_dC, "p_dW": args.p_dW, "predicted_accuracy": acc}))
    else:
        print(f"predicted accuracy = {acc:.6f}")
    return 0


def _cmd_simulate(args) -> int:
    sim = simulate(args.p_s, args.p_dC, args.p_dW, n=args.n, seed=args.seed)
    obs = float(sim.final_correct.mean())
    out = {"n": args.n, "seed": args.seed, "observed_accuracy": obs,
           "predicted_accuracy": predicted_accuracy(args.p_s, args.p_dC, args.p_dW), "mean_attempts": float(sim.n_attempts.mean())}
    print(json.dumps(out) if args.json else "\n".join(f"{k} = {v}" for k, v in out.items()))
    return 0


def _cmd_table(args) -> int:
    from .theory.implicit_rewards import comparison_table

    table = comparison_table()
    if args.json:
        print(json.dumps(table))
        return 0
    cols = list(table)
    rows = list(next(iter(table.values())))
    width = max(map(len, rows)) + 2
    print("".ljust(width) + "".join(c.ljust(24) for c in cols))
    for r in rows:
        print(r.ljust(width) + "".join(str(table[c][r]).ljust(24) for c in cols))
    return 0


def _cmd_calibrate(args) -> int:
    task = tasks.get(args.task)          # how a response is read: the task that wrote the questions
    records = read_records(args.file)
    import re

    patterns = []
    for x in args.marker_pattern or ():
        try:
            patterns.append(re.compile(x, re.IGNORECASE))
        except re.error as e:
            raise ValueError(f"--marker-pattern must be a regular expression; {x!r}: {e}") from None
    markers = DEFAULT_MARKERS + tuple(args.marker or ()) + tuple(patterns)
    result = calibrate(records, drop_truncated=args.drop_truncated, n_bootstrap=args.bootstrap,
                       seed=args.seed, markers=markers, parse=task.parse)
    print(json.dumps(result) if args.json else format_table(result))
    return 0


def _cmd_data(args) -> int:
    cfg = TraceConfig(granularity=args.granularity, style=args.style, retry_fraction=args.retry_fraction,
                      max_attempts=args.max_attempts)
    for path in write_data(args.out, cfg, args.n_train, args.n_test, args.seed, args.verl):
        print(path)
    return 0


def _cmd_train(args) -> int:
    overrides = settings.assignments("--set", args.set, fixed={"method": "--method"})
    for key, flag in (("model", "--model"), ("output_dir", "--output-dir"), ("resume", "--resume")):
        if key in overrides and getattr(args, key):
            raise ValueError(f"{key} is given twice (--set {key}=... and {flag}); give it once")
    if args.model:
        overrides["model"] = args.model
    elif "model" not in overrides:          # the preset's starting model (laptop: the shipped tiny base)
        overrides["model"] = get(args.preset).model
    if args.output_dir:
        overrides["output_dir"] = args.output_dir
    if args.resume:
        overrides["resume"] = True
    cfg = resolve(args.method, args.preset, **overrides)
    if args.fresh and args.resume:
        raise ValueError("--fresh and --resume exclude each other: --fresh starts the run in --output-dir over")
    if args.fresh and not args.dry_run:
        resolve_model(cfg.model)                  # a bad model or setting fails before the old run is removed
        to_trl_config(cfg)
        clear_run(cfg.output_dir)                 # only what dsh train wrote; a folder with anything else is refused
    if args.dry_run:
        print(json.dumps({"dsh": vars(cfg), "trl": to_trl_config(cfg).to_dict()}, indent=1, default=str))
        return 0
    summary = train(cfg)
    print(json.dumps(summary, indent=1))
    return 0


def _cmd_evaluate(args) -> int:
    levels = [x.strip() for x in args.levels.split(",") if x.strip()]
    settings = EvalSettings(levels=levels, n_per_level=args.n, temperature=args.temperature,
                            max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                            samples_per_question=args.samples, kv_cache=args.kv_cache, attempt_budget=args.attempt_budget)
    path = evaluate(model=args.model, out=args.out, settings=settings, seed=args.seed, backend=args.backend)
    recs = read_jsonl(path)
    cut = sum(bool(r.get("truncated")) for r in recs)
    print(f"{path}: {len(recs)} responses, {cut} ({100 * cut / max(len(recs), 1):.1f} %) cut at "
          f"max_new_tokens={args.max_new_tokens}")
    return 0


def _cmd_pipeline(args) -> int:
    from .experiment.run.pipeline import run_pipeline

    overrides = settings.assignments("--set", args.set, fixed={"model": "--model", "output_dir": "--runs-dir",
                                                  "method": "--stages (a stage trains by its preset's method)",
                                                  "resume": "--fresh (a pipeline resumes unless --fresh)"})
    eval_overrides = settings.assignments("--eval-set", args.eval_set)
    attribution_overrides = settings.assignments("--attribution-set", args.attribution_set)
    stages = tuple(x.strip() for x in args.stages.split(",") if x.strip()) if args.stages is not None else None
    if stages == ():
        raise ValueError("stages must name at least one stage, e.g. rl or rl-s0 (leave --stages out for the whole plan)")
    summary = run_pipeline(preset=args.preset, results_dir=args.results_dir, runs_dir=args.runs_dir, model=args.model,
                           overrides=overrides or None, stages=stages, eval_overrides=eval_overrides or None,
                           seeds=_int_list("seeds", args.seeds) if args.seeds else None,
                           ablation_seeds=(_int_list("ablation_seeds", args.ablation_seeds)
                                           if args.ablation_seeds is not None else None),
                           progress=not args.quiet, fresh=args.fresh,
                           attribution_overrides=attribution_overrides or None, workers=args.workers, threads=args.threads)
    print(json.dumps({k: summary[k] for k in ("preset", "stages", "wall_s", "timings_s", "design")}, indent=1))
    return 0


def _cmd_probe(args) -> int:
    if not args.model:
        raise ValueError("probe needs --model (a laptop model); a pipeline's stages are probed by its own probe step "
                         "(python -m dsh pipeline --preset laptop ... runs it, and reuses every other step)")
    levels = tuple(x.strip() for x in args.levels.split(",") if x.strip())
    settings = ProbeSettings(n_per_level=args.n, temperature=args.temperature, seed=args.seed)
    x = run_probe(args.model, args.out or "probe.json", levels, settings, progress=not args.quiet)
    t = x["tuned"]
    print(f"{args.model}: fine-tuning levels {t['checks']} checks of {t['items']} items, verdict follows the true "
          f"check {t.get('verdict_follows_check')}, chance {t.get('chance_agreement')}, kappa {t['kappa']}")
    return 0


def _int_list(name: str, text: str) -> tuple:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{name} must be comma-separated integers such as 0,1,2; got {text!r}") from None


def _cmd_base(args) -> int:
    from dataclasses import replace

    if args.slip_rate is not None and args.spec != "graded":
        raise ValueError("--slip-rate is a setting of --spec graded (the laptop base's answers are all right)")
    spec = BaseSpec() if args.spec == "laptop" else graded_spec(GRADED_SLIP_RATE if args.slip_rate is None
                                                                else args.slip_rate)
    if args.no_report:
        spec = replace(spec, report_n=0)
    train = replace(spec.train, seed=args.seed, **({"tokens": args.tokens} if args.tokens is not None else {}))
    spec = replace(spec, train=train, **({"n_examples": args.n_examples} if args.n_examples is not None else {}))
    prov = build_base(args.out, spec, progress=not args.quiet)
    print(json.dumps({"out": args.out, "parameters": prov["parameters"], **prov["train"],
                      "report": prov.get("report")}, indent=1))
    return 0


def _cmd_budgets(args) -> int:
    if args.write:
        out = budgets.write(DERIVED, n_per_level=args.n)
    else:
        out = budgets.derive(DERIVED, n_per_level=args.n)
        if args.check and out != budgets.load():
            print("error: dsh/training/budgets.json is stale; run python -m dsh budgets --write", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps(out))
    else:
        for preset, by_name in out.items():
            for name, b in by_name.items():
                print(f"{preset:10s} {name:28s} {b['tokens']:6d} tokens  (p99 of {b['longest_level']} "
                      f"{b['levels'][b['longest_level']]['p99']:.0f} + margin {b['margin']})")
    return 0


def _cmd_bench(args) -> int:
    import contextlib

    parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    # with --json, stdout carries the JSON only: what the trainers print goes to stderr
    with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
        result = bench.run(model=args.model, size=args.size, parts=parts, out=args.out, seed=args.seed,
                           progress=not args.json)
    if args.json:
        print(bench.format_table(result), file=sys.stderr)
        print(json.dumps(result))
    else:
        print(bench.format_table(result))
        if args.out:
            print(args.out)
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (``error: ...``, exit code 2) instead of the usage block, and every option's
    default in ``--help`` (unless its text already names it, or it has none); an epilog's line breaks are kept."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def add_argument(self, *args, **kwargs):
        action = super().add_argument(*args, **kwargs)
        d, text = action.default, action.help or ""
        if action.option_strings and "default" not in text and d is not None and d is not False \
                and d is not argparse.SUPPRESS and not isinstance(action, argparse._VersionAction):
            shown = ",".join(map(str, d)) if isinstance(d, (list, tuple)) else str(d)
            action.help = f"{text} (default {shown.replace('%', '%%')})".strip()
        return action

    def error(self, message):
        self.exit(2, f"error: {self.prog.replace('python -m ', '')}: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    presets_help = f"{', '.join(NAMES)} (default {DEFAULT})"
    model_help = f"'{EMBEDDED}' (default), a Hugging Face id, a local path or a run directory"
    p = _Parser(prog="python -m dsh", description=(
        "The Two-Stage Decision-Sampling hypothesis: theory checks and measurement tools."))
    p.add_argument("--version", action="version", version=f"dsh {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    _add_accuracy(sub)
    _add_simulate(sub)
    _add_calibrate(sub)
    _add_data(sub)
    _add_train(sub, presets_help)
    _add_evaluate(sub, model_help)
    _add_pipeline(sub, presets_help, model_help)
    _add_probe(sub, model_help)
    _add_base(sub)
    _add_budgets(sub)
    _add_bench(sub, model_help)
    _add_table(sub)
    return p


def _add_accuracy(sub) -> None:
    a = sub.add_parser("accuracy", help="two-stage accuracy p_s p_dC / (1 - p_s(1-p_dC) - (1-p_s) p_dW)")
    for name in ("p_s", "p_dC", "p_dW"):
        a.add_argument(f"--{name.replace('_', '-').lower()}", dest=name, type=float, required=True)
    a.add_argument("--json", action="store_true", help="print one JSON object")
    a.set_defaults(func=_cmd_accuracy)


def _add_simulate(sub) -> None:
    s = sub.add_parser("simulate", help="Monte Carlo of the two-stage process against the formula")
    for name in ("p_s", "p_dC", "p_dW"):
        s.add_argument(f"--{name.replace('_', '-').lower()}", dest=name, type=float, required=True)
    s.add_argument("--n", type=int, default=100_000)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_cmd_simulate)


def _add_calibrate(sub) -> None:
    c = sub.add_parser("calibrate", help="p_s, p_dC, p_dW and predicted vs observed accuracy from a JSONL file")
    c.add_argument("file", metavar="FILE.jsonl",
                   help='records {"question", "answer", "response"[, "level", "truncated"]}, one per line')
    c.add_argument("--json", action="store_true", help="print one JSON object {overall, by_level}")
    c.add_argument("--task", default="traces", help="how responses are read: traces (the paper's multiplication "
                   "traces) or laptop_task (the laptop ladder's attempts, checks and verdicts: a laptop results "
                   "folder's generations)")
    c.add_argument("--drop-truncated", action="store_true", help="drop records with truncated: true (as the paper)")
    c.add_argument("--bootstrap", type=int, default=100, help="bootstrap resamples (default 100)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--marker", action="append", help="an extra reflection marker phrase (repeatable)")
    c.add_argument("--marker-pattern", action="append",
                   help="an extra reflection marker as a regular expression, case-insensitive (repeatable)")
    c.set_defaults(func=_cmd_calibrate)


def _add_data(sub) -> None:
    d = sub.add_parser("data", help="write the multiplication data (SFT traces, test prompts, verl parquet)")
    d.add_argument("--out", required=True, help="output directory")
    d.add_argument("--n-train", type=int, default=N_TRAIN)
    d.add_argument("--n-test", type=int, default=N_TEST)
    d.add_argument("--style", default=TraceConfig.style, help=", ".join(STYLES))
    d.add_argument("--granularity", default=TraceConfig.granularity, help=", ".join(GRANULARITIES))
    d.add_argument("--retry-fraction", type=float, default=TraceConfig.retry_fraction)
    d.add_argument("--max-attempts", type=int, default=TraceConfig.max_attempts)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--verl", action="store_true", help="also write verl parquet files")
    d.set_defaults(func=_cmd_data)


def _add_train(sub, presets_help) -> None:
    tr = sub.add_parser("train", help="train with TRL: sft, sft_reflection, dft or grpo under a preset",
                        epilog="TrainConfig fields (--set KEY=VALUE, read by the field's type: true/false/1/0/yes/no/"
                               "on/off for a boolean, a,b for a list, none where a field admits it; a preset's values "
                               "replace these defaults):\n"
                               + fields_help())
    tr.add_argument("--method", required=True, help=", ".join(METHODS))
    tr.add_argument("--preset", default=DEFAULT, help=presets_help)
    tr.add_argument("--model", help=f"the preset's starting model by default ('{EMBEDDED}'; laptop: the shipped tiny "
                                    f"base); '{EMBEDDED}', a Hugging Face id, a local path or a run directory")
    tr.add_argument("--output-dir", help="run directory (default runs/PRESET/METHOD)")
    tr.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a TrainConfig field (repeatable)")
    tr.add_argument("--resume", action="store_true", help="continue the run in --output-dir from its last checkpoint")
    tr.add_argument("--fresh", action="store_true", help="remove the run in --output-dir first and train from the "
                    "start (only what dsh train wrote there: a folder holding anything else is refused)")
    tr.add_argument("--dry-run", action="store_true", help="print the resolved dsh and TRL configurations and stop")
    tr.set_defaults(func=_cmd_train)


def _add_evaluate(sub, model_help) -> None:
    ev = sub.add_parser("evaluate", help="one sample per test question (or --samples); JSONL that `dsh calibrate` reads")
    ev.add_argument("--model", default=EMBEDDED, help=model_help)
    ev.add_argument("--out", default="generations.jsonl", help="output JSONL (an existing file is resumed)")
    ev.add_argument("--levels", default=",".join(EvalSettings.levels))
    ev.add_argument("--n", type=int, default=EvalSettings.n_per_level, help="questions per level (the paper's protocol)")
    ev.add_argument("--samples", type=int, default=EvalSettings.samples_per_question,
                    help="samples per question (the paper's protocol: 1; the statistics then resample questions)")
    ev.add_argument("--temperature", type=float, default=EvalSettings.temperature)
    ev.add_argument("--max-new-tokens", type=int, default=EvalSettings.max_new_tokens)
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument("--batch-size", type=int, default=EvalSettings.batch_size)
    ev.add_argument("--kv-cache", default=EvalSettings.kv_cache,
                    help="the engine's KV cache on the CPU: float32 (default) or float16 (half the bytes read; where "
                         "the CPU has F16C)")
    ev.add_argument("--attempt-budget", type=int, default=None, help="most attempts a response may hold: it ends "
                    "at that many reflection markers, its last answer final (default: none, the paper's protocol)")
    ev.add_argument("--backend", default=BACKENDS[0], help=", ".join(BACKENDS))
    ev.set_defaults(func=_cmd_evaluate)


def _add_pipeline(sub, presets_help, model_help) -> None:
    pl = sub.add_parser("pipeline", help="train every stage, evaluate and calibrate: one results folder",
                        allow_abbrev=False)   # --seed is not --seeds: each option by its whole name
    pl.add_argument("--preset", default=DEFAULT, help=presets_help)
    pl.add_argument("--model", help=f"the model the first stages start from: '{EMBEDDED}', a Hugging Face id, a local "
                    "path or a run directory (default: the preset's: embedded, or the shipped laptop base for laptop)")
    pl.add_argument("--results-dir", help="small artifacts for the book (default results/PRESET)")
    pl.add_argument("--runs-dir", help="model runs (default runs/PRESET)")
    pl.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a TrainConfig field of every stage")
    pl.add_argument("--stages", help="comma-separated stages, e.g. rl or rl-s0 (and every stage they start from; "
                    "default: every stage of the preset)")
    pl.add_argument("--eval-set", action="append", metavar="KEY=VALUE",
                    help="override an evaluation setting: levels, n_per_level, samples_per_question, max_new_tokens, "
                    "temperature, batch_size")
    pl.add_argument("--attribution-set", action="append", metavar="KEY=VALUE",
                    help="override a setting of the gradient-attribution study (the laptop presets): levels, prompts_per_level, "
                    "group, temperature, max_new_tokens, objectives")
    pl.add_argument("--seeds", help="training seeds of every training stage, e.g. 0,1,2 (default: the preset's; "
                    "laptop 0,1,2, the others one unseeded run)")
    pl.add_argument("--ablation-seeds", help="seeds of the preset's ablations, a subset of --seeds (laptop: 0,1,2)")
    pl.add_argument("--fresh", action="store_true", help="start over results and runs folders that hold another "
                    "pipeline run (only what the pipeline wrote there is removed; without it such folders are refused)")
    pl.add_argument("--workers", type=int, default=1, help="worker processes that run steps side by side (default 1)")
    pl.add_argument("--threads", type=int, help="threads a worker (default: the cores shared out); weights depend on it")
    pl.add_argument("--quiet", action="store_true", help="no progress output")
    pl.set_defaults(func=_cmd_pipeline)


def _add_probe(sub, model_help) -> None:
    pr = sub.add_parser("probe", help="the check probe: does a laptop model's verdict follow its own check, asked "
                        "about right and wrong answers alike")
    pr.add_argument("--model", help=model_help + " (a laptop model)")
    pr.add_argument("--out", help="output JSON (its records beside it as .jsonl.gz; default probe.json)")
    pr.add_argument("--levels", default=",".join(TEST_LEVELS))
    pr.add_argument("--n", type=int, default=ProbeSettings.n_per_level, help="test questions per level")
    pr.add_argument("--temperature", type=float, default=ProbeSettings.temperature)
    pr.add_argument("--seed", type=int, default=ProbeSettings.seed)
    pr.add_argument("--quiet", action="store_true", help="no progress output")
    pr.set_defaults(func=_cmd_probe)


def _add_base(sub) -> None:
    ba = sub.add_parser("base", help="train the laptop base model from scratch (a tiny LlamaForCausalLM) into --out")
    ba.add_argument("--out", required=True, help="model folder to write (resumed when a killed run left its state)")
    ba.add_argument("--seed", type=int, default=0, help="initialisation and data order (default 0)")
    ba.add_argument("--tokens", type=int, help="training budget in tokens (default: the shipped base's)")
    ba.add_argument("--n-examples", type=int, help="distinct corpus examples (default: the shipped base's)")
    ba.add_argument("--spec", choices=("laptop", "graded"), default="laptop",
                    help="laptop: the shipped base, from scratch; graded: the laptop base trained further on "
                         "fallible attempts at every ladder length (the shipped laptop-graded-base)")
    ba.add_argument("--slip-rate", type=float, help=f"graded: chance of a slip per multiplicand digit (default: "
                                                    f"the shipped graded base's, {GRADED_SLIP_RATE})")
    ba.add_argument("--no-report", action="store_true",
                    help="no test-ladder report in the provenance (a design candidate measured on validation only)")
    ba.add_argument("--quiet", action="store_true", help="no progress bar")
    ba.set_defaults(func=_cmd_base)


def _add_budgets(sub) -> None:
    bu = sub.add_parser("budgets", help="token budgets of the presets that derive them, from their own traces")
    bu.add_argument("--write", action="store_true", help="recompute and write dsh/training/budgets.json")
    bu.add_argument("--check", action="store_true", help="exit 1 when dsh/training/budgets.json differs from a recomputation")
    bu.add_argument("--n", type=int, default=N_PER_LEVEL, help=f"traces per level (default {N_PER_LEVEL})")
    bu.add_argument("--json", action="store_true")
    bu.set_defaults(func=_cmd_budgets)


def _add_bench(sub, model_help) -> None:
    b = sub.add_parser("bench", help="dsh's generation, SFT and GRPO paths against the libraries' defaults")
    b.add_argument("--model", default=EMBEDDED, help=model_help)
    b.add_argument("--size", default="auto", help="auto (gpu on CUDA, else cpu), cpu, gpu, or laptop (cpu with the tiny "
                   "part at full size: the README's performance table)")
    b.add_argument("--parts", default="generation,sft,grpo,tiny",
                   help="comma-separated: generation, sft, grpo, tiny (the laptop base)")
    b.add_argument("--out", help="write the JSON result here (e.g. book/results/bench-h100/bench.json)")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--json", action="store_true", help="print the JSON result (the table goes to stderr)")
    b.set_defaults(func=_cmd_bench)


def _add_table(sub) -> None:
    t = sub.add_parser("table", help="Appendix D's SFT / DFT / RL comparison table, computed in SymPy")
    t.add_argument("--json", action="store_true")
    t.set_defaults(func=_cmd_table)


# the optional packages by pyproject.toml's extras (as imported), for the one-line "install this extra" error
EXTRAS = {"train": ("transformers", "trl", "peft", "accelerate", "datasets", "safetensors", "gguf", "tensorboard",
                    "pandas", "pyarrow", "huggingface_hub", "tokenizers"),
          "gpu": ("vllm", "deepspeed")}


def _stop(signum, frame):
    """SIGTERM (``timeout``, a scheduler) stops a command as Ctrl-C does: what it had started is cleaned up."""
    raise KeyboardInterrupt


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 0
    import signal
    import threading

    main_thread = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGTERM, _stop) if main_thread else None
    try:
        return args.func(args)
    except ModuleNotFoundError as e:   # a base install (pip install .) without the extra this command needs
        top = (e.name or "").split(".")[0]
        extra = next((x for x, mods in EXTRAS.items() if top in mods), None)
        if extra is None:
            raise
        print(f"error: dsh {args.command} needs the package {top}: pip install 'dsh[{extra}]' (or the pinned "
              f"requirements.txt)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: one line; a resumable command resumes when run again
        print(f"dsh {args.command}: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    except ValueError as e:  # bad input: one line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    except MemoryError:      # an input or a size beyond this machine: one line, not a traceback
        print("error: not enough memory for this input or these sizes; choose smaller ones", file=sys.stderr)
        return 2
    except RecursionError:
        print("error: an input nested too deeply to read", file=sys.stderr)
        return 2
    except OSError as e:     # an unreadable input or unwritable output found late: still one line
        print(f"error: {e.strerror or e}: {e.filename}" if e.filename else f"error: {e}", file=sys.stderr)
        return 2
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, before)


if __name__ == "__main__":
    sys.exit(main())
