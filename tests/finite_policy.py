"""An independent implementation of the finite MDP's policy for the theory tests.

It uses only the model's definition (``sample_logits`` / ``decision_logits``: the logits of each context)
and does everything else itself, in numpy: its own softmax, its own walk through a trajectory, an
ancestral sampler, and finite differences. Nothing here calls dsh's log-probabilities, steps, Q-values
or gradients, so a test comparing the two can disagree.
"""

import numpy as np
import torch

STOP, RESAMPLE = 0, 1


def _np(x):
    return x.detach().numpy() if torch.is_tensor(x) else np.asarray(x)


def log_softmax(z):
    z = np.asarray(z, dtype=np.float64)
    m = z.max()
    return z - m - np.log(np.exp(z - m).sum())


def token_logps(m, theta_sample, theta_decision, attempts, decisions):
    """Per-token log-probabilities of a trajectory, in generation order, with kinds: a list of
    ("sample" | "decision", logp). Sampling tokens use ``theta_sample``, decisions ``theta_decision``."""
    ts = torch.as_tensor(np.asarray(theta_sample, dtype=np.float64))
    td = torch.as_tensor(np.asarray(theta_decision, dtype=np.float64))
    out, prev_answer = [], None
    for k, (att, dec) in enumerate(zip(attempts, decisions), start=1):
        prev_tok = None
        for j, tok in enumerate(att):
            out.append(("sample", log_softmax(_np(m.sample_logits(ts, k, j, prev_answer, prev_tok)))[tok]))
            prev_tok = tok
        ans = sum(att) % m.vocab_size
        if k == m.max_attempts:
            out.append(("decision", 0.0 if dec == STOP else -np.inf))
        else:
            out.append(("decision", log_softmax(_np(m.decision_logits(td, k, ans)))[dec]))
        prev_answer = ans
    return out


def log_prob(m, theta, traj, theta_decision=None):
    td = theta if theta_decision is None else theta_decision
    return float(sum(lp for _, lp in token_logps(m, theta, td, traj.attempts, traj.decisions)))


def sample(m, theta, n, seed):
    """Ancestral sampling of ``n`` trajectories token by token; returns (attempts, decisions) tuples."""
    rng = np.random.default_rng(seed)
    th = torch.as_tensor(np.asarray(theta, dtype=np.float64))
    cache = {}

    def probs(kind, *ctx):
        if (kind, ctx) not in cache:
            z = m.sample_logits(th, *ctx) if kind == "s" else m.decision_logits(th, *ctx)
            cache[kind, ctx] = np.exp(log_softmax(_np(z)))
        return cache[kind, ctx]

    out = []
    for _ in range(n):
        attempts, decisions, prev_answer = [], [], None
        for k in range(1, m.max_attempts + 1):
            att, prev_tok = [], None
            for j in range(m.attempt_length):
                p = probs("s", k, j, prev_answer, prev_tok)
                tok = int(rng.choice(m.vocab_size, p=p))
                att.append(tok)
                prev_tok = tok
            ans = sum(att) % m.vocab_size
            attempts.append(tuple(att))
            if k == m.max_attempts:
                decisions.append(STOP)
                break
            p = probs("d", k, ans)
            dec = int(rng.choice(2, p=p))
            decisions.append(dec)
            prev_answer = ans
            if dec == STOP:
                break
        out.append((tuple(attempts), tuple(decisions)))
    return out


def finite_difference(f, theta, h=1e-6):
    """Central differences of the scalar function ``f`` at ``theta`` (numpy vector)."""
    theta = np.asarray(theta, dtype=np.float64)
    g = np.zeros_like(theta)
    for i in range(theta.size):
        e = np.zeros_like(theta)
        e[i] = h
        g[i] = (f(theta + e) - f(theta - e)) / (2 * h)
    return g
