"""Third-party chatter kept out of the rendered book: :func:`book_mode`, called by each chapter's first cell.

Progress bars (tqdm, transformers, datasets), transformers' and datasets' log lines below error level, and the
deprecation FutureWarnings of the libraries are noise on a page a reader reads; they stay on everywhere else (the
CLI, the tests, a developer's own scripts), where they tell a developer something. Tables are shown whole (pandas'
display limits raised), so that no cell is cut to "...". The browser check (tests/browser/check_book.py) fails on
a warning, a cut cell or an all-NaN table in a page."""

from __future__ import annotations

import os
import warnings

from .validate import papermill_parameters

ENVIRONMENT = {"TQDM_DISABLE": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error",
               "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1", "TOKENIZERS_PARALLELISM": "false"}


def book_mode(parameters=None, namespace=None) -> None:
    """Quiet the libraries in this process (a chapter's kernel): the environment above (read by tqdm, transformers
    and datasets when they start or draw a bar), their progress bars and logging off if already imported, and
    FutureWarning / deprecation warnings of third-party modules not printed (dsh's own warnings still are).
    With ``parameters`` (the chapter's names as its parameters cell left them) and ``namespace`` (its globals now),
    a parameter papermill injected that the chapter does not have is refused first
    (:func:`dsh.core.validate.papermill_parameters`)."""
    if parameters is not None:
        papermill_parameters(parameters, namespace if namespace is not None else {})
    os.environ.update(ENVIRONMENT)
    for module in ("transformers", "trl", "datasets", "torch", "peft", "accelerate", "tqdm", "huggingface_hub"):
        warnings.filterwarnings("ignore", category=FutureWarning, module=module)
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=module)
    warnings.filterwarnings("ignore", message="IProgress not found")
    import sys

    try:                                        # whole tables: no rows, columns or cell text cut to "..."
        import pandas as pd

        pd.set_option("display.max_rows", 500, "display.max_columns", 60, "display.max_colwidth", None,
                      "display.width", 250)
    except ImportError:  # pragma: no cover - pandas comes with the book's requirements
        pass
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
