"""Export for verl (the paper's RL framework), for users who scale past one machine.

``write_parquet`` writes verl's RL dataset columns; ``compute_score`` is a verl reward function
(``custom_reward_function.path=dsh/task/verl.py custom_reward_function.name=compute_score``).
"""

from __future__ import annotations

from pathlib import Path

from ..core.files import atomic_write
from .parse import is_correct
from .problems import Problem

DATA_SOURCE = "dsh/multiplication"


def verl_rows(problems, split: str = "train", data_source: str = DATA_SOURCE) -> list[dict]:
    """One verl row per problem: data_source, prompt (chat messages), ability, reward_model
    (style "rule", ground_truth) and extra_info (split, index, operands, level)."""
    rows = []
    for i, p in enumerate(problems):
        if not isinstance(p, Problem):
            raise ValueError(f"problems must be dsh.task.problems.Problem objects; item {i} is {type(p).__name__}")
        rows.append({
            "data_source": data_source,
            "prompt": [{"role": "user", "content": p.question}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(p.answer)},
            "extra_info": {"split": split, "index": i, "a": p.a, "b": p.b, "level": p.level,
                           "question": p.question},
        })
    return rows


def write_parquet(problems, path, split: str = "train", data_source: str = DATA_SOURCE) -> Path:
    """Write the verl dataset to ``path`` (atomically: no half-written file on failure)."""
    import pandas as pd
    import pyarrow  # noqa: F401 - pandas' parquet engine: a missing one is named (ModuleNotFoundError), not a hint

    path = Path(path)
    if path.suffix != ".parquet":
        raise ValueError(f"path must end in .parquet, got {str(path)!r}")
    df = pd.DataFrame(verl_rows(problems, split, data_source))
    atomic_write(path, lambda tmp: df.to_parquet(tmp, index=False))
    return path


def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float:
    """verl reward: 1.0 when the response's final answer equals ``ground_truth`` (:func:`dsh.task.parse.is_correct`,
    with the operands of ``extra_info`` when it has them), else 0.0. Never raises on a string response."""
    question = None
    if isinstance(extra_info, dict):
        a, b = extra_info.get("a"), extra_info.get("b")
        question = f"{a} * {b}" if a is not None and b is not None else extra_info.get("question")
    return float(is_correct(solution_str, ground_truth, question))
