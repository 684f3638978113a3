import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def pytest_ignore_collect(collection_path, config):
    """A module marked slow as a whole (``pytestmark = pytest.mark.slow``) is not imported at all when the marker
    expression leaves slow tests out (`make check`): its imports (torch, transformers, TRL) would otherwise cost
    every pytest-xdist worker seconds for no test. Any other expression collects it as usual."""
    expr = config.getoption("markexpr", "")
    if collection_path.suffix != ".py" or not expr or not collection_path.name.startswith("test_"):
        return None
    try:
        from _pytest.mark.expression import Expression
        wants_slow = Expression.compile(expr).evaluate(lambda name, **kw: name == "slow")
    except Exception:   # another pytest: collect as usual
        return None
    if not wants_slow and "\npytestmark = pytest.mark.slow" in collection_path.read_text():
        return True
    return None
