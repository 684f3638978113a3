"""dsh: the Two-Stage Decision-Sampling hypothesis, executable.

Modules (one concept each):

- :mod:`dsh.two_stage` - the two-stage process (p_s, p_dC, p_dW): accuracy formula, simulation.
- :mod:`dsh.theory` - SymPy objects for the paper's lemmas and theorems (Sections 3, Appendix D).
- :mod:`dsh.mdp` - a finite two-stage MDP with a token-level policy, solved by exact enumeration.
- :mod:`dsh.toy` - the paper's three-logit toy (Appendix C): exact expectations, sweeps, simulated GRPO.
- :mod:`dsh.data` - multiplication problems and SFT traces (with and without reflection).
- :mod:`dsh.parse` - candidate answers and STOP / RESAMPLE decisions in any response.
- :mod:`dsh.calibration` - p_s, p_dC, p_dW, predicted vs observed accuracy, intervals, transitions.
- :mod:`dsh.synthetic` - responses from a known two-stage process (ground truth for the estimators).
- :mod:`dsh.models` - the embedded SmolLM2-135M-Instruct, Hugging Face ids, run directories.
- :mod:`dsh.train` / :mod:`dsh.presets` - SFT, SFT with reflection, DFT and GRPO through TRL.
- :mod:`dsh.evaluate` - one sample per test question, resumable JSONL.
- :mod:`dsh.pipeline` / :mod:`dsh.report` - the whole experiment of a preset and its tables and figures.
- :mod:`dsh.attribution` - sampling/decision gradient attribution inside a real transformer.
- :mod:`dsh.verl` - parquet export and reward function for verl.
"""

from .two_stage import accuracy_within, predicted_accuracy, simulate

__version__ = "0.1.0"

__all__ = ["predicted_accuracy", "accuracy_within", "simulate", "__version__"]
