"""The paper's mathematics, exact: the two-stage process (:mod:`~dsh.theory.two_stage`), the lemmas and theorems
in SymPy (:mod:`~dsh.theory.symbolic`), a finite two-stage MDP solved by enumeration (:mod:`~dsh.theory.mdp`),
its Bellman split (:mod:`~dsh.theory.bellman`), PPO clipping (:mod:`~dsh.theory.clipping`), SFT as a policy
gradient (:mod:`~dsh.theory.sft_pg`), the three-logit toy and its simulated GRPO (:mod:`~dsh.theory.toy`,
:mod:`~dsh.theory.toy_grpo`) and its token-consistent variant (:mod:`~dsh.theory.token_toy`). Imports only
:mod:`dsh.core`."""
