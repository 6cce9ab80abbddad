"""numpy's own single-precision matrix-vector product (its BLAS's sgemv), callable from a kernel.

The op-by-op path multiplies one token's query heads by the absorbed key up-projections (and the heads'
output latents by the value up-projections) with numpy (archrun_mla.layout): np.matmul of a row [1, k] and a
matrix [k, m] is one sgemv of numpy's BLAS. A fused kernel that must give the same bits calls the very same
routine with the same arguments (`vec_mat`), through a first-class function value whose address is read at
call time, so the compiled kernel stays cacheable. `sgemv()` is None when numpy's BLAS is not one whose
calling convention is known here (the layer then decodes op by op).
"""

from __future__ import annotations

import ctypes
import functools

import numba.experimental.function_type  # noqa: F401  (types wrapper-address objects as function values)
import numpy as np
from numba import njit, types

from archrun.kernels._jit import JIT

# cblas_sgemv(order, trans, M, N, alpha, A, lda, x, incx, beta, y, incy); pointers passed as int64 addresses
_ROW_MAJOR, _TRANS = 101, 112
_SYMBOLS = (("scipy_cblas_sgemv64_", ctypes.c_int64), ("cblas_sgemv64_", ctypes.c_int64),
            ("scipy_cblas_sgemv", ctypes.c_int32))


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


@functools.cache
def sgemv() -> Sgemv | None:
    """numpy's BLAS sgemv (looked up through numpy's own extension module, so its BLAS library), or None."""
    try:
        from numpy._core import _multiarray_umath
        lib = ctypes.CDLL(_multiarray_umath.__file__)
    except (ImportError, OSError):  # numpy < 2, or an extension module ctypes cannot open
        return None
    if "blas" not in np.show_config(mode="dicts").get("Build Dependencies", {}):
        return None
    for name, blasint in _SYMBOLS:
        fn = getattr(lib, name, None)
        if fn is not None:
            return Sgemv(fn, blasint)
    return None


@njit(**JIT)
def vec_mat(gemv, x, m, y):
    """y f32 [k] = x f32 [n] @ m f32 [n, k] (C-contiguous rows; x, y unit strides) as np.matmul computes a
    row times a matrix (k > 1): numpy's gemv call, transposed row-major. gemv: (Sgemv(),)."""
    n, k = m.shape
    gemv[0](np.int32(_ROW_MAJOR), np.int32(_TRANS), np.int64(n), np.int64(k), np.float32(1.0),
            np.int64(m.ctypes.data), np.int64(k), np.int64(x.ctypes.data), np.int64(1), np.float32(0.0),
            np.int64(y.ctypes.data), np.int64(1))
