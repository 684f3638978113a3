"""Gradient attribution (chapter 08): the studies of a results folder, their slope tables against Theorem 3.2's
prediction and against the balanced-weight baseline, the censoring-robust fits, the Theorem 3.1 identity, the
decision's per-token KL per level (the premise), the reproduction count of repeated studies, and their figures."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ...core import validate as v
from ...core.files import read_json, read_jsonl
from ...measure.length_law import TOLERANCE, cluster_median, mutual_inclusion
from ...task.problems import level_index
from ..run.attribution_fits import PREDICTED_SLOPE, carries, excess_fit, reward_identity, robust_fit, study_record
from .frame import levels_sorted


def load_attribution(results_dir) -> dict:
    """The gradient-attribution studies of a results folder (``attribution/<stage>.json.gz``, written by the
    pipeline's attribution step, :func:`dsh.experiment.run.steps.attribution_stage`), by name (the file's without
    ``.json.gz``); empty when there are none."""
    return _records_in(results_dir, "attribution")


def load_dynamics(results_dir) -> dict:
    """The attribution studies along the GRPO runs (``dynamics/<arm>-step<k>.json.gz``, written by
    ``book/results/laptop/design/grpo_dynamics.py``), by name (without ``.json.gz``); empty when there are none."""
    return _records_in(results_dir, "dynamics")


def _records_in(results_dir, sub: str) -> dict:
    """The gzipped JSON records ``<results_dir>/<sub>/*.json.gz`` by name (``.json.gz`` dropped); ``results_dir``
    must be an existing folder."""
    if not isinstance(results_dir, (str, Path)) or not Path(results_dir).is_dir():
        raise ValueError(f"results_dir must be an existing folder, got {results_dir!r}")
    return {f.name[:-len(".json.gz")]: read_json(f) for f in sorted(Path(results_dir).glob(f"{sub}/*.json.gz"))}


DYNAMICS_TERMS = ("reward", "kl_k3")


def dynamics_table(studies: dict, betas: dict, seed: int = 0) -> pd.DataFrame:
    """One row per GRPO arm and step (:func:`load_dynamics`): the run's validation estimates at that step (p_s,
    p_dC, p_dW and the intervals of p_s and p_dW) and, per term of the GRPO loss, the median over trajectories of the
    norm of its attempt part (what reaches pi_sample) and of its decision part (pi_d), with 95 % intervals that
    resample questions (:func:`dsh.measure.length_law.cluster_median`): the surrogate reward over the trajectories
    with an advantage, TRL's k3 KL times the arm's coefficient ``betas[arm]`` (its weight in the loss; none where the
    policy is its reference)."""
    _studies("studies", studies, ("arm", "step", "trajectories"))
    if not isinstance(betas, dict):
        raise ValueError(f"betas must map each GRPO arm to its KL coefficient, got {type(betas).__name__}")
    missing = sorted({x["arm"] for x in studies.values()} - set(betas))
    if missing:
        raise ValueError(f"betas must give every arm's KL coefficient; missing {', '.join(missing)}")
    rows = []
    for s in sorted(studies.values(), key=lambda x: (x["arm"], x["step"])):
        val = s.get("validation") or {}
        (s_lo, s_hi), (w_lo, w_hi) = (val.get(f"{k}_ci") or (None, None) for k in ("p_s", "p_d_given_wrong"))
        row = {"arm": s["arm"], "step": s["step"], "p_s": val.get("p_s"), "p_s low": s_lo, "p_s high": s_hi,
               "p_dC": val.get("p_d_given_correct"), "p_dW": val.get("p_d_given_wrong"), "p_dW low": w_lo,
               "p_dW high": w_hi, "trajectories": len(s["trajectories"])}
        for o in DYNAMICS_TERMS:
            weight = 1.0 if o == "reward" else betas[s["arm"]]
            got = [r for r in s["trajectories"] if r["grad"].get(o)]
            for part in ("attempt", "decision"):
                m = cluster_median([weight * r["grad"][o][part] for r in got], [r["prompt"] for r in got], seed=seed) \
                    if got else {"median": None, "ci": [None, None]}
                row[f"{o} {part}"], row[f"{o} {part} low"], row[f"{o} {part} high"] = m["median"], *m["ci"]
        rows.append(row)
    return pd.DataFrame(rows)


def question_repeats(results_dir, stage: str = "base") -> pd.DataFrame:
    """The test questions of a results folder, read from ``generations/<stage>.jsonl.gz`` (every stage is asked the
    same ones): per level the questions asked, how many are distinct, and the repeats (a draw with replacement
    repeats a question; :func:`dsh.task.problems.draw_problems` with ``distinct`` does not)."""
    if not isinstance(results_dir, (str, Path)):
        raise ValueError(f"results_dir must be a results folder path, got {results_dir!r}")
    recs = read_jsonl(Path(results_dir) / "generations" / f"{stage}.jsonl.gz", what="results_dir")
    rows = []
    for lv in sorted({r["level"] for r in recs}, key=level_index):
        qs = [r["question"] for r in recs if r["level"] == lv]
        rows.append({"level": lv, "questions": len(qs), "distinct": len(set(qs)), "repeats": len(qs) - len(set(qs))})
    return pd.DataFrame(rows, columns=["level", "questions", "distinct", "repeats"])


def _study(name: str, study, needs=("fits",)) -> dict:
    """``study`` checked to be a study record holding ``needs`` (by default its fits)."""
    return study_record(name, study, needs)


def _studies(name: str, studies, needs=("fits",)) -> dict:
    """``studies`` checked to map names to study records holding ``needs``."""
    if not isinstance(studies, dict):
        raise ValueError(f"{name} must map study names to study records (attribution_study.run_study), "
                         f"got {type(studies).__name__}")
    for k, st in studies.items():
        _study(f"{name}[{k!r}]", st, needs)
    return studies


def attribution_table(studies: dict) -> pd.DataFrame:
    """One row per study, term and denominator: the log-log slope of |g_attempt| / |g_part| on the attempt length
    with its 95 % bootstrap interval, the pairs used, those left out because the part carries no gradient, the
    lengths' span, Theorem 3.2's predicted slope and the verdict (:mod:`dsh.measure.length_law`)."""
    rows = []
    for name, s in _studies("studies", studies).items():
        for key, f in s["fits"].items():
            term, against = key.split(" / ")
            rows.append({"study": name, "term": term, "against": against, "pairs": f["n"],
                         "silent": f.get("silent"), "span": f["span"], "slope": f["slope"], "low": f["ci"][0],
                         "high": f["ci"][1], "predicted": f["predicted"], "verdict": f["verdict"]})
    return pd.DataFrame(rows)


def _side_by_side(first: dict, second: dict, labels, key: list, cols: list, against: str | None = None) -> pd.DataFrame:
    """:func:`attribution_table` of two sets of studies joined on ``key``, ``cols`` of each suffixed with its label
    (``against``: only fits against it), only the fits with a slope in both."""
    a, b = attribution_table(first), attribution_table(second)
    if against is not None:
        a, b = a[a.against == against], b[b.against == against]
    both = a.set_index(key)[cols].add_suffix(f" ({labels[0]})").join(
        b.set_index(key)[cols].add_suffix(f" ({labels[1]})"), how="inner")
    return both[both[f"slope ({labels[0]})"].notna() & both[f"slope ({labels[1]})"].notna()].copy()


def reproduction(first: dict, second: dict) -> pd.DataFrame:
    """Two studies of one model with different seeds of trajectories, side by side: per term and denominator the
    slope and 95 % interval of each (suffixes ``(t0)``, ``(t1)``), whether the slope is reproduced (each run's
    slope inside the other's interval) and the chance of that were both estimates of one slope, normal, with
    intervals of these widths (``chance``: :func:`dsh.measure.length_law.mutual_inclusion`, about 0.83). Terms
    without a slope in either are left out."""
    both = _side_by_side({"x": _study("first", first)}, {"x": _study("second", second)}, ("t0", "t1"),
                         ["term", "against"], ["slope", "low", "high"])
    both["reproduced"] = ((both["low (t1)"] <= both["slope (t0)"]) & (both["slope (t0)"] <= both["high (t1)"])
                          & (both["low (t0)"] <= both["slope (t1)"]) & (both["slope (t1)"] <= both["high (t0)"]))
    both["chance"] = [mutual_inclusion([a, b], [c, d]) for a, b, c, d in
                      both[["low (t0)", "high (t0)", "low (t1)", "high (t1)"]].itertuples(index=False)]
    return both[["slope (t0)", "low (t0)", "high (t0)", "slope (t1)", "low (t1)", "high (t1)", "reproduced", "chance"]]


def reproduction_count(tables, correlations=None, draws: int = 100_000, seed: int = 0) -> dict:
    """Over :func:`reproduction` tables (one per model), how many slopes are reproduced, against how many were
    expected were every pair two estimates of one slope (the sum of ``chance``), with the 95 % range of that count
    and the chance that every slope is reproduced (``p_all``). Without ``correlations`` the slopes count as
    independent: the range is the normal approximation to a sum of Bernoulli draws, sum p +- 1.96 sqrt(sum p (1 - p)),
    and ``p_all`` the product of the chances. ``correlations``: one entry per table, the correlation of its first
    study's slopes and of its second's (a pair of :func:`dsh.experiment.run.attribution_fits.slope_correlation` frames,
    or one frame for both), indexed by ``(term, against)`` as the table is; then the difference of each pair of runs
    is drawn ``draws`` times, normal with those correlations and the intervals' widths (tables independent of each
    other), a slope counting as reproduced when the difference lies within both intervals' half-widths
    (:func:`dsh.measure.length_law.mutual_inclusion`'s rule), and the range and ``p_all`` come from those draws."""
    from statistics import NormalDist

    import numpy as np

    tables = v.collection("tables", tables, "reproduction() tables", nonempty=True)
    if not all(isinstance(t, pd.DataFrame) and {"reproduced", "chance"} <= set(t.columns) for t in tables):
        raise ValueError("tables must be a non-empty list of reproduction() tables")
    p = pd.concat(tables).chance.to_numpy(dtype=float)
    expected, sd = float(p.sum()), float((p * (1 - p)).sum()) ** 0.5
    out = {"reproduced": int(sum(int(t.reproduced.sum()) for t in tables)), "slopes": int(p.size),
           "expected": expected}
    if correlations is None:
        return {**out, "low": expected - 1.96 * sd, "high": expected + 1.96 * sd, "p_all": float(np.prod(p)),
                "range_by": "independent slopes (normal approximation)"}
    correlations = v.collection("correlations", correlations, "correlation frames, one per table")
    if len(correlations) != len(tables):
        raise ValueError(f"correlations must give one entry per table ({len(tables)}), got {len(correlations)}")
    v.positive_int("draws", draws)
    v.length("seed", seed)
    z, rng = NormalDist().inv_cdf(0.975), np.random.default_rng(seed)
    count, every = np.zeros(draws), np.ones(draws, dtype=bool)
    for t, corr in zip(tables, correlations):
        pair = corr if isinstance(corr, (tuple, list)) else (corr, corr)
        if len(pair) != 2 or not all(isinstance(c, pd.DataFrame) for c in pair):
            raise ValueError("correlations[i] must be a correlation DataFrame or a pair of them (slope_correlation)")
        missing = [k for c in pair for k in t.index if k not in c.index or k not in c.columns]
        if missing:
            raise ValueError(f"correlations[i] lacks the table's slopes {sorted(set(missing))[:3]}")
        s0 = (t["high (t0)"] - t["low (t0)"]).to_numpy(dtype=float) / (2 * z)
        s1 = (t["high (t1)"] - t["low (t1)"]).to_numpy(dtype=float) / (2 * z)
        r0, r1 = (c.loc[t.index, t.index].to_numpy(dtype=float) for c in pair)
        cov = r0 * np.outer(s0, s0) + r1 * np.outer(s1, s1)
        d = rng.multivariate_normal(np.zeros(len(t)), cov, size=draws, method="eigh")
        hit = np.abs(d) <= z * np.minimum(s0, s1)
        count += hit.sum(1)
        every &= hit.all(1)
    low, high = np.quantile(count, [0.025, 0.975])
    return {**out, "low": float(low), "high": float(high), "p_all": float(every.mean()),
            "range_by": "correlated slopes (the studies' bootstrap correlations, normal draws)"}


def compare_fits(first: dict, second: dict, labels=("first", "second"), against: str = "decision") -> pd.DataFrame:
    """The same models' fits in two sets of studies (``{study: record with fits}``, e.g. one model sampled at two
    temperatures), side by side per study and term against ``against``: slope, interval and pairs of each (suffixed
    with ``labels``), only fits with a slope in both, and whether the two intervals are disjoint."""
    v.choice("against", against, ("decision", "stage"))
    _studies("first", first), _studies("second", second)
    if len(labels) != 2 or labels[0] == labels[1]:
        raise ValueError(f"labels must be two different names, got {labels!r}")
    both = _side_by_side(first, second, labels, ["study", "term"], ["slope", "low", "high", "pairs"], against)
    lo, hi = both.filter(like="low").to_numpy(dtype=float).T, both.filter(like="high").to_numpy(dtype=float).T
    both["disjoint"] = (hi[0] < lo[1]) | (hi[1] < lo[0])
    return both


def kl_profile(study: dict, width: int = 10) -> pd.DataFrame:
    """The mean k1 = log(pi / pi_ref) by position along the first attempt, in bins of ``width`` positions (positions
    with at least 10 trajectories): the stationarity premise says it is flat. No rows (the columns kept) where no
    position has 10 trajectories, as for a model that writes no check after its answer."""
    import numpy as np

    v.positive_int("width", width)
    s, n = (np.asarray(_study("study", study, ("kl_positions",))["kl_positions"][k]) for k in ("sum", "n"))
    rows = []
    for start in range(0, len(s), width):
        ok = n[start:start + width] >= 10
        if ok.any():
            rows.append({"positions": f"{start}-{start + width - 1}", "first": start,
                         "mean k1": float(s[start:start + width][ok].sum() / n[start:start + width][ok].sum()),
                         "trajectories": int(n[start:start + width][ok].min())})
    return pd.DataFrame(rows, columns=["positions", "first", "mean k1", "trajectories"])


def plot_attribution(study: dict, terms=("reward", "kl_reward", "kl_k3"), against: str = "stage", title: str = ""):
    """|g_attempt| / |g_<against>| of every trajectory against its attempt length (log-log), one panel per term,
    with the fitted slope and its interval in the legend."""
    import matplotlib.pyplot as plt
    import numpy as np

    _study("study", study, ("fits", "trajectories"))
    v.choice("against", against, ("decision", "stage"))
    fig, axes = plt.subplots(1, len(terms), figsize=(4 * len(terms), 3.4), squeeze=False)
    for ax, term in zip(axes[0], terms):
        pts = [(r["L"], r["grad"][term]["attempt"] / r["grad"][term][against]) for r in study["trajectories"]
               if r["grad"].get(term) and carries(r["grad"][term], against)]
        f = study["fits"].get(f"{term} / {against}")
        if pts:
            x, y = np.array(pts).T
            ax.scatter(x, y, s=8, alpha=0.5)
            if f and f["slope"] is not None:
                xs = np.linspace(np.log(x.min()), np.log(x.max()), 20)
                c = np.mean(np.log(y)) - f["slope"] * np.mean(np.log(x))
                ax.plot(np.exp(xs), np.exp(c + f["slope"] * xs), "k-",
                        label=f"slope {f['slope']:.2f} [{f['ci'][0]:.2f}, {f['ci'][1]:.2f}]")
                ax.legend(fontsize=8)
        ax.set(xscale="log", yscale="log", xlabel="attempt length L (tokens)",
               ylabel=f"|g_attempt| / |g_{against}|", title=f"{title} {term}".strip())
    fig.tight_layout()
    return fig


def grad_by_level(study: dict, term: str) -> pd.DataFrame:
    """Per level (ladder order): the median attempt length and the median |g_attempt| and |g_decision| of the
    objective ``term`` over the level's trajectories: how much of a length-law slope fitted across levels is the
    length's, and how much the level's own."""
    terms = sorted({k for t in _study("study", study, ("trajectories",))["trajectories"] for k in t.get("grad", {})})
    v.choice("term", term, terms)
    df = pd.DataFrame([{"level": t["level"], "L": t["L"], "|g_attempt|": t["grad"][term]["attempt"],
                        "|g_decision|": t["grad"][term]["decision"]}
                       for t in study["trajectories"] if t["grad"].get(term)])
    return df.groupby("level").median().loc[levels_sorted(df)]


def plot_slopes(groups: dict, terms=("kl_immediate", "kl_k3", "kl_reward", "reward"), against: str = "decision"):
    """The length law's slopes with their 95 % intervals, one panel per term, one row per study of each group
    (``{group label: {study name: study}}``, e.g. the laptop stages and the laptop-wide stages), with the prediction
    and the band of the verdict rule (:data:`dsh.measure.length_law.TOLERANCE`) shaded."""
    import matplotlib.pyplot as plt

    if not isinstance(groups, dict) or not groups:
        raise ValueError("groups must map group labels to {study name: study record}")
    for g, studies in groups.items():
        _studies(f"groups[{g!r}]", studies)
    v.choice("against", against, ("decision", "stage"))
    names = [(g, n) for g, studies in groups.items() for n in studies]
    fig, axes = plt.subplots(1, len(terms), figsize=(3.3 * len(terms), 0.32 * len(names) + 1.4), sharey=True,
                             squeeze=False)
    colours = dict(zip(groups, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for ax, term in zip(axes[0], terms):
        want = PREDICTED_SLOPE.get(term)
        if want is not None:
            ax.axvspan(want - TOLERANCE, want + TOLERANCE, color="0.9", zorder=0)
            ax.axvline(want, color="0.5", lw=1, zorder=0)
        for y, (g, n) in enumerate(names):
            f = groups[g][n]["fits"].get(f"{term} / {against}")
            if f and f["slope"] is not None:
                ax.errorbar(f["slope"], y, xerr=[[f["slope"] - f["ci"][0]], [f["ci"][1] - f["slope"]]], fmt="o",
                            color=colours[g], ms=4, capsize=2)
        ax.set(title=term, xlabel="log-log slope")
    axes[0][0].set_yticks(range(len(names)), [f"{g}: {n}" for g, n in names], fontsize=8)
    axes[0][0].invert_yaxis()
    fig.suptitle(f"|g_attempt| / |g_{against}| against the attempt length L: slopes with 95 % intervals "
                 f"(shaded: the prediction +-{TOLERANCE:g})", fontsize=10)
    fig.tight_layout()
    return fig


def attempt_lengths(studies: dict) -> pd.DataFrame:
    """Median attempt length (tokens) per level of each study's own trajectories, and the span of those medians
    (longest / shortest): the range of L the length law is fitted over, free of a few outlying attempts."""
    rows = {}
    for name, s in _studies("studies", studies, ("trajectories",)).items():
        if not s["trajectories"]:
            continue
        df = pd.DataFrame([{"level": t["level"], "L": t["L"]} for t in s["trajectories"]])
        med = df.groupby("level")["L"].median()
        rows[name] = {**med.to_dict(), "span of medians": med.max() / med.min(),
                      "span of all": df.L.max() / df.L.min()}
    out = pd.DataFrame(rows).T
    levels = sorted((c for c in out.columns if not c.startswith("span")), key=level_index)   # 1x10 after 1x9
    return out[levels + [c for c in out.columns if c.startswith("span")]]


def kl_by_level(study: dict) -> pd.DataFrame:
    """The immediate KL of Theorem 3.2 against the study's reference, per level (ladder order): the median over the
    level's trajectories of the k1 sum of the attempt tokens and of the decision tokens, and the trajectories."""
    df = pd.DataFrame([{"level": t["level"], "attempt k1": t["kl"]["attempt"], "decision k1": t["kl"]["decision"]}
                       for t in _study("study", study, ("trajectories",))["trajectories"]])
    out = df.groupby("level").agg(**{"attempt k1": ("attempt k1", "median"),
                                     "decision k1": ("decision k1", "median"),
                                     "trajectories": ("attempt k1", "size")})
    return out.loc[levels_sorted(df)]


def _ci(x) -> str:
    lo, hi = x["ci"]
    return "-" if x.get("slope") is None or lo is None else f"{x['slope']:+.2f} ({lo:+.2f}, {hi:+.2f})"


def baseline_table(studies: dict, terms=("kl_immediate", "kl_k3", "kl_reward"), n_boot: int = 400) -> pd.DataFrame:
    """Theorem 3.2 in each study, read as its predictions are made: per study and KL term, the fit's own span (the
    per-level median L of the levels it uses), the plain slope (silent decisions left out) and the censoring-robust
    one (per-level medians, silent = +inf: :func:`dsh.experiment.run.attribution_fits.robust_fit`) with their verdicts
    against 1, and the slope in excess of the SFT loss's on the same trajectories (the balanced-weight baseline:
    :func:`dsh.experiment.run.attribution_fits.excess_fit`; none for the immediate KL, not a gradient); and per study the
    Theorem 3.1 identity (:func:`dsh.experiment.run.attribution_fits.reward_identity`)."""
    rows = []
    for name, st in _studies("studies", studies, ("trajectories", "fits")).items():
        ident = reward_identity(st)
        for term in terms:
            plain = st["fits"].get(f"{term} / decision") or {}
            if not plain.get("n"):
                continue
            r = robust_fit(st, term, n_boot=n_boot)
            ex = excess_fit(st, term, n_boot=n_boot) if term != "kl_immediate" else None
            rows.append({"study": name, "term": term, "own span": None if r["span"] is None else round(r["span"], 1),
                         "plain slope (95 %)": _ci(plain), "plain": plain.get("verdict"),
                         "robust slope (95 %)": _ci(r), "robust": r["verdict"],
                         "silent": f"{r['silent']} of {r['n']}", "excess over SFT (95 %)": _ci(ex) if ex else "-",
                         "Theorem 3.1 identity": f"{ident['trajectories']} trajectories, {ident['violations']} off"})
    return pd.DataFrame(rows)


def premise_table(by_level: dict) -> pd.DataFrame:
    """Theorem 3.2's premise per study and level: the decision's and the attempt's median per-token k1 with 95 %
    intervals, from ``{study: dsh.experiment.run.attribution_fits.decision_kl_by_level(study)}``."""
    if not isinstance(by_level, dict):
        raise ValueError("by_level must map study names to decision_kl_by_level's result")
    rows = []
    fmt = lambda m: "-" if m["median"] is None else f"{m['median']:+.4f} ({m['ci'][0]:+.4f}, {m['ci'][1]:+.4f})"  # noqa: E731
    for name, levels in by_level.items():
        for lv, x in levels.items():
            rows.append({"study": name, "level": lv, "trajectories": x["n"], "decision k1 per token": fmt(x["decision"]),
                         "attempt k1 per token": fmt(x["attempt"])})
    return pd.DataFrame(rows)
