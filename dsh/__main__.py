"""Command line: ``python -m dsh --help``."""

from __future__ import annotations

import argparse
import json
import sys

from . import __version__


def _cmd_accuracy(args) -> int:
    from .two_stage import predicted_accuracy

    acc = predicted_accuracy(args.p_s, args.p_dC, args.p_dW)
    if args.json:
        print(json.dumps({"p_s": args.p_s, "p_dC": args.p_dC, "p_dW": args.p_dW, "predicted_accuracy": acc}))
    else:
        print(f"predicted accuracy = {acc:.6f}")
    return 0


def _cmd_simulate(args) -> int:
    from .two_stage import predicted_accuracy, simulate

    sim = simulate(args.p_s, args.p_dC, args.p_dW, n=args.n, seed=args.seed)
    obs = float(sim.final_correct.mean())
    out = {"n": args.n, "seed": args.seed, "observed_accuracy": obs,
           "predicted_accuracy": predicted_accuracy(args.p_s, args.p_dC, args.p_dW),
           "mean_attempts": float(sim.n_attempts.mean())}
    print(json.dumps(out) if args.json else "\n".join(f"{k} = {v}" for k, v in out.items()))
    return 0


def _cmd_table(args) -> int:
    from .theory import comparison_table

    table = comparison_table()
    if args.json:
        print(json.dumps(table))
        return 0
    cols = list(table)
    rows = list(next(iter(table.values())))
    width = max(map(len, rows)) + 2
    print("".ljust(width) + "".join(c.ljust(24) for c in cols))
    for r in rows:
        print(r.ljust(width) + "".join(str(table[c][r]).ljust(24) for c in cols))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dsh", description=(
        "The Two-Stage Decision-Sampling hypothesis: theory checks and measurement tools."))
    p.add_argument("--version", action="version", version=f"dsh {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    a = sub.add_parser("accuracy", help="two-stage accuracy p_s p_dC / (1 - p_s(1-p_dC) - (1-p_s) p_dW)")
    for name in ("p_s", "p_dC", "p_dW"):
        a.add_argument(f"--{name.replace('_', '-').lower()}", dest=name, type=float, required=True)
    a.add_argument("--json", action="store_true", help="print one JSON object")
    a.set_defaults(func=_cmd_accuracy)

    s = sub.add_parser("simulate", help="Monte Carlo of the two-stage process against the formula")
    for name in ("p_s", "p_dC", "p_dW"):
        s.add_argument(f"--{name.replace('_', '-').lower()}", dest=name, type=float, required=True)
    s.add_argument("--n", type=int, default=100_000)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_cmd_simulate)

    t = sub.add_parser("table", help="Appendix D's SFT / DFT / RL comparison table, computed in SymPy")
    t.add_argument("--json", action="store_true")
    t.set_defaults(func=_cmd_table)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 0
    try:
        return args.func(args)
    except ValueError as e:  # bad input: one line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
