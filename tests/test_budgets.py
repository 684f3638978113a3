"""Token budgets: derived from the presets' own traces, committed, and never truncating more than 1 %."""

import pytest

from dsh.experiment.run import pipeline, presets
from dsh.training import budgets


@pytest.fixture(scope="module")
def tok():
    return budgets.embedded_tokenizer()


@pytest.mark.slow
def test_committed_budgets_are_a_recomputation(tok):
    """Fails when dsh/training/budgets.json was edited by hand or a preset's traces changed without
    ``python -m dsh budgets --write``."""
    assert budgets.derive(presets.DERIVED, tok) == budgets.load()


@pytest.mark.slow
@pytest.mark.parametrize("preset", sorted(presets.DERIVED))
def test_no_budget_truncates_more_than_one_percent_of_fresh_traces(tok, preset):
    """Traces drawn with another seed than the one the budgets came from: training examples (SFT),
    the correct responses GRPO and evaluation expect (reflection traces, completion only)."""
    for name, spec in presets.DERIVED[preset].items():
        rate = budgets.truncation(tok, spec, budgets.tokens(preset, name), n_per_level=150, seed=11)
        assert rate <= budgets.MAX_TRUNCATION, (preset, name, rate)


def test_the_truncation_test_can_fail(tok):
    """The pre-issue-11 gpu-small budgets (max_length 2400 for digit-level reflection traces of 4x5, 2048 new
    tokens for 3x9) cut far more than 1 % of the traces of that design."""
    old = budgets.TraceSpec(("4x5", "5x4"), "reflection", granularity="digit", max_attempts=3)
    assert budgets.truncation(tok, old, 2400, n_per_level=100) > 0.05
    old_eval = budgets.TraceSpec(("3x9",), "reflection", granularity="digit", max_attempts=3, chat=False)
    assert budgets.truncation(tok, old_eval, 2048, n_per_level=100) > 0.3


def test_presets_take_budgets_from_the_file_never_typed():
    """Every token budget of ci and gpu-small is a Budget marker (no number typed in the preset) and
    resolves to the committed value."""
    keys = ("max_length", "max_completion_length")
    for preset in presets.DERIVED:
        for method, values in presets.PRESETS[preset].training.items():
            for k in keys:
                if k in values:
                    assert isinstance(values[k], presets.Budget), (preset, method, k)
        settings = presets.PRESETS[preset].evaluation
        assert isinstance(settings.max_new_tokens, presets.Budget)
        assert presets.get(preset).eval_settings().max_new_tokens == budgets.tokens(preset, "eval.max_new_tokens")
    cfg = presets.resolve("sft_reflection", "gpu-small")
    assert cfg.max_length == budgets.tokens("gpu-small", "sft_reflection.max_length")
    grpo = presets.resolve("grpo", "gpu-small")
    assert grpo.max_completion_length == budgets.tokens("gpu-small", "grpo.max_completion_length")
    base = pipeline.plan("gpu-small", "/tmp/never-written")["base"]
    assert base.max_length == budgets.tokens("gpu-small", "base.max_length")
    assert presets.resolve("grpo", "paper").max_completion_length == 8192      # the paper's, untouched


def test_budget_errors_name_the_budget(monkeypatch):
    with pytest.raises(ValueError, match="no derived budget 'x.max_length' for preset 'ci'"):
        budgets.tokens("ci", "x.max_length")
    with pytest.raises(ValueError, match="^unknown evaluation field"):
        presets.get("ci").eval_settings(max_tokens=3)


def test_training_summary_truncation_counts_what_is_cut(tok):
    """dsh.training.train.example_truncation on records whose lengths are known: 2 of 4 are over the limit."""
    from dsh.task import problems, records, traces
    from dsh.training import train
    recs = records.sft_records(problems.draw_problems("2x2", 4, seed=0), traces.TraceConfig(style="no_reflection"))
    def count(r):
        ids = tok.apply_chat_template(r["prompt"] + r["completion"], tokenize=True)
        return len(ids["input_ids"] if hasattr(ids, "keys") else ids)

    n = sorted(count(r) for r in recs)
    limit = n[1]
    cut = train.example_truncation(recs, tok, limit)
    assert cut["over"] == sum(x > limit for x in n) and cut["rate"] == cut["over"] / 4
    assert train.example_truncation(recs, tok, n[-1])["over"] == 0
