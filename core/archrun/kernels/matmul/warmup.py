"""Compile (or load from numba's on-disk cache) every kernel a model will call, before the first token.

numba compiles a kernel the first time it runs; without this, a cold cache stalls the first
token (and the first prefill) for tens of seconds with nothing on screen. `warm_up` runs each
kernel once on tiny zero inputs, reporting progress per kernel. Kernels whose compiled code is
already in numba's cache are left to load on first use (~30-50 ms each): the prefill-path
kernels then cost the first token nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

import numpy as np

from archrun.io import quant
from archrun.kernels._jit import LANES
from archrun.kernels.matmul import dequant, dots, floatmm, qmatrix

_N_IN = 256  # a multiple of every block size


def _matmul_paths(ggml_type: int) -> None:
    """Run the decode (integer) and prefill (int8 GEMM, or tile + BLAS) paths of one weight type."""
    raw = np.zeros((LANES, quant.row_bytes(ggml_type, _N_IN)), np.uint8)
    w = qmatrix.prepare(raw, ggml_type, _N_IN)
    limit = qmatrix.INT_MAX_TOKENS.get(ggml_type, 0)
    for n in (1, limit + 1) if limit < 1 << 20 else (1,):  # unbounded: the one path serves every count
        qmatrix.matmul(w, np.zeros((n, _N_IN), np.float32))


def _cached(*kernels) -> bool:
    """Whether every kernel has an index in numba's on-disk cache (then it loads, not compiles)."""
    try:
        return all(os.path.exists(k._cache._cache_file._index_path) for k in kernels)
    except AttributeError:  # no cache (e.g. NUMBA_DISABLE_JIT) or another numba: warm up
        return False


def _type_kernels(ggml_type: int) -> tuple:
    if ggml_type in (qmatrix.F16, qmatrix.BF16):
        return floatmm.half_run, dequant.deq_float16
    return (dots.KERNELS[ggml_type], dequant.DEQUANT[ggml_type]) if ggml_type in dots.KERNELS else ()


def warm_up(ggml_types: Iterable[int], progress: Callable[[str, int, int], None] | None = None,
            extra: Iterable[Callable[[], None]] = ()) -> None:
    """Compile/load the product kernels of these weight types, then run the `extra` steps (e.g. a
    throwaway prefill and decode step of the model, which compile its ops' kernels); progress per step."""
    types = sorted(t for t in set(ggml_types) if t in qmatrix.SUPPORTED_TYPES)
    steps: list[Callable[[], None]] = [lambda t=t: _matmul_paths(t) for t in types if not _cached(*_type_kernels(t))]
    steps += list(extra)
    for i, step in enumerate(steps):
        step()
        if progress:
            progress("compiling kernels (cached after the first run)", i + 1, len(steps))
