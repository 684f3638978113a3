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

from dsh.experiment.run import presets

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
    assert where.get(8192) <= {"evaluate.py", "peaks.py"}, where   # dsh.llm.peaks: a matrix size, not a default
    # the chapters take preset objects and settings from dsh.experiment.run.presets outside their parameters cell
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


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path) -> dict[str, set[str]]:
    """``{module: dsh modules it imports}`` for every module of the package at ``root / "dsh"``, imports inside
    functions included (a lazy import goes up a layer as much as one at the top)."""
    files = {_module_name(p, root): p for p in sorted((root / "dsh").rglob("*.py"))}
    graph = {}
    for name, path in files.items():
        is_pkg = path.name == "__init__.py"
        out = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_pkg else name.split(".")[:-1]
                    base = base[:len(base) - node.level + 1]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                if mod.split(".")[0] != "dsh":
                    continue
                for a in node.names:       # `from dsh.task import parse` imports the module dsh.task.parse
                    out.add(f"{mod}.{a.name}" if f"{mod}.{a.name}" in files else mod)
            elif isinstance(node, ast.Import):
                out |= {a.name for a in node.names if a.name.split(".")[0] == "dsh"}
        graph[name] = {m for m in out if m != name and m in files}
    return graph


def _rank(module: str) -> int:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 2 and parts[1] in LAYERS else len(LAYERS)


def layer_violations(root: Path) -> list[str]:
    """Every import of the package at ``root`` that goes up a layer, every module outside a layer (other than
    ``dsh``, ``dsh.__main__`` and the layer packages), and every import cycle."""
    graph = import_graph(root)
    bad = [f"{m} is in no layer" for m in graph
           if _rank(m) == len(LAYERS) and m not in ("dsh", "dsh.__main__", *(f"dsh.{x}" for x in LAYERS))]
    bad += [f"{m} (layer {LAYERS[_rank(m)]}) imports {d} (layer {LAYERS[_rank(d)]}), a layer above it"
            for m, deps in graph.items() if _rank(m) < len(LAYERS) for d in sorted(deps) if _rank(d) > _rank(m)]
    state = {}

    def visit(m, stack):
        state[m] = 1
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                bad.append("import cycle: " + " -> ".join(stack[stack.index(d):] + [d]))
            elif d not in state:
                visit(d, stack + [d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    return bad


def test_each_layer_imports_only_the_layers_below_it_and_no_import_closes_a_cycle():
    assert sorted(p.name for p in (ROOT / "dsh").iterdir() if p.is_dir() and p.name != "__pycache__") == \
        sorted(LAYERS + ("assets",))
    assert layer_violations(ROOT) == []


# the experiment layer's sub-packages, by role: running makes what reporting and benchmarking read
ROLES = {"run": set(), "report": {"run"}, "bench": {"run"}}


def test_the_experiment_layer_is_split_by_role_and_running_imports_neither_report_nor_bench():
    assert sorted(p.name for p in (ROOT / "dsh" / "experiment").iterdir() if p.is_dir() and p.name != "__pycache__") \
        == sorted(ROLES)
    assert not list((ROOT / "dsh" / "experiment").glob("[!_]*.py"))
    bad = []
    for m, deps in import_graph(ROOT).items():
        parts = m.split(".")
        if parts[:2] != ["dsh", "experiment"] or len(parts) < 3:
            continue
        for d in deps:
            q = d.split(".")
            if q[:2] == ["dsh", "experiment"] and len(q) > 2 and q[2] != parts[2] and q[2] not in ROLES[parts[2]]:
                bad.append(f"{m} imports {d}")
    assert bad == []


def test_no_module_is_over_500_lines_and_no_function_over_80():
    long_files = [f"{p.relative_to(ROOT)}: {n}" for p in MODULES if (n := len(p.read_text().splitlines())) > 500]
    long_functions = [f"{p.relative_to(ROOT)}:{f.lineno} {f.name}: {f.end_lineno - f.lineno + 1}"
                      for p in MODULES for f in ast.walk(ast.parse(p.read_text()))
                      if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.end_lineno - f.lineno + 1 > 80]
    assert long_files == [] and long_functions == [], (long_files, long_functions)


def test_the_layer_check_catches_an_upward_import_a_cycle_and_a_module_outside_the_layers(tmp_path):
    pkg = tmp_path / "dsh"
    for layer in LAYERS:
        (pkg / layer).mkdir(parents=True)
        (pkg / layer / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from .theory.a import f\n")
    (pkg / "theory" / "a.py").write_text("from ..core import v\n\ndef f():\n    from ..experiment import presets\n")
    (pkg / "core" / "v.py").write_text("")
    (pkg / "experiment" / "presets.py").write_text("from ..task import b\n")
    (pkg / "task" / "b.py").write_text("import dsh.task.c\n")
    (pkg / "task" / "c.py").write_text("from . import b\n")
    (pkg / "loose.py").write_text("")
    assert layer_violations(tmp_path) == [
        "dsh.loose is in no layer",
        "dsh.theory.a (layer theory) imports dsh.experiment.presets (layer experiment), a layer above it",
        "import cycle: dsh.task.b -> dsh.task.c -> dsh.task.b"]
    (pkg / "theory" / "a.py").write_text("from ..core import v\n")
    (pkg / "task" / "c.py").write_text("")
    (pkg / "loose.py").unlink()
    assert layer_violations(tmp_path) == []


# third-party libraries that take long to import (or need a GPU stack); only these are imported lazily
HEAVY = ("torch", "transformers", "trl", "peft", "vllm", "datasets", "accelerate", "sympy", "pandas", "scipy",
         "matplotlib", "safetensors", "tokenizers", "yaml", "gguf")


def _imports(tree, name: str, is_pkg: bool, files) -> tuple[set, set]:
    """(dsh modules, third-party top-level packages) imported by the statements ``tree`` holds."""
    dsh, ext = set(), set()
    for node in tree:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                mod = ".".join(base[:len(base) - node.level + 1] + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] == "dsh":
                dsh |= {f"{mod}.{a.name}" if f"{mod}.{a.name}" in files else mod for a in node.names}
            else:
                ext.add(mod.split(".")[0])
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "dsh":
                    dsh.add(a.name)
                else:
                    ext.add(a.name.split(".")[0])
    return dsh, ext


def lazy_light_imports(root: Path) -> list[str]:
    """Imports of dsh modules inside functions where the module imported is light: neither it nor anything it
    imports at its top imports a library of ``HEAVY``. Those belong at the top of the module."""
    files = {_module_name(p, root): p for p in sorted((root / "dsh").rglob("*.py"))}
    trees = {n: ast.parse(p.read_text()) for n, p in files.items()}
    top = {n: _imports(t.body, n, files[n].name == "__init__.py", files) for n, t in trees.items()}

    def heavy(n, seen):
        if n in seen:
            return False
        seen.add(n)
        parents = [".".join(n.split(".")[:i]) for i in range(1, n.count(".") + 1)]
        return bool(set(top[n][1]) & set(HEAVY)) or any(heavy(d, seen) for d in [*top[n][0], *parents] if d in top)

    bad = []
    for n, tree in trees.items():
        inner = [x for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) for x in ast.walk(f)]
        dsh, _ = _imports(inner, n, files[n].name == "__init__.py", files)
        bad += [f"{n} imports {d} inside a function" for d in sorted(dsh) if d in files and not heavy(d, set())]
    return bad


def test_dsh_modules_are_imported_at_module_top_unless_they_bring_a_heavy_library():
    assert lazy_light_imports(ROOT) == []


def test_the_lazy_import_check_catches_a_light_module_imported_inside_a_function(tmp_path):
    (tmp_path / "dsh" / "core").mkdir(parents=True)
    (tmp_path / "dsh" / "core" / "v.py").write_text("")
    (tmp_path / "dsh" / "core" / "h.py").write_text("import torch\n")
    (tmp_path / "dsh" / "core" / "a.py").write_text("def f():\n    from . import h, v\n")
    assert lazy_light_imports(tmp_path) == ["dsh.core.a imports dsh.core.v inside a function"]


@pytest.mark.parametrize("code", ["import dsh", "import dsh.experiment.run.gpu_small",
                                  "import runpy, sys\nsys.argv = ['dsh', '--help']\ntry:\n"
                                  "    runpy.run_module('dsh', run_name='__main__')\nexcept SystemExit:\n    pass"])
def test_import_dsh_and_the_cli_help_do_not_import_torch(code):
    probe = f"{code}\nimport sys\nprint(sorted(m for m in ('torch', 'transformers', 'trl', 'sympy') if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "[]", (code, r.stdout[-500:])


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


def test_no_test_sets_a_wall_clock_limit():
    """No test stops a call after so many seconds (a ``timeout=`` argument, a ``pytest.mark.timeout``) or waits a fixed
    time for a child to end: a test that fails under load is a defect. A child that must outlive the test's check
    waits for its kill (``signal.pause()``)."""
    found = []
    for p in sorted((ROOT / "tests").rglob("*.py")):
        src = p.read_text()
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Call) and any(k.arg == "timeout" for k in node.keywords):
                found.append(f"{p.name}:{node.lineno} timeout=")
            if isinstance(node, ast.Attribute) and node.attr == "timeout" and "mark" in ast.unparse(node.value):
                found.append(f"{p.name}:{node.lineno} pytest.mark.timeout")
        found += [f"{p.name}: a child's fixed sleep" for _ in re.findall(r"time\.sleep\(\d{2,}\)", src)]
    assert not found, found


@pytest.mark.skipif(shutil.which("ruff") is None and not (Path(sys.prefix) / "bin" / "ruff").exists(),
                    reason="ruff not installed")
def test_ruff_is_clean():
    ruff = shutil.which("ruff") or str(Path(sys.prefix) / "bin" / "ruff")
    r = subprocess.run([ruff, "check", "dsh", "tests"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:]


def test_every_train_config_field_has_help_and_train_help_lists_it():
    import dataclasses

    from dsh.training.train_config import FIELDS, TrainConfig
    assert all(len(f.metadata.get("help", "")) > 5 for f in dataclasses.fields(TrainConfig))
    r = subprocess.run([sys.executable, "-m", "dsh", "train", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    listed = re.findall(r"^  (\w+) \(default ", r.stdout, re.M)
    assert listed == list(FIELDS), set(FIELDS) ^ set(listed)


def test_the_readme_layout_names_every_module_in_its_layer():
    layout = (ROOT / "README.md").read_text().split("## Layout", 1)[1].split("\n## ", 1)[0]
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^- `dsh/(\w+)/`: (.*)$", layout, re.M)}
    assert set(rows) == set(LAYERS), set(rows) ^ set(LAYERS)
    for layer in LAYERS:
        on_disk = {p.relative_to(ROOT / "dsh" / layer).with_suffix("").as_posix()
                   for p in (ROOT / "dsh" / layer).rglob("*.py") if p.stem != "__init__"}
        named = set(re.findall(r"`(\w+(?:/\w+)*)` \(", rows[layer]))
        assert named == on_disk, (layer, named ^ on_disk)


def test_the_design_scripts_import_only_what_dsh_still_has():
    """The scripts that produced committed design results stay runnable: every ``from dsh... import name`` in them
    resolves on this tree (those in a ``logs/`` folder are kept as they were run, and are not checked)."""
    import importlib.util

    bad = []
    for f in sorted((ROOT / "book" / "results").rglob("*.py")):
        if "logs" in f.relative_to(ROOT).parts:
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "dsh":
                module = importlib.import_module(node.module)
                bad += [f"{f.name}: {node.module}.{a.name}" for a in node.names if not hasattr(module, a.name)
                        and importlib.util.find_spec(f"{node.module}.{a.name}") is None]
    assert bad == []


def test_make_check_does_not_import_a_module_marked_slow_as_a_whole(tmp_path):
    import conftest

    class Config:
        def __init__(self, expr):
            self.expr = expr

        def getoption(self, name, default=None):
            return self.expr

    slow, fast = tmp_path / "test_x.py", tmp_path / "test_y.py"
    slow.write_text("import pytest\n\npytestmark = pytest.mark.slow\n")
    fast.write_text("import pytest\n")
    assert conftest.pytest_ignore_collect(slow, Config("not slow and not full")) is True
    for expr in ("slow", "not full", "slow or not full", ""):
        assert conftest.pytest_ignore_collect(slow, Config(expr)) is None, expr
    assert conftest.pytest_ignore_collect(fast, Config("not slow and not full")) is None
