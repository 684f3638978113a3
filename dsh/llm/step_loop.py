"""The CPU path's generate loop in C (``decode_run`` in ``cpu_kernels.c``), for
:meth:`dsh.llm.kernel_engine.KernelDecoder.generate`: the decoding steps, each row's retirement when it is done and the
start of a waiting prompt in the freed slot, all without a return to Python between the steps. The host takes the
finished rows in batches (a tenth of a second's steps, :data:`SECONDS`, or fewer where the finished rows would
overfill the :data:`RESULT_ROWS` times the slots held for it, so that memory does not grow with the prompts), decides
a row count's products when a step first meets it, and takes a step itself where a row count is not in C. The same
steps on the same rows in the same order as the loop in Python (``c_loop = False``), so the same completions, bit for
bit.

Why: after each C step the host's Python runs on caches the step has swept; on the sampling bench (1024 ladder
prompts, 256 slots, 200 tokens, float16 cache, the 2-core AMD Zen 4) its retirements, admissions and row-count
lookups took 66 ms of an 864 ms generate, outside the steps' 798 ms.
"""

from __future__ import annotations

import ctypes

import numpy as np
import torch

SECONDS = 0.1      # the host hands on the finished rows (callbacks, progress) at the first step's end after this long
RESULT_ROWS = 2    # finished rows held for the host: this many times the slots (the host takes them all at each return)
ALL_DONE, HAND_ON, UNDECIDED = 0, 1, 2   # decode_run's returns


class RunState(ctypes.Structure):
    """``run_state`` in ``cpu_kernels.c``, field for field: the rows in flight, the waiting prompts, the free slots,
    the results and the ways of each row count (see ``decode_run``)."""
    _fields_ = ([(f, ctypes.c_int64) for f in ("slots", "A", "n_done", "waiting", "n_free", "width", "limit", "out_w",
                                               "n_finished", "started", "greedy", "stop_tok", "stop_n", "n_eos",
                                               "res_rows")]
                + [("inv_temp", ctypes.c_float), ("seconds", ctypes.c_double)]
                + [(f, ctypes.c_void_p) for f in ("st", "owner", "free_slots", "out", "prompt", "res_tok", "res_meta",
                                                  "finished", "scratch", "out_logp", "res_logp", "order", "padded",
                                                  "plen", "keys", "ways", "eos")])


def ways_table(slots: int, products: int) -> np.ndarray:
    """Per row count ``0 .. slots``: the C step's parts (-1: not decided yet; 0: the step in Python) and each product's
    way."""
    t = np.zeros((slots + 1, 1 + products), dtype=np.int64)
    t[:, 0] = -1
    return t


def set_way(table: np.ndarray, A: int, way) -> None:
    """Enter row count ``A``'s decision (``(parts, ways)``, the step's parts and each product's way; None: the step in
    Python) in ``table``, as :meth:`dsh.llm.kernel_engine.KernelDecoder.way_in_c` makes it."""
    if way is None:
        table[A, 0] = 0
    else:
        table[A, 0] = way[0]
        table[A, 1:] = way[1]


def generate_in_c(dec, table: tuple, waiting: list, max_new_tokens: int, inv_temp: float, greedy: bool, on_finish,
                  on_step=None) -> None:
    """Every prompt of ``table`` (padded prompts, lengths, stream keys: numpy arrays) through ``dec``'s C step
    (:class:`dsh.llm.kernel_engine.KernelDecoder`, its buffers made for this generate), started in the order of
    ``waiting`` (its last first); ``on_finish`` and ``on_step`` as in its :meth:`generate`."""
    padded, lengths, keys = table
    n, slots = len(lengths), dec.slots
    rows = min(n, RESULT_ROWS * slots)     # the finished rows not yet taken by the host: at most this many
    res_tok = np.zeros((rows, max_new_tokens), dtype=np.int64)
    res_logp = np.zeros((rows, max_new_tokens), dtype=np.float32)
    res_meta = np.zeros((rows, 3), dtype=np.int64)
    state = torch.zeros(dec.ROWS * slots, dtype=torch.long)
    arrays = {"st": state.numpy(), "owner": np.zeros(slots, np.int64), "free_slots": np.arange(slots)[::-1].copy(),
              "res_tok": res_tok, "res_meta": res_meta, "finished": np.zeros(rows, np.int64),
              "scratch": np.zeros(dec.ROWS * slots, np.int64), "res_logp": res_logp,
              "order": np.ascontiguousarray(waiting, dtype=np.int64), "padded": padded, "plen": lengths, "keys": keys,
              "ways": dec.ways}
    stop_tok, stop_n = dec.stop_after if dec.stop_after is not None else (-1, 0)
    r = RunState(slots=slots, res_rows=rows, waiting=n, n_free=slots, width=padded.shape[1], limit=max_new_tokens,
                 out_w=max_new_tokens, greedy=int(greedy), stop_tok=stop_tok, stop_n=stop_n, n_eos=dec.eos.numel(),
                 inv_temp=inv_temp, seconds=SECONDS, out=dec.out.data_ptr(), prompt=dec.prompt_buf.data_ptr(),
                 out_logp=dec.out_logp.data_ptr(), eos=dec.eos.data_ptr(),
                 **{k: a.ctypes.data for k, a in arrays.items()})
    handed = written = 0
    while True:
        why = dec.lib.decode_run(ctypes.byref(dec.c_model), ctypes.byref(r))
        if r.n_finished > handed:           # the rows finished since the last return, in the order they finished
            qs = np.arange(handed, r.n_finished) % rows
            n_gen, stopped, capped = res_meta[qs].T.tolist()
            width = max(n_gen)
            for j, k, stop, cap, toks, lps in zip(arrays["finished"][qs].tolist(), n_gen, stopped, capped,
                                                  res_tok[qs, :width].tolist(), res_logp[qs, :width].tolist()):
                on_finish(j, toks[:k], bool(stop), lps[:k], bool(cap))
            handed, written = r.n_finished, written + sum(n_gen)
        if why == UNDECIDED:
            # decided (and entered in dec.ways) when first met; where not in C, the host takes this step itself, on
            # the rows as C holds them
            if dec.way_in_c(r.A) is None:
                r.n_done = dec.python_step(state[:dec.ROWS * r.A].view(dec.ROWS, r.A), inv_temp, greedy)
        if on_step is not None:
            active = arrays["st"][:dec.ROWS * r.A].reshape(dec.ROWS, r.A)
            on_step(r.started, written + int(active[dec.N_GEN].sum()))
        if why == ALL_DONE:
            return
