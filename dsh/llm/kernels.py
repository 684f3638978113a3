"""The CPU loops of :mod:`dsh.llm.kernel_engine` and of :mod:`dsh.llm.packed_attention`, in C (``cpu_kernels.c``),
compiled on first use, called through ctypes.

On the CPU a decoding step of a tiny model spends its time reading the KV cache: ``torch.matmul`` of one query
against the cache runs as many 1 x D by D x L products, over every row up to the longest row's length (measured
2-3x slower than these loops on the 2-core machine: README, "Performance"), while the linear layers already run
near the matmul peak. ``attend`` rotates and stores a decoding position's keys and values, then reads each row's own
keys and values once, up to its own length (keys transposed within tiles of 16 positions, so that 16 scores are one
vector product); ``rms_norm``, ``silu_mul`` and ``sample_tokens`` (the counted uniforms of
:func:`dsh.llm.streams.counted_uniform`, bit for bit, in the Gumbel-max form of the same draw, with the drawn token's
log-probability) replace a dozen small torch operations each. All run over OpenMP threads (the libgomp that torch
loaded: one thread pool).

Built with the C compiler (``$CC`` or ``cc``) into ``$DSH_CACHE/kernels`` (default ``~/.cache/dsh/kernels``), keyed
by a hash of the source, the flags and the CPU's feature flags, written atomically; compiled once per machine in
well under a second. Where no compiler works, :func:`load` returns None with the reason in :data:`why_not`, and the
engine uses its torch path (the results are the same up to float rounding).

``-ffast-math`` is applied when compiling only (vectorised ``expf`` from glibc's libmvec), never when linking: a
shared library linked with it would switch the whole process to flush-to-zero. The code is built for this CPU
(``-march=native``), or for the architecture ``$DSH_KERNELS_MARCH`` names (e.g. ``znver3``: with ``-ffast-math`` the
compiler's vector width and tuning decide the summation order, so another host's sampled log-probabilities are
reproduced only with its architecture; README, "Reproducing a result on another CPU").
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import platform
import subprocess
import tempfile
from pathlib import Path

from ..core import store
from ..core.provenance import cpu_feature_line, cpu_flags

SOURCE = Path(__file__).with_name("cpu_kernels.c")
TILE = 16                      # positions per key tile (TILE in cpu_kernels.c)
KV_CACHE = ("float32", "float16")    # the dtypes of the CPU path's KV cache (float16: attend_f16, see half_cache)
# tried in order: vectorised expf and OpenMP; OpenMP without libmvec; single-threaded portable C
FLAG_SETS = (
    (["-O3", "-march=native", "-ffast-math", "-fopenmp"], ["-fopenmp", "-lmvec", "-lm"]),
    (["-O3", "-march=native", "-fopenmp"], ["-fopenmp", "-lm"]),
    (["-O3"], ["-lm"]),
)

_lib = None
why_not: str | None = None     # why the kernels are unavailable (None: not tried yet, or available)


def cache_dir() -> Path:
    return Path(os.environ.get("DSH_CACHE") or Path.home() / ".cache" / "dsh") / "kernels"


def _build(cc: str, cflags: list, ldflags: list, out: Path) -> str | None:
    """Compile and link into ``out`` (atomically); None on success, else the compiler's last line."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".build-") as tmp:
        obj, so = Path(tmp) / "k.o", Path(tmp) / "k.so"
        for cmd in ([cc, *cflags, "-fPIC", "-c", str(SOURCE), "-o", str(obj)],
                    [cc, "-shared", str(obj), "-o", str(so), *ldflags]):
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            except (OSError, subprocess.TimeoutExpired) as e:
                return f"{cmd[0]}: {e}"
            if r.returncode:
                return (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1][:200]
        try:
            ctypes.CDLL(str(so))
        except OSError as e:
            return str(e)[:200]
        os.replace(so, out)
    return None


def load():
    """The compiled kernels (a ctypes library: ``attend``, ``rms_norm``, ``silu_mul``, ``sample_tokens``,
    ``advance_rows``, ``decode_step`` (the whole step; its products through ``set_sgemm``'s function), ``decode_run``
    (steps, retirements and admissions: :mod:`dsh.llm.step_loop`),
    ``varlen_attention`` and its backward (``_bf16``: bfloat16 products where ``has_attention_bf16``), ``fma_rate``),
    or None when no compiler could build them (reason in :data:`why_not`). ``DSH_KERNELS=0`` turns them off."""
    global _lib, why_not
    if os.environ.get("DSH_KERNELS", "1") == "0":
        return None
    if _lib is not None:
        return _lib
    if why_not is not None:
        return None
    cc = os.environ.get("CC", "cc")
    src = SOURCE.read_bytes()
    errors = []
    asked = os.environ.get("DSH_KERNELS_MARCH")
    march = f"-march={asked or 'native'}"
    # an architecture asked for is built for or not at all (the portable build would round otherwise)
    flag_sets = [fs for fs in FLAG_SETS if "-march=native" in fs[0]] if asked else FLAG_SETS
    for cflags, ldflags in flag_sets:
        cflags = [march if f == "-march=native" else f for f in cflags]
        key = store.key_digest({"source": hashlib.sha256(src).hexdigest(), "cc": cc, "flags": cflags + ldflags,
                                "cpu": cpu_feature_line()})[:16]
        path = cache_dir() / f"dsh_kernels_{key}.so"
        try:
            err = None if path.exists() else _build(cc, cflags, ldflags, path)
        except OSError as e:                      # an unwritable cache folder: no kernels, the torch path runs
            err = f"{cache_dir()}: {e.strerror or e}"
        if err is None:
            try:
                lib = ctypes.CDLL(str(path))
            except OSError as e:
                errors.append(str(e)[:200])
                continue
            _declare(lib)
            lib.build = path.stem               # which build this is (the decisions about its products key on it)
            _lib = lib
            return lib
        errors.append(err)
    why_not = f"the C kernels could not be built with {cc!r}: {errors[-1]}"
    return None


@contextlib.contextmanager
def disabled():
    """The engine's torch path inside (``DSH_KERNELS=0``), the setting before restored after."""
    old = os.environ.get("DSH_KERNELS")
    os.environ["DSH_KERNELS"] = "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("DSH_KERNELS", None)
        else:
            os.environ["DSH_KERNELS"] = old


def unavailable() -> str | None:
    """Why :func:`load` gives no kernels (None when it does)."""
    if os.environ.get("DSH_KERNELS", "1") == "0":
        return "turned off by DSH_KERNELS=0"
    return None if load() is not None else why_not


def _declare(lib):
    P, N, F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
    lib.attend.restype = None
    lib.attend.argtypes = [P, P, P, P, P, P, P, P, P, N, N, N, N, N, F]
    lib.rms_norm.restype = None
    lib.rms_norm.argtypes = [P, P, F, P, N, N]
    lib.silu_mul.restype = None
    lib.silu_mul.argtypes = [P, P, N, N]
    lib.sample_tokens.restype = None
    lib.sample_tokens.argtypes = [P, P, P, F, ctypes.c_int, P, P, N, N]
    lib.advance_rows.restype = N
    lib.advance_rows.argtypes = [P, P, P, N, P, P, N, P, N, P, N, N, N]
    lib.has_attend_f16.restype = ctypes.c_int
    lib.has_attend_f16.argtypes = []
    if lib.has_attend_f16():
        lib.attend_f16.restype = None
        lib.attend_f16.argtypes = lib.attend.argtypes
    lib.fma_rate.restype = ctypes.c_double
    lib.fma_rate.argtypes = [N]
    lib.varlen_attention.restype = None
    lib.varlen_attention.argtypes = [P, P, P, P, N, N, N, N, F, P, P]
    lib.varlen_attention_backward.restype = None
    lib.varlen_attention_backward.argtypes = [P, P, P, P, N, N, N, N, F, P, P, P, P, P, P]
    lib.has_attention_bf16.restype = ctypes.c_int
    lib.has_attention_bf16.argtypes = []
    lib.varlen_attention_bf16.restype = lib.varlen_attention_backward_bf16.restype = None
    lib.varlen_attention_bf16.argtypes = lib.varlen_attention.argtypes
    lib.varlen_attention_backward_bf16.argtypes = lib.varlen_attention_backward.argtypes
    lib.rms_norm_rstd.restype = lib.rms_norm_backward.restype = None
    lib.rms_norm_rstd.argtypes = [P, P, F, P, P, N, N]
    lib.rms_norm_backward.argtypes = [P, P, P, P, P, P, N, N, N]
    lib.rope_split.restype = lib.rope_split_backward.restype = lib.silu_mul_backward.restype = None
    lib.rope_split.argtypes = [P, P, P, P, P, P, N, N, N, N]
    lib.rope_split_backward.argtypes = [P, P, P, P, P, P, N, N, N, N]
    lib.silu_mul_backward.argtypes = [P, P, P, N, N]
    lib.silu_mul_bf16.restype = lib.silu_mul_bf16_backward.restype = None
    lib.silu_mul_bf16.argtypes = [P, P, N, N]
    lib.silu_mul_bf16_backward.argtypes = [P, P, P, N, N]
    lib.rope_split_bf16.restype = lib.rope_split_bf16_backward.restype = None
    lib.rope_split_bf16.argtypes = lib.rope_split.argtypes
    lib.rope_split_bf16_backward.argtypes = lib.rope_split_backward.argtypes
    lib.set_sgemm.restype = None
    lib.set_sgemm.argtypes = [P, P, P]
    lib.has_panel_product.restype = ctypes.c_int
    lib.has_panel_product.argtypes = []
    lib.panel_pack.restype = lib.panel_product.restype = None
    lib.panel_pack.argtypes = [P, P, N, N]
    lib.panel_product.argtypes = [P, P, P, N, N, N, F, N]
    lib.decode_step.restype = N
    lib.decode_step.argtypes = [P, P, N, F, ctypes.c_int, P, P, N, P, N, P, N, N, N, P, P, N]
    lib.decode_run.restype = N
    lib.decode_run.argtypes = [P, P]


@functools.cache
def bf16_dot_products() -> bool:
    """Whether the CPU multiplies bfloat16 pairs in hardware (AVX512_BF16's vdpbf16ps; read once a process)."""
    return "avx512_bf16" in cpu_flags()


def half_cache(lib) -> bool:
    """Whether ``lib`` reads a float16 KV cache (:func:`attend` with float16 caches): its compiler has ``_Float16``
    and the CPU converts half floats in hardware (F16C on x86; every 64-bit ARM CPU), else a float16 cache would be
    converted in software, slower than reading float32."""
    hardware = "f16c" in cpu_flags() or platform.machine() in ("aarch64", "arm64")
    return bool(lib is not None and lib.has_attend_f16() and hardware)


PANEL = 32                     # outputs a panel of panel_pack (PANEL in cpu_kernels.c)


def has_panels(lib) -> bool:
    """Whether ``lib`` has the decoding step's own matrix product (:func:`panel_product`: built for AVX-512)."""
    return bool(lib is not None and lib.has_panel_product())


def panel_pack(lib, w):
    """``w [O, I]`` (contiguous float32) packed for :func:`panel_product`: panels of :data:`PANEL` outputs, each
    holding its outputs' weights input by input (zeros past ``O``)."""
    import torch

    outs, ins = w.shape
    panels = torch.empty(-(-outs // PANEL) * PANEL * ins)
    lib.panel_pack(w.data_ptr(), panels.data_ptr(), outs, ins)
    return panels


def panel_product(lib, x, panels, out, beta: float = 0.0, chunk: int = 0):
    """``out = beta * out + x @ w.T`` (``beta`` 0 or 1) from ``w``'s :func:`panel_pack`: each output one chain of
    fused multiply-adds over its inputs in order, the inputs cut into chunks of ``chunk`` (0: one chunk), each chunk's
    chain from zero and their sums added in order, the first to ``out`` where ``beta`` is 1 (``panel_product`` in
    ``cpu_kernels.c``); ``x [A, I]`` and ``out [A, O]`` contiguous float32. A row's result depends on its own row
    alone."""
    lib.panel_product(x.data_ptr(), panels.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], out.shape[1], beta,
                      chunk)
    return out


def attend(lib, qkv, cos, sin, pos, lens, slot, k_tiles, v_cache, out, KV: int, M: int, scale: float):
    """One decoding position of every live row (``lens > 0``; ``lens = pos + 1``): the rotated keys and the values of
    ``qkv [B, (H + 2 KV) D]`` stored at ``pos`` in the caches of the row's ``slot`` (one layer's ``k_tiles
    [slots, M / TILE, KV, D, TILE]`` and ``v_cache [slots, M, KV, D]``), then ``out [B, H, D]`` = the attention of the
    rotated query heads over positions ``0 .. pos``. float32 and int64 tensors, contiguous, on the CPU; the caches
    float32, or float16 where :func:`half_cache` holds (keys and values rounded to half as they are stored, read back
    as float)."""
    B, H, D = out.shape
    f = lib.attend_f16 if k_tiles.element_size() == 2 else lib.attend
    f(qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), pos.data_ptr(), lens.data_ptr(), slot.data_ptr(),
               k_tiles.data_ptr(), v_cache.data_ptr(), out.data_ptr(), B, H, KV, D, M, float(scale))


def rms_norm(lib, x, weight, eps: float, out):
    """``out [B, N]`` = RMSNorm of the rows of ``x [B, N]`` with ``weight [N]`` (transformers' LlamaRMSNorm)."""
    lib.rms_norm(x.data_ptr(), weight.data_ptr(), float(eps), out.data_ptr(), x.shape[0], x.shape[1])
    return out


def silu_mul(lib, gate_up, out):
    """``out [B, F]`` = silu(gate) * up for ``gate_up [B, 2F]`` (the fused gate and up projections)."""
    lib.silu_mul(gate_up.data_ptr(), out.data_ptr(), out.shape[0], out.shape[1])
    return out


def sample_tokens(lib, logits, key, step, inv_temp: float, greedy: bool, out, logp):
    """``out [B]`` (int64): the next token of each row of ``logits [B, V]``: the argmax when ``greedy``, else a draw
    from softmax(logits * inv_temp) in its Gumbel-max form with the engine's counted uniforms of (``key``, ``step``);
    ``logp [B]`` (float32): its log-probability under softmax(logits * inv_temp)."""
    lib.sample_tokens(logits.data_ptr(), key.data_ptr(), step.data_ptr(), float(inv_temp), int(bool(greedy)),
                      out.data_ptr(), logp.data_ptr(), logits.shape[0], logits.shape[1])
    return out, logp


def advance_rows(lib, new, logp, state, out, out_logp, prompt, eos, stop_tok: int, stop_n: int) -> int:
    """The active rows' bookkeeping after a decoding step, in place (``advance_rows`` in the C source says what):
    ``new [A]`` (int64) the tokens drawn, ``logp [A]`` (float32) theirs, ``state [fields, A]`` (int64) the rows' fields
    in :data:`dsh.llm.kernel_engine.ROW_FIELDS`' order, ``out`` / ``out_logp [slots, W]`` the completions written so
    far, ``prompt [slots, P]`` (int64) the prompts, ``eos`` (int64) the end tokens, ``stop_tok`` < 0 for no stop
    token. Returns how many rows are done."""
    return lib.advance_rows(new.data_ptr(), logp.data_ptr(), state.data_ptr(), state.shape[1], out.data_ptr(),
                            out_logp.data_ptr(), out.shape[1], prompt.data_ptr(), prompt.shape[1], eos.data_ptr(),
                            eos.numel(), int(stop_tok), int(stop_n))
