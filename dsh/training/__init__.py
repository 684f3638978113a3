"""Training: SFT, SFT with reflection, DFT and GRPO through TRL (:mod:`~dsh.training.train`), GRPO rollouts
(:mod:`~dsh.training.rollout`), token budgets from the traces (:mod:`~dsh.training.budgets`), pre-training a tiny
model from scratch (:mod:`~dsh.training.pretrain`) and the laptop base model (:mod:`~dsh.training.laptop_base`).
Imports only the layers below (core .. llm)."""
