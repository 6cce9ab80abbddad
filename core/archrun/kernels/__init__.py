"""numba kernels: the quantized-matmul engine (GGUF block layouts, dots, dequantization, SIMD,
the decode worker pool) and the fused decode path's layer kernel and calling conventions.
The math of the ops lives with the vocabulary plugins that register them.

Public API (see qmatrix.py, parts.py, layer.py):
    QMatrix, prepare(raw_rows, ggml_type, n_in), matmul(w, x, out=None),
    matmul_rows(w, x, rows, out=None), embedding_rows(raw_rows, ggml_type, n_in, ids),
    set_threads(n), SUPPORTED_TYPES;
    kernel_cache(__file__): a plugin's kernel package calls it first (see _jit.py, docs/plugins.md).
"""

from __future__ import annotations

# first: the kernels' cache folder is named by a digest of their sources, taken before any is imported
from archrun.kernels._jit import kernel_cache  # noqa: I001
from archrun.kernels.matmul.qmatrix import (
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
    "embedding_rows",
    "kernel_cache",
    "matmul",
    "matmul_rows",
    "prepare",
    "set_threads",
]
