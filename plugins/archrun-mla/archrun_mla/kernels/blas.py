"""numpy's own single-precision matrix products (its BLAS's sgemv and sgemm), callable from a kernel.

The op-by-op path multiplies one token's query heads by the absorbed key up-projections (and the heads'
output latents by the value up-projections) with numpy (archrun_mla.layout): np.matmul of a row [1, k] and a
matrix [k, m] is one sgemv of numpy's BLAS; the sparse attention's indexer (archrun_mla.indexer) multiplies
its query heads [Hi, Di] by the keys [Di, T] (np.matmul of two matrices: one sgemm) and weighs the heads (a
row times a matrix: sgemv). A fused kernel that must give the same bits calls the very same routines with
the same arguments (`vec_mat`, `mat_mat`), through first-class function values whose addresses are read at
call time, so the compiled kernel stays cacheable. `sgemv()` / `sgemm()` are None when numpy's BLAS is not
one whose calling convention is known here (the layer then decodes op by op).
"""

from __future__ import annotations

import ctypes
import functools

import numba.experimental.function_type  # noqa: F401  (types wrapper-address objects as function values)
import numpy as np
from numba import njit, types

from archrun.kernels._jit import JIT

# cblas_sgemv(order, trans, M, N, alpha, A, lda, x, incx, beta, y, incy); pointers passed as int64 addresses
_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_SYMBOLS = (("scipy_cblas_{}64_", ctypes.c_int64), ("cblas_{}64_", ctypes.c_int64), ("scipy_cblas_{}", ctypes.c_int32))


class Sgemv(types.WrapperAddressProtocol):
    """numpy's cblas_sgemv as a first-class function value (numba's wrapper address protocol): int64
    integer arguments (blasint of an ILP64 BLAS; an LP64 BLAS's are the low halves of the same registers)."""

    SIG = types.void(types.int32, types.int32, types.int64, types.int64, types.float32, types.int64, types.int64,
                     types.int64, types.int64, types.float32, types.int64, types.int64)

    def __init__(self, fn: ctypes._CFuncPtr, blasint: type):
        i, f, e = blasint, ctypes.c_float, ctypes.c_int32
        self._call = ctypes.CFUNCTYPE(None, e, e, i, i, f, ctypes.c_void_p, i, ctypes.c_void_p, i, f,
                                      ctypes.c_void_p, i)(ctypes.cast(fn, ctypes.c_void_p).value)
        self._address = ctypes.cast(fn, ctypes.c_void_p).value

    def __wrapper_address__(self) -> int:
        return self._address

    def signature(self):
        return self.SIG

    def __call__(self, *args):  # the JIT-less path (NUMBA_DISABLE_JIT)
        self._call(*(int(a) if isinstance(a, (int, np.integer)) else float(a) for a in args))


class Sgemm(types.WrapperAddressProtocol):
    """numpy's cblas_sgemm as a first-class function value (integer arguments as Sgemv's)."""

    # cblas_sgemm(order, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)
    SIG = types.void(types.int32, types.int32, types.int32, types.int64, types.int64, types.int64, types.float32,
                     types.int64, types.int64, types.int64, types.int64, types.float32, types.int64, types.int64)

    def __init__(self, fn: ctypes._CFuncPtr, blasint: type):
        i, f, e, p = blasint, ctypes.c_float, ctypes.c_int32, ctypes.c_void_p
        self._call = ctypes.CFUNCTYPE(None, e, e, e, i, i, i, f, p, i, p, i, f, p, i)(
            ctypes.cast(fn, ctypes.c_void_p).value)
        self._address = ctypes.cast(fn, ctypes.c_void_p).value

    def __wrapper_address__(self) -> int:
        return self._address

    def signature(self):
        return self.SIG

    def __call__(self, *args):  # the JIT-less path (NUMBA_DISABLE_JIT)
        self._call(*(int(a) if isinstance(a, (int, np.integer)) else float(a) for a in args))


def _lookup(routine: str, wrapper: type) -> Sgemv | Sgemm | None:
    """numpy's BLAS routine (looked up through numpy's own extension module, so its BLAS library) wrapped, or
    None."""
    try:
        from numpy._core import _multiarray_umath
        lib = ctypes.CDLL(_multiarray_umath.__file__)
    except (ImportError, OSError):  # numpy < 2, or an extension module ctypes cannot open
        return None
    if "blas" not in np.show_config(mode="dicts").get("Build Dependencies", {}):
        return None
    for name, blasint in _SYMBOLS:
        fn = getattr(lib, name.format(routine), None)
        if fn is not None:
            return wrapper(fn, blasint)
    return None


@functools.cache
def sgemv() -> Sgemv | None:
    """numpy's BLAS sgemv, or None."""
    return _lookup("sgemv", Sgemv)


@functools.cache
def sgemm() -> Sgemm | None:
    """numpy's BLAS sgemm, or None."""
    return _lookup("sgemm", Sgemm)


@njit(**JIT)
def vec_mat(gemv, x, m, y):
    """y f32 [k] = x f32 [n] @ m f32 [n, k] (C-contiguous rows; x, y unit strides) as np.matmul computes a
    row times a matrix (k > 1): numpy's gemv call, transposed row-major. gemv: (Sgemv(),)."""
    n, k = m.shape
    gemv[0](np.int32(_ROW_MAJOR), np.int32(_TRANS), np.int64(n), np.int64(k), np.float32(1.0),
            np.int64(m.ctypes.data), np.int64(k), np.int64(x.ctypes.data), np.int64(1), np.float32(0.0),
            np.int64(y.ctypes.data), np.int64(1))


@njit(**JIT)
def mat_mat(gemm, a, b, c):
    """c f32 [m, k] = a f32 [m, n] @ b f32 [n, k] (C-contiguous) as np.matmul computes two matrices (m, n, k > 1,
    no matrix times its own transpose): numpy's gemm call, row-major, neither transposed. gemm: (Sgemm(),)."""
    m, n = a.shape
    k = b.shape[1]
    gemm[0](np.int32(_ROW_MAJOR), np.int32(_NO_TRANS), np.int32(_NO_TRANS), np.int64(m), np.int64(k), np.int64(n),
            np.float32(1.0), np.int64(a.ctypes.data), np.int64(n), np.int64(b.ctypes.data), np.int64(k),
            np.float32(0.0), np.int64(c.ctypes.data), np.int64(k))
