"""The pipeline loses nothing and mixes nothing. A results or runs folder it did not write is refused
before any work and left byte-identical; a folder of another run needs --fresh, which removes only what the
pipeline wrote; the loader refuses a folder whose stages disagree with its summary; statistics do not depend on the
order in which an evaluation wrote its records; options the preset cannot honour are refused."""

import hashlib
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dsh.core.files import exclusive, read_json, read_jsonl
from dsh.experiment.run import folders, pipeline
from dsh.measure.stage import calibrate_stage

ROOT = Path(__file__).resolve().parent.parent
LAPTOP = ROOT / "book" / "results" / "laptop"
SMALL = dict(seeds=(0,), ablation_seeds=(), stages=("base",), eval_overrides={"levels": ("1x2",), "n_per_level": 2},
             overrides={"max_steps": 1}, progress=False,
             attribution_overrides={"levels": ("1x2",), "prompts_per_level": 1, "group": 2, "max_new_tokens": 120,
                                                   "min_signal": 0})


def _hashes(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _foreign_results(folder: Path) -> None:
    (folder / "generations").mkdir(parents=True)
    (folder / "calibration").mkdir()
    (folder / "summary.json").write_text('{"someone": "else"}')
    (folder / "calibration" / "base.json").write_text('{"theirs": 1}')
    (folder / "generations" / "base.jsonl.gz").write_bytes(b"not ours")


@pytest.mark.parametrize("which", ["results", "runs"])
def test_a_folder_the_pipeline_did_not_write_is_refused_and_left_byte_identical(tmp_path, which):
    """The cases of the issue: someone else's summary.json, base.json and generations/base.jsonl.gz in the results
    folder were overwritten, a runs folder's generations/base.jsonl with no settings record deleted (exit 0)."""
    results, runs = tmp_path / "results", tmp_path / "runs"
    if which == "results":
        _foreign_results(results)
    else:
        (runs / "generations").mkdir(parents=True)
        (runs / "generations" / "base.jsonl").write_text('{"mine": true}\n')
    target = results if which == "results" else runs
    before = _hashes(target)
    for fresh in (False, True):
        with pytest.raises(ValueError, match=f"^{which}_dir {target} holds files dsh pipeline did not write .*nothing "
                                             "was changed$"):
            pipeline.run_pipeline("laptop", results_dir=str(results), runs_dir=str(runs), fresh=fresh, **SMALL)
        assert _hashes(target) == before
    assert not (runs if which == "results" else results).exists()     # nothing written in the other folder either


def test_another_runs_folder_needs_fresh_which_removes_only_what_the_pipeline_wrote(tmp_path):
    a = folders.identity("laptop", [], ["base"], "m", {}, 0)
    b = folders.identity("laptop", [], ["base"], "m", {"sft": {"max_steps": 3}}, 0)
    res = tmp_path / "results"
    assert folders.claim({"results_dir": res}, a) == {"results_dir": "new"}
    (res / "calibration").mkdir()
    (res / "calibration" / "base.json").write_text("{}")
    (res / "summary.json").write_text("{}")
    (res / ".summary.json.x1y2.tmp").write_text("left by a kill")
    assert folders.claim({"results_dir": res}, a) == {"results_dir": "resume"}
    before = _hashes(res)
    with pytest.raises(ValueError, match="holds a pipeline run with another overrides; run it with the same options to "
                                         "resume it, pass --fresh"):
        folders.claim({"results_dir": res}, b)
    assert _hashes(res) == before
    (res / "notes.txt").write_text("a user's file")
    with pytest.raises(ValueError, match=r"holds files dsh pipeline did not write \(notes.txt\)"):
        folders.claim({"results_dir": res}, b, fresh=True)
    assert _hashes(res) == {**before, "notes.txt": _hashes(res)["notes.txt"]}
    (res / "notes.txt").unlink()
    assert folders.claim({"results_dir": res}, b, fresh=True) == {"results_dir": "fresh"}
    assert sorted(p.name for p in res.iterdir()) == [folders.CLAIM] and folders.claimed_identity(res) == b


def test_a_runs_folder_with_a_foreign_run_folder_is_refused(tmp_path):
    runs = tmp_path / "runs"
    (runs / "sft-s0").mkdir(parents=True)
    (runs / "sft-s0" / "run_config.json").write_text("{}")
    (runs / "sft-s0" / "my_weights.pt").write_text("x")
    with pytest.raises(ValueError, match=r"runs_dir .* holds files dsh pipeline did not write \(sft-s0/my_weights.pt"):
        folders.claim({"runs_dir": runs}, folders.identity("laptop", [], [], "m", {}, 0), fresh=True)
    assert (runs / "sft-s0" / "my_weights.pt").is_file() and not (runs / folders.CLAIM).exists()


def _copy_laptop(tmp_path: Path, jobs: bool = True) -> Path:
    """The committed laptop results in ``tmp_path/laptop``; ``jobs=False``: as a folder written before job records
    existed (no ``jobs/``, no ``jobs`` in its summary)."""
    out = tmp_path / "laptop"
    for sub in ("calibration", "generations", "probe") + (("jobs",) if jobs else ()):
        shutil.copytree(LAPTOP / sub, out / sub)
    summary = json.loads((LAPTOP / "summary.json").read_text())
    if not jobs:
        summary.pop("jobs")
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return out


@pytest.mark.parametrize("jobs", [True, False])
def test_the_loader_refuses_a_folder_that_mixes_two_runs_and_names_the_stage(tmp_path, jobs):
    """The issue's case: a base evaluated on fewer questions a level than the summary says, rendered without a word.
    With job records the changed file is refused by its sha256; without (an older folder) by its question count."""
    folder = _copy_laptop(tmp_path, jobs)
    assert len(pipeline.load_results(folder)["calibration"]) == 25
    path = folder / "calibration" / "sft-s1.json"
    cal = json.loads(path.read_text())
    cal["all"]["by_level"]["1x4"]["n"] = 21
    path.write_text(json.dumps(cal))
    refusal = (r"calibration/sft-s1.json is not the file stage sft-s1's job wrote" if jobs else
               r"stage sft-s1 has .*1x4: 21.* responses, its summary says 100 a level")
    with pytest.raises(ValueError, match=refusal):
        pipeline.load_results(folder)
    path.unlink()
    with pytest.raises(ValueError, match="stage sft-s1 of its summary has no calibration/sft-s1.json"):
        pipeline.load_results(folder)


def test_a_claim_that_disagrees_with_the_summary_is_refused(tmp_path):
    folder = _copy_laptop(tmp_path)
    s = json.loads((folder / "summary.json").read_text())
    folders.claim({"results_dir": folder / "x"}, folders.identity("laptop", [], s["stages"][:-1], "m", {}, 0))
    shutil.move(folder / "x" / folders.CLAIM, folder / folders.CLAIM)
    with pytest.raises(ValueError, match="summary.json is not the one of the run that claimed the folder"):
        pipeline.load_results(folder)


@pytest.mark.slow
def test_statistics_do_not_depend_on_the_order_the_records_were_written_in():
    """The issue's case: the same records, resumed in another order, moved the bootstrap intervals (p_s [0.426,
    0.606] vs [0.441, 0.594])."""
    recs = read_jsonl(LAPTOP / "generations" / "rl-s0.jsonl.gz")
    shuffled = recs[:]
    random.Random(1).shuffle(shuffled)
    assert shuffled != recs
    assert calibrate_stage(shuffled, task="laptop_task") == calibrate_stage(recs, task="laptop_task")


@pytest.mark.slow   # a subprocess: make check leaves it out
def test_the_pipeline_has_no_evaluation_seed_to_choose(tmp_path):
    """Every training set leaves out the test questions of seed 0 only: the pipeline evaluates with that seed, and
    offers no other (a flag with one legal value is no choice)."""
    with pytest.raises(TypeError, match="seed"):
        pipeline.run_pipeline("laptop", results_dir=str(tmp_path / "r"), runs_dir=str(tmp_path / "w"), seed=5, **SMALL)
    r = subprocess.run([sys.executable, "-m", "dsh", "pipeline", "--preset", "laptop", "--seed", "0",
                        "--results-dir", str(tmp_path / "r"), "--runs-dir", str(tmp_path / "w")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "unrecognized arguments: --seed 0" in r.stderr and "Traceback" not in r.stderr
    assert not any(tmp_path.iterdir())
    assert pipeline.TEST_SEED == 0


def test_a_lock_left_by_a_killed_process_is_cleared_with_a_message(tmp_path, capsys):
    out = tmp_path / "g.jsonl"
    (tmp_path / ".g.jsonl.lock").write_text("")          # a holder killed before it could remove its lock
    with exclusive(out, "busy"):
        pass
    assert "a lock left by a process that is gone was cleared" in capsys.readouterr().err
    assert not (tmp_path / ".g.jsonl.lock").exists()
    with exclusive(out, "busy"):
        pass
    assert "cleared" not in capsys.readouterr().err


@pytest.mark.slow
def test_a_kill_during_the_write_of_a_results_file_leaves_the_old_file_and_a_temporary_the_claim_recognises(tmp_path):
    """Results files are written to a temporary beside them and moved in whole: killed mid-write, the file keeps its
    old content, and the temporary left behind is the pipeline's (a resume or --fresh may remove it)."""
    import os
    import signal
    import time

    res = tmp_path / "results"
    ident = folders.identity("laptop", [], ["base"], "m", {}, 0)
    folders.claim({"results_dir": res}, ident)
    (res / "summary.json").write_text('{"old": true}')
    code = (f"from dsh.core.files import atomic_write\n"
            f"def w(tmp):\n    f = open(tmp, 'w')\n    f.write('x' * 1000)\n    f.flush()\n    import signal; signal.pause()\n"
            f"atomic_write({str(res / 'summary.json')!r}, w)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    while proc.poll() is None and not [p for p in res.glob(".summary.json.*.tmp") if p.stat().st_size]:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (res / "summary.json").read_text() == '{"old": true}'
    left = list(res.glob(".summary.json.*.tmp"))
    assert len(left) == 1
    ours, foreign = folders.pipeline_files(res, "results_dir")
    assert foreign == [] and left[0] in ours
    assert folders.claim({"results_dir": res}, ident) == {"results_dir": "resume"}


@pytest.fixture(scope="module")
def small_results(tmp_path_factory):
    """One pipeline run at the smallest size (the base only, 2 questions): its results folder."""
    root = tmp_path_factory.mktemp("jobs")
    pipeline.run_pipeline("laptop", results_dir=str(root / "results"), runs_dir=str(root / "runs"), **SMALL)
    return root / "results"


def _copy(folder: Path, tmp_path: Path) -> Path:
    out = tmp_path / "copy"
    shutil.copytree(folder, out)
    return out


@pytest.mark.slow
def test_the_summary_is_written_from_the_folders_files_and_each_job_records_them(small_results):
    s = json.loads((small_results / "summary.json").read_text())
    record = json.loads((small_results / folders.JOBS / "base.json").read_text())
    assert s["jobs"] == {"base": record}
    assert record["commit"] == s["commit"] and record["eval"] == s["eval"] and record["seed"] == s["seed"] == 0
    assert record["stage"] == "base" and record["model"].startswith("sha256:") and record["probe"]["seed"] == 0
    assert sorted(record["files"]) == ["calibration/base.json", "generations/base.jsonl.gz", "probe/base.json",
                                       "probe/base.jsonl.gz"]
    assert all(_hashes(small_results)[rel] == h for rel, h in record["files"].items())
    cal = json.loads((small_results / "calibration" / "base.json").read_text())
    assert s["accuracy"]["base"]["1x2"]["observed_accuracy"] == cal["all"]["by_level"]["1x2"]["observed_accuracy"]
    assert pipeline.load_results(small_results)["summary"] == s


@pytest.mark.slow
def test_the_loader_refuses_a_job_cut_short_another_commits_job_or_a_file_its_job_did_not_write(small_results,
                                                                                                tmp_path):
    """A job's record is its commit point: a kill before it leaves none; a file swapped in from elsewhere, or a job
    of other settings than the summary's, is a folder that mixes two runs (a job of another commit is one reused by
    its key)."""
    folder = _copy(small_results, tmp_path)
    (folder / folders.JOBS / "base.json").unlink()
    with pytest.raises(ValueError, match=r"stage base's job did not finish \(no jobs/base.json\)"):
        pipeline.load_results(folder)
    shutil.rmtree(folder)
    folder = _copy(small_results, tmp_path)
    path = folder / folders.JOBS / "base.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "commit": "0" * 40}))
    pipeline.load_results(folder)
    shutil.rmtree(folder)
    for key, value in (("eval", {"levels": ["1x2"], "n_per_level": 3}), ("seed", 1)):
        folder = _copy(small_results, tmp_path)
        path = folder / folders.JOBS / "base.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), key: value}))
        with pytest.raises(ValueError, match=f"stage base's job ran with another {key} .* the folder mixes two runs"):
            pipeline.load_results(folder)
        shutil.rmtree(folder)
    folder = _copy(small_results, tmp_path)
    recs = read_jsonl(folder / "generations" / "base.jsonl.gz")
    from dsh.core.files import write_jsonl_gz
    write_jsonl_gz(folder / "generations" / "base.jsonl.gz", recs[::-1])     # another run's file (same stage)
    with pytest.raises(ValueError, match="generations/base.jsonl.gz is not the file stage base's job wrote"):
        pipeline.load_results(folder)


@pytest.mark.slow
def test_a_job_without_its_record_is_redone_and_the_folder_equals_the_first_runs(small_results, tmp_path):
    """Killed after a job's files but before its record: the same run again redoes the job (from the cached
    generations) and writes the same files."""
    root = tmp_path / "again"
    shutil.copytree(small_results.parent, root)
    (root / "results" / folders.JOBS / "base.json").unlink()
    (root / "results" / "summary.json").unlink()
    pipeline.run_pipeline("laptop", results_dir=str(root / "results"), runs_dir=str(root / "runs"), **SMALL)
    got, want = _hashes(root / "results"), _hashes(small_results)
    assert sorted(got) == sorted(want)
    assert {k: x for k, x in got.items() if k not in ("summary.json", "probe/base.json")} == \
           {k: x for k, x in want.items() if k not in ("summary.json", "probe/base.json")}
    pipeline.load_results(root / "results")


@pytest.mark.slow
def test_the_same_run_again_reuses_every_step_and_rewrites_nothing(small_results, tmp_path, capsys):
    """Every step keyed by what it is made from (dsh.core.store): the same run again trains, evaluates, calibrates and
    probes nothing and leaves every file of both folders as it was, byte for byte and untouched; a job whose record
    names other weights is redone, and so is every job of the same run with other evaluation settings (two samples a
    question), its attribution study reused."""
    root = tmp_path / "again"
    shutil.copytree(small_results.parent, root)
    files = [f for f in root.rglob("*") if f.is_file()]
    before = {f: (f.read_bytes(), f.stat().st_mtime_ns) for f in files}
    capsys.readouterr()
    pipeline.run_pipeline("laptop", results_dir=str(root / "results"), runs_dir=str(root / "runs"), **{**SMALL, "progress": True})
    said = capsys.readouterr().out
    assert "base: evaluation, calibration and probe reused" in said and "left as it is" in said, said
    assert sorted(f for f in root.rglob("*") if f.is_file()) == sorted(files)
    assert {f: (f.read_bytes(), f.stat().st_mtime_ns) for f in files} == before
    job = root / "results" / folders.JOBS / "base.json"
    job.write_text(json.dumps({**json.loads(job.read_text()), "model": "sha256:" + "0" * 64}))
    pipeline.run_pipeline("laptop", results_dir=str(root / "results"), runs_dir=str(root / "runs"), **{**SMALL, "progress": True})
    said = capsys.readouterr().out
    assert "evaluate base:" in said and "reused" not in said.split("evaluate base:")[0].split("\n")[-1]
    assert json.loads(job.read_text())["model"] == json.loads((small_results / folders.JOBS / "base.json")
                                                               .read_text())["model"]
    # other evaluation settings: the same run (its claim holds what its trainings are made from), every job redone
    two = {**SMALL, "progress": True, "eval_overrides": {**SMALL["eval_overrides"], "samples_per_question": 2}}
    pipeline.run_pipeline("laptop", results_dir=str(root / "results"), runs_dir=str(root / "runs"), **two)
    said = capsys.readouterr().out
    assert "evaluate base: 4 responses" in said and "attribution base: reused" in said, said
    cal = json.loads((root / "results" / "calibration" / "base.json").read_text())["all"]["overall"]
    assert cal["n"] == 4 and cal["questions"] == 2
    assert pipeline.load_results(root / "results")["summary"]["eval"]["samples_per_question"] == 2


def _strings(x):
    if isinstance(x, dict):
        for y in x.values():
            yield from _strings(y)
    elif isinstance(x, list):
        for y in x:
            yield from _strings(y)
    elif isinstance(x, str):
        yield x


@pytest.mark.slow
def test_a_results_folder_names_no_machine_path_and_a_relative_base_is_the_same_run(small_results, tmp_path,
                                                                                       monkeypatch):
    """Results record paths from labels (<dsh>, <runs_dir>), and the claim knows the model by content, so
    the same base named by a relative path resumes the run an absolute path started."""
    for p in small_results.rglob("*.json"):
        if p.name != folders.CLAIM:
            assert not [s for s in _strings(json.loads(p.read_text())) if s.startswith("/")], p
    s = json.loads((small_results / "summary.json").read_text())
    assert s["model"] == "<dsh>/assets/laptop-base"
    root = tmp_path / "again"
    shutil.copytree(small_results.parent, root)
    claim = (root / "results" / folders.CLAIM).read_text()
    monkeypatch.chdir(ROOT)
    pipeline.run_pipeline("laptop", results_dir=str(root / "results"), runs_dir=str(root / "runs"),
                          model="dsh/assets/laptop-base", **SMALL)
    assert (root / "results" / folders.CLAIM).read_text() == claim


def test_every_committed_laptop_results_folder_is_at_most_16_mb():
    """The results a clone carries (design logs included) stay small: the attribution studies are gzipped."""
    for folder in sorted(LAPTOP.parent.glob("laptop*")):
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        assert size <= 16e6, (folder.name, size)
        assert not [p for p in folder.glob("attribution/*") if not p.name.endswith(".json.gz")], folder.name


def test_the_committed_laptop_results_name_no_machine_path():
    for p in [LAPTOP / "summary.json", *sorted((LAPTOP / "attribution").glob("*.json.gz"))]:
        found = [s for s in _strings(read_json(p)) if s.startswith(("/tmp/", "/work/", "/home/", "/root/"))]
        assert not found, (p, found[:3])


@pytest.mark.slow
def test_the_same_runs_folder_by_a_relative_or_an_absolute_path_is_one_run(tmp_path, monkeypatch, capsys):
    """A stage's configuration names its starting model by path (the stage before it, under runs_dir), so
    the same runs folder given by an absolute path after a relative one was 'a finished run with another
    configuration'; the starting model is now compared by content and the finished stage reused."""
    monkeypatch.chdir(tmp_path)
    args = dict(SMALL, stages=("rl-s0",), overrides={"max_steps": 1, "n_train": 16, "generation_batch_size": 16,
                                                     "per_device_train_batch_size": 8, "max_completion_length": 96})
    pipeline.run_pipeline("laptop", results_dir="results", runs_dir="runs", **args)
    before = _hashes(tmp_path / "runs" / "rl-s0")      # rl-s0 starts from runs/sft_reflection-s0
    summary = pipeline.run_pipeline("laptop", results_dir=str(tmp_path / "results"),
                                    runs_dir=str(tmp_path / "runs"), **{**args, "progress": True})
    assert "train rl-s0: reused" in capsys.readouterr().out
    assert _hashes(tmp_path / "runs" / "rl-s0") == before and summary["stages"] == ["rl-s0"]


def test_a_claim_of_other_weights_is_refused_naming_the_model(tmp_path):
    """A folder claimed for one model (by content) is refused for another, naming the field that differs."""
    old = folders.identity("laptop", [], ["base"], "sha256:" + "1" * 64, {}, 0)
    new = folders.identity("laptop", [], ["base"], "sha256:" + "0" * 64, {}, 0)
    folders.claim({"results_dir": tmp_path / "r"}, old)
    with pytest.raises(ValueError, match=r"holds a pipeline run with another model; run it with the same options"):
        folders.claim({"results_dir": tmp_path / "r"}, new)
    assert folders.claim({"results_dir": tmp_path / "r"}, old) == {"results_dir": "resume"}


@pytest.mark.slow
def test_committed_results_hold_no_machine_path():
    """A committed results folder names paths by label (<dsh>, <runs_dir>, <scratch>), never by this
    machine's absolute paths (the design logs under design/ are the design runs' raw output and are left as written)."""
    import gzip
    import re

    machine = re.compile(r"(?<![\w<>])/(tmp|work|home|root|Users|var)/")
    results = LAPTOP.parent
    checked = 0
    for path in results.rglob("*"):
        if not path.is_file() or "design" in path.relative_to(results).parts:
            continue
        if path.suffix == ".gz":
            text = gzip.decompress(path.read_bytes()).decode()
        elif path.suffix == ".json":
            text = path.read_text()
        else:
            continue
        assert not machine.search(text), (path, machine.search(text).group(0))
        checked += 1
    assert checked > 50


def test_a_resumed_run_removes_what_a_killed_write_left_and_nothing_else(tmp_path):
    """SIGKILL during an atomic write leaves its temporary file (``.<name>.<8 random>.tmp``); the pipeline removes
    those when it takes its folders again, and no other file."""
    from dsh.core.files import remove_partial_writes
    from dsh.experiment.run.steps import make_folders

    res, runs = tmp_path / "results", tmp_path / "runs"
    make_folders(res, runs, ("generations", "calibration"))
    left = [res / "generations" / ".base.jsonl.gz.52i1_yo2.tmp", res / ".summary.json.k9x_ab12.tmp",
            runs / "generations" / ".base.jsonl.settings.json.zz99yy88.tmp"]
    kept = [res / "generations" / "base.jsonl.gz", res / ".notes.tmp", res / "calibration" / "x.abcdefgh.tmp"]
    for f in left + kept:
        f.write_text("x")
    make_folders(res, runs, ("generations", "calibration"))
    assert not any(f.exists() for f in left) and all(f.exists() for f in kept)
    assert remove_partial_writes(tmp_path / "missing") == []


def test_the_same_run_resumes_a_results_folder_that_also_holds_the_users_files_and_leaves_them(tmp_path):
    """A committed results folder carries its README and design notes beside the pipeline's files: the same run resumes
    it (they stay as they are); another run, or a start over, is refused as before."""
    a = folders.identity("laptop", [], ["base"], "m", {}, 0)
    b = folders.identity("laptop", [], ["base"], "m", {"sft": {"max_steps": 3}}, 0)
    res = tmp_path / "results"
    folders.claim({"results_dir": res}, a)
    (res / "README.md").write_text("what this run was")
    (res / "design").mkdir()
    (res / "design" / "rule.md").write_text("the rule")
    before = _hashes(res)
    assert folders.claim({"results_dir": res}, a) == {"results_dir": "resume"}
    assert _hashes(res) == before
    for fresh in (False, True):
        with pytest.raises(ValueError, match=r"holds files dsh pipeline did not write \(README.md, design/rule.md\)"):
            folders.claim({"results_dir": res}, b, fresh=fresh)
    assert _hashes(res) == before
