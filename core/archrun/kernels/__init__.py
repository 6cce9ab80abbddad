"""numba kernels: quantized matmul straight from GGUF blocks, and the fast elementwise ops.

Public API (see qmatrix.py and elementwise.py):
    QMatrix, prepare(raw_rows, ggml_type, n_in), matmul(w, x, out=None),
    matmul_rows(w, x, rows, out=None), embedding_rows(raw_rows, ggml_type, n_in, ids),
    rms_norm, rope, attention, swiglu, geglu_tanh, set_threads(n), SUPPORTED_TYPES.
"""

from __future__ import annotations

from archrun.kernels.elementwise import attention, geglu_tanh, rms_norm, rope, swiglu
from archrun.kernels.qmatrix import (
    SUPPORTED_TYPES,
    QMatrix,
    embedding_rows,
    matmul,
    matmul_rows,
    prepare,
    set_threads,
)

__all__ = [
    "SUPPORTED_TYPES",
    "QMatrix",
    "attention",
    "embedding_rows",
    "geglu_tanh",
    "matmul",
    "matmul_rows",
    "prepare",
    "rms_norm",
    "rope",
    "set_threads",
    "swiglu",
]
