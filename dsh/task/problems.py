"""Multiplication problems (paper, Appendix "Task Description" and "Dataset Construction").

A problem is "Calculate [a] * [b]. Think step by step." with an m-digit ``a`` and an n-digit ``b`` drawn
uniformly from [10^(m-1), 10^m - 1]; its level is "mxn". Training problems come from 4x5 and 5x4, test problems
from 3x3 ... 3x9, held out of training.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ..core import validate as v

QUESTION = "Calculate {a} * {b}. Think step by step."
TRAIN_LEVELS = ((4, 5), (5, 4))
TEST_LEVELS = tuple((3, n) for n in range(3, 10))
N_TRAIN = 20_000       # the paper's training problems
N_TEST = 100           # the paper's test problems per level
TEST_STREAM = 1_000_003   # test problems are drawn with seed + TEST_STREAM, apart from training's stream


@dataclass(frozen=True)
class Problem:
    """One multiplication problem; ``level`` is "mxn" (digits of a, digits of b)."""

    a: int
    b: int

    @property
    def level(self) -> str:
        return f"{len(str(self.a))}x{len(str(self.b))}"

    @property
    def question(self) -> str:
        return QUESTION.format(a=self.a, b=self.b)

    @property
    def answer(self) -> int:
        return self.a * self.b


def parse_level(level) -> tuple[int, int]:
    """"3x5" -> (3, 5); raises ValueError naming ``level`` otherwise."""
    if isinstance(level, (tuple, list)) and len(level) == 2:
        m, n = level
    else:
        try:
            m, n = (int(x) for x in str(level).lower().split("x"))
        except ValueError:
            raise ValueError(f"level must look like '3x5' (digits of a x digits of b, each 1..18); got {level!r}") from None
    if not (isinstance(m, int) and isinstance(n, int) and 1 <= m <= 18 and 1 <= n <= 18):
        raise ValueError(f"level must look like '3x5' (digits of a x digits of b, each 1..18); got {level!r}")
    return m, n


def level_index(level) -> int:
    """A sort key that orders levels by digits of a, then digits of b ("3x9" before "4x2")."""
    m, n = parse_level(level)
    return m * 100 + n


MAX_PROBLEMS = 1_000_000   # problems drawn at once per level: beyond it a run would only exhaust memory


def draw_problems(level, count: int, seed: int = 0, exclude=frozenset(), distinct: bool = False) -> list[Problem]:
    """``count`` problems of one level, uniform operands, deterministic under ``seed``; pairs in
    ``exclude`` (a set of (a, b)) are redrawn. ``distinct``: drawn without replacement (the same stream with
    repeats skipped, so a draw that had no repeat is the same list either way)."""
    m, n = parse_level(level)
    count = v.length("count", count)
    if count > MAX_PROBLEMS:
        raise ValueError(f"count must be at most {MAX_PROBLEMS:,} problems a level (memory); got {count:,}")
    space = 9 * 10 ** (m - 1) * 9 * 10 ** (n - 1)
    left = space - sum(1 for a, b in set(exclude) if len(str(a)) == m and len(str(b)) == n)
    if count and left <= 0:
        raise ValueError(f"level {level}: every one of its {space} problems is excluded; nothing left to draw")
    if distinct and count > left:
        raise ValueError(f"count must be at most {left:,} for distinct problems of level {level} "
                         f"({space:,} problems, {space - left:,} excluded); got {count:,}")
    rng = random.Random(f"{seed}-{m}x{n}")
    out, seen = [], set()
    while len(out) < count:
        p = Problem(rng.randint(10 ** (m - 1), 10 ** m - 1), rng.randint(10 ** (n - 1), 10 ** n - 1))
        if (p.a, p.b) in exclude or (distinct and (p.a, p.b) in seen):
            continue
        if distinct:
            seen.add((p.a, p.b))
        out.append(p)
    return out


def test_problems(levels=TEST_LEVELS, n_per_level: int = N_TEST, seed: int = 0) -> list[Problem]:
    """The held-out test problems: ``n_per_level`` distinct problems per level, in level order (the draw that
    :func:`make_splits` holds out of training and that ``dsh.experiment.run.evaluate`` asks). Drawn without
    replacement, so no question is counted twice in a level's accuracy."""
    return [p for lv in levels for p in draw_problems(lv, n_per_level, seed=seed + TEST_STREAM, distinct=True)]


def make_splits(n_train: int = N_TRAIN, train_levels=TRAIN_LEVELS, n_test: int = N_TEST,
                test_levels=TEST_LEVELS, seed: int = 0) -> dict[str, list[Problem]]:
    """The paper's data: ``n_train`` training problems split evenly over ``train_levels`` and
    ``n_test`` test problems per level. Test problems never appear in training (asserted)."""
    n_train = v.length("n_train", n_train)
    n_test = v.length("n_test", n_test)
    if n_train > MAX_PROBLEMS or n_test > MAX_PROBLEMS:
        name, x = ("n_train", n_train) if n_train > MAX_PROBLEMS else ("n_test", n_test)
        raise ValueError(f"{name} must be an integer in 0..{MAX_PROBLEMS:,} (memory); got {x:,}")
    v.length("seed", seed)
    train_levels = [parse_level(x) for x in train_levels]
    test_levels = [parse_level(x) for x in test_levels]
    if not train_levels:
        raise ValueError("train_levels must name at least one level such as '4x5'")
    test = test_problems(test_levels, n_test, seed)
    held_out = {(p.a, p.b) for p in test}
    per = [n_train // len(train_levels) + (1 if i < n_train % len(train_levels) else 0) for i in range(len(train_levels))]
    train = []
    for lv, k in zip(train_levels, per):
        train += draw_problems(lv, k, seed=seed, exclude=held_out)
    rng = random.Random(seed)
    rng.shuffle(train)
    assert not ({(p.a, p.b) for p in train} & held_out), "a test problem leaked into training"
    return {"train": train, "test": test}
