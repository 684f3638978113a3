"""The token-consistent toy (dsh.theory.token_toy): closed forms against enumeration over token sequences, gradients
against finite differences of the enumeration, the paper's toy at L = 1, and what its length sweep shows."""

import numpy as np
import pytest

from dsh.theory import token_toy as TT
from dsh.theory import toy

THETA, REF = [0.4, 2.2, 1.4], [0.3, 2.0, 1.2]     # Appendix C's logits


@pytest.mark.parametrize("L", [1, 2, 3, 5])
def test_closed_forms_equal_the_sum_over_every_token_sequence(L):
    J, K = TT.expected_by_enumeration(THETA, REF, L)
    assert abs(J - float(TT.expected_reward(THETA, L))) < 1e-12
    assert abs(K - float(TT.expected_kl(THETA, REF, L))) < 1e-12


def test_kl_gradient_is_the_finite_difference_of_the_enumeration():
    g = TT.expected_gradients(THETA, REF, 3)["kl"]
    h = 1e-6
    for i in range(3):
        up, dn = list(THETA), list(THETA)
        up[i] += h
        dn[i] -= h
        fd = (TT.expected_by_enumeration(up, REF, 3)[1] - TT.expected_by_enumeration(dn, REF, 3)[1]) / (2 * h)
        assert abs(fd - g[i]) < 1e-6 * max(1.0, abs(g[i]))


def test_at_one_token_it_is_the_papers_toy():
    ours = TT.expected_gradients(THETA, REF, 1)
    paper = toy.expected_gradients(THETA, REF, 1, 1)
    np.testing.assert_allclose(ours["reward"], paper.reward, atol=1e-12)
    np.testing.assert_allclose(ours["kl"], paper.kl, atol=1e-12)
    np.testing.assert_allclose(ours["kl_loss_k3"], paper.kl_loss_k3, atol=1e-12)


def test_length_sweep_reward_flat_kl_bounded_where_the_papers_toy_grows_linearly():
    Ls = [1, 8, 32, 256, 1024]
    ours, paper = TT.length_sweep(THETA, REF, Ls), toy.length_sweep(THETA, REF, Ls)
    np.testing.assert_allclose(ours["reward"], paper["reward"], rtol=1e-9)
    assert np.ptp(ours["reward"]) < 1e-9
    for k in ("kl", "kl_loss_k3"):
        assert ours[k][-1] / ours[k][2] < 1.1 and ours[k][-1] < 2 * ours[k][0]    # bounded
        assert paper[k][-1] / paper[k][2] > 3                                     # grows with L


def test_bad_input():
    with pytest.raises(ValueError, match="^L must be an integer >= 1"):
        TT.expected_kl(THETA, REF, 0)
    with pytest.raises(ValueError, match="^L must be at most 12"):
        TT.expected_by_enumeration(THETA, REF, 13)
    with pytest.raises(ValueError, match="^theta must be three finite logits"):
        TT.expected_reward([0.1, 0.2], 2)
