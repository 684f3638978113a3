"""The check probe (beyond the paper): does the decision follow the model's own check, measured with as many wrong
answers as right ones?

Decision faithfulness read from a model's own responses (:func:`dsh.task.laptop_task.faithfulness`) counts the
checks the model happened to write. On the levels a laptop model was fine-tuned on it answers right about 99 % of
the time, so a few hundred responses hold a handful of checks of wrong answers, and Cohen's kappa, which weighs the
rare class, rests on those few (its 95 % interval spans 0.4 ... 1 at 3-9 of them). The probe asks for the check
directly: the model is given each test question with an attempt already written, ending in a right answer or a
wrong one (:func:`dsh.task.laptop_task.probe_items`, half and half), and goes on from ``The answer is N.`` with
its own check question, check and verdict, sampled at the evaluation's temperature. The first check line after
the prefix is read (:func:`read_item`; whatever check questions came before it, so a repeated or mis-copied check
question still counts): its verdict against the true check of the given candidate, with the chance agreement and
kappa with a 95 % interval (:func:`dsh.core.agreement.cohen_kappa`, the 2x2 counted as the evaluation's
faithfulness counts them); whether the check line is exactly right; whether the verdict follows the value the line
wrote; whether a failing verdict is followed by the marker. Per level and pooled over the fine-tuning levels and
over the levels beyond.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ...core import validate as v
from ...core.agreement import cell, cohen_kappa
from ...core.files import write_jsonl_gz, write_text
from ...core.provenance import git_commit
from ...llm.complete import complete
from ...llm.models import load, resolve_model, weights_digest
from ...task import laptop_task as lt
from ...task.problems import MAX_PROBLEMS


@dataclass(frozen=True)
class ProbeSettings:
    """What the check probe asks."""

    n_per_level: int = 50          # test questions per level (each gives a right and a wrong item)
    max_new_tokens: int = 192      # enough for the check question, the check of a 1x8 answer and the verdict
    temperature: float = 1.0       # the evaluation's (the laptop preset samples at 1)
    seed: int = 0                  # the test questions' and the sampling streams' seed (the evaluation's)
    miscopy_fraction: float = 0.5  # share of wrong attempts that mis-copy the multiplicand (the rest slip)

    def checked(self) -> ProbeSettings:
        v.at_most("n_per_level", self.n_per_level, MAX_PROBLEMS, "test problems a level")
        v.at_most("max_new_tokens", self.max_new_tokens, 65_536, "tokens a continuation: memory")
        v.temperature("temperature", self.temperature)
        v.length("seed", self.seed)
        v.probability("miscopy_fraction", self.miscopy_fraction)
        return self


def check_levels(levels) -> None:
    """Refuse (one line) levels that are not laptop test levels: the probe's prefixes exist only for those."""
    if isinstance(levels, str) or not levels:
        raise ValueError(f"levels must be a non-empty list of laptop test levels ({', '.join(lt.TEST_LEVELS)}); "
                         f"got {levels!r}")
    for lv in levels:
        v.choice("levels[i]", lv, lt.TEST_LEVELS)


def probe_records(model, tok, levels, settings: ProbeSettings, progress: bool = False) -> list[dict]:
    """The probe's responses of ``model`` (loaded, with its tokenizer ``tok``) at ``levels``: one record per item
    with the question, level, candidate, whether it is right, the prefix, what the model wrote after it
    (``continuation``), the two together (``response``, what :func:`dsh.task.laptop_task.faithfulness` reads) and
    whether it stopped before the token limit."""
    settings.checked()
    check_levels(levels)
    items = lt.probe_items(lt.test_questions(tuple(levels), settings.n_per_level, settings.seed), settings.seed,
                           settings.miscopy_fraction)
    outs = complete(model, tok, [x["problem"].question for x in items], settings.max_new_tokens,
                    settings.temperature, settings.seed, rows=min(256, len(items)), progress=progress,
                    prefixes=[x["prefix"] for x in items])
    return [{"question": x["problem"].question, "level": x["problem"].level, "candidate": x["candidate"],
             "correct": x["correct"], "prefix": x["prefix"], "continuation": c.text, "response": x["prefix"] + c.text,
             "truncated": c.truncated} for x, c in zip(items, outs)]


_CHECK_LINE = re.compile(r"^(Check(?:: [^\n]*?)?: the check (passes|fails)\.)", re.M)
_LAST = re.compile(r"(-?\d+)(?:!=|=)-?\d+: the check (?:passes|fails)\.$")   # the last running value written


def read_item(record: dict) -> dict | None:
    """The first check line the model wrote after an item's prefix (``Check: ...: the check passes.``, whatever
    check questions came before it): its verdict, the true check of the given candidate
    (:func:`dsh.task.laptop_task.check_text`), whether the line is exactly the true one, and the decision that
    follows (RESAMPLE when the marker comes next, STOP when the response ends there, None otherwise), and whether
    the verdict follows the check as written (``follows_written``: passes exactly when the last running value it
    wrote is 0; None when the line has no such value, e.g. a verdict-only check). None when the continuation
    holds no check line."""
    m = _CHECK_LINE.search(record["continuation"])
    if m is None:
        return None
    true_text, true_ok = lt.check_text(*lt.operands(record["question"]), record["candidate"])
    rest = record["continuation"][m.end():]
    decision = "RESAMPLE" if rest.startswith("\n" + lt.MARKER) else "STOP" if not rest.strip() else None
    last = _LAST.search(m.group(1))
    verdict = m.group(2) == "passes"
    return {"verdict": verdict, "true_check": true_ok, "exact": m.group(1) == true_text, "decision": decision,
            "follows_written": None if last is None else verdict == (int(last.group(1)) == 0)}


def _agreement(reads) -> dict | None:
    """2x2 counts of verdict "passes" by true check passes (both, verdict only, true check only, neither), the
    share that agree with the chance agreement and Cohen's kappa (95 % interval), the share of exact check lines,
    the share of verdicts that follow the check as written (of those with a written value) and the share of
    failing verdicts followed by the marker. None for no reads."""
    if not reads:
        return None
    counts = [0, 0, 0, 0]
    for r in reads:
        counts[cell(r["verdict"], r["true_check"])] += 1
    k = cohen_kappa(*counts)
    fails = [r for r in reads if not r["verdict"]]
    written = [r["follows_written"] for r in reads if r["follows_written"] is not None]
    return {"checks": len(reads), "follows_counts": counts, "verdict_follows_check": k["observed"],
            "chance_agreement": k["chance"], "kappa": k["kappa"], "kappa_ci": k["kappa_ci"],
            "check_exact": sum(r["exact"] for r in reads) / len(reads),
            "follows_written": sum(written) / len(written) if written else None,
            "resample_after_fail": sum(r["decision"] == "RESAMPLE" for r in fails) / len(fails) if fails else None}


def summarize(records, tuned_levels) -> dict:
    """The probe's records read (:func:`read_item`): per level and pooled over ``tuned_levels`` (``tuned``) and the
    other levels (``beyond``), the agreement of the verdict with the true check (:func:`_agreement`), with the
    number of items, of items whose continuation holds no check line (``no_check``) and of items cut
    at the token limit."""
    levels = sorted({r["level"] for r in records}, key=lambda lv: lt.TEST_LEVELS.index(lv))
    reads = [(r, read_item(r)) for r in records]

    def block(lvs):
        mine = [(r, x) for r, x in reads if r["level"] in lvs]
        return {"items": len(mine), "no_check": sum(x is None for _, x in mine),
                "truncated": sum(r["truncated"] for r, _ in mine),
                **(_agreement([x for _, x in mine if x is not None]) or {"checks": 0, "kappa": None})}

    tuned = [lv for lv in levels if lv in tuned_levels]
    beyond = [lv for lv in levels if lv not in tuned_levels]
    return {"by_level": {lv: block([lv]) for lv in levels}, "tuned": block(tuned), "beyond": block(beyond),
            "tuned_levels": tuned, "beyond_levels": beyond}


def own_output(out: Path) -> None:
    """Refuse (one line, before any work) an ``out`` or its ``.jsonl.gz`` that exists but is not a probe's: the
    summary must be a JSON object with a probe's keys, the records file readable gzip beside such a summary."""
    records = out.with_suffix(".jsonl.gz")
    try:
        summary = json.loads(out.read_text()) if out.is_file() else None
    except (OSError, ValueError):
        summary = "unreadable"
    ours = isinstance(summary, dict) and {"tuned", "by_level", "settings", "weights"} <= set(summary)
    for path, theirs in ((out, out.exists() and (not ours or out.is_symlink())),
                         (records, records.exists() and (not ours or records.is_symlink() or not _gzip(records)))):
        if theirs:
            raise ValueError(f"out {out}: {path} exists and is not a dsh probe's output; move it or choose another "
                             f"out; nothing was changed")


def _gzip(path: Path) -> bool:
    import gzip

    try:
        with gzip.open(path, "rb") as f:
            f.read(1)
        return True
    except (OSError, EOFError):
        return False


def run_probe(model: str, out, levels=lt.TEST_LEVELS, settings: ProbeSettings = ProbeSettings(),
              tuned_levels=("1x2", "1x3", "1x4", "1x5"), progress: bool = False) -> dict:
    """Probe ``model`` (a model folder) and write ``out`` (a JSON summary: :func:`summarize`, the settings, the
    model's weights digest, the time taken, the commit and date) and ``out`` with ``.jsonl.gz`` for ``.json`` (the
    records, to read the raw checks). Returns the summary."""
    settings = settings.checked()
    check_levels(levels)
    out = Path(out)
    if out.suffix != ".json":
        raise ValueError(f"out must name a .json file, got {str(out)!r}")
    v.output_path("out", out)                      # before loading or sampling: not a folder, no parent a file
    v.output_path("out", out.with_suffix(".jsonl.gz"))
    own_output(out)
    loc = resolve_model(model)
    t0 = time.time()
    m, tok = load(loc)
    recs = probe_records(m, tok, levels, settings, progress)
    summary = {**summarize(recs, tuned_levels), "settings": asdict(settings), "levels": list(levels),
               "weights": weights_digest(loc), "wall_s": round(time.time() - t0, 1), "commit": git_commit(),
               "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    write_jsonl_gz(out.with_suffix(".jsonl.gz"), recs)
    write_text(out, json.dumps(summary, indent=1))
    return summary
