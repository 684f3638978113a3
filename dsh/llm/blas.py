"""torch's float32 matrix product as C code can call it: the BLAS ``sgemm_`` that torch's CPU library exports (MKL's
on x86 Linux builds, linked into ``libtorch_cpu``), for the decoding step in C (:mod:`dsh.llm.kernel_engine`).

``torch.mm(x, w.t())`` of float32 tensors on the CPU calls ``sgemm_('T', 'N', out_features, rows, in_features, 1, w,
in_features, x, in_features, 0, out, out_features)`` (and ``r.addmm_(x, w.t())`` the same with beta 1 into ``r``);
:func:`product` makes that call, so that where the two give the same bits (checked per shape and row count,
:func:`dsh.llm.products.sgemm_agrees`) a product taken in C is torch's. Where the library exports no ``sgemm_``
(another BLAS, another platform), :func:`address` is None and the step stays in Python.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

_found: list = []   # [address or None], once per process


def address() -> int | None:
    """The address of ``sgemm_`` in the torch library this process loaded; None where it exports none."""
    if not _found:
        lib_dir = Path(torch.__file__).parent / "lib"
        addr = None
        for name in ("libtorch_cpu.so", "libtorch_cpu.dylib"):
            try:
                addr = ctypes.cast(ctypes.CDLL(str(lib_dir / name)).sgemm_, ctypes.c_void_p).value
                break
            except (OSError, AttributeError):
                continue
        _found.append(addr if torch.backends.mkl.is_available() else None)
    return _found[0]


_SGEMM = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 13)


def product(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, beta: float = 0.0) -> torch.Tensor:
    """``out = beta * out + x @ w.T`` by ``sgemm_`` with torch's arguments (``x [A, I]``, ``w [O, I]``, ``out [A, O]``:
    contiguous float32 on the CPU); needs :func:`address`."""
    if address() is None:
        raise ValueError("blas.product needs torch's sgemm_, which this torch library does not export")
    for name, t in (("x", x), ("w", w), ("out", out)):
        if t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous() or t.dim() != 2:
            raise ValueError(f"{name} must be a contiguous 2-d float32 CPU tensor; got {t.dtype} {tuple(t.shape)}")
    if x.shape[1] != w.shape[1] or tuple(out.shape) != (x.shape[0], w.shape[0]):
        raise ValueError(f"shapes must be x [A, I], w [O, I], out [A, O]; got {tuple(x.shape)}, {tuple(w.shape)}, "
                         f"{tuple(out.shape)}")
    (A, k), m = x.shape, w.shape[0]
    ints = [ctypes.c_int(v) for v in (m, A, k)]
    ta, tb, one, b = ctypes.c_char(b"T"), ctypes.c_char(b"N"), ctypes.c_float(1.0), ctypes.c_float(beta)
    ref = ctypes.byref
    _SGEMM(address())(ref(ta), ref(tb), ref(ints[0]), ref(ints[1]), ref(ints[2]), ref(one), w.data_ptr(),
                      ref(ints[2]), x.data_ptr(), ref(ints[2]), ref(b), out.data_ptr(), ref(ints[0]))
    return out
