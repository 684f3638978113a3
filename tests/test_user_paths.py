"""The user's paths as typed: the CLI shows its defaults, the shipped base has a name, no trap is left after an
interruption, the paper's model is named and checked before any work, the GPU extra is declared."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsh.__main__ import build_parser, main
from dsh.experiment.run import evaluate as evaluate_module
from dsh.experiment.run import presets
from dsh.llm import models
from dsh.training import train as train_module
from dsh.training import train_config
from dsh.training.laptop_base import SHIPPED_BASE

ROOT = Path(__file__).resolve().parent.parent


def _subcommands():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return dict(sub.choices)


@pytest.mark.parametrize("name", sorted(_subcommands()))
def test_every_option_with_a_default_shows_it_in_help(name):
    parser = _subcommands()[name]
    for action in parser._actions:
        d = action.default
        if not action.option_strings or d is None or d is False or d is True or d == "==SUPPRESS==":
            continue
        assert "default" in (action.help or ""), (name, action.option_strings, action.help)
    text = parser.format_help()
    if name == "evaluate":
        assert "(default 8192)" in text and "(default 3x3,3x4,3x5,3x6,3x7,3x8,3x9)" in text


def test_the_shipped_base_has_a_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                  # from anywhere, not only the repository root
    assert models.resolve_model("laptop-base") == str(SHIPPED_BASE)
    assert models.model_digest("laptop-base") == models.model_digest(SHIPPED_BASE)


@pytest.mark.slow
def test_train_prints_no_library_deprecation_warning():
    r = subprocess.run([sys.executable, "-W", "error::FutureWarning", "-m", "dsh", "train", "--method", "sft",
                        "--dry-run"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0 and "FutureWarning" not in r.stderr, r.stderr[-2000:]


def test_sigterm_stops_evaluate_as_ctrl_c_does(tmp_path):
    """An evaluate stopped by SIGTERM (timeout, a scheduler) left a settings record that refused a re-run with
    other settings; Ctrl-C left nothing. Now SIGTERM is Ctrl-C. The signal is sent where the model would load, before
    the first record (in a process of its own: the handler is the command's)."""
    out = tmp_path / "g.jsonl"
    code = ("import os, signal, sys\n"
            "from dsh.experiment.run import evaluate\n"
            "def stopped(*a, **k):\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    raise AssertionError('SIGTERM did not stop the command')\n"
            "evaluate._evaluate = stopped\n"
            "from dsh.__main__ import main\n"
            f"rc = main(['evaluate', '--model', 'laptop-base', '--levels', '1x2', '--n', '2', '--max-new-tokens', "
            f"'24', '--out', {str(out)!r}])\n"
            "assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL\n"
            "sys.exit(rc)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 130 and "dsh evaluate: interrupted" in r.stderr, r.stderr[-2000:]
    assert not out.exists() and not evaluate_module.settings_path(out).exists()
    assert main(["evaluate", "--model", "laptop-base", "--levels", "1x2", "--n", "2", "--max-new-tokens", "16",
                 "--out", str(out)]) == 0          # other settings than the stopped run's: not refused


def test_a_train_that_fails_before_its_first_checkpoint_leaves_nothing(tmp_path, monkeypatch):
    run = tmp_path / "run"
    cfg = presets.LAPTOP.train_config("sft", model="laptop-base", output_dir=str(run), max_steps=1, n_train=8)

    def broken(*args, **kwargs):
        raise RuntimeError("the trainer could not be built")

    monkeypatch.setitem(train_module.TRAINERS, "sft", broken)
    with pytest.raises(RuntimeError, match="could not be built"):
        train_module.train(cfg)
    assert not run.exists()                      # a restart (or --resume) is not refused
    monkeypatch.undo()
    assert train_module.train(cfg)["global_step"] == 1


def test_train_fresh_starts_a_run_over_and_keeps_a_users_file(tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["train", "--preset", "laptop", "--method", "sft", "--set", "max_steps=1", "--set", "n_train=8",
            "--output-dir", str(run)]
    assert main(argv) == 0
    assert main(argv) == 2 and "already holds a run" in capsys.readouterr().err
    assert main([*argv, "--fresh"]) == 0 and (run / "summary.json").is_file()
    assert main([*argv, "--fresh", "--resume"]) == 2 and "exclude each other" in capsys.readouterr().err
    (run / "final" / "mine.txt").write_text("x")
    assert main([*argv, "--fresh"]) == 2 and "final/mine.txt" in capsys.readouterr().err
    assert (run / "final" / "mine.txt").read_text() == "x"


def test_build_folder_is_ignored():
    assert "/build/" in (ROOT / ".gitignore").read_text().split()


def test_the_paper_preset_names_the_papers_model_and_checks_its_weights_first(tmp_path, capsys):
    assert presets.PAPER.model == "Qwen/Qwen2.5-7B-Instruct"
    assert main(["train", "--preset", "paper", "--method", "sft", "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["dsh"]["model"] == "Qwen/Qwen2.5-7B-Instruct"
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))     # a machine without the weights
    r = subprocess.run([sys.executable, "-m", "dsh", "train", "--preset", "paper", "--method", "grpo",
                        "--output-dir", str(tmp_path / "run")], capture_output=True, text=True, cwd=ROOT, env=env)
    assert r.returncode == 2 and "huggingface-cli download Qwen/Qwen2.5-7B-Instruct" in r.stderr, r.stderr[-2000:]
    assert "dsh: train" not in r.stdout and not (tmp_path / "run").exists()      # nothing built, nothing written


def test_the_gpu_extra_is_declared():
    import re

    names = re.search(r"^gpu = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert "vllm" in names and "deepspeed" in names and "dsh[train]" in names


def test_a_run_shorter_than_its_logging_interval_logs_its_loss():
    cfg = presets.resolve("sft", "laptop", max_steps=3, logging_steps=10)
    assert train_config.to_trl_config(cfg).logging_steps == 3


def test_calibrate_reads_a_laptop_results_folder_with_its_tasks_reading(capsys):
    """The CLI read the laptop generations' check lines as answers (0.313 for rl-s1 against the committed 0.559)."""
    gen = ROOT / "book" / "results" / "laptop" / "generations" / "rl-s1.jsonl.gz"
    committed = json.loads((ROOT / "book" / "results" / "laptop" / "calibration" / "rl-s1.json").read_text())
    assert main(["calibrate", str(gen), "--task", "laptop_task", "--json", "--bootstrap", "0"]) == 0
    got = json.loads(capsys.readouterr().out)["overall"]
    assert got["observed_accuracy"] == committed["all"]["overall"]["observed_accuracy"]
    assert main(["calibrate", str(gen), "--task", "nope"]) == 2
    assert "task must be one of traces, laptop_task; got 'nope'" in capsys.readouterr().err


def test_a_question_in_words_keeps_its_operands():
    from dsh.task import parse

    assert parse.operands("What is 123 times 457?") == (123, 457)
    assert parse.operands("What is 1,234 multiplied by 5?") == (1234, 5)
    wrong = "123 * 457 = 56,000"
    assert parse.parse_response(wrong, *parse.operands("What is 123 times 457?")).final_answer == 56000
    assert not parse.is_correct(wrong, 56211, "What is 123 times 457?")


def test_a_missing_extra_is_named_in_one_line(tmp_path):
    """In a base install (`pip install .`), `data --verl`, `train` and `evaluate` ended in tracebacks."""
    blocker = tmp_path / "sitecustomize.py"      # this interpreter without pyarrow, as a base install has it
    blocker.write_text("import sys\nsys.modules['pyarrow'] = None\n")
    r = subprocess.run([sys.executable, "-m", "dsh", "data", "--out", str(tmp_path / "d"), "--n-train", "2",
                        "--n-test", "1", "--verl"], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}"))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.strip() == "error: dsh data needs the package pyarrow: pip install 'dsh[train]' (or the pinned " \
                               "requirements.txt)"


def test_the_readme_is_a_front_door():
    """The README was a log: 565 lines, a 5,961-character table cell, the findings from line 515."""
    text = (ROOT / "README.md").read_text()
    first = "\n".join(text.splitlines()[:40])
    for needed in ("make book", "make test", "](chapters/00_findings.md)", "pip install -e \".[gpu]\"",
                   "huggingface-cli download Qwen/Qwen2.5-7B-Instruct", "--preset paper"):
        assert needed in first, needed
    cells = [c for line in text.splitlines() if line.startswith("|") for c in line.strip("|").split("|")]
    assert cells and max(map(len, cells)) <= 300, max(cells, key=len)[:120]


def test_i_get_n_is_read_as_an_answer_and_an_intermediate_value_is_not():
    from dsh.task import parse

    assert parse.parse_response("Multiplying out, I get 56,211.").final_answer == 56211
    assert parse.parse_response("I get 6 for the digit sum. The answer is 12.").candidates == [12]
    assert parse.is_correct("So I get 56211.\n", 56211, "What is 123 times 457?")


def test_grpo_with_fewer_prompts_than_one_rollout_round_is_refused():
    """`-p n_train 16` in the training chapter trained GRPO for 0 steps (16 prompts x 8 < a round of 256)."""
    with pytest.raises(ValueError, match=r"^n_train must be at least 32 for GRPO: one rollout round draws 256 "
                                         r"completions, 8 a prompt; got 16$"):
        presets.resolve("grpo", "laptop", n_train=16)
