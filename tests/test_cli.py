"""The command line: python -m dsh."""

import json
import subprocess
import sys

import pytest

from dsh.core.paper import paper_results


def run(*args):
    return subprocess.run([sys.executable, "-m", "dsh", *args], capture_output=True, text=True)


def test_help_lists_commands():
    r = run("--help")
    assert r.returncode == 0
    for cmd in ("accuracy", "simulate", "table", "calibrate", "data"):
        assert cmd in r.stdout


def test_accuracy_json():
    r = run("accuracy", "--p-s", "0.5", "--p-dc", "0.9", "--p-dw", "0.6", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["predicted_accuracy"] == pytest.approx(0.45 / 0.65)


@pytest.mark.parametrize("args,name", [
    (("accuracy", "--p-s", "1.5", "--p-dc", "0.9", "--p-dw", "0.6"), "p_s"),
    (("simulate", "--p-s", "0.5", "--p-dc", "0.9", "--p-dw", "0.6", "--n", "0"), "n"),
])
def test_bad_input_one_line_error(args, name):
    r = run(*args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {name} must be")
    assert "Traceback" not in r.stderr


def test_simulate_matches_formula():
    r = run("simulate", "--p-s", "0.3", "--p-dc", "0.8", "--p-dw", "0.7", "--n", "50000", "--json")
    out = json.loads(r.stdout)
    assert abs(out["observed_accuracy"] - out["predicted_accuracy"]) < 0.01


def test_table_json_agrees_with_the_papers_printed_table():
    """`dsh table` derives Appendix D's table from the paper's definitions; every cell is compared with the
    table as the paper prints it (dsh/core/paper_results.yaml), which the derivation does not read."""
    r = run("table", "--json")
    ours = json.loads(r.stdout)
    printed = paper_results()["appendix_d_comparison_table"]["rows"]
    n = 0
    for prop, cells in printed.items():
        for method, text in cells.items():
            val = ours[method][prop]
            assert text.split(" ")[0] == (("Yes" if val else "No") if isinstance(val, bool) else val), (prop, method)
            n += 1
    assert n == 15


def test_data_command_writes_files(tmp_path):
    r = run("data", "--out", str(tmp_path / "d"), "--n-train", "20", "--n-test", "2", "--verl", "--seed", "3")
    assert r.returncode == 0, r.stderr
    names = sorted(p.name for p in (tmp_path / "d").iterdir())
    assert names == ["test.jsonl", "train_reflection_digit.jsonl", "verl_test.parquet", "verl_train.parquet"]
    lines = (tmp_path / "d" / "train_reflection_digit.jsonl").read_text().splitlines()
    assert len(lines) == 20 and json.loads(lines[0])["completion"][0]["role"] == "assistant"
    assert len((tmp_path / "d" / "test.jsonl").read_text().splitlines()) == 14


def test_data_command_bad_style_writes_nothing(tmp_path):
    r = run("data", "--out", str(tmp_path / "d"), "--style", "cot")
    assert r.returncode == 2 and r.stderr.startswith("error: style must be one of")
    assert not (tmp_path / "d").exists()


def test_a_comma_separated_set_value_is_a_list(capsys):
    from dsh.__main__ import main

    assert main(["train", "--method", "sft", "--set", "train_levels=2x2,2x3", "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["dsh"]["train_levels"] == ["2x2", "2x3"]


def test_train_without_model_starts_from_the_presets_model(capsys):
    """`train --preset laptop` without --model trained the 135M embedded model (25 s a step) instead of
    the preset's tiny base; it starts from the preset's model, and --model or --set model=... still choose another."""
    from dsh.__main__ import main
    from dsh.training.laptop_base import SHIPPED_BASE

    for argv, want in ((["--preset", "laptop"], str(SHIPPED_BASE)), (["--preset", "ci"], "embedded"),
                       (["--preset", "laptop", "--model", "embedded"], "embedded"),
                       (["--preset", "laptop", "--set", "model=embedded"], "embedded")):
        assert main(["train", "--method", "sft", *argv, "--dry-run"]) == 0
        assert json.loads(capsys.readouterr().out)["dsh"]["model"] == want, argv


def test_train_help_shows_every_fields_default():
    """A field with a default factory (task_options) was listed as '<dataclasses._MISSING_TYPE object ...>'."""
    from dsh.training.train_config import fields_help

    text = fields_help()
    assert "MISSING" not in text and "task_options (default {})" in text
