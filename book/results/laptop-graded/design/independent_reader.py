"""A second route to the graded run's headline numbers, importing nothing from dsh: reads a results folder's
generations (generations/<stage>.jsonl.gz), takes every whole line "The answer is N." as a candidate, a candidate
followed by "Let me recompute." and another candidate as RESAMPLE and any other as STOP, and prints per stage and
level: n, accuracy (the last candidate right), p_s (the first right, over responses with a candidate), p_dC (STOP
after a right candidate), p_dW (RESAMPLE after a wrong one), F->T, and the share truncated. A response an attempt
budget ended (its record "capped": true, right after its last "Let me recompute.") has its last decision RESAMPLE.
    python book/results/laptop-graded/design/independent_reader.py book/results/laptop-graded [stage ...]"""
import gzip
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

ANSWER = re.compile(r"^The answer is (\d+)\.(?!\d)", re.M)
MARKER = "Let me recompute."


def read(response: str, capped: bool = False):
    """(candidates, decisions) of one response; ``capped``: ended by an attempt budget at its last marker."""
    found = [(int(m.group(1)), m.start(), m.end()) for m in ANSWER.finditer(response)]
    cands, decs = [], []
    for i, (value, _, end) in enumerate(found):
        cands.append(value)
        nxt = found[i + 1][1] if i + 1 < len(found) else None
        decs.append("RESAMPLE" if nxt is not None and MARKER in response[end:nxt] else "STOP")
        if decs[-1] == "STOP":
            break
    if capped and decs and len(decs) == len(found) and response.rstrip().endswith(MARKER):
        decs[-1] = "RESAMPLE"
    return cands, decs


def stage_numbers(path: Path) -> dict:
    by = defaultdict(lambda: defaultdict(int))
    with gzip.open(path, "rt") as f:
        for line in f:
            r = json.loads(line)
            b = by[r["level"]]
            ans = int(r["answer"])
            cands, decs = read(r["response"], r.get("capped") is True)
            b["n"] += 1
            b["truncated"] += bool(r.get("truncated"))
            b["right"] += bool(cands) and cands[-1] == ans
            if cands:
                b["answered"] += 1
                b["first_right"] += cands[0] == ans
            for i, (c, d) in enumerate(zip(cands, decs)):
                if c == ans:
                    b["C"] += 1
                    b["stop_C"] += d == "STOP"
                else:
                    b["W"] += 1
                    b["resample_W"] += d == "RESAMPLE"
                    if d == "RESAMPLE" and i + 1 < len(cands):
                        b["F->T"] += cands[i + 1] == ans
    ratio = lambda a, b: round(a / b, 3) if b else None  # noqa: E731
    return {lv: {"n": b["n"], "accuracy": ratio(b["right"], b["n"]), "p_s": ratio(b["first_right"], b["answered"]),
                 "p_dC": ratio(b["stop_C"], b["C"]), "p_dW": ratio(b["resample_W"], b["W"]), "F->T": b["F->T"],
                 "truncated": ratio(b["truncated"], b["n"])} for lv, b in sorted(by.items())}


if __name__ == "__main__":
    folder = Path(sys.argv[1])
    stages = sys.argv[2:] or sorted(p.name[:-len(".jsonl.gz")] for p in (folder / "generations").glob("*.jsonl.gz"))
    print(json.dumps({s: stage_numbers(folder / "generations" / f"{s}.jsonl.gz") for s in stages}, indent=1))
