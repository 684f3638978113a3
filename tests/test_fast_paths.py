"""The opt-in fast paths of training and evaluation reach the code that runs them: the float16 KV cache
(``EvalSettings.kv_cache``, ``TrainConfig.rollout_kv_cache``), the packed attention in C
(``TrainConfig.packed_attention``) and GRPO's update in bfloat16 products (``TrainConfig.update_precision``). Their
values are tested where they are computed (test_kernels, test_packed_attention); here: the settings, their errors,
and that a run uses what it was given."""

import dataclasses

import pytest

from dsh.experiment.run.evaluate import EvalSettings
from dsh.experiment.run.presets import resolve
from dsh.llm import kernels
from dsh.training.train_config import TrainConfig

HALF = kernels.half_cache(kernels.load())
half = pytest.mark.skipif(not HALF, reason="no half floats in hardware here")


def test_settings_keys_and_one_line_errors():
    assert "kv_cache" not in EvalSettings().key()                 # the records made before the field: reused as before
    assert EvalSettings(kv_cache="float16").key()["kv_cache"] == "float16"
    with pytest.raises(ValueError, match=r"^kv_cache must be one of float32, float16; got 'bfloat16'"):
        EvalSettings(kv_cache="bfloat16").checked()
    with pytest.raises(ValueError, match=r"^rollout_kv_cache must be one of float32, float16; got 'half'"):
        TrainConfig(method="grpo", rollout_kv_cache="half")
    with pytest.raises(ValueError, match=r"^packed_attention must be one of torch, kernels, fused; got 'c'"):
        TrainConfig(method="sft", packed_attention="c")
    from dsh.llm.packing import PATHS
    from dsh.training.train_config import PACKED_ATTENTION

    assert PACKED_ATTENTION == tuple(PATHS)                      # the settings' choices are the paths packing knows
    for path in ("kernels", "fused"):
        with pytest.raises(ValueError, match=rf"^packed_attention '{path}' attends over packed rows: it needs padding_free"):
            TrainConfig(method="sft", packed_attention=path, padding_free=False)
        assert TrainConfig(method="sft", packed_attention=path, padding_free=True).packed_attention == path
    with pytest.raises(ValueError, match=r"^update_precision must be one of float32, bfloat16; got 'fp16'"):
        TrainConfig(method="grpo", update_precision="fp16")
    with pytest.raises(ValueError, match=r"^update_precision applies to GRPO's update; method 'sft' needs float32"):
        TrainConfig(method="sft", update_precision="bfloat16")
    assert TrainConfig(method="grpo", update_precision="bfloat16").update_precision == "bfloat16"
    with pytest.raises(ValueError, match=r"^scoring_precision must be one of float32, bfloat16; got 'half'"):
        TrainConfig(method="grpo", scoring_precision="half")
    with pytest.raises(ValueError, match=r"^scoring_precision applies to GRPO's reference scoring; method 'dft' needs"):
        TrainConfig(method="dft", scoring_precision="bfloat16")


@pytest.mark.slow   # loads the shipped base
def test_bfloat16_layers_round_only_the_layers_products_and_leave_the_model_as_it_was():
    import torch

    from dsh.llm import packing
    from dsh.llm.models import load
    from dsh.training.grpo_trainer import bfloat16_layers
    from dsh.training.laptop_base import SHIPPED_BASE

    m, _ = load(str(SHIPPED_BASE))
    m.set_attn_implementation(packing.register("kernels"))
    ids = torch.randint(3, 60, (1, 600), generator=torch.Generator().manual_seed(0))
    pos = torch.cat([torch.arange(200)] * 3)[None]
    dtypes = []
    hook = m.model.layers[0].mlp.down_proj.register_forward_hook(lambda mod, i, o: dtypes.append(o.dtype))

    def logits():
        return m(input_ids=ids, position_ids=pos).logits

    before = logits()
    with bfloat16_layers(m) as layers:
        low = logits()
    after = logits()
    hook.remove()
    assert len(layers) == len(m.model.layers) and dtypes == [torch.float32, torch.bfloat16, torch.float32]
    assert low.dtype == torch.float32 and torch.equal(before, after)           # the LM head float32; restored
    diff = (torch.log_softmax(low, -1) - torch.log_softmax(before, -1)).abs()
    assert 0 < diff.mean() < 0.05                                              # rounded, not another model
    with pytest.raises(ValueError, match="^update_precision bfloat16 needs a model with decoder layers"):
        with bfloat16_layers(torch.nn.Linear(2, 2)):
            pass


def _spy_engines(monkeypatch) -> list:
    from dsh.llm.engine import Engine

    seen, init = [], Engine.__init__

    def spy(self, *a, **k):
        seen.append(k.get("kv_cache", "float32"))
        init(self, *a, **k)

    monkeypatch.setattr(Engine, "__init__", spy)
    return seen


@pytest.mark.slow   # loads the shipped base
@half
def test_an_evaluation_samples_with_the_kv_cache_it_names(tmp_path, monkeypatch):
    from dsh.experiment.run.evaluate import evaluate
    from dsh.training.laptop_base import SHIPPED_BASE

    seen = _spy_engines(monkeypatch)
    s = EvalSettings(levels=("1x2",), n_per_level=3, max_new_tokens=40, batch_size=4)
    for kv in ("float32", "float16"):
        evaluate(str(SHIPPED_BASE), out=str(tmp_path / f"{kv}.jsonl"), settings=dataclasses.replace(s, kv_cache=kv),
                 backend="dsh", progress=False)
    assert seen == ["float32", "float16"]
    assert (tmp_path / "float16.jsonl").read_text().count("\n") == 3


@pytest.mark.slow   # trains: two GRPO steps of the laptop preset from the shipped base
@half
def test_grpo_rollouts_validation_and_update_use_the_paths_they_name(tmp_path, monkeypatch):
    from dsh.llm import packed_attention
    from dsh.training.laptop_base import SHIPPED_BASE
    from dsh.training.train import train

    seen = _spy_engines(monkeypatch)
    calls, apply = [], packed_attention._PackedCausal.apply
    monkeypatch.setattr(packed_attention._PackedCausal, "apply", lambda *a: calls.append(1) or apply(*a))
    cfg = resolve("grpo", "laptop", model=str(SHIPPED_BASE), output_dir=str(tmp_path / "rl"), max_steps=2,
                  generation_batch_size=32, per_device_train_batch_size=16, max_completion_length=48,
                  validation_every=1, validation_per_level=1, save_steps=10 ** 6, report_to=(),
                  rollout_kv_cache="float16", packed_attention="kernels")
    s = train(cfg)
    assert s["global_step"] == 2 and s["generation_backend"] == "dsh"
    assert seen and set(seen) == {"float16"}                   # the rollouts' engine and every validation pass
    assert calls                                              # the update's and the scoring's attention in C


@pytest.mark.slow   # trains: two GRPO steps of the laptop preset from the shipped base, three times
def test_grpo_update_and_scoring_precision_each_change_only_their_pass(tmp_path, monkeypatch):
    import json

    from dsh.llm.models import weights_digest
    from dsh.training import grpo_trainer
    from dsh.training.laptop_base import SHIPPED_BASE
    from dsh.training.train import train

    entered, layers = [], grpo_trainer.bfloat16_layers
    monkeypatch.setattr(grpo_trainer, "bfloat16_layers", lambda m: entered.append(1) or layers(m))
    runs = {}
    for precision, scoring in (("float32", "float32"), ("bfloat16", "float32"), ("float32", "bfloat16")):
        out = tmp_path / f"{precision}-{scoring}"
        cfg = resolve("grpo", "laptop", model=str(SHIPPED_BASE), output_dir=str(out), max_steps=2,
                      generation_batch_size=32, per_device_train_batch_size=16, max_completion_length=48,
                      validation_every=0, save_steps=10 ** 6, report_to=(), packed_attention="kernels",
                      update_precision=precision, scoring_precision=scoring)
        assert cfg.beta > 0                                              # a reference model to score with
        train(cfg)
        rec = json.loads((out / "run_config.json").read_text())["dsh"]
        runs[precision, scoring] = (len(entered), weights_digest(out / "final"),
                                    (rec["update_precision"], rec["scoring_precision"]))
        entered.clear()
    # one update pass a step, never scoring; with scoring_precision the round's one reference pass, not the update
    assert [r[0] for r in runs.values()] == [0, 2, 1]
    assert len({r[1] for r in runs.values()}) == 3                       # each gives other weights
    assert [r[2] for r in runs.values()] == list(runs)


@pytest.mark.slow   # trains: two GRPO steps of the laptop preset from the shipped base, twice
def test_progress_off_prints_no_bar_and_no_log_lines_and_trains_the_same(tmp_path, capfd):
    from dsh.llm.models import weights_digest
    from dsh.training.laptop_base import SHIPPED_BASE
    from dsh.training.train import train

    got = {}
    for progress in (True, False):
        cfg = resolve("grpo", "laptop", model=str(SHIPPED_BASE), output_dir=str(tmp_path / str(progress)), max_steps=2,
                      generation_batch_size=32, per_device_train_batch_size=16, max_completion_length=48,
                      validation_every=0, save_steps=10 ** 6, report_to=())
        capfd.readouterr()
        train(cfg, progress=progress)
        out = "".join(capfd.readouterr())
        got[progress] = (out, weights_digest(tmp_path / str(progress) / "final"))
    loud, quiet = got[True][0], got[False][0]
    assert "dsh: train grpo" in loud and "'loss'" in loud and "it/s" in loud + loud.replace("s/it", "it/s")
    assert "dsh: train" not in quiet and "'loss'" not in quiet and "%|" not in quiet
    # transformers' per-step warning that GRPO's inputs carry no input_ids: dropped either way
    assert "Tried to track the number of tokens seen" not in loud + quiet
    assert got[True][1] == got[False][1]
    with pytest.raises(ValueError, match="progress must be true or false"):
        train(cfg, progress="no")


@pytest.mark.slow   # trains: two GRPO steps of the laptop preset from the shipped base, three times
def test_grpo_with_fused_layers_runs_policy_and_reference_through_them_and_trains_as_kernels_does(tmp_path, monkeypatch):
    from safetensors.torch import load_file

    from dsh.llm import fused_layers
    from dsh.training.laptop_base import SHIPPED_BASE
    from dsh.training.train import train

    entered, swap = [], fused_layers.fused_layers
    monkeypatch.setattr(fused_layers, "fused_layers", lambda m: entered.append(m) or swap(m))
    weights = {}
    for path in ("torch", "kernels", "fused"):
        cfg = resolve("grpo", "laptop", model=str(SHIPPED_BASE), output_dir=str(tmp_path / path), max_steps=2,
                      generation_batch_size=32, per_device_train_batch_size=16, max_completion_length=48,
                      validation_every=0, save_steps=10 ** 6, report_to=(), packed_attention=path)
        assert cfg.beta > 0                                              # a reference model as well
        train(cfg, progress=False)
        weights[path] = load_file(str(tmp_path / path / "final" / "model.safetensors"))
    assert len(entered) == 2 and entered[0] is not entered[1]            # the policy and the reference, once each
    # one round feeds both steps (the same rollouts): the paths' weights differ by float rounding only, which Adam's
    # normalised steps enlarge where a gradient is near 0; the fused path no further from the C attention's weights
    # than torch's per-sequence attention is (another rounding of the same function)
    base = load_file(str(SHIPPED_BASE / "model.safetensors"))

    def gap(a, b):
        return max((weights[a][k] - weights[b][k]).abs().max().item() for k in base)
    moved = max((weights["kernels"][k] - base[k]).abs().max().item() for k in base)
    assert moved > 1e-4 and 0 < gap("torch", "kernels") < moved / 10
    assert gap("fused", "kernels") < 3 * gap("torch", "kernels"), (gap("fused", "kernels"), gap("torch", "kernels"))
