"""Gradient attribution measured in the trained laptop models (beyond the paper, which argues it on a toy).

For one model and its reference (the model its training started from), the model answers questions of every
length of the ladder, a group of samples per question at the rollouts' temperature; each response is split into
the tokens pi_sample writes (the attempts), the check pi_d reads and the decision tokens (verdict, marker, or the
end of turn that stops: :func:`dsh.llm.attribution.segment_laptop`), and for every objective term the gradient of
each part is taken by autograd (:func:`dsh.llm.attribution.part_gradients`): the surrogate reward with GRPO's
group-relative advantage (Theorem 3.1), the KL penalty as a reward (k1 KL-to-go: Theorem 3.2's setting), the KL
penalty in the loss as TRL computes it (k3), the SFT loss and the DFT loss (Appendix D). Per trajectory this gives
|g_attempt| / |g_decision| against the attempt's length L; per group the same split of the group's summed reward
gradient (GRPO's update for one prompt, where trajectories with opposite advantages cancel); and the immediate KL
of Theorem 3.2 itself, the k1 sums of the attempt and of the decision tokens, with the mean k1 by position along
the first attempt (the stationarity premise that chapter 02's counterexample breaks). Log-probabilities are taken
at the sampling temperature, the policy's and the reference's, as TRL's GRPO scores its rollouts. The length law is
fitted on a log-log scale with bootstrap intervals that resample questions (a question's group of samples is one
cluster: its samples share the question's numbers and are not independent; :mod:`dsh.measure.length_law`).
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ...core import store
from ...core import validate as v
from ...core.files import write_json_gz
from ...core.provenance import git_commit, portable
from ...llm.complete import complete
from ...llm.models import load, resolve_model, weights_digest
from ...measure import tasks
from ...measure.length_law import usable
from ...task import laptop_task as lt
from ...task.problems import parse_level
from .attribution_fits import MIN_TRAJECTORIES, fit_series, fits, study_record

OBJECTIVES = ("reward", "kl_reward", "kl_k3", "sft", "dft")


KL_OBJECTIVES = ("kl_reward", "kl_k3")


POSITIONS = 128     # positions along the first attempt whose mean k1 is kept


METHOD = 3          # the split's rules (1: verdicts only, attempts may hold stray verdicts; 2: :func:`segment_laptop`
#                     with STOP after an unchecked answer, attempts holding a verdict left out, rounds until min_signal
#                     trajectories carry a reward signal; 3: method 2's split, rounds until every term's fit has
#                     min_signal trajectories, :func:`enough`). Method 2's rounds are method 3's first rounds
#                     (:func:`resume_point`).


@dataclass(frozen=True)
class StudySettings:
    """What the attribution study samples and measures."""

    levels: tuple = ("1x1", "1x2", "1x3", "1x4", "1x5", "1x6", "1x7", "1x8")   # attempts of ~17 to ~100 tokens
    prompts_per_level: int = 12     # questions a level: 12 x 8 x 8 = 768 samples, ~300 with a reward signal (8 gave
    #                                 152-189, fewer than MIN_TRAJECTORIES; the table in chapter 08)
    group: int = 8                  # samples a question (the laptop GRPO's num_generations)
    temperature: float = 2.0        # the laptop GRPO's rollout temperature
    max_new_tokens: int = 400
    objectives: tuple = OBJECTIVES
    min_signal: int = MIN_TRAJECTORIES   # another round of prompts_per_level new questions a level is drawn until
    #                                 every term's fit holds this many trajectories (:func:`enough`)
    max_rounds: int = 12            # ... or this many rounds were drawn (DFT on 1x1 ... 1x10 gives its KL-as-reward
    #                                 fit ~23 trajectories a round: 9 rounds; chapter 08's design table)
    seed: int = 0                   # questions and sampling streams

    def checked(self) -> StudySettings:
        if isinstance(self.levels, str) or not self.levels:
            raise ValueError(f"levels must be a non-empty list of levels like '1x3', got {self.levels!r}")
        for lv in self.levels:
            m, _ = parse_level(lv)
            if m != 1:
                raise ValueError(f"levels must be laptop levels 1xN, got {lv!r}")
        v.at_most("prompts_per_level", self.prompts_per_level, 10_000, "questions a level a round: time")
        if v.length("group", self.group) < 2:
            raise ValueError(f"group must be an integer >= 2 (a group-relative advantage), got {self.group!r}")
        v.at_most("group", self.group, 1_024, "samples a question: memory")
        if v.real("temperature", self.temperature) <= 0:
            raise ValueError(f"temperature must be a number > 0 (samples of a group must differ), got {self.temperature!r}")
        v.at_most("max_new_tokens", self.max_new_tokens, 65_536, "tokens a sample: memory")
        if isinstance(self.objectives, str) or not self.objectives:
            raise ValueError(f"objectives must be a non-empty list of {', '.join(OBJECTIVES)}; got {self.objectives!r}")
        for o in self.objectives:
            v.choice("objectives[i]", o, OBJECTIVES)
        if v.length("min_signal", self.min_signal) > 10_000_000:
            raise ValueError(f"min_signal must be an integer in 0..10,000,000 (trajectories a fit); got {self.min_signal:,}")
        v.at_most("max_rounds", self.max_rounds, 1_000, "rounds of questions: time")
        v.length("seed", self.seed)
        return self


def questions(settings: StudySettings, rounds: int = 1) -> list:
    """The study's questions: ``prompts_per_level`` drawn per level from the settings' seed, round after round (the
    first round's questions do not depend on how many rounds are drawn)."""
    v.positive_int("rounds", rounds)
    rng = random.Random(f"attribution-{settings.seed}")
    return [lt.draw(lv, rng) for _ in range(rounds) for lv in settings.levels for _ in range(settings.prompts_per_level)]


def sample_groups(model, tok, settings: StudySettings, round_no: int = 0) -> list[dict]:
    """``group`` samples of every question of round ``round_no`` at the settings' temperature, with the task's reward
    and GRPO's group-relative advantage (reward minus the group's mean, over the group's standard deviation; 0 for a
    group whose rewards all agree). Each sample has its own counted random stream (keyed by its place over all
    rounds), and each question its index over all rounds (``prompt``: the cluster the intervals resample)."""
    task = tasks.get("laptop_task")
    per = len(settings.levels) * settings.prompts_per_level
    qs = questions(settings, round_no + 1)[round_no * per:]
    keys = [round_no * per * settings.group + j for j in range(per * settings.group)]
    outs = complete(model, tok, [p.question for p in qs for _ in range(settings.group)], settings.max_new_tokens,
                    settings.temperature, settings.seed, rows=min(256, len(qs) * settings.group), keys=keys)
    rows = []
    for i, p in enumerate(qs):
        mine = outs[i * settings.group:(i + 1) * settings.group]
        r = np.array([task.reward(c.text, p.answer, p.question) for c in mine])
        adv = (r - r.mean()) / r.std() if r.std() > 0 else np.zeros_like(r)
        rows += [{"question": p.question, "level": p.level, "prompt": round_no * per + i, "response": c.text,
                  "stopped": c.stopped, "reward": float(x), "advantage": float(a)} for c, x, a in zip(mine, r, adv)]
    return rows


def _segment(tok, sample):
    """:func:`dsh.llm.attribution.segment_laptop` of a sample and None, or None and why the split leaves it out
    (the error's first clause; "empty response" for a response with no text, the model's end of turn first)."""
    from ...llm.attribution import segment_laptop

    if not sample["response"]:
        return None, "empty response"
    try:
        return segment_laptop(tok, sample["question"], sample["response"], sample.get("stopped", True)), None
    except ValueError as e:
        return None, str(e).split(" (")[0]


def decision_count(tok, samples) -> dict:
    """How many ``samples`` the split can take (:func:`dsh.llm.attribution.segment_laptop`: a decision, no verdict
    inside an attempt), how many of those carry a reward signal (advantage != 0), and why the others are left out."""
    out = {"decision": 0, "signal": 0, "left_out": {}}
    for s in samples:
        _, why = _segment(tok, s)
        if why is not None:
            out["left_out"][why] = out["left_out"].get(why, 0) + 1
            continue
        out["decision"] += 1
        out["signal"] += s["advantage"] != 0
    return out


def counted_terms(objectives) -> list[str]:
    """The fits the round rule counts (:func:`enough`): every objective's against the decision and against the
    stage, and the immediate KL's where the study has KL terms (a model against itself has none). The group-summed
    reward (``reward_group``) counts groups, not trajectories, and is not held to it."""
    terms = list(objectives) + (["kl_immediate"] if any(o in KL_OBJECTIVES for o in objectives) else [])
    return [f"{t} / {a}" for t in terms for a in ("decision", "stage")]


def fit_counts(rows, objectives) -> dict:
    """How many trajectories each fit of :func:`counted_terms` takes from ``rows`` (:func:`fits`' ``n``: the pairs
    with a positive, finite length and ratio, as :func:`dsh.measure.length_law.loglog_slope` keeps them)."""
    if not isinstance(rows, list) or not all(isinstance(r, dict) and {"L", "grad", "kl"} <= set(r) for r in rows):
        raise ValueError("rows must be a study's trajectory rows (attribute_groups), each with L, grad and kl")
    terms = counted_terms(objectives)
    return {f"{o} / {a}": int(usable([x for x, _, _ in pairs], [y for _, y, _ in pairs]).sum())
            for a in ("decision", "stage") for o, pairs in fit_series(rows, [], objectives, a).items()
            if f"{o} / {a}" in terms}


def _first_rounds(study: dict, rounds: int) -> list[dict]:
    """A study record's trajectories of its first ``rounds`` rounds' questions."""
    s = study["settings"]
    return [t for t in study["trajectories"] if t["prompt"] < rounds * len(s["levels"]) * s["prompts_per_level"]]


def counts_after(study: dict, rounds: int) -> dict:
    """:func:`fit_counts` of a study record's first ``rounds`` rounds (its trajectories of those rounds' questions):
    what the round rule saw after that round."""
    study_record("study", study, ("rounds", "settings", "trajectories", "objectives"))
    if not 0 < v.length("rounds", rounds) <= study["rounds"]:
        raise ValueError(f"rounds must be 1 ... {study['rounds']} (the study's rounds), got {rounds!r}")
    return fit_counts(_first_rounds(study, rounds), study["objectives"])


def enough(rows, objectives, min_signal: int) -> bool:
    """The round rule (method 3): every fit the study counts (:func:`counted_terms`) holds ``min_signal``
    trajectories or more. A rule on counts alone, never on what the trajectories measure."""
    v.length("min_signal", min_signal)
    return all(n >= min_signal for n in fit_counts(rows, objectives).values())


GRADIENTS = "packed"    # the gradients' default route (run_study's packed); a record without the field: "per trajectory"


def gradients_of(study: dict) -> str:
    """How a study record's gradients were formed: its ``gradients`` field, "per trajectory" where it has none."""
    return study.get("gradients", "per trajectory")


def resume_point(previous: dict, settings: StudySettings, objectives, weights: tuple,
                 gradients: str = GRADIENTS) -> int | None:
    """The rounds of ``previous`` (a study record) that this study can take as its own first rounds, or None: a
    study of the same weights (model's, reference's), objectives and settings but ``max_rounds``, by method 2 or 3
    (one split; rounds are drawn and attributed one by one, each from its own seeded questions and streams) and with
    gradients formed as this study forms them (``gradients``, :data:`GRADIENTS` or "per trajectory": the two routes
    agree to rounding, not bit for bit),
    with no more rounds than ``max_rounds``, and where :func:`enough` holds after none of its rounds but the last
    (method 3 would have drawn them all). Its rounds are then exactly what this study draws first."""
    study_record("previous", previous)
    if gradients_of(previous) != gradients:
        return None
    same = {k: x for k, x in asdict(settings).items() if k != "max_rounds"}
    old = {k: x for k, x in (previous.get("settings") or {}).items() if k != "max_rounds"}
    if previous.get("method") not in (2, 3) or not 0 < previous.get("rounds", 0) <= settings.max_rounds or \
            not store.made_from({**previous, "settings": old}, {"settings": same, "weights": weights[0],
                                                                "reference_weights": weights[1],
                                                                "objectives": objectives}):
        return None
    for r in range(1, previous["rounds"]):         # method 3 stops after the first round where enough() holds
        if enough(_first_rounds(previous, r), objectives, settings.min_signal):
            return None
    return previous["rounds"]


def study_rounds(model, ref_model, tok, settings: StudySettings, objectives, previous: dict | None = None,
                 start: int = 0, progress: bool = False, packed: bool = True) -> dict:
    """Rounds of :func:`sample_groups` and :func:`attribute_groups`, one after the other, until :func:`enough`
    holds or ``max_rounds`` rounds were drawn; the first ``start`` rounds taken from ``previous`` (a study record,
    :func:`resume_point`). Returns the samples drawn, the rounds, the per-trajectory and per-group rows, the k1
    profile and the seconds spent sampling. ``progress``: a bar over each round's trajectories; ``packed``: the
    gradients' route (:func:`attribute_groups`)."""
    if previous is not None and start:
        got = {"samples": previous["samples"], "rounds": start, "trajectories": list(previous["trajectories"]),
               "groups": list(previous["groups"]), "sample_s": previous.get("sample_s", 0.0),
               "kl_positions": json.loads(json.dumps(previous["kl_positions"]))}
    else:
        got = {"samples": 0, "rounds": 0, "trajectories": [], "groups": [], "sample_s": 0.0,
               "kl_positions": {"sum": [0.0] * POSITIONS, "n": [0.0] * POSITIONS, "skipped": 0, "skipped_why": {}}}
    pos = got["kl_positions"]
    while got["rounds"] < settings.max_rounds and not (got["rounds"] and enough(got["trajectories"], objectives,
                                                                                   settings.min_signal)):
        t0 = time.time()
        new = sample_groups(model, tok, settings, got["rounds"])
        got["sample_s"] += time.time() - t0
        rows, group_rows, p = attribute_groups(model, ref_model, tok, new, objectives, settings.temperature, packed,
                                               bar=f"attribution round {got['rounds'] + 1}" if progress else None)
        got["samples"] += len(new)
        got["rounds"] += 1
        got["trajectories"] += rows
        got["groups"] += group_rows
        pos["sum"] = [a + b for a, b in zip(pos["sum"], p["sum"])]
        pos["n"] = [a + b for a, b in zip(pos["n"], p["n"])]
        pos["skipped"] += p["skipped"]
        for k, n in p["skipped_why"].items():
            pos["skipped_why"][k] = pos["skipped_why"].get(k, 0) + n
    return got


def generator_samples(levels, per_level: int = 1, seed: int = 0) -> list[dict]:
    """Two-attempt reflection traces written by the task's generator (a wrong attempt the check catches, the
    marker, the right attempt, STOP), ``per_level`` a level, as samples for :func:`attribute_groups` (advantage 1:
    no groups): the mechanics of the split on a model that does not reflect itself, such as the shipped base."""
    v.positive_int("per_level", per_level)
    v.length("seed", seed)
    rng, out = random.Random(f"generator-{seed}"), []
    for lv in levels:
        got = 0
        while got < per_level:
            p = lt.draw(lv, rng)
            t = lt.trace_from_attempts(p, [lt.wrong_attempt(p.a, p.b, rng)])
            if t is None or t.decisions != ("RESAMPLE", "STOP"):
                continue        # a multiplier of 1 admits no wrong attempt the check catches
            out.append({"question": p.question, "level": p.level, "prompt": len(out), "response": t.text,
                        "stopped": True, "reward": 1.0, "advantage": 1.0})
            got += 1
    return out


def full_attempt_lengths(tok, levels, n: int = 20, seed: int = 0) -> dict:
    """Median tokens of a correct attempt in the task's own form (the steps and ``The answer is N.``) at each level,
    over ``n`` drawn questions: how long an attempt that copies the whole multiplicand is."""
    v.positive_int("n", n)
    rng, out = random.Random(f"full-{seed}"), {}
    for lv in levels:
        lens = []
        for _ in range(n):
            p = lt.draw(lv, rng)
            body, res = lt.attempt_text(p.a, p.b)
            lens.append(len(tok(f"{body}\n{lt.ANSWER}{res}.", add_special_tokens=False)["input_ids"]))
        out[lv] = float(np.median(lens))
    return out


def perturbed(model, noise: float, seed: int = 0):
    """A copy of ``model`` with seeded N(0, noise^2) added to every weight: a reference a little away from it."""
    import copy

    import torch

    if v.real("noise", noise) < 0:
        raise ValueError(f"noise must be a number >= 0, got {noise!r}")
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for q in out.parameters():
            q.add_(noise * torch.randn(q.shape, generator=g, dtype=q.dtype))
    return out


def _split(g: dict) -> dict:
    """Norms of a gradient's parts: the attempt (pi_sample), the check, the decision tokens (verdict, marker, end
    of turn: the paper's one action of pi_d) and the decision stage (check and decision together); the cosine of
    the attempt's and the decision stage's. Summed in float64: a float32 norm of the ~850,000 entries is off by
    ~1e-4 of itself."""
    a, c, d = (g[k].double() for k in ("attempt", "check", "decision"))
    stage = c + d
    na, ns = float(a.norm()), float(stage.norm())
    return {"attempt": na, "check": float(c.norm()), "decision": float(d.norm()), "stage": ns,
            "cosine": float(a @ stage) / (na * ns) if na > 0 and ns > 0 else None}


def _split_gram(gram) -> dict:
    """:func:`_split` from the Gram matrix of the parts' gradients (attempt, check, decision:
    :func:`dsh.llm.packed_gradients.packed_part_grams`): |stage|^2 = |check|^2 + |decision|^2 + 2 check . decision,
    attempt . stage = attempt . check + attempt . decision."""
    g = gram.double()
    na, nc, nd = (float(g[i, i].clamp(min=0).sqrt()) for i in range(3))
    ns = float((g[1, 1] + g[2, 2] + 2 * g[1, 2]).clamp(min=0).sqrt())
    return {"attempt": na, "check": nc, "decision": nd, "stage": ns,
            "cosine": float(g[0, 1] + g[0, 2]) / (na * ns) if na > 0 and ns > 0 else None}


PACK_TOKENS = 2048      # tokens packed into one pass of :func:`dsh.llm.packed_gradients.packed_part_grams`


def _packs(segs: list, limit: int | None = None) -> list[list[int]]:
    """Indices of ``segs`` in order, cut into runs of at most ``limit`` tokens (:data:`PACK_TOKENS` by default; a
    longer trajectory alone)."""
    limit = PACK_TOKENS if limit is None else limit
    out, cur, size = [], [], 0
    for i, s in enumerate(segs):
        n = len(s.input_ids)
        if cur and size + n > limit:
            out.append(cur)
            cur, size = [], 0
        cur.append(i)
        size += n
    return out + ([cur] if cur else [])


def _per_trajectory(model, ref_model, segs, objectives, advantages, temperature):
    """Per trajectory of ``segs``: ``(k1 of its targets, {objective: _split}, reward part vectors or None)``, one
    trajectory at a time through :func:`dsh.llm.attribution.all_part_gradients` (the reference route)."""
    from ...llm.attribution import all_part_gradients, token_kl

    for seg, adv in zip(segs, advantages):
        grads = all_part_gradients(model, ref_model, seg, objectives, adv, temperature)
        yield token_kl(model, ref_model, seg, temperature), {o: _split(g) for o, g in grads.items()}, grads.get("reward")


def _packed(model, ref_model, segs, objectives, advantages, temperature):
    """What :func:`_per_trajectory` yields, from packed passes (:func:`dsh.llm.packed_gradients.packed_part_grams`)."""
    from ...llm.packed_gradients import packed_part_grams

    keep = ("reward",) if "reward" in objectives else ()
    for idx in _packs(segs):
        for r in packed_part_grams(model, ref_model, [segs[i] for i in idx], objectives,
                                   [advantages[i] for i in idx], temperature, keep):
            yield r["k1"], {o: _split_gram(g) for o, g in r["gram"].items()}, r["vectors"].get("reward")


def attribute_groups(model, ref_model, tok, samples, objectives, temperature: float = 1.0, packed: bool = True,
                     bar: str | None = None) -> tuple[list[dict], list[dict], dict]:
    """Per trajectory: its attempt length, token counts and k1 sums per part, and per objective the norm of each
    part's gradient and the cosine of the attempt's and the decision's; per group with reward variance: the norms
    of the parts of the summed reward gradient. Trajectories with no decision (cut before a verdict) are left out
    (counted). Also the mean k1 by position along the first attempt (sum and count per position). Log-probabilities
    at ``temperature`` (the sampling's, as GRPO scores its rollouts). ``packed``: the gradients from packed passes
    over several trajectories (:func:`dsh.llm.packed_gradients.packed_part_grams`), else one trajectory at a time
    (:func:`dsh.llm.attribution.all_part_gradients`); the two agree to float rounding. ``bar``: a progress bar of
    that name over the trajectories attributed (none by default)."""
    from tqdm import tqdm

    for name, m in (("model", model), ("ref_model", ref_model)):
        where = next(m.parameters()).device.type
        if where != "cpu":
            raise ValueError(f"{name} must be on the CPU (load(..., device='cpu')): the segments are CPU tensors; "
                             f"got {where}")
    rows, groups, pos_sum, pos_n = [], {}, np.zeros(POSITIONS), np.zeros(POSITIONS)
    skipped, why, kept = 0, {}, []
    for s in samples:
        seg, reason = _segment(tok, s)
        if seg is None:
            skipped += 1
            why[reason] = why.get(reason, 0) + 1
        else:
            kept.append((s, seg))
    route = _packed if packed else _per_trajectory
    results = route(model, ref_model, [seg for _, seg in kept], tuple(objectives), [s["advantage"] for s, _ in kept],
                    temperature) if kept else []
    progress = tqdm(total=len(kept), desc=bar, unit="trajectory", disable=bar is None)
    for (s, seg), (k1, split, reward) in zip(kept, results):
        progress.update()
        att = seg.sample_mask.nonzero()[:, 0]
        first = att[:seg.attempt_lengths[0]] if seg.attempt_lengths else att[:0]
        n = min(len(first), POSITIONS)
        pos_sum[:n] += k1[first[:n]].numpy()
        pos_n[:n] += 1
        parts = (("attempt", seg.sample_mask), ("check", seg.check_mask), ("decision", seg.decision_mask))
        row = {"level": s["level"], "prompt": s["prompt"], "reward": s["reward"], "advantage": s["advantage"],
               "L": float(np.mean(seg.attempt_lengths)), "attempts": len(seg.attempt_lengths),
               "checks": s["response"].count(lt.PASSES) + s["response"].count(lt.FAILS),
               "tokens": {k: int(m.sum()) for k, m in parts}, "kl": {k: float(k1[m].sum()) for k, m in parts},
               "grad": {}}
        for o in objectives:
            if o == "reward" and s["advantage"] == 0:
                row["grad"][o] = None          # a group whose rewards agree: no reward gradient
                continue
            row["grad"][o] = split[o]
            if o == "reward":
                acc = groups.setdefault(s["prompt"], {"level": s["level"], "L": [], "sum": None})
                acc["L"].append(row["L"])
                acc["sum"] = ({k: x.clone() for k, x in reward.items()} if acc["sum"] is None
                              else {k: acc["sum"][k] + reward[k] for k in reward})
        rows.append(row)
    group_rows = [{"prompt": k, "level": x["level"], "L": float(np.mean(x["L"])), "trajectories": len(x["L"]),
                   **_split(x["sum"])} for k, x in groups.items()]
    progress.close()
    positions = {"sum": pos_sum.tolist(), "n": pos_n.tolist(), "skipped": skipped, "skipped_why": why}
    return rows, group_rows, positions


def study_objectives(settings: StudySettings, model: str, reference: str) -> tuple:
    """The settings' objectives but the KL terms when ``reference`` is ``model`` (resolved folders; their gradients
    vanish)."""
    same = Path(model).resolve() == Path(reference).resolve()
    return tuple(o for o in settings.objectives if not (same and o in KL_OBJECTIVES))


def run_study(model: str, reference: str, out, settings: StudySettings = StudySettings(),
              progress: bool = False, roots: dict | None = None, previous: dict | None = None,
              bars: bool | None = None, packed: bool = True) -> dict:
    """Sample, attribute and fit (:func:`sample_groups`, :func:`attribute_groups`, :func:`fits`) for ``model``
    against ``reference`` (model folders; the reference is the model its training started from) and write ``out``
    (a ``.json.gz`` name: one gzipped JSON object, :func:`dsh.core.files.write_json_gz`, holding settings, models,
    per-trajectory and per-group rows, the k1 profile, the fits, time, commit). The KL terms are left out when the
    reference is the model itself (their gradients vanish). The models' paths are recorded from the labels of
    ``roots`` (``{folder: label}``; :func:`dsh.core.provenance.portable`). ``previous``: a study record whose rounds
    become this study's first (:func:`resume_point`; refused in one line when they cannot), recorded as ``resumed``;
    its wall time counts in ``wall_s``. The models run on the CPU in float32, on a GPU host too. ``progress``: a
    line when it is written; ``bars`` (``progress`` unless given): a progress bar over each round's trajectories.
    ``packed``: the gradients from packed passes (the default, recorded as :data:`GRADIENTS`), else one trajectory
    at a time (recorded as "per trajectory"; :func:`attribute_groups`). Returns what it wrote."""
    settings = settings.checked()
    if not isinstance(packed, bool):
        raise ValueError(f"packed must be true or false, got {packed!r}")
    gradients = GRADIENTS if packed else "per trajectory"
    out = Path(out)
    if not out.name.endswith(".json.gz"):
        raise ValueError(f"out must name a .json.gz file, got {str(out)!r}")
    v.output_path("out", out)                      # before any sampling: not a folder, no parent a file
    loc, ref_loc = resolve_model(model), resolve_model(reference)
    t0 = time.time()
    m, tok = load(loc, device="cpu")       # float32 on the CPU wherever it runs: the segments' ids are CPU tensors
    ref, _ = load(ref_loc, device="cpu")   # and the packed attention kernels are the CPU's
    ref.eval()
    m.eval()        # no dropout in the tiny models; the gradients are those of the weights as they are
    objectives = study_objectives(settings, loc, ref_loc)
    weights = weights_digest(loc), weights_digest(ref_loc)
    start = 0
    if previous is not None:
        start = resume_point(previous, settings, objectives, weights, gradients)
        if start is None:
            raise ValueError("previous must be a study of the same weights, objectives and settings but max_rounds, "
                             f"by method 2 or 3 with {gradients} gradients, whose rounds this study would draw "
                             "(resume_point)")
    got = study_rounds(m, ref, tok, settings, objectives, previous, start, progress=progress if bars is None else bars,
                       packed=packed)
    rows, group_rows = got["trajectories"], got["groups"]
    result = {"model": portable(str(model), roots), "reference": portable(str(reference), roots),
              "weights": weights[0], "reference_weights": weights[1],
              "settings": asdict(settings), "method": METHOD, "gradients": gradients, "rounds": got["rounds"],
              "samples": got["samples"],
              "objectives": list(objectives), "trajectories": rows, "groups": group_rows,
              "kl_positions": got["kl_positions"], "fits": fits(rows, group_rows, objectives, settings.seed),
              "sample_s": round(got["sample_s"], 1),
              "wall_s": round(time.time() - t0 + (previous.get("wall_s", 0.0) if start else 0.0), 1),
              "commit": git_commit(), "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    if start:       # where its first rounds come from
        result["resumed"] = {"rounds": start, "method": previous["method"], "commit": previous.get("commit"),
                             "date": previous.get("date"), "wall_s": previous.get("wall_s"),
                             **({"resumed": previous["resumed"]} if "resumed" in previous else {})}
    write_json_gz(out, result)
    if progress:
        print(f"[dsh attribution] {model}: {len(rows)} trajectories in {result['wall_s']} s")
    return result
