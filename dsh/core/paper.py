"""The paper's own printed numbers (shown as the paper's, never as ours).

They live in ``dsh/core/paper_results.yaml``, shipped with the package; ``book/paper_results.yaml`` is a
link to the same file.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import yaml

PAPER_RESULTS = Path(__file__).resolve().parent / "paper_results.yaml"


@cache
def paper_results(path: str | None = None) -> dict:
    """Load the labelled file of numbers printed in the paper."""
    p = Path(path) if path else PAPER_RESULTS
    if not p.is_file():
        raise ValueError(f"path must point to the paper's results YAML file; {p} does not exist")
    with open(p) as f:
        return yaml.safe_load(f)
