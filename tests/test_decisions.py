"""The products' decisions kept on disk per machine (dsh.llm.decisions): a later process reads them instead of measuring
again, the file's key changes with what decides a library's code, and a bad file or folder never stops a product."""

import json

import pytest
import torch

from dsh.llm import decisions, products


@pytest.fixture
def new_process(tmp_path, monkeypatch):
    """A cache folder of its own; ``start()`` forgets every decision this process holds, as a new process would."""
    monkeypatch.setenv("DSH_CACHE", str(tmp_path))

    def start():
        for name in ("_FASTER", "_AGREES", "_SPLITS"):
            monkeypatch.setattr(products, name, {})
        monkeypatch.setattr(products, "_TAKEN", set())
        monkeypatch.setattr(decisions, "_READ", {})
        monkeypatch.setattr(decisions, "_PENDING", set())

    start()
    return start


def _decide_all(shape=(40, 24), rows=16):
    out = {n: products.split_at("linear", *shape, n, rows) for n in range(1, rows + 1)}
    out.update({("onednn", n): products.uses_onednn(*shape, n, rows) for n in range(1, rows + 1)})
    return out


def test_a_later_process_reads_the_decisions_without_measuring(new_process, monkeypatch):
    first = _decide_all()
    decisions.flush()
    stored = json.loads(decisions.path().read_text())
    assert len(stored["splits"]) == 16 and len(stored["faster"]) >= (1 if products.onednn_available() else 0)
    assert decisions.stored() == sum(map(len, stored.values()))
    new_process()

    def measured(*a, **k):
        raise AssertionError("measured again")

    monkeypatch.setattr(products, "split_of", measured)
    monkeypatch.setattr(products, "clearly_faster", measured)
    monkeypatch.setattr(products.torch, "equal", measured)
    asked = []
    recall = decisions.recall
    monkeypatch.setattr(decisions, "recall", lambda *a: asked.append(a) or recall(*a))
    assert _decide_all() == first
    assert not decisions._PENDING                      # nothing new to write
    assert not asked                    # each table's stored decisions taken at its first miss, none asked one by one


def test_without_a_file_each_decision_is_measured(new_process, monkeypatch):
    calls = []
    real = products.split_of
    monkeypatch.setattr(products, "split_of", lambda *a: calls.append(1) or real(*a))
    _decide_all()
    assert len(calls) == 16


def test_the_file_is_per_thread_count_and_library_environment(new_process, monkeypatch):
    was = torch.get_num_threads()
    here = decisions.path()
    try:
        torch.set_num_threads(was + 1)
        assert decisions.path() != here
    finally:
        torch.set_num_threads(was)
    assert decisions.path() == here
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX2")
    assert decisions.path() != here
    monkeypatch.setenv("DSH_UNRELATED", "1")
    monkeypatch.delenv("MKL_ENABLE_INSTRUCTIONS")
    assert decisions.path() == here


def test_a_flush_keeps_what_another_process_wrote(new_process):
    p = decisions.path()
    p.parent.mkdir(parents=True)
    p.write_text(json.dumps({"faster": [[1, 2, 3, True]], "splits": [["linear", 5, 6, 7, 8, 4]]}))
    decisions.remember("splits", ("linear", 5, 6, 7, 8), 0)          # decided here meanwhile: the file's is kept
    decisions.remember("agrees", (9, 9, 9), False)
    decisions.flush()
    stored = json.loads(p.read_text())
    assert stored == {"faster": [[1, 2, 3, True]], "agrees": [[9, 9, 9, False]], "splits": [["linear", 5, 6, 7, 8, 4]],
                      "sgemm": [], "packed": [], "parts": [], "panels": []}
    assert decisions.recall("splits", ("linear", 5, 6, 7, 8)) == 4
    assert not [f for f in p.parent.iterdir() if f.name.startswith(".decisions-")]


def test_a_bad_file_counts_as_empty_and_is_replaced(new_process):
    p = decisions.path()
    p.parent.mkdir(parents=True)
    p.write_text('{"splits": [["linear", 40')
    assert decisions.recall("splits", ("linear", 40, 24, 3, 16)) is decisions.MISSING and decisions.stored() == 0
    first = _decide_all()
    decisions.flush()
    assert len(json.loads(p.read_text())["splits"]) == 16
    assert first == _decide_all()


def test_an_unwritable_folder_keeps_the_decisions_in_the_process(new_process, tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("DSH_CACHE", str(tmp_path / "a-file"))
    first = _decide_all()
    decisions.flush()                                   # no error
    assert not decisions._PENDING
    assert _decide_all() == first


def test_a_bad_table_name_is_refused():
    with pytest.raises(ValueError, match="table must be one of faster, agrees, splits, sgemm, packed, parts, panels; got 'fast'"):
        decisions.recall("fast", (1,))
    with pytest.raises(ValueError, match="table must be one of"):
        decisions.remember("fast", (1,), True)


def test_after_the_engines_plan_a_generate_makes_no_decision(new_process, monkeypatch):
    """``Engine.plan`` decides the C step's products at every row count up to its slots, so that a generate whose rows
    end one after another (its row count falling through most counts) finds every decision made."""
    from tiny_llamas import gqa_llama

    from dsh.llm.engine import Engine

    for name in ("_SGEMM", "_PACKED", "_PANELS", "_PARTS"):
        monkeypatch.setattr(products, name, {})
    eng = Engine(gqa_llama(), [11], slots=8, max_len=40, attention="kernels")
    eng.plan()
    made = decisions.stored()
    assert made >= 8                                  # at least one a row count
    eng.generate([[1, 2, 3] * k for k in range(1, 11)], 4, temperature=0)   # 8 rows, then 10 prompts' tails
    decisions.flush()
    assert decisions.stored() == made
