"""dsh.core.paths: a chapter's relative path parameters point at the same folder from any working directory."""

import re
from pathlib import Path

import pytest

from dsh.core import paths

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "chapters").glob("*.md"))


@pytest.mark.parametrize("where", [ROOT, ROOT / "chapters", "tmp"])
def test_a_relative_path_is_read_from_the_chapters_folder_wherever_the_chapter_runs(where, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path if where == "tmp" else where)
    got = paths.chapter_path("committed_results", "../book/results", must_exist=True)
    assert got == ROOT / "book" / "results"
    assert paths.chapter_path("runs_dir", "runs/book/x") == ROOT / "chapters" / "runs" / "book" / "x"
    assert paths.chapter_path("runs_dir", str(tmp_path / "abs")) == tmp_path / "abs"       # absolute: as given
    assert paths.repo_relative(got) == "book/results"
    assert paths.repo_relative(tmp_path) == str(tmp_path)


def test_a_missing_or_wrong_path_is_one_line_naming_it():
    with pytest.raises(ValueError, match=r"^committed_results: .*book/nothing does not exist \(given '\.\./book/nothing', "
                                         r"relative to the chapters/ folder\)$"):
        paths.chapter_path("committed_results", "../book/nothing", must_exist=True)
    for bad in (3, "", None):
        with pytest.raises(ValueError, match=r"^committed_results must be a folder path, got "):
            paths.chapter_path("committed_results", bad)


@pytest.mark.parametrize("md", CHAPTERS, ids=lambda p: p.name)
def test_every_path_parameter_of_a_chapter_goes_through_chapter_path(md):
    """papermill from the repository root gave wrong pages with exit 0 ("No laptop run is committed") because a
    chapter read "../book/results" from the working directory."""
    text = md.read_text()
    cell = text.split("tags: [parameters]", 1)[1].split("PARAMETERS = set(globals())", 1)[0]
    names = re.findall(r'^(\w+) = "([^"]*/[^"]*)"', cell, re.M)
    for name, _ in names:
        assert re.search(rf'{name} = (str\()?chapter_path\("{name}", {name}', text), (md.name, name)
