"""Mutation check: the theory tests must fail when the implementation is broken.

Each case copies dsh/ and tests/ to a temporary folder, makes one small change to the implementation
(a flipped sign, a dropped gamma^t, a missing stop-gradient), and runs the tests that check that result in
a fresh interpreter. The case passes only if those tests fail (pytest exit code 1, not a collection error).
The unmutated copy is run first and must pass, so a failure can only come from the mutation.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # one interpreter per mutation (~5 s each)

ROOT = Path(__file__).resolve().parent.parent

# (claim, file, original text, mutated text, tests that must catch it)
MUTATIONS = [
    ("Lemma 3.2: drop gamma^t in the policy-gradient sum", "dsh/theory/mdp.py",
     "wi * gamma ** s.t * q[s.prefix] * s.logp", "wi * q[s.prefix] * s.logp",
     ["tests/test_mdp.py::test_lemma_3_2"]),
    ("Lemma 3.2: drop gamma^(t_end - t) in the return", "dsh/theory/mdp.py",
     "return [gamma ** (t_end - s.t) * r for s in steps]", "return [r for s in steps]",
     ["tests/test_mdp.py::test_lemma_3_2"]),
    ("Theorem 3.1: drop the discount in the conditional-expectation Q", "dsh/theory/bellman.py",
     "return [gamma ** (t_end - s.t) * adv[traj] for s in steps]", "return [adv[traj] for s in steps]",
     ["tests/test_mdp.py::test_theorem_3_1_q_values_are_one_continuation"]),
    ("Theorem 3.1: flip the sign of the advantage", "dsh/theory/bellman.py",
     "return [mdp.reward(tr) - J for tr in mdp.trajectories]", "return [J - mdp.reward(tr) for tr in mdp.trajectories]",
     ["tests/test_mdp.py::test_theorem_3_1_q_values_are_one_continuation"]),
    ("Theorem 3.1 (symbolic): one gamma instead of gamma^L_(k+1) after a RESAMPLE", "dsh/theory/symbolic.py",
     "discount_decision=[gamma ** Ls[k + 1] if k + 1 < T else 1 for k in range(T)]",
     "discount_decision=[gamma if k + 1 < T else 1 for k in range(T)]",
     ["tests/test_theory.py::test_surrogate_q_values_against_brute_force_discounting"]),
    ("Theorem 3.2: flip the sign of the log-ratio", "dsh/theory/mdp.py",
     "[float(s.logp - r.logp) for s, r in zip(st, rst)]", "[float(r.logp - s.logp) for s, r in zip(st, rst)]",
     ["tests/test_mdp.py::test_theorem_3_2_kl_gradient"]),
    ("Theorem 3.2: drop gamma in the KL-to-go", "dsh/theory/mdp.py",
     "return to_go(kl_penalties(mdp, theta.detach(), theta_ref, traj)[0], gamma)",
     "return to_go(kl_penalties(mdp, theta.detach(), theta_ref, traj)[0])",
     ["tests/test_mdp.py::test_theorem_3_2_kl_gradient"]),
    ("Theorem 3.2 (symbolic): an attempt pays one token's penalty", "dsh/theory/symbolic.py",
     "ds = [Ls[k] * delta for k in range(T)]", "ds = [delta for k in range(T)]",
     ["tests/test_theory.py::test_one_rule_for_both_objectives"]),
    ("Accuracy formula: 1 - p_dW in place of p_dW", "dsh/theory/two_stage.py",
     "resample = p_s * (1.0 - p_dC) + (1.0 - p_s) * p_dW", "resample = p_s * (1.0 - p_dC) + (1.0 - p_s) * (1.0 - p_dW)",
     ["tests/test_two_stage.py::test_monte_carlo_matches_formula"]),
    ("Accuracy formula (chain): RESAMPLE after W with 1 - p_dW", "dsh/theory/symbolic.py",
     "[p_dW, 0, 0],             # W: RESAMPLE with p_dW", "[1 - p_dW, 0, 0],",
     ["tests/test_two_stage.py::test_formula_is_the_absorption_probability_of_the_chain"]),
    ("SFT (D.1): reward P(tau*) instead of 1 / P(tau*)", "dsh/theory/sft_pg.py",
     "return [1.0 / p_star if tr == traj else 0.0] * len(st)", "return [p_star if tr == traj else 0.0] * len(st)",
     ["tests/test_sft_pg.py::test_sft_is_the_policy_gradient_of_the_outcome_reward"]),
    ("Appendix D table (valid Q): RL's Q_d without the later attempts", "dsh/theory/implicit_rewards.py",
     "q_decision = [gamma * V[k + 1] for k in range(T - 1)]", "q_decision = [gamma for k in range(T - 1)]",
     ["tests/test_theory.py::test_valid_property_table_cells_recomputed_independently"]),
    ("Theorem 3.2 (unified Phi): the paper's indices instead of Definition 3.1's", "dsh/theory/symbolic.py",
     "gamma * (phi_plus[k] if k + 1 < T else 0)", "gamma * (phi[k + 1] if k + 1 < T else 0)",
     ["tests/test_theory.py::test_unified_phi_exists_with_the_indices_of_definition_3_1"]),
    ("Token-consistent toy: each token right with sigma(theta_s) instead of its L-th root", "dsh/theory/token_toy.py",
     "q = torch.sigmoid(theta[0]) ** (1.0 / L)", "q = torch.sigmoid(theta[0])",
     ["tests/test_token_toy.py::test_closed_forms_equal_the_sum_over_every_token_sequence"]),
    ("Claim (i') mixture: the F->T prediction ignores the candidates before it", "dsh/measure/predictions.py",
     "ft += (alpha + sum(c[:j])) / (alpha + beta + j)", "ft += alpha / (alpha + beta)",
     ["tests/test_predictions.py::test_questions_that_differ_fail_the_plain_checks_but_not_the_mixture"]),
    ("SFT (D.1): the error after the best rescale taken as 1 - cosine", "dsh/theory/sft_pg.py",
     "return float(np.sqrt(max(0.0, 1.0 - self.cosine ** 2)))", "return float(1.0 - self.cosine)",
     ["tests/test_sft_pg.py::test_erratum_measures_against_an_independent_least_squares_fit"]),
    ("SFT (D.1): the printed Q with pi instead of 1/pi", "dsh/theory/sft_pg.py",
     "q_paper = _paper_q(pi, 1.0 / pi)", "q_paper = _paper_q(pi, pi)",
     ["tests/test_sft_pg.py::test_theorem_d1_as_printed_is_not_the_sft_gradient"]),
    ("DFT (D.2): no stop-gradient on the weight", "dsh/theory/sft_pg.py",
     "grad = torch.autograd.grad((logp.detach().exp() * logp).sum()", "grad = torch.autograd.grad((logp.exp() * logp).sum()",
     ["tests/test_sft_pg.py::test_lemma_d2_dft_gradient_is_grad_pi"]),
    ("Appendix C: drop the reward's discount", "dsh/theory/toy.py",
     "reward[par] = R(reward[par] + advantage * gamma ** n_after * g)", "reward[par] = R(reward[par] + advantage * g)",
     ["tests/test_toy.py::test_appendix_c_against_an_independent_computation"]),
]


def _copy(dest: Path) -> Path:
    shutil.copytree(ROOT / "dsh", dest / "dsh", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "tests", dest / "tests", ignore=shutil.ignore_patterns("__pycache__", "browser"))
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


def _pytest(where: Path, nodes) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--no-header",
                           "-o", "addopts=", *nodes], cwd=where, env=env, capture_output=True, text=True)


def test_unmutated_copy_passes(tmp_path):
    nodes = sorted({n for *_, ns in MUTATIONS for n in ns})
    r = _pytest(_copy(tmp_path), nodes)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]


@pytest.mark.parametrize("claim,path,old,new,nodes", MUTATIONS, ids=[m[0].split(":")[0] + f"-{i}" for i, m in enumerate(MUTATIONS)])
def test_mutation_is_caught(tmp_path, claim, path, old, new, nodes):
    where = _copy(tmp_path)
    f = where / path
    text = f.read_text()
    assert text.count(old) == 1, f"the mutation site of '{claim}' is not unique in {path}: update MUTATIONS"
    f.write_text(text.replace(old, new))
    r = _pytest(where, nodes)
    assert r.returncode == 1, f"{claim}: the tests did not fail (exit {r.returncode})\n{r.stdout[-2000:]}"
