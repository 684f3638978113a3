"""dsh.core.settings: every KEY=VALUE a user types is read by its field's declared type (the reader behind --set,
--eval-set, --attribution-set and papermill's overrides)."""

import dataclasses
import json

import pytest

from dsh.__main__ import main
from dsh.core import settings
from dsh.experiment.run import attribution_study, evaluate, pipeline, presets, steps
from dsh.training.train_config import TrainConfig


@pytest.mark.parametrize("text,value", [("true", True), ("True", True), ("1", True), ("yes", True), ("ON", True),
                                        ("false", False), ("False", False), ("0", False), ("no", False),
                                        ("Off", False), (" false ", False)])
def test_booleans_read_by_their_meaning(text, value):
    assert settings.coerce("lora", text, (bool,)) is value


@pytest.mark.parametrize("text", ["none", "maybe", "", "2", "False2", "tru"])
def test_a_boolean_refuses_anything_else(text):
    with pytest.raises(ValueError, match=r"^lora must be true or false; got "):
        settings.coerce("lora", text, (bool,))


def test_types_by_field():
    kinds = settings.field_types(TrainConfig)
    assert settings.coerce("max_steps", "12", kinds["max_steps"]) == 12
    assert settings.coerce("learning_rate", "1e-3", kinds["learning_rate"]) == 1e-3
    assert settings.coerce("bf16", "none", kinds["bf16"]) is None and settings.coerce("bf16", "off", kinds["bf16"]) is False
    assert settings.coerce("max_length", "null", kinds["max_length"]) is None
    assert settings.coerce("report_to", "wandb", kinds["report_to"]) == ("wandb",)
    assert settings.coerce("train_levels", "2x2, 2x3", kinds["train_levels"]) == ("2x2", "2x3")
    assert settings.coerce("train_levels", '["2x2"]', kinds["train_levels"]) == ("2x2",)
    assert settings.coerce("task_options", '{"check": "verdict"}', kinds["task_options"]) == {"check": "verdict"}
    assert settings.coerce("model", "False", kinds["model"]) == "False"      # a string field keeps its text
    for name, text, fragment in (("max_steps", "1e18", "an integer"), ("max_steps", "1.5", "an integer"),
                                 ("learning_rate", "nan", "a number"), ("learning_rate", "inf", "a number"),
                                 ("task_options", "[1]", "a JSON object"), ("trust_remote_code", "none", "true or false")):
        with pytest.raises(ValueError, match=f"^{name} must be .*{fragment}"):
            settings.coerce(name, text, kinds[name])


def test_values_that_are_not_text_keep_their_type_or_are_refused():
    kinds = settings.field_types(TrainConfig)
    assert settings.coerce("learning_rate", 1, kinds["learning_rate"]) == 1
    assert settings.coerce("train_levels", ["2x2"], kinds["train_levels"]) == ("2x2",)
    for name, value in (("max_steps", True), ("lora", 1), ("lora", None), ("max_steps", 2.0)):
        with pytest.raises(ValueError, match=f"^{name} must be "):
            settings.coerce(name, value, kinds[name])


def test_every_field_of_the_three_settings_has_a_reader():
    for cls in (TrainConfig, evaluate.EvalSettings, attribution_study.StudySettings):
        for name, kinds in settings.field_types(cls).items():
            assert set(kinds) <= {bool, int, float, str, tuple, dict, type(None)}, (cls.__name__, name, kinds)


@pytest.mark.parametrize("text", ["False", "false", "no", "off", "0", "FALSE"])
def test_set_trust_remote_code_false_is_false_in_train_and_pipeline(text, capsys):
    assert main(["train", "--method", "sft", "--set", f"trust_remote_code={text}", "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["dsh"]["trust_remote_code"] is False
    cfgs = pipeline.plan("laptop", "runs", overrides={"trust_remote_code": text})
    assert all(c.trust_remote_code is False for c in cfgs.values())


@pytest.mark.parametrize("field", ["lora", "bf16", "gradient_checkpointing", "keep_checkpoints",
                                   "use_bias_correction_kl", "padding_free"])
def test_set_false_means_false_for_every_boolean(field, capsys):
    assert main(["train", "--method", "sft", "--set", f"{field}=False", "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["dsh"][field] is False


def test_a_boolean_field_never_keeps_text_in_the_api():
    with pytest.raises(ValueError, match=r"^trust_remote_code must be true or false; got 'False'$"):
        TrainConfig(trust_remote_code="False")
    with pytest.raises(ValueError, match=r"^lora must be true or false; got 1$"):
        TrainConfig(lora=1)
    from dsh.llm import models

    with pytest.raises(ValueError, match=r"^trust_remote_code must be True or False, got 'False'$"):
        models.load_weights("x", "x", trust_remote_code="False")


def test_report_to_is_a_list_of_integrations(capsys):
    assert main(["train", "--method", "sft", "--set", "report_to=wandb", "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["dsh"]["report_to"] == ["wandb"]


def test_eval_and_attribution_settings_are_typed():
    s = presets.LAPTOP.eval_settings(levels="1x2,1x3", n_per_level="3", temperature="0.5")
    assert s.levels == ("1x2", "1x3") and s.n_per_level == 3 and s.temperature == 0.5
    study = steps.study_settings(presets.LAPTOP, {"levels": "1x2", "prompts_per_level": "2", "group": "4"})
    assert study.levels == ("1x2",) and study.prompts_per_level == 2 and study.group == 4
    with pytest.raises(ValueError, match=r"^n_per_level must be an integer; got '1e3'$"):
        presets.LAPTOP.eval_settings(n_per_level="1e3")
    with pytest.raises(ValueError, match=r"^prompts_per_level must be an integer; got '1e9'$"):
        steps.study_settings(presets.LAPTOP, {"prompts_per_level": "1e9"})


def test_papermill_overrides_are_read_by_the_same_types():
    cfgs = pipeline.method_plan("laptop", "sft", "runs", overrides={"lora": "off", "max_steps": "3"})
    assert all(c.lora is False and c.max_steps == 3 for c in cfgs.values())


def test_the_typed_config_round_trips_through_json():
    cfg = presets.resolve("sft", "laptop", **settings.typed(TrainConfig, {"report_to": "tensorboard", "bf16": "off"}))
    again = TrainConfig(**{k: (tuple(x) if isinstance(x, list) else x)
                           for k, x in json.loads(json.dumps(dataclasses.asdict(cfg))).items()})
    assert again == cfg
