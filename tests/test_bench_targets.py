"""The sampling targets against the bounds measured in the same bench run (dsh.experiment.bench.targets)."""

import pytest

from dsh.experiment.bench import compare as bench
from dsh.experiment.bench import targets
from dsh.experiment.bench.baselines import CT2_PATH
from dsh.experiment.bench.reference import REFERENCE_PATH


def _row(path, rep, tps, serial_s=None, roof_s=None, rows=256, tokens=1000):
    r = {"path": f"{path}, {rows} rows", "rows": rows, "repeat": rep, "tokens_per_s": tps, "generated_tokens": tokens,
         "ratio_to_generate": 1.0}
    if serial_s is not None:
        r["roofline_at_step_shapes"] = {"serial_s": serial_s}
        r["roofline"] = {"roofline_s": roof_s}
    return r


def _run(ref_tps, ct2_tps, rep=0):
    """One repeat: the engine's two caches (float16's bound the higher: fewer bytes read), the two baselines, and
    a 32-row row that must not count."""
    return [_row("dsh engine, CPU path (C kernels)", rep, 300.0, serial_s=0.02, roof_s=0.01),      # 50k / 100k
            _row("dsh engine, CPU path, float16 KV cache", rep, 400.0, serial_s=0.016, roof_s=0.01),  # 62.5k
            _row(REFERENCE_PATH, rep, ref_tps), _row(CT2_PATH, rep, ct2_tps),
            _row(REFERENCE_PATH, rep, 1.0, rows=32)]


def test_targets_are_multiples_of_the_baselines_set_against_the_highest_engine_bound():
    got = targets.sampling_targets(_run(ref_tps=25_000.0, ct2_tps=25_000.0))
    ref, ct2 = got
    assert (ref["baseline"], ref["multiple"], ct2["baseline"], ct2["multiple"]) == (REFERENCE_PATH, 2.0, CT2_PATH, 3.0)
    assert ref["target_tokens_per_s"] == 50_000.0 and ct2["target_tokens_per_s"] == 75_000.0
    # the bound of the float16 path (1,000 tokens in a serial 0.016 s), not the float32 path's 50k
    assert ref["serial_bound_tokens_per_s"] == pytest.approx(62_500.0)
    assert ref["bound_path"].startswith("dsh engine, CPU path, float16")
    assert ref["target_share_of_serial_bound"] == pytest.approx(0.8)
    assert ct2["target_share_of_serial_bound"] == pytest.approx(1.2)
    assert ct2["target_share_of_roofline"] == pytest.approx(0.75)
    assert ref["engine_tokens_per_s"] == 400.0 and ref["engine_share_of_target"] == pytest.approx(400 / 50_000)


def test_target_rows_take_medians_over_repeats_and_count_those_over_the_bound():
    runs = _run(20_000.0, 15_000.0, 0) + _run(35_000.0, 25_000.0, 1) + _run(30_000.0, 10_000.0, 2)
    ref, ct2 = targets.target_rows(runs)
    assert ref["part"] == "tiny targets" and ref["path"] == f"2x {REFERENCE_PATH}, 256 rows"
    assert ref["value"] == 60_000.0 and ref["share of ceiling"] == pytest.approx(0.96)
    assert ref["over_bound"] == 1                  # 70k of 62.5k; 40k and 60k under it
    assert ct2["value"] == 45_000.0 and ct2["over_bound"] == 1
    assert ct2["measure"].startswith("target tokens/s (median of 3")
    # the tiny table carries them after the sampling rows
    table = bench.tiny_table({"sampling": runs, "evaluation": [], "grpo": [], "training": []})
    assert [r["path"] for r in table if r["part"] == "tiny targets"] == [ref["path"], ct2["path"]]


def test_no_row_without_an_engine_bound_or_a_baseline_and_bad_input_named():
    assert targets.sampling_targets([_row(REFERENCE_PATH, 0, 5.0)]) == []        # no engine row with a bound
    engine_only = [r for r in _run(1.0, 1.0) if r["path"].startswith("dsh engine")]
    assert targets.sampling_targets(engine_only) == []
    with pytest.raises(ValueError, match="sampling must be"):
        targets.sampling_targets({"sampling": []})
    with pytest.raises(ValueError, match="rows must be an integer >= 1"):
        targets.sampling_targets([], rows=0)
