"""dsh: the Two-Stage Decision-Sampling hypothesis, executable.

The package is layered; each sub-package imports only those above it in this list (``tests/test_structure.py``
fails on an import that goes the other way or closes a cycle):

- :mod:`dsh.core` - argument checks, atomic writes and JSON lines, provenance, the paper's printed numbers.
- :mod:`dsh.theory` - the two-stage process, the lemmas and theorems in SymPy, the finite MDP, the toy.
- :mod:`dsh.task` - multiplication problems, arithmetic and checks, traces, chat records, the response parser,
  synthetic responses, the laptop task.
- :mod:`dsh.measure` - p_s, p_dC, p_dW and predicted accuracy, the paper's claims as tests, faithfulness.
- :mod:`dsh.llm` - the embedded and tiny models, generation, packing, memory, gradient attribution.
- :mod:`dsh.training` - SFT, DFT and GRPO through TRL, rollouts, token budgets, pre-training, the laptop base.
- :mod:`dsh.experiment` - presets, evaluation, the pipelines, reports, benchmarks, the one-command GPU run.
- ``python -m dsh`` (:mod:`dsh.__main__`) - the command line, on top.

``import dsh`` imports the two-stage formulas only (no torch): :func:`predicted_accuracy`, :func:`accuracy_within`,
:func:`simulate`.
"""

from .theory.two_stage import accuracy_within, predicted_accuracy, simulate

__version__ = "0.1.0"

__all__ = ["predicted_accuracy", "accuracy_within", "simulate", "__version__"]
