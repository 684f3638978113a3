"""`python -m dsh bench` on CPU: every part measured side by side, written as JSON, in under 2 minutes."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from dsh.core.files import read_jsonl
from dsh.core.provenance import cpu_flags
from dsh.experiment.bench import attribution as bench_attribution
from dsh.experiment.bench import baselines
from dsh.experiment.bench import compare as bench
from dsh.experiment.bench import host as bench_host
from dsh.experiment.bench import tiny as bench_tiny
from dsh.experiment.run import presets

pytestmark = pytest.mark.slow   # loads or trains the embedded model (make check leaves it out)

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.full   # make test-all: the whole CPU bench (~150 s); its arithmetic and bad input stay in make test
def test_bench_cli_on_cpu(tmp_path):
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, "-m", "dsh", "bench", "--json", "--out", str(out)], capture_output=True,
                       text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    assert res == json.loads(out.read_text())
    assert res["size"] == "cpu" and res["commit"] and res["hardware"]["torch"]
    assert res["device"]["bandwidth_bytes_per_s"] > 1e8 and res["device"]["matmul_peak_flops"] > 1e8
    gen = {x["path"]: x for x in res["generation"]}
    assert set(gen) == {"transformers generate (default cache)", "dsh engine"}
    for x in gen.values():
        assert x["useful_tokens"] > 0 and x["tokens_per_s"] > 0
        assert 0 < x["share_of_ceiling"] <= 1                 # nothing beats the bandwidth bound
    assert res["generation"][0]["ratio_to_default"] == 1.0
    sft = res["sft"]
    assert len(sft) == 2 and sft[1]["padding_share"] == pytest.approx(0, abs=1e-9) and sft[0]["padding_share"] > 0
    assert all(0 < x["mfu"] < 1 and x["real_tokens"] > 0 for x in sft)
    grpo = res["grpo"]
    assert [x["backend_used"] for x in grpo] == ["trl", "dsh"]
    assert all(0 < x["generation_s_per_step"] < x["seconds_per_step"] for x in grpo)
    tiny = res["tiny"]
    peaks = tiny["device"]
    assert all(peaks[k] == max(m[k] for m in tiny["device_measurements"]) for k in peaks)   # the stricter roofline
    assert peaks["library_peak_flops"] == max(peaks["matmul_peak_flops"], peaks.get("onednn_matmul_flops", 0))
    assert peaks.get("fma_issue_flops", 0) > 0 and isinstance(tiny["cpu_flags"], list)
    samp, paths = tiny["sampling"], bench_tiny.sampling_paths()
    assert [x["path"].rsplit(",", 1)[0] for x in samp[:len(paths)]] == list(paths)
    assert paths[:3] == bench_tiny.SAMPLING_PATHS
    for x in samp:
        assert x["minor_page_faults"] >= 0 and x["load_1min"] >= 0 and x["loaded"] == bench_host.loaded(x["load_1min"])
        if x["path"].startswith(bench_tiny.HALF_PATH):          # the same streams as the float32 cache's run
            assert 0 <= x["identical_to_float32_cache"] <= 1
            assert x["roofline"]["kv_bytes"] < samp[samp.index(x) - 1]["roofline"]["kv_bytes"] or \
                x["generated_tokens"] != samp[samp.index(x) - 1]["generated_tokens"]
    for x in samp:
        assert x["generated_tokens"] > 0 and x["tokens_per_s"] > 0
        assert 0 < x["share_of_roofline"] <= x["share_of_serial_bound"] <= 1     # nothing beats the roofline
        assert x["roofline"]["roofline_s"] == max(x["roofline"]["matmul_s"], x["roofline"]["kv_read_s"])
        shapes = x["roofline_at_step_shapes"]                 # the same work, products at the step's own rate
        assert x["step_matmul_flops"] > 0 and shapes["flops"] == x["roofline"]["flops"]
        assert shapes["matmul_s"] == pytest.approx(shapes["flops"] / x["step_matmul_flops"])
        assert x["share_of_serial_bound_at_step_shapes"] == pytest.approx(shapes["serial_s"] / x["seconds"])
    assert [x["ratio_to_generate"] for x in samp[::len(paths)]] == [1.0] * (len(samp) // len(paths))
    if baselines.HEAP_PATH in paths:                                 # glibc: generate with its freed memory kept
        kept = [x for x in samp if x["path"].startswith(baselines.HEAP_PATH)]
        assert kept and all(x["ratio_to_generate_heap_kept"] == 1.0 for x in kept)
        assert all(x["ratio_to_generate_heap_kept"] > 0 for x in samp)
    if baselines.CT2_PATH in paths:                                   # CTranslate2 installed: a second baseline
        ct2 = [x for x in samp if x["path"].startswith(baselines.CT2_PATH)]
        assert ct2 and all(x["ratio_to_ctranslate2"] == 1.0 and x["ctranslate2"] for x in ct2)
    grpo = tiny["grpo"]
    gpaths = bench_tiny.grpo_paths()
    assert [x["path"] for x in grpo] == list(gpaths) and len(gpaths) == (6 if "avx512_bf16" in cpu_flags() else 5)
    assert [x["backend_used"] for x in grpo] == ["dsh", "trl"] + ["dsh"] * (len(gpaths) - 2)
    assert grpo[0]["ratio_to_before"] == 1.0
    assert [x["completions_per_round"] for x in grpo] == [32] + [256] * (len(gpaths) - 1)
    assert [x["packed_attention"] for x in grpo] == ["torch"] * 3 + ["kernels"] + ["fused"] * (len(gpaths) - 4)
    assert all(x["rollout_kv_cache"] == bench_host.fast_paths()["rollout_kv_cache"] for x in grpo[3:])
    assert [x["update_precision"] for x in grpo] == ["float32"] * 5 + ["bfloat16"] * (len(gpaths) - 5)
    for x in grpo:
        assert x["rollouts"] == 8 * 32 and x["rollouts_per_s"] > 0
        assert x["rollout_tokens_per_s"] == pytest.approx(x["rollouts_per_s"] * x["mean_completion_tokens"])
        assert x["token_ratio_to_before"] == pytest.approx(
            x["ratio_to_before"] * x["mean_completion_tokens"] / grpo[0]["mean_completion_tokens"])
        assert x["generation_s"] > 0 and x["update_s"] > 0 and x["scoring_s"] >= 0 and x["other_s"] > -0.5
    ev = tiny["evaluation"]
    assert [x["questions"] for x in ev] == [7 * 4] * 4 and ev[0]["time_share_of_before"] == 1.0
    assert ev[3]["path"].endswith("its own process") and ev[3]["products_decisions_made"] >= 0
    assert ev[0]["identical_responses"] == 1 and all(0 <= x["identical_responses"] <= 1 for x in ev)
    attr = tiny["attribution"]          # the attribution routes: one repeat, the same 7 traces by both
    assert [x["path"] for x in attr] == list(bench_attribution.ROUTES) and {x["trajectories"] for x in attr} == {7}
    assert attr[1]["ratio_to_one_at_a_time"] == pytest.approx(attr[0]["seconds"] / attr[1]["seconds"])
    diff = attr[1]["norm_difference"]           # float rounding; the KL terms' the most (bench.attribution)
    assert 0 <= diff["median"] < 1e-4 and diff["median"] <= diff["largest"] < 1e-2
    assert all(x["trajectories_per_s"] > 0 for x in attr)
    att = tiny["attention"]             # the decode attention alone: 32 rows at 20 and 40 positions, each cache dtype
    assert [x["context"] for x in att][::len(att) // 2] == [20, 40] and {x["rows"] for x in att} == {32}
    for x in att:
        assert x["kv_bytes_per_call"] == 32 * (x["context"] + 1) * 4 * 32 * 2 * (4 if x["kv_cache"] == "float32" else 2)
        assert x["bytes_per_s"] == pytest.approx(x["kv_bytes_per_call"] / x["seconds_per_call"])
        assert x["share_of_read_bandwidth"] == pytest.approx(x["bytes_per_s"] / peaks["read_bandwidth_bytes_per_s"])
        assert x["read_bandwidth_beside"] > 0                       # measured just before and after it
        assert x["share_of_read_bandwidth_beside"] == pytest.approx(x["bytes_per_s"] / x["read_bandwidth_beside"])
    prod = tiny["products"]             # the step's products inside full steps and alone: rows 8 and 32, 3 repeats
    assert [x["rows"] for x in prod] == [8] * 3 + [32] * 3
    for x in prod:
        assert 0 < x["full_steps"] <= x["steps"] and x["products_flops"] > 0 and x["tokens_per_s"] > 0
        assert x["best_flops"] >= max(x["mkl_flops"], x.get("onednn_flops", 0), x.get("mkl_packed_flops", 0)) * (1 - 1e-9)
        assert x["share_of_best_library"] == pytest.approx(x["products_flops"] / x["best_flops"])
        assert x["attention_bytes_per_s"] > 0 and x["run_s"] > 0      # the attention timed in the same steps
        assert 0 < x["products_share_of_run"] and 0 < x["attention_share_of_run"]
        assert x["products_share_of_run"] + x["attention_share_of_run"] < 1     # parts of the run, not all of it
    train = tiny["training"]
    assert all(x["tokens_per_s"] > 0 and 0 < x["share_of_peak"] < 1 for x in train)
    assert train[0]["ratio_to_default"] == 1.0 and len(train) == 5 and "packed attention in C" in train[2]["path"]
    assert "(fused)" in train[3]["path"]
    table = r.stderr[r.stderr.index("dsh bench ("):]
    for x in bench.table(res):
        assert x["path"][:69] in table


@pytest.mark.parametrize("hw, want", [
    ({"cpu": "AMD EPYC", "cpu_id": {"vendor": "AuthenticAMD", "family": 25, "model": 17, "stepping": 1}, "cpus": 2,
      "cpu_flags": ["avx2", "fma", "avx512f"]}, "AMD EPYC, family 25 model 17, 2 CPUs, avx2 fma avx512f"),
    ({"cpu": None, "cpu_id": {"implementer": 0x41, "part": 0xD0C}, "cpus": 4, "cpu_flags": ["asimd"]},
     "cpu, part 0xd0c, 4 CPUs, asimd"),
    ({"cpu": "Intel Xeon", "cpus": 2, "cpu_flags": []}, "Intel Xeon, 2 CPUs"),      # a record made before cpu_id
    ({"cpu": "AMD EPYC", "gpu": "NVIDIA H100 80GB HBM3", "cpu_id": {"family": 25}}, "NVIDIA H100 80GB HBM3"),
])
def test_the_printed_table_names_the_machine(hw, want):
    """The first line of ``dsh bench``'s table says which machine measured it: its GPU, else its CPU as the result's
    hardware record has it (committed results from before the CPU's family and model were recorded included)."""
    assert bench.machine(hw) == want
    result = {"size": "cpu", "hardware": hw, "wall_s": 1.0, "parts": []}
    assert bench.format_table(result).splitlines()[0] == f"dsh bench (cpu, {want}, 1.0 s)"


def test_kv_ceiling_arithmetic():
    # 512 rows at 1000 tokens of context, 23,040 bytes a token, 0.27 GB of weights, 3 TB/s
    c = bench.kv_ceiling({"bandwidth": 3e12, "weight_bytes": 0.27e9, "batch": 512, "context": 1000,
                          "kv_bytes_per_token": 23_040})
    assert c == pytest.approx(3e12 / (0.27e9 / 512 + 1000 * 23_040))
    assert 100_000 < c < 200_000


def test_sampling_roofline_arithmetic():
    """One row of prompt 3 and completion 3: forward positions 0..4 attend 1..5 positions (15 in all), the two
    positions after the prompt read 4 + 5 positions of KV."""
    from dsh.llm import roofline

    shape = {"matmul_params": 1000, "layers": 2, "attention_width": 8, "kv_bytes_per_token": 64}
    r = roofline.sampling_roofline(shape, [3], [3], peak_flops=1e6, read_bandwidth=1e3)
    assert r["flops"] == 2 * 1000 * 5 + 4 * 8 * 2 * 15
    assert r["kv_bytes"] == 64 * (4 + 5)
    assert r["matmul_s"] == pytest.approx(r["flops"] / 1e6) and r["kv_read_s"] == pytest.approx(64 * 9 / 1e3)
    assert r["roofline_s"] == r["kv_read_s"] and r["bound_by"] == "KV read"
    assert r["serial_s"] == pytest.approx(r["matmul_s"] + r["kv_read_s"])
    one = roofline.sampling_roofline(shape, [5], [1], 1e6, 1e3)
    assert one["kv_bytes"] == 0                                          # a lone first token reads no cache


def test_bad_input_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="^size must be one of auto, cpu, gpu"):
        bench.run(size="tpu")
    with pytest.raises(ValueError, match="^parts\\[i\\] must be one of generation, sft, grpo, tiny"):
        bench.run(parts=["generation", "ppo"])
    with pytest.raises(ValueError, match="^out must be a file path; .* is a folder"):
        bench.run(out=str(tmp_path))
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(ValueError, match="^out cannot be written: .*a_file is a file"):     # refused before measuring
        bench.run(out=str(tmp_path / "a_file" / "bench.json"))


@pytest.mark.slow   # two child processes load torch and the shipped base (~18 s)
def test_generate_in_a_heap_keeping_process_takes_fewer_fresh_pages():
    """model.generate of 64 rows x 120 tokens in a child process: with glibc told to keep freed memory (the bench's
    setting) it takes far fewer fresh pages (minor faults) than with the allocator's thresholds at their documented
    defaults, and writes the same completions (the same seed). Fails if the setting did not reach the child."""
    from dsh.llm.models import load
    from dsh.training.laptop_base import SHIPPED_BASE

    if not baselines.heap_kept_available():
        pytest.skip("the C library is not glibc")
    _, tok = load(str(SHIPPED_BASE))
    prompts = bench_tiny._ladder_prompts(tok, 64, seed=0)
    _, gen_kept, kept = baselines.run_generate_heap_kept(prompts, 64, 120, seed=1)
    default = {"MALLOC_MMAP_THRESHOLD_": str(128 * 1024), "MALLOC_TRIM_THRESHOLD_": str(128 * 1024)}
    _, gen_plain, plain = baselines.run_generate_heap_kept(prompts, 64, 120, seed=1, env=default)
    assert gen_kept == gen_plain and sum(gen_kept) > 64 * 10
    print("minor faults, heap kept vs defaults:", kept, plain)
    assert kept < plain / 3, (kept, plain)


@pytest.mark.slow   # a child process converts the shipped base and samples it with CTranslate2 (~10 s)
def test_ctranslate2_samples_the_shipped_base_like_the_engine():
    """CTranslate2 (where installed) writes completions of the shipped base whose lengths follow the engine's on the
    same prompts: the same model and sampling protocol, so the mean completion length agrees within 15 % (fails if the
    conversion, the token mapping, the end token or the temperature were wrong: the base then writes garbage to the
    limit or stops at once)."""
    if not baselines.ctranslate2_available():
        pytest.skip("CTranslate2 is not installed")
    from dsh.llm.models import load
    from dsh.training.laptop_base import SHIPPED_BASE

    model, tok = load(str(SHIPPED_BASE))
    prompts = bench_tiny._ladder_prompts(tok, 128, seed=0)
    with tempfile.TemporaryDirectory() as d:
        _, gen, _, version = baselines.run_ctranslate2(prompts, 32, 200, seed=1, converted=Path(d) / "ct2")
    _, toks = bench_tiny._run_engine(model, tok, prompts, 32, 200, 1, "kernels")
    engine = [len(t) for t in toks]
    assert version and len(gen) == len(prompts) and max(gen) < 200
    assert abs(sum(gen) / sum(engine) - 1) < 0.15, (sum(gen), sum(engine))


def test_a_baseline_that_fails_is_left_out_and_the_sampling_part_goes_on(monkeypatch, capsys):
    """CTranslate2 installed but failing (a model it cannot convert): its row is left out with a one-line reason on
    stderr, tried once, and every other path is measured."""
    calls = []

    def broken(*a, **k):
        calls.append(1)
        raise RuntimeError("a bench baseline's process failed: ['ValueError: unsupported model']")

    monkeypatch.setattr(bench_tiny, "ctranslate2_available", lambda: True)
    monkeypatch.setattr(bench_tiny, "run_ctranslate2", broken)
    size = bench_tiny.dataclasses.replace(bench_tiny.TINY_SIZES["cpu"], rows=(8,), repeats=2, max_new=8)
    rows = bench_tiny.sampling_rows(size)
    paths = {r["path"].rsplit(",", 1)[0] for r in rows}
    assert baselines.CT2_PATH not in paths and bench_tiny.SAMPLING_PATHS[2] in paths and len(calls) == 1
    assert len(rows) == 2 * (len(bench_tiny.sampling_paths()) - 1)
    assert f"dsh bench: {baselines.CT2_PATH} left out: a bench baseline's process failed" in capsys.readouterr().err


@pytest.mark.parametrize("before,after", [(100e9, 200e9), (200e9, 100e9)])
def test_the_step_shapes_rate_is_the_faster_of_two_measurements(before, after, monkeypatch):
    """The rate of the step's shapes alone, which sets the serial bound at those shapes, is measured before a row
    count's repeats and after them, and every row of that count carries the faster: a host slow through one
    measurement (one run measured half the rate of the day's others) does not raise the bound."""
    measured = iter([before, after])
    monkeypatch.setattr(bench_tiny, "library_rates", lambda model, rows: {"best_flops": next(measured)})
    monkeypatch.setattr(bench_tiny, "ctranslate2_available", lambda: False)
    size = bench_tiny.dataclasses.replace(bench_tiny.TINY_SIZES["cpu"], rows=(8,), repeats=1, max_new=8)
    rows = bench_tiny.sampling_rows(size)
    assert rows and all(r["step_matmul_flops"] == 200e9 for r in rows)


@pytest.mark.slow
def test_the_reference_commit_runs_its_own_paths_from_a_worktree(tmp_path):
    """dsh at the reference commit, from a worktree that is gone afterwards, in processes that import its own
    modules: its engine draws from the same counted streams as today's float32 CPU path (the same completion lengths
    on the same prompts), its evaluation answers the laptop ladder, its GRPO preset path trains from a given policy;
    a workload it does not have is refused."""
    from dsh.experiment.bench import reference
    from dsh.llm.models import load
    from dsh.training.laptop_base import SHIPPED_BASE

    why = reference.unavailable()
    if why:
        pytest.skip(f"the reference cannot run here: {why}")
    model, tok = load(str(SHIPPED_BASE))
    prompts = bench_tiny._ladder_prompts(tok, 8, seed=0)
    with reference.Reference(tmp_path) as ref:
        assert (ref.path / "dsh" / "experiment" / "bench_tiny.py").is_file()      # its own layout, not today's
        got = ref.run("sampling", prompts=prompts, rows=8, max_new=24, seed=3)
        _, toks = bench_tiny._run_engine(model, tok, prompts, 8, 24, 3, "kernels")
        assert got["seconds"] > 0 and got["gen"] == [len(t) for t in toks]
        ev = ref.run("evaluation", out=str(tmp_path / "eval.jsonl"), n_per_level=2, seed=0)
        recs = read_jsonl(tmp_path / "eval.jsonl")
        assert ev["seconds"] > 0 and len(recs) == 2 * len(presets.LAPTOP.evaluation.levels)
        g = ref.run("grpo", policy=str(SHIPPED_BASE), out=str(tmp_path / "grpo"), steps=1, max_completion=16, seed=0)
        assert g["global_step"] == 1 and g["rollouts"] > 0 and g["update_s"] > 0
        with pytest.raises(ValueError, match="^what must be one of sampling, evaluation, grpo"):
            ref.run("training")
    assert not ref.path.exists()


def test_the_tiny_table_reports_medians_over_the_repeats_and_counts_the_loaded_ones():
    """Sampling and evaluation rows of the tiny table are medians over their repeats (a repeat that ran beside other
    work counted in ``loaded``); against the reference, the median of the repeats' ratios; a run above the CPUs'
    count plus a half is loaded."""
    rates, loads = [10.0, 30.0, 20.0, 50.0, 40.0], [0.5, 0.9, 9.0, 1.1, 1.0]
    samp = [{"path": "p, 8 rows", "tokens_per_s": x, "ratio_to_generate": x / 10, "share_of_roofline": x / 100,
             "ratio_to_reference": x / 20, "loaded": bench_host.loaded(ld)} for x, ld in zip(rates, loads)]
    ev = [{"path": "e", "seconds": s, "time_share_of_before": s / 4, "time_share_of_reference": s / 2,
           "loaded": False} for s in (1.0, 3.0, 2.0)]
    attr = [{"path": p, "trajectories_per_s": t, "loaded": False, **({"ratio_to_one_at_a_time": t / b} if b else {})}
            for p, t, b in (("one", 10.0, None), ("packed", 16.0, 10.0), ("one", 12.0, None), ("packed", 15.0, 12.0),
                            ("one", 8.0, None), ("packed", 14.0, 8.0))]
    rows = bench.tiny_table({"sampling": samp, "evaluation": ev, "grpo": [], "training": [], "attribution": attr})
    s, e, one, packed = rows
    assert one["value"] == 10.0 and one["ratio to default"] == 1.0 and one["part"] == "tiny attribution"
    assert packed["value"] == 15.0 and packed["ratio to default"] == 1.6 and packed["measure"].endswith("(median of 3)")
    assert s["value"] == 30.0 and s["ratio to default"] == 3.0 and s["x reference"] == 1.5 and s["loaded"] == 1
    assert s["measure"].startswith("tokens/s (median of 5")
    assert e["value"] == 2.0 and e["ratio to default"] == 0.5 and e["x reference"] == 1.0 and e["loaded"] == 0
    assert bench_host.loaded((os.cpu_count() or 1) + 0.6) and not bench_host.loaded(0.1)
    grpo = [{"path": p, "rollouts_per_s": x, "ratio_to_before": x, "ratio_to_reference": x / 2, "update_s": u,
             "update_ratio_to_reference": 4 / u} for p, x, u in (("fast", 6.0, 2.0), ("ref", 2.0, 4.0), ("fast", 4.0, 1.0),
                                                                  ("ref", 2.0, 4.0), ("fast", 5.0, 4.0))]
    g_fast, g_ref, u_fast, _ = bench.tiny_table({"sampling": [], "evaluation": [], "grpo": grpo, "training": []})
    assert g_fast["value"] == 5.0 and g_fast["x reference"] == 2.5 and g_fast["measure"].endswith("(median of 3)")
    assert g_ref["value"] == 2.0 and u_fast["value"] == 2.0 and u_fast["x reference"] == 2.0


def test_the_tiny_table_puts_the_attention_in_the_step_against_the_read_bandwidth():
    """The products' rows: the attention's cache bytes/s inside the full steps (median over the repeats) as a share
    of the run's read bandwidth, and the seconds of the run that the products and the attention took (medians) with
    their shares of it; rows of runs without the attention's timing (before 2026-12-07) give the products' row alone."""
    prod = [{"path": "products in the step, 8 rows", "products_flops": f * 1e9, "share_of_best_library": f / 100,
             "attention_bytes_per_s": a * 1e9, "run_s": t, "products_share_of_run": p, "attention_share_of_run": q,
             "loaded": False} for f, a, t, p, q in ((90, 10, 2.0, 0.5, 0.2), (80, 30, 1.0, 0.7, 0.1),
                                                     (100, 20, 3.0, 0.6, 0.3))]
    tiny = {"sampling": [], "evaluation": [], "grpo": [], "training": [], "products": prod,
            "device": {"read_bandwidth_bytes_per_s": 40e9}}
    flops, att, p_s, a_s = bench.tiny_table(tiny)
    assert flops["value"] == 90 and flops["share of ceiling"] == 0.9
    assert att["path"] == "attention in the step, 8 rows" and att["value"] == 20 and att["share of ceiling"] == 0.5
    assert p_s["value"] == 1.0 and p_s["share of ceiling"] == 0.6 and a_s["value"] == 0.4 and a_s["share of ceiling"] == 0.2
    old = [{k: v for k, v in r.items() if k in ("path", "products_flops", "share_of_best_library", "loaded")} for r in prod]
    assert len(bench.tiny_table({**tiny, "products": old})) == 1


def test_todays_evaluation_in_its_own_process_answers_the_ladder(tmp_path, monkeypatch):
    """bench.own_process: the laptop preset's evaluation (2 questions a level) in a child process of this checkout,
    after its warm-up: every question answered, its time returned; a second child reads every products decision the
    first one made from this machine's file (dsh.llm.decisions) instead of making it again."""
    import shutil

    from dsh.experiment.bench import own_process
    from dsh.llm import kernels

    if kernels.cache_dir().is_dir():               # a cache of its own, with the kernels already built here
        shutil.copytree(kernels.cache_dir(), tmp_path / "cache" / "kernels")
    monkeypatch.setenv("DSH_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "eval.jsonl"
    first = own_process.run_evaluation(str(out), 2, 0, "float32")
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert first["seconds"] > 0 and len(recs) == 2 * len(presets.LAPTOP.evaluation.levels)
    again = own_process.run_evaluation(str(tmp_path / "again.jsonl"), 2, 0, "float32")
    assert first["products_decisions_made"] > 0 and again["products_decisions_made"] == 0
    assert own_process.own_process_path("float32", 256) == "dsh evaluate, CPU path, float32 KV cache, 256 rows, its own process"


def test_the_step_products_fastest_rate_is_the_fastest_of_the_libraries_and_the_panel_product_per_shape():
    from dsh.experiment.bench.step_products import library_rates
    from dsh.llm import kernels
    from dsh.llm.models import load
    from dsh.training.laptop_base import SHIPPED_BASE

    model, _ = load(str(SHIPPED_BASE), device="cpu")
    r = library_rates(model, 16, repeats=2, calls=2)
    libraries = [v for k, v in r.items() if k in ("mkl_flops", "onednn_flops", "mkl_packed_flops")]
    assert libraries and all(v > 0 for v in libraries)
    assert r["best_flops"] >= max(libraries) * (1 - 1e-9)          # the fastest per shape beats each library's sum
    if not kernels.has_panels(kernels.load()):
        assert "panel_flops" not in r and "fastest_flops" not in r
        return
    assert r["panel_flops"] > 0
    assert r["fastest_flops"] >= max(r["best_flops"], r["panel_flops"]) * (1 - 1e-9)
