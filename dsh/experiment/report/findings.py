"""The book's findings: one row per claim of the paper, with the book's verdict, the number behind it and the
section that shows it, each computed by the library functions the chapters call (the theory on the finite
two-stage MDP and in SymPy, the empirical rows from a committed results folder). Nothing here is typed in: a
check that comes out differently gives a different verdict.

Verdicts: "confirmed" (a formal statement checked exactly), "erratum" (the printed statement is wrong where the
book says), "holds" / "fails" (an empirical claim whose 95 % interval excludes the other answer on every seed),
"cannot tell" (the data cannot decide, or the seeds disagree), "not testable here" (no level where the data could
have said the opposite: :mod:`dsh.measure.claims`)."""

from __future__ import annotations

import html

import numpy as np

from ...core import validate as v
from ...measure.claims import GRADED, NOT_TESTABLE, block, claim_kl_keeps_decision, graded, sign_verdict
from ...theory import verdicts
from .. import report
from ..run.attribution_fits import (
    IDENTITY_RTOL,
    MIN_SPAN,
    MIN_TRAJECTORIES,
    decision_kl_by_level,
    levels_apart,
    reward_identity,
    robust_fit,
)
from ..run.pipeline import plan_of
from ..run.presets import stage_label

VERDICTS = ("confirmed", "erratum", "holds", "fails", "cannot tell", NOT_TESTABLE)


def _row(group, claim, verdict, number, doc, anchor=""):
    if verdict not in VERDICTS:
        raise ValueError(f"verdict must be one of {', '.join(VERDICTS)}, got {verdict!r}")
    return {"group": group, "claim": claim, "verdict": verdict, "number": number, "doc": doc, "anchor": anchor}


# the formal claims as the first page names them: (claim, its check in dsh.theory.verdicts, chapter, anchor)
THEORY_CLAIMS = (
    ("Lemma 3.1: the trajectory probability factorizes into pi_sample and pi_d", "lemma_3_1",
     "01_decision_sampling", "lem-factorization"),
    ("Corollary 3.1: the score splits into sampling and decision terms", "corollary_3_1", "01_decision_sampling",
     "cor-gradient"),
    ("Lemma 3.2: the policy gradient splits into sampling and decision terms", "lemma_3_2", "01_decision_sampling",
     "lem-pg"),
    ("The two-stage accuracy formula", "accuracy_formula", "01_decision_sampling", "prop-accuracy"),
    ("Theorem 3.1: the surrogate reward attributes balanced", "theorem_3_1", "02_gradient_attribution",
     "thm-surrogate"),
    ("Theorem 3.2: the token-level KL penalty attributes unbalanced (O(L_k) vs O(1))", "theorem_3_2",
     "02_gradient_attribution", "thm-kl"),
    ("Remark (clipping) keeps the balance", "clipping_remark", "02_gradient_attribution", "rem-clipping"),
    ("Appendix C: the toy's tables and conclusion", "appendix_c", "03_toy_example", "appendix-c-reproduced"),
    ("Theorem D.1: SFT's gradient as Q-weighted scores", "theorem_d1", "05_sft_dft", "thm-sft"),
    ("Theorem D.2: DFT's gradient as Q-weighted scores", "theorem_d2", "05_sft_dft", "thm-dft"),
    ("Appendix D: the SFT / DFT / RL comparison table", "appendix_d", "05_sft_dft",
     "the-comparison-table-recomputed"),
)


def theory_findings(seed: int = 0, T: int = 3) -> list[dict]:
    """The formal claims (:data:`THEORY_CLAIMS`), each by its check in :mod:`dsh.theory.verdicts` (the one its
    chapter calls), on the finite two-stage MDP of ``seed`` and symbolically for ``T`` attempts."""
    v.length("seed", seed)
    v.length("T", T, minimum=2)
    model, theta, _, theta_old = verdicts.mdp_setup(seed)
    args = {"lemma_3_1": (model, theta), "corollary_3_1": (model, theta), "lemma_3_2": (model, theta),
            "accuracy_formula": (), "theorem_3_1": (T,), "theorem_3_2": (T,),
            "clipping_remark": (model, theta, theta_old), "appendix_c": (), "theorem_d1": (),
            "theorem_d2": (model, theta, T), "appendix_d": (T,)}
    rows = []
    for claim, check, doc, anchor in THEORY_CLAIMS:
        got = getattr(verdicts, check)(*args[check])
        rows.append(_row("theory", claim, got["verdict"], got["number"], doc, anchor))
    return rows


def _every(oks: list[bool]) -> str:
    """"holds" when a condition holds on every seed, "fails" when on none, else "cannot tell"."""
    return "holds" if all(oks) else "fails" if not any(oks) else "cannot tell"


def _across_seeds(verdicts: list[str]) -> str:
    """One verdict from several (seeds, studies): theirs when they all agree (a "not testable here: <reason>" read
    as "not testable here"), else "cannot tell"."""
    short = [x.split(":")[0] for x in verdicts]
    return short[0] if short and len(set(short)) == 1 else "cannot tell"


def graded_levels(results: dict, kind: str) -> str:
    """One phrase on a stage kind's levels over the seeds: how many levels have p_s in the graded band and the range
    of its per-level p_s (the first page shows it beside each verdict)."""
    counts, ps = [], []
    for x in plan_of(results):
        if x["kind"] != kind:
            continue
        levels = block(results["calibration"][x["name"]])["by_level"].values()
        counts.append(sum(graded(s) for s in levels))
        ps += [s["p_s"] for s in levels if s.get("p_s") is not None]
    if not counts:
        return f"no {kind} stage"
    return (f"{stage_label(kind)}: {min(counts)}-{max(counts)} levels a seed with p_s in "
            f"{GRADED[0]}-{GRADED[1]}, p_s by level {min(ps):.2f}-{max(ps):.2f}")


def empirical_findings(results: dict, group: str = "laptop", anchor: str = "laptop-results") -> list[dict]:
    """The paper's empirical claims on a results folder (:func:`dsh.experiment.run.pipeline.load_results`): Table 1's
    reading (RL more accurate than SFT with reflection, levels weighted equally), the calibration figure (claim (i))
    and claims (i')-(iii), each per training seed by :func:`dsh.experiment.report.claims_by_seed` and the seeds'
    verdicts combined, each with the graded levels it could be judged on (:func:`graded_levels`); ``group`` and
    ``anchor``: the rows' group and the section of chapter 07 that shows them."""
    report.check_results(results)
    rows = []
    acc = report.long_table(results)
    pooled = {}
    for kind in ("rl", "sft_reflection"):
        d = acc[acc.kind == kind]
        by_level = d.groupby("level").apply(lambda g: (float((g.accuracy * g.n).sum()), float(g.n.sum()),
                                                       float(g.n_effective.sum())))
        a = float(np.mean([r / n for r, n, _ in by_level]))          # equal level weights
        var = float(np.sum([(r / n) * (1 - r / n) / m for r, n, m in by_level])) / len(by_level) ** 2
        pooled[kind] = (a, var)
    (a, va), (b, vb) = pooled["rl"], pooled["sft_reflection"]
    se = float(np.sqrt(va + vb))
    lo, hi = a - b - 1.96 * se, a - b + 1.96 * se
    verdict = sign_verdict([lo, hi])
    mismatch = report.rl_sampling_mismatch(results)     # RL compared only at the sampling it was trained at
    if mismatch:
        verdict = NOT_TESTABLE
    rows.append(_row(group, "Table 1: RL answers more questions right than SFT (reflection)", verdict,
                     f"accuracy {100 * a:.1f} % vs {100 * b:.1f} %, difference {100 * (a - b):+.1f} points "
                     f"(95 % interval {100 * lo:+.1f} to {100 * hi:+.1f}; levels weighted equally, seeds pooled)"
                     + (f"; {mismatch}" if mismatch else ""),
                     "07_laptop_experiment", anchor))
    by_seed = report.claims_by_seed(results)
    names = {"(i)": ("Calibration figure, claim (i): the two-stage model predicts accuracy", ("sft_reflection", "rl")),
             "(i')": ("Claim (i'): it predicts what it was not fitted to", ()),
             "(ii)": ("Claim (ii): RL improves pi_d more than pi_sample", ("sft_reflection",)),
             "(iii)": ("Claim (iii): out-of-distribution accuracy is limited by pi_sample", ("rl",))}
    for key, (name, kinds) in names.items():
        mine = by_seed[by_seed.claim.str.split(" ").str[0] == key]
        got = [x.split(":")[0] for x in mine.verdict]
        counts = ", ".join(f"{v} on {got.count(v)}" for v in VERDICTS if got.count(v))
        why = next((x for x in mine.verdict if x.startswith(NOT_TESTABLE + ":")), None)
        number = f"{len(got)} seeds: {counts}" + (f" ({why.split(': ', 1)[1]})" if why else "")
        if kinds:
            number += "; " + "; ".join(graded_levels(results, k) for k in kinds)
        verdict = _across_seeds(list(mine.verdict))
        if mismatch and key in ("(ii)", "(iii)"):      # claims about what RL did
            verdict, number = NOT_TESTABLE, f"{mismatch}; {number}"
        rows.append(_row(group, name, verdict, number, "07_laptop_experiment", anchor))
    return rows


def beyond_findings(results: dict, studies: dict | None = None, wide: dict | None = None,
                    anchor: str = "laptop-results") -> list[dict]:
    """Results beyond the paper on the same folder: the KL ablation (does a larger beta keep more of pi_d, on every
    seed), the check probe's decision faithfulness after SFT (reflection), and the length law of Theorems 3.1 and 3.2
    in the trained models' gradients (``studies``: :func:`dsh.experiment.report.load_attribution` of the folder;
    ``wide``: the same of the ``laptop-wide`` preset's folder, whose verdicts count only fits on >= 200
    trajectories of studies whose per-level median attempt lengths span >= 5x)."""
    report.check_results(results)
    for name, x in (("studies", studies), ("wide", wide)):
        if x is not None and not isinstance(x, dict):
            raise ValueError(f"{name} must be a dict of attribution studies by name (report.load_attribution), got "
                             f"{type(x).__name__}")
    rows = []
    arms = dict(report.kl_arms(results))
    if len(arms) >= 2:
        lo_b, hi_b = min(arms), max(arms)
        got = [claim_kl_keeps_decision(report.calibration_by_kind(results, s), arms[hi_b], arms[lo_b])
               for s in report.seeds_of(results)]
        short = [c["verdict"].split(":")[0] for c in got]
        counts = ", ".join(f"{v} on {short.count(v)}" for v in VERDICTS if short.count(v))
        strat = [c["stratified"] for c in got if c["stratified"]]
        mismatch = report.rl_sampling_mismatch(results)
        rows.append(_row("beyond", f"KL ablation: beta {hi_b:g} keeps more of pi_d (p_dW) than beta {lo_b:g}",
                         NOT_TESTABLE if mismatch else _across_seeds([c["verdict"] for c in got]),
                         f"{len(got)} seeds: {counts}; p_dW difference level-stratified over the graded levels of "
                         f"SFT (reflection): " + (", ".join(f"{x['difference']:+.2f} [{x['interval'][0]:+.2f}, "
                                                            f"{x['interval'][1]:+.2f}]" for x in strat) or "none")
                         + "; " + graded_levels(results, "sft_reflection") + (f"; {mismatch}" if mismatch else ""),
                         "07_laptop_experiment", anchor))
    if results.get("probe"):
        probe = report.probe_table(results, ("sft_reflection",))
        probe = probe[probe.seed != "pooled"]
        ok = [(f >= 0.9 and k >= 0.8) for f, k in zip(probe["verdict follows check"], probe.kappa)]
        rows.append(_row("beyond", "Decision faithfulness: after SFT (reflection) the verdict follows the check",
                         _every(ok),
                         "check probe, fine-tuning levels, per seed: kappa "
                         + ", ".join(f"{k:.2f} [{a:.2f}, {b:.2f}]" for k, a, b in
                                     zip(probe.kappa, probe["kappa low"], probe["kappa high"]))
                         + f" (chance agreement {probe.chance.min():.2f}-{probe.chance.max():.2f}; "
                         "'holds': agreement >= 0.9 and kappa >= 0.8 on every seed)",
                         "07_laptop_experiment", anchor))
    graded_probe = probe_on_graded_levels(results)
    if graded_probe is not None:
        rows.append({**graded_probe, "anchor": anchor})
    rows += _reward_identity_rows({**{f"laptop {k}": x for k, x in (studies or {}).items()},
                                   **{f"laptop-wide {k}": x for k, x in (wide or {}).items()}})
    rows += _length_law_rows(studies or {}, "", MIN_SPAN)
    temps = sorted({s["settings"]["temperature"] for s in (wide or {}).values()})
    at = f", sampled at temperature {', '.join(f'{t:g}' for t in temps)}" if temps else ""
    rows += _length_law_rows(wide or {}, f" (stages fine-tuned on 1x1 ... 1x10{at}, attempts spanning >= 5x)", MIN_SPAN)
    rows += premise_rows(studies or {}) + premise_rows(wide or {}, f" (stages fine-tuned on 1x1 ... 1x10{at})")
    return rows


def probe_on_graded_levels(results: dict) -> dict | None:
    """The check probe after SFT (reflection) on the levels where that stage's p_s lies in the graded band, per seed
    and level: "holds" when every such level of every seed has agreement >= 0.9 and kappa >= 0.8; None when the
    folder has no probe or no graded level (its claims are then "not testable here" anyway)."""
    probe = results.get("probe") or {}
    cells = []
    for x in plan_of(results):
        if x["kind"] != "sft_reflection" or x["name"] not in probe:
            continue
        for lv, e in block(results["calibration"][x["name"]])["by_level"].items():
            b = probe[x["name"]]["by_level"].get(lv)
            if graded(e) and b and b.get("checks"):
                cells.append((x["seed"], lv, b["verdict_follows_check"], b["kappa"], b["chance_agreement"]))
    if not cells:
        return None
    ok = [f >= 0.9 and k is not None and k >= 0.8 for _, _, f, k, _ in cells]
    kappas = [c[3] for c in cells if c[3] is not None]
    kappa = f"{min(kappas):.2f}-{max(kappas):.2f}" if kappas else "undefined"
    return _row("beyond", "Decision faithfulness on the graded levels: after SFT (reflection) the verdict follows the "
                          "check", _every(ok),
                f"check probe, {len(cells)} (seed, level) cells with p_s in {GRADED[0]}-{GRADED[1]}: agreement "
                f"{min(c[2] for c in cells):.2f}-{max(c[2] for c in cells):.2f} (chance "
                f"{min(c[4] for c in cells):.2f}-{max(c[4] for c in cells):.2f}), kappa {kappa}; "
                "'holds': agreement >= 0.9 and kappa >= 0.8 in every cell", "07_laptop_experiment")


def regime_sentence(results: dict) -> str:
    """One sentence on the design points of the graded experiment (:data:`dsh.experiment.report.REGIME_POINTS`,
    measured per seed by :func:`dsh.experiment.report.regime_rows`): how many are met on every seed, and each one
    not met with the seeds where it is not."""
    rows = report.regime_rows(results)
    missed = {k: [str(r["seed"]) for r in rows if r["met"][k] is False] for k in report.REGIME_POINTS}
    unknown = [k for k in report.REGIME_POINTS if not missed[k] and any(r["met"][k] is None for r in rows)]
    met = [k for k in report.REGIME_POINTS if not missed[k] and k not in unknown]
    out = f"Design points met on every seed: {len(met)} of {len(report.REGIME_POINTS)}"
    if any(missed.values()):
        out += "; not met: " + "; ".join(f"{report.REGIME_POINTS[k]} (seed {', '.join(x)})"
                                         for k, x in missed.items() if x)
    if unknown:
        out += "; not measured: " + ", ".join(unknown)
    return out + "."


def _reward_identity_rows(studies: dict) -> list[dict]:
    """Theorem 3.1 in the trained models, as the identity it states (every token's score weighted by the same
    advantage: :func:`dsh.experiment.run.attribution_fits.reward_identity`), over every study. The studies form the
    reward's parts as |A_i| times the score's and the SFT loss's as -1 times them, from one pass (both gradient
    routes), so the identity holds by construction: "not testable here" (the data could not say otherwise; the
    theorem itself is confirmed symbolically), "fails" when a record breaks it (its gradients were formed wrongly);
    no row without studies."""
    got = {n: reward_identity(s) for n, s in studies.items()}
    got = {n: x for n, x in got.items() if x["trajectories"]}
    if not got:
        return []
    n = sum(x["trajectories"] for x in got.values())
    bad = sum(x["violations"] for x in got.values())
    worst = max(x["worst"] for x in got.values())
    why = ("a study's reward parts are not |A_i| times its SFT loss's: its gradients were formed wrongly" if bad else
           "the studies form both from one score pass (the reward's parts |A_i| times it, the SFT loss's -1 times "
           "it), so the identity holds by construction and the data could not say otherwise; the theorem itself is "
           "confirmed symbolically (chapter 02)")
    return [_row("beyond", "Theorem 3.1 in the trained models: per trajectory the reward weighs attempt and decision "
                           "alike (its split is the SFT loss's split times |A_i|)", "fails" if bad else NOT_TESTABLE,
                 f"{n} trajectories with an advantage in {len(got)} studies: {bad} parts off by more than "
                 f"{IDENTITY_RTOL:g} (largest relative deviation {worst:.1e}, float32); {why}. The ratio of gradient "
                 "norms grows with L_k under this identity too, since the attempt's side sums L_k scores: no slope is "
                 "judged for it", "08_attribution_in_llms")]


def premise_rows(studies: dict, where: str = "") -> list[dict]:
    """Theorem 3.2's premise in the trained models: the decision's per-token divergence is one size at every level
    (:func:`dsh.experiment.run.attribution_fits.decision_kl_by_level`, 95 % intervals resampling questions). Per
    seed-0 study of a trained model on >= 200 trajectories: "not testable here" where the decision carries no
    gradient on most trajectories (the KL terms' fits count them silent: a STOP the model is certain of), "fails"
    where two levels' intervals lie apart, "cannot tell" otherwise; the row fails when one study does. No row
    without studies."""
    judged = {}
    for n, s in studies.items():
        if n == "base" or s["settings"].get("seed", 0) != 0 or len(s["trajectories"]) < MIN_TRAJECTORIES:
            continue
        silent = max(s["fits"].get(f"{t} / decision", {}).get("silent", 0) for t in ("kl_k3", "kl_reward"))
        if silent >= len(s["trajectories"]) / 2:
            judged[n] = NOT_TESTABLE
            continue
        judged[n] = "fails" if levels_apart(decision_kl_by_level(s, n_boot=200)) else "cannot tell"
    if not judged:
        return []
    got = set(judged.values())
    verdict = next(v for v in ("fails", "cannot tell", NOT_TESTABLE) if v in got)
    number = "; ".join(f"{v}: {', '.join(sorted(n for n, x in judged.items() if x == v))}"
                       for v in ("fails", "cannot tell", NOT_TESTABLE) if v in got)
    return [_row("beyond", "Theorem 3.2's premise in the trained models: the decision's per-token KL is one size at "
                           "every level" + where, verdict,
                 f"the decision's per-token k1 per level with 95 % intervals, per study: {number} (fails: two levels' "
                 "intervals apart; not testable here: the decision silent on most trajectories, a STOP the model is "
                 "certain of)", "08_attribution_in_llms")]


KL_TERMS = ("kl_immediate", "kl_k3", "kl_reward")


def identified_fits(studies: dict, n_boot: int = 400) -> list[dict]:
    """Theorem 3.2's length-law fits (the KL terms against the decision) of the studies of trajectory seed 0 (each
    model once) with >= 200 trajectories, each fit on >= 200 of them, with what decides whether it is identified: its
    own span (the per-level median L of the levels it uses, :func:`dsh.experiment.run.attribution_fits.robust_fit`)
    >= 5x, a censoring-robust slope (silent decisions counted as +inf), and the plain fit's verdict (silent ones left
    out) equal to the robust one's. Each: study, term, plain and robust verdicts, span, and ``identified`` or why not."""
    out = []
    for name, st in sorted(studies.items()):
        if len(st["trajectories"]) < MIN_TRAJECTORIES or st["settings"].get("seed", 0) != 0:
            continue
        for term in KL_TERMS:
            plain = st["fits"].get(f"{term} / decision") or {}
            if not plain.get("n") or plain["n"] < MIN_TRAJECTORIES or plain.get("verdict") is None:
                continue
            r = robust_fit(st, term, n_boot=n_boot)
            robust = r["verdict"]
            reason = ("robust" if robust is None else "span" if r["span"] < MIN_SPAN else
                      "disagree" if robust != plain["verdict"] else None)
            why = (None if reason is None else "robust fit undefined: the decision silent on most trajectories"
                   if reason == "robust" else f"own span {r['span']:.1f}x < {MIN_SPAN:g}x" if reason == "span"
                   else f"plain {plain['verdict']}, robust {robust}")
            out.append({"study": name, "term": term, "plain": plain["verdict"], "robust": robust, "span": r["span"],
                        "identified": reason is None, "reason": reason, "why": why})
    return out


def _length_law_rows(studies: dict, where: str, min_span: float) -> list[dict]:
    """The length-law row of Theorem 3.2's KL terms (:func:`identified_fits`): a verdict over the identified fits
    only (own span >= 5x, plain and censoring-robust verdicts equal), the others counted by why; no row without
    fits. ``min_span``: the span of a study's per-level median attempt lengths below which it is left out whole.
    (Theorem 3.1 is judged as its identity: :func:`_reward_identity_rows`.)"""
    studied = {n: s for n, s in studies.items() if len(s["trajectories"]) >= MIN_TRAJECTORIES
               and s["settings"].get("seed", 0) == 0}
    if not studied:     # a model that (almost) never writes a check gives nothing to split: no verdict from it
        return []
    medians = report.attempt_lengths(studied)["span of medians"]
    short = sorted(n for n in studied if medians[n] < min_span)
    studied = {n: s for n, s in studied.items() if n not in short}
    if not studied:     # every study's attempts span less than the law needs: said, not left out
        spans = [medians[n] for n in short]
        return [_row("beyond", "Theorem 3.2 in the trained models: the KL terms' attempt / decision ratio grows like "
                               "L_k (log-log slope 1)" + where, NOT_TESTABLE,
                     f"no study's attempts span {min_span:g}x (per-level median lengths span {min(spans):.1f}x to "
                     f"{max(spans):.1f}x in {', '.join(short)})", "08_attribution_in_llms")]
    fits = identified_fits(studied)
    if not fits:
        return []
    got = [f["plain"] for f in fits if f["identified"]]
    counts = ", ".join(f"{v} {got.count(v)}" for v in ("holds", "fails", "cannot tell") if got.count(v)) or "none"
    skipped = {}
    for f in fits:
        if not f["identified"]:
            skipped.setdefault(f["reason"], []).append(f"{f['study']} {f['term']}")
    left = f"; left out, spanning less: {', '.join(short)}" if short else ""
    reasons = {"robust": "robust fit undefined (decision silent on most trajectories)", "span": f"own span < {MIN_SPAN:g}x",
               "disagree": "plain and censoring-robust verdicts differ"}
    why = "; ".join(f"not identified, {reasons[k]}: {', '.join(v)}" for k, v in skipped.items())
    return [_row("beyond", "Theorem 3.2 in the trained models: the KL terms' attempt / decision ratio grows like L_k "
                           "(log-log slope 1)" + where, _across_seeds(got) if got else NOT_TESTABLE,
                 f"{len(got)} of {len(fits)} fits identified (own span >= {MIN_SPAN:g}x, on >= {MIN_TRAJECTORIES} "
                 f"trajectories, the plain and the censoring-robust fit agreeing), each against the prediction "
                 f"+-0.5: {counts}" + (f"; {why}" if why else "") + left, "08_attribution_in_llms")]


def to_html(rows: list[dict]) -> str:
    """The findings as one HTML table with a link from each row to the section that shows it (pages beside
    this one in the rendered book)."""
    colour = {"confirmed": "#1a7f37", "holds": "#1a7f37", "erratum": "#9a6700", "fails": "#cf222e",
              "cannot tell": "#57606a", NOT_TESTABLE: "#57606a"}
    out = ['<table class="findings"><thead><tr><th>claim</th><th>verdict</th><th>the number behind it</th>'
           "<th>shown in</th></tr></thead><tbody>"]
    for r in rows:
        href = f"{r['doc']}.html" + (f"#{r['anchor']}" if r["anchor"] else "")
        out.append(f"<tr><td>{html.escape(r['claim'])}</td><td style=\"color:{colour[r['verdict']]}\"><b>"
                   f"{r['verdict']}</b></td><td>{html.escape(r['number'])}</td>"
                   f"<td><a href=\"{href}\">{html.escape(r['doc'])}</a></td></tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def summary(rows: list[dict]) -> str:
    """One line: how many claims got each verdict."""
    got = [r["verdict"] for r in rows]
    return ", ".join(f"{got.count(v)} {v}" for v in VERDICTS if got.count(v))
