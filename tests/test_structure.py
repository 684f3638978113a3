"""The package's structure: each preset name and default in one place, no private names across modules, no
reference outside the repository, lint clean."""

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jupytext
import pytest

from dsh.experiment import presets

ROOT = Path(__file__).resolve().parent.parent
MODULES = sorted((ROOT / "dsh").rglob("*.py"))
# the layers, bottom first: a module may import its own layer and those before it, never one after it
LAYERS = ("core", "theory", "task", "measure", "llm", "training", "experiment")


def _code_constants(path: Path):
    """String and number constants of a module's code that are values: docstrings, dictionary keys and
    subscripts (``r["ci"]``, a confidence interval) excluded."""
    tree = ast.parse(path.read_text())
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                skip.add(id(first.value))
        if isinstance(node, ast.Dict):
            skip |= {id(k) for k in node.keys if k is not None}
        if isinstance(node, ast.Subscript):
            skip.add(id(node.slice))
    return [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and id(n) not in skip]


def test_each_preset_name_and_evaluation_default_is_spelled_in_one_module():
    names = set(presets.NAMES)
    where = {}
    for path in MODULES:
        for c in _code_constants(path):
            if c.value in names or (isinstance(c.value, int) and not isinstance(c.value, bool) and c.value == 8192):
                where.setdefault(c.value, set()).add(path.name)
    assert where.get("ci") == where.get("gpu-small") == where.get("paper") == {"presets.py"}, where
    assert where.get(8192) <= {"evaluate.py", "bench.py"}, where   # bench: a matrix size, not a default
    # the chapters take preset objects and settings from dsh.experiment.presets outside their parameters cell
    for md in sorted((ROOT / "chapters").glob("*.md")):
        for cell in jupytext.read(md).cells:
            if cell.cell_type != "code" or "parameters" in cell.metadata.get("tags", []):
                continue
            call = re.search(r"(resolve|plan|get|stage_table|run_pipeline|eval_settings|train_config)\([^)]*"
                             r"[\"'](ci|gpu-small|paper)[\"']", cell.source)
            assert not call, (md.name, call.group(0))
            assert not re.search(r"[\"'](ci|gpu-small|paper)[\"'],\s*[\"'](ci|gpu-small|paper)[\"']", cell.source), md.name


def _dsh_aliases(tree) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level > 0 and node.module is None or node.module == "dsh"):
            out |= {a.asname or a.name for a in node.names}
    return out


def _private_uses(source: str, own: bool = False) -> list[str]:
    tree = ast.parse(source)
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").startswith("dsh")):
            bad += [f"from {node.module} import {a.name}" for a in node.names
                    if a.name.startswith("_") and a.name != "__version__"]
    aliases = _dsh_aliases(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases \
                and node.attr.startswith("_") and not node.attr.startswith("__"):
            bad.append(f"{node.value.id}.{node.attr}")
    return bad


def test_no_module_uses_another_modules_private_names():
    for path in MODULES + sorted((ROOT / "tests").glob("*.py")):
        assert not _private_uses(path.read_text()), (path.name, _private_uses(path.read_text()))
    for md in sorted((ROOT / "chapters").glob("*.md")):
        src = "\n".join(c.source for c in jupytext.read(md).cells if c.cell_type == "code")
        src = "\n".join(x for x in src.splitlines() if not x.lstrip().startswith(("%", "!")))
        assert not _private_uses(src), (md.name, _private_uses(src))


def test_nothing_points_outside_the_repository():
    pattern = re.compile(r"\.\./shared|shared/(notes|paper|tools)|h100-baseline\.md|small-model-findings\.md|stack\.md")
    files = [*MODULES, *(ROOT / "dsh").glob("*.yaml"), *(ROOT / "chapters").glob("*.md"), *(ROOT / "book").glob("*.md"),
             ROOT / "README.md", ROOT / "Makefile", ROOT / "_config.yml"]
    for f in files:
        hits = [m.group(0) for m in pattern.finditer(f.read_text())]
        assert not hits, (f.name, hits)


@pytest.mark.skipif(shutil.which("ruff") is None and not (Path(sys.prefix) / "bin" / "ruff").exists(),
                    reason="ruff not installed")
def test_ruff_is_clean():
    ruff = shutil.which("ruff") or str(Path(sys.prefix) / "bin" / "ruff")
    r = subprocess.run([ruff, "check", "dsh", "tests"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:]
