"""torch's float32 matrix product as C code can call it: the BLAS ``sgemm_`` that torch's CPU library exports (MKL's
on x86 Linux builds, linked into ``libtorch_cpu``), for the decoding step in C (:mod:`dsh.llm.kernel_engine`).

``torch.mm(x, w.t())`` of float32 tensors on the CPU calls ``sgemm_('T', 'N', out_features, rows, in_features, 1, w,
in_features, x, in_features, 0, out, out_features)`` (and ``r.addmm_(x, w.t())`` the same with beta 1 into ``r``);
:func:`product` makes that call, so that where the two give the same bits (checked per shape and row count,
:func:`dsh.llm.products.sgemm_agrees`) a product taken in C is torch's. Where the library exports no ``sgemm_``
(another BLAS, another platform), :func:`address` is None and the step stays in Python.

MKL also takes the same product from a weight packed ahead in its own layout (:func:`pack`, :func:`packed_product`:
``cblas_sgemm_pack`` and ``cblas_sgemm_compute``), which saves packing the weight at every call (1.03-1.18x at the
laptop base's step shapes, 256 rows, an Intel Xeon); its result equals ``sgemm_``'s at most row counts, not all (on
that CPU not below 6 rows), so it is checked per row count too (:func:`dsh.llm.products.packed_agrees`).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

_found: list = []   # [the torch library loaded as ctypes, or None], once per process


def _library():
    """torch's CPU library as a ctypes library (None where it cannot be opened or has no MKL)."""
    if not _found:
        lib = None
        if torch.backends.mkl.is_available():
            for name in ("libtorch_cpu.so", "libtorch_cpu.dylib"):
                try:
                    lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / name))
                    break
                except OSError:
                    continue
        _found.append(lib)
    return _found[0]


_ADDRESSES: dict = {}   # names -> their addresses (or None), once per process: the decoding step asks at every row count


def _symbols(*names) -> tuple | None:
    """The addresses of ``names`` in :func:`_library`; None where it or any of them is missing."""
    if names not in _ADDRESSES:
        lib = _library()
        try:
            _ADDRESSES[names] = None if lib is None else tuple(ctypes.cast(getattr(lib, n), ctypes.c_void_p).value
                                                               for n in names)
        except AttributeError:
            _ADDRESSES[names] = None
    return _ADDRESSES[names]


def address() -> int | None:
    """The address of ``sgemm_`` in the torch library this process loaded; None where it exports none."""
    found = _symbols("sgemm_")
    return None if found is None else found[0]


def _checked(**tensors) -> None:
    for name, t in tensors.items():
        if t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous() or t.dim() != 2:
            raise ValueError(f"{name} must be a contiguous 2-d float32 CPU tensor; got {t.dtype} {tuple(t.shape)}")


_SGEMM = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 13)


def product(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, beta: float = 0.0) -> torch.Tensor:
    """``out = beta * out + x @ w.T`` by ``sgemm_`` with torch's arguments (``x [A, I]``, ``w [O, I]``, ``out [A, O]``:
    contiguous float32 on the CPU); needs :func:`address`."""
    if address() is None:
        raise ValueError("blas.product needs torch's sgemm_, which this torch library does not export")
    _checked(x=x, w=w, out=out)
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


_COL_MAJOR, _NO_TRANS, _TRANS, _PACKED_MATRIX, _A_MATRIX = 102, 111, 112, 151, 161   # MKL's CBLAS constants


def packed_addresses() -> tuple | None:
    """The addresses of MKL's ``cblas_sgemm_pack_get_size``, ``cblas_sgemm_pack`` and ``cblas_sgemm_compute`` in torch's
    library; None where :func:`address` is None or it exports them not."""
    if address() is None:
        return None
    return _symbols("cblas_sgemm_pack_get_size", "cblas_sgemm_pack", "cblas_sgemm_compute")


def local_threads_address() -> int | None:
    """The address of MKL's ``MKL_Set_Num_Threads_Local`` (its C interface, the thread count by value; the lower-case
    name is the Fortran one, by reference) in torch's library: the decoding step in C puts each part of its rows'
    products on one thread with it; None where :func:`address` is None or it is not exported."""
    found = _symbols("MKL_Set_Num_Threads_Local") if address() is not None else None
    return None if found is None else found[0]


_INT, _FLOAT, _PTR = ctypes.c_int, ctypes.c_float, ctypes.c_void_p
_GET_SIZE = ctypes.CFUNCTYPE(ctypes.c_size_t, _INT, _INT, _INT, _INT)
_PACK = ctypes.CFUNCTYPE(None, _INT, _INT, _INT, _INT, _INT, _INT, _FLOAT, _PTR, _INT, _PTR)
_COMPUTE = ctypes.CFUNCTYPE(None, _INT, _INT, _INT, _INT, _INT, _INT, _PTR, _INT, _PTR, _INT, _FLOAT, _PTR, _INT)


def pack(w: torch.Tensor, rows: int) -> torch.Tensor:
    """``w [O, I]`` (contiguous float32) packed by MKL as the weight of :func:`product`'s call for up to ``rows`` rows:
    a float32 tensor holding the packed bytes; needs :func:`packed_addresses`."""
    fns = packed_addresses()
    if fns is None:
        raise ValueError("blas.pack needs MKL's cblas_sgemm_pack, which this torch library does not export")
    _checked(w=w)
    m, k = w.shape
    size = _GET_SIZE(fns[0])(_A_MATRIX, m, rows, k)
    out = torch.empty(-(-size // 4) + 16)
    _PACK(fns[1])(_COL_MAJOR, _A_MATRIX, _TRANS, m, rows, k, 1.0, w.data_ptr(), k, out.data_ptr())
    return out


def packed_product(x: torch.Tensor, packed: torch.Tensor, out: torch.Tensor, beta: float = 0.0) -> torch.Tensor:
    """:func:`product` (``out = beta * out + x @ w.T``) from ``w`` packed by :func:`pack`; ``out [A, O]``."""
    _checked(x=x, out=out)
    if out.shape[0] != x.shape[0]:
        raise ValueError(f"x and out must have the same rows; got {tuple(x.shape)} and {tuple(out.shape)}")
    (A, k), m = x.shape, out.shape[1]
    _COMPUTE(packed_addresses()[2])(_COL_MAJOR, _PACKED_MATRIX, _NO_TRANS, m, A, k, packed.data_ptr(), k, x.data_ptr(),
                                    k, beta, out.data_ptr(), m)
    return out
