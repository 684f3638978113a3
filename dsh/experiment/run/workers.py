"""The pipeline's steps on several worker processes.

A step is one call (a stage's training, its evaluation job, an attribution study) with the steps it needs
(``after``). :func:`run_steps` runs each step once everything it needs has finished: with one worker in this
process, in the order given; with more, each on the first free worker (a process of its own, started once, with
``threads`` threads for torch, MKL and OpenMP), the ready step with the longest chain of work behind it first
(``cost``: rough relative cost, only for this order). On a 2-core machine two workers of one thread each do more
work than one worker of two threads: the small products and the sampling's steps with few rows do not use a second
thread well. Results depend on the thread count (sums split over threads round differently), not on the number of
workers: a run with ``workers=2, threads=1`` gives what ``workers=1, threads=1`` gives.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

from ...core import validate as v


@dataclasses.dataclass(frozen=True)
class Step:
    """One step of the pipeline: ``fn(*args, clock=clock)``, run after the steps named in ``after``."""

    name: str
    fn: Callable
    args: tuple
    after: tuple = ()
    cost: float = 1.0


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:   # not on Linux
        return os.cpu_count() or 1


def check_workers(workers, threads=None) -> tuple[int, int | None]:
    """``workers`` (1 .. the cores) and ``threads`` a worker (None: torch's default with one worker, the cores
    shared out with more; else 1 .. the cores, with workers x threads at most the cores), checked; returns
    ``(workers, threads)`` with the default filled in for more than one worker."""
    n = cores()
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= n:
        raise ValueError(f"workers must be an integer from 1 to {n} (this machine's cores), got {workers!r}")
    if threads is None:
        return workers, (None if workers == 1 else max(1, n // workers))
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= n // workers:
        raise ValueError(f"threads must be an integer from 1 to {n // workers} (this machine's {n} cores shared by "
                         f"{workers} worker{'s' if workers > 1 else ''}), got {threads!r}")
    return workers, threads


def set_threads(threads: int | None) -> tuple | None:
    """This process's threads for torch, MKL and OpenMP (None: leave them). Returns what they were, for
    :func:`restore_threads` (None when left)."""
    if threads is None:
        return None
    import torch

    keys = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
    was = (torch.get_num_threads(), {k: os.environ.get(k) for k in keys})
    for k in keys:
        os.environ[k] = str(threads)
    torch.set_num_threads(threads)
    return was


def restore_threads(was: tuple | None) -> None:
    """Undo :func:`set_threads`."""
    if was is None:
        return
    import torch

    torch.set_num_threads(was[0])
    for k, x in was[1].items():
        if x is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = x


def _in_worker(fn, args, progress: bool, start: float):
    """A step in a worker: its own clock (the pipeline's start, no progress bars); what it timed and whether it did
    work go back with its result, and when it ran."""
    from .steps import Clock

    clock = Clock(progress, bars=False)
    clock.start = start
    t0 = time.time()
    out = fn(*args, clock=clock)
    return out, clock.timings, clock.worked, (t0 - start, time.time() - start, os.getpid())


def _priorities(steps: list[Step]) -> dict[str, float]:
    """Each step's cost plus the longest chain of costs of the steps that need it."""
    after_me = {s.name: [t for t in steps if s.name in t.after] for s in steps}
    prio: dict[str, float] = {}

    def of(s: Step) -> float:
        if s.name not in prio:
            prio[s.name] = s.cost + max((of(t) for t in after_me[s.name]), default=0.0)
        return prio[s.name]

    for s in steps:
        of(s)
    return prio


def run_steps(steps: list[Step], clock, workers: int = 1, threads: int | None = None,
              done: Callable | None = None) -> tuple[dict, list[dict]]:
    """Run every step (see the module's text) and return ``({name: result}, schedule)``: the schedule one row a step,
    ``{"step", "start_s", "end_s", "worker"}`` (seconds since ``clock.start``; the worker's process id). Each step's
    timings and whether it worked go to ``clock``; ``done(step, result)`` is called here as each step ends. A step
    that fails stops the run: no new step starts, the running ones finish (their work is kept for the next run),
    and its error is raised."""
    names = [s.name for s in steps]
    for s in steps:
        for a in s.after:
            v.choice(f"{s.name}: after", a, names)
    results, schedule = {}, []
    if workers == 1:
        was = set_threads(threads)
        try:
            for s in steps:
                t0 = time.time()
                results[s.name] = s.fn(*s.args, clock=clock)
                schedule.append({"step": s.name, "start_s": round(t0 - clock.start, 1),
                                 "end_s": round(clock.elapsed(), 1), "worker": os.getpid()})
                if done:
                    done(s, results[s.name])
        finally:
            restore_threads(was)
        return results, schedule
    prio, order = _priorities(steps), {n: i for i, n in enumerate(names)}
    pending, running = dict.fromkeys(names), {}
    by_name = {s.name: s for s in steps}
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=set_threads,
                               initargs=(threads,))
    try:
        while pending or running:
            ready = sorted((n for n in pending if all(a in results for a in by_name[n].after)),
                           key=lambda n: (-prio[n], order[n]))
            for n in ready[:workers - len(running)]:
                del pending[n]
                s = by_name[n]
                running[pool.submit(_in_worker, s.fn, s.args, clock.progress, clock.start)] = s
            if not running:
                raise RuntimeError(f"steps {sorted(pending)} wait for one another")
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for f in sorted(finished, key=lambda f: order[running[f].name]):
                s = running.pop(f)
                out, timings, worked, (t0, t1, pid) = f.result()
                clock.timings.update(timings)
                clock.worked = clock.worked or worked
                results[s.name] = out
                schedule.append({"step": s.name, "start_s": round(t0, 1), "end_s": round(t1, 1), "worker": pid})
                if done:
                    done(s, out)
    except BaseException:
        if running:
            clock.say(f"stopping: waiting for {', '.join(s.name for s in running.values())} to finish")
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return results, sorted(schedule, key=lambda r: (r["start_s"], order[r["step"]]))
