"""dsh: the Two-Stage Decision-Sampling hypothesis, executable.

Modules (one concept each):

- :mod:`dsh.two_stage` - the two-stage process (p_s, p_dC, p_dW): accuracy formula, simulation.
- :mod:`dsh.theory` - SymPy objects for the paper's lemmas and theorems (Sections 3, Appendix D).
- :mod:`dsh.mdp` - a finite two-stage MDP with a token-level policy, solved by exact enumeration.
- :mod:`dsh.toy` - the paper's three-logit toy (Appendix C): exact expectations, Monte Carlo, sweeps.
- :mod:`dsh.toy_grpo` - a simulated GRPO run on the toy and its figure.
- :mod:`dsh.problems` - multiplication problems, levels and the train/test split.
- :mod:`dsh.arithmetic` - long multiplication step by step, injected errors, the checks that catch them.
- :mod:`dsh.traces` - SFT traces (with and without reflection) in three granularities.
- :mod:`dsh.records` - TRL prompt/completion records and chat prompts.
- :mod:`dsh.parse` - candidate answers and STOP / RESAMPLE decisions in any response.
- :mod:`dsh.calibration` - p_s, p_dC, p_dW, predicted vs observed accuracy, intervals, transitions.
- :mod:`dsh.synthetic` - responses from a known two-stage process (ground truth for the estimators).
- :mod:`dsh.models` - the embedded SmolLM2-135M-Instruct, Hugging Face ids, run directories.
- :mod:`dsh.train` - SFT, SFT with reflection, DFT and GRPO through TRL.
- :mod:`dsh.presets` - every preset (stages, training overrides, evaluation settings, token budgets) as a ``Preset``.
- :mod:`dsh.budgets` - token budgets derived from the presets' own traces.
- :mod:`dsh.evaluate` - one sample per test question, resumable JSONL; the evaluation settings.
- :mod:`dsh.pipeline` - the whole experiment of a preset: train, evaluate, calibrate, check its design.
- :mod:`dsh.report` - tables, figures and verdicts on the paper's claims from a results folder.
- :mod:`dsh.faithfulness` - whether a trace's checks are computed and followed.
- :mod:`dsh.engine` / :mod:`dsh.rollout` / :mod:`dsh.packing` - fast generation, GRPO rollouts, padding-free SFT.
- :mod:`dsh.scale` / :mod:`dsh.bench` - memory and batch sizes; measured throughput against the libraries.
- :mod:`dsh.gpu_small` - the gpu-small experiment as one command on a GPU host.
- :mod:`dsh.provenance` / :mod:`dsh.files` / :mod:`dsh.validate` - where a result came from; atomic writes;
  one-line argument checks.
- :mod:`dsh.attribution` - sampling/decision gradient attribution inside a real transformer.
- :mod:`dsh.verl` - parquet export and reward function for verl.
- :mod:`dsh.laptop_task` - the laptop task: 1xN multiplication, a check the model computes, base corpus, faithfulness.
- :mod:`dsh.tiny` / :mod:`dsh.pretrain` - a tiny ``LlamaForCausalLM`` and its alphabet tokenizer; training from scratch.
- :mod:`dsh.laptop` - the shipped base (``python -m dsh base``), its stopping rule, the model's own attempts.
- :mod:`dsh.laptop_pipeline` / :mod:`dsh.laptop_report` - every stage, seeds and ablations on 2 CPU cores; its tables.
"""

from .two_stage import accuracy_within, predicted_accuracy, simulate

__version__ = "0.1.0"

__all__ = ["predicted_accuracy", "accuracy_within", "simulate", "__version__"]
