"""The one reuse rule (dsh.core.store): an artifact is reused exactly when its record holds the key asked for, field by
field as JSON reads both back; and it is the only rule the steps use (the source says so)."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from dsh.core import store
from dsh.measure.length_law import median

DSH = Path(__file__).resolve().parents[1] / "dsh"


def test_a_record_is_made_from_its_key_and_from_no_other():
    key = {"step": "probe", "weights": "ab" * 32, "levels": ("1x2", "1x3"), "seed": 0, "out": Path("x")}
    record = {**store.as_json(key), "results": [1, 2, 3]}           # fields beyond the key are not compared
    assert store.made_from(record, key) and store.differences(record, key) == []
    for field, other in (("weights", "cd" * 32), ("levels", ["1x3", "1x2"]), ("seed", 1), ("out", "y")):
        assert store.differences(record, {**key, field: other}) == [field]
    assert store.differences({k: x for k, x in record.items() if k != "seed"}, key) == ["seed"]
    assert store.differences(None, key) == sorted(key) and not store.made_from([1], key)


def test_reusable_reads_the_record_and_refuses_a_missing_broken_or_other_one(tmp_path):
    key = {"settings": {"t": 1.0}, "weights": "w"}
    path = tmp_path / "probe.json"
    assert store.reusable(path, key) is None                          # nothing there
    path.write_text("{not json")
    assert store.reusable(path, key) is None
    path.write_text("[1, 2]")
    assert store.reusable(path, key) is None
    path.write_text(json.dumps({**key, "kappa": 0.9}))
    assert store.reusable(path, key)["kappa"] == 0.9
    assert store.reusable(path, {**key, "settings": {"t": 0.5}}) is None


def test_a_gzipped_record_is_read_alike_and_a_cut_or_plain_one_is_no_record(tmp_path):
    from dsh.core.files import read_json, write_json_gz

    key = {"settings": {"t": 1.0}, "weights": "w"}
    path = tmp_path / "study.json.gz"
    write_json_gz(path, {**key, "rows": [0.1, 1e-12, 3]})
    first = path.read_bytes()
    assert store.reusable(path, key)["rows"] == [0.1, 1e-12, 3] == read_json(path)["rows"]
    write_json_gz(path, {**key, "rows": [0.1, 1e-12, 3]})
    assert path.read_bytes() == first                                 # no name or time in the header
    path.write_bytes(first[: len(first) // 2])                        # cut short
    assert store.read_record(path) is None and store.reusable(path, key) is None
    path.write_text(json.dumps(key))                                  # a plain file under a .gz name
    assert store.read_record(path) is None
    assert [p.name for p in tmp_path.iterdir()] == ["study.json.gz"]   # nothing half-written beside it


def test_the_key_digest_names_the_key_whatever_its_order_and_only_it():
    a = {"weights": "w", "k": 2, "problems": [[1, 2], [3, 4]]}
    b = {"problems": ((1, 2), (3, 4)), "k": 2, "weights": "w"}
    assert store.key_digest(a) == store.key_digest(b)
    assert re.fullmatch(r"[0-9a-f]{64}", store.key_digest(a))
    assert store.key_digest({**a, "k": 3}) != store.key_digest(a)


def _sources():
    return {p.relative_to(DSH).as_posix(): p.read_text() for p in DSH.rglob("*.py")}


def test_one_function_digests_weights_and_every_reuse_check_goes_through_the_store():
    src = _sources()
    hashes_weights = [f for f, s in src.items() if re.search(r"safetensors", s) and "hashlib" in s]
    assert hashes_weights == ["llm/models.py"], hashes_weights
    assert sum(s.count("def weights_digest(") for s in src.values()) == 1
    # the modules that decide whether an artifact is reused, each through dsh.core.store
    for f in ("experiment/run/steps.py", "experiment/run/evaluate.py", "experiment/run/folders.py",
              "experiment/run/attribution_study.py", "training/run_dir.py", "training/own_attempts.py"):
        assert "from ...core import store" in src[f] or "from ..core import store" in src[f], f
        assert "store." in src[f], f
    # no record compared to a key by hand
    hand = [f for f, s in src.items() if re.search(r"json\.loads\([^)]*read_text\(\)\)\s*[!=]=", s)]
    assert hand == [], hand


@pytest.mark.parametrize("n", [1, 2, 3, 10, 11, 40])
def test_the_bootstrap_median_is_numpys(n):
    rng = np.random.default_rng(n)
    for _ in range(50):
        x = rng.standard_normal(n) * 10.0 ** rng.integers(-4, 4)
        x[rng.random(n) < 0.2] = np.inf
        assert median(x) == float(np.median(x)) and median(list(x)) == float(np.median(x))

