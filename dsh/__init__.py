"""dsh: the Two-Stage Decision-Sampling hypothesis, executable.

Modules (one concept each):

- :mod:`dsh.two_stage` - the two-stage process (p_s, p_dC, p_dW): accuracy formula, simulation.
- :mod:`dsh.theory` - SymPy objects for the paper's lemmas and theorems (Sections 3, Appendix D).
- :mod:`dsh.mdp` - a finite two-stage MDP with a token-level policy, solved by exact enumeration.
"""

from .two_stage import accuracy_within, predicted_accuracy, simulate

__version__ = "0.1.0"

__all__ = ["predicted_accuracy", "accuracy_within", "simulate", "__version__"]
