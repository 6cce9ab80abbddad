"""Compile (or load from numba's on-disk cache) every kernel a model will call, before the first token.

numba compiles a kernel the first time it runs; without this, a cold cache stalls the first
token (and the first prefill) for tens of seconds with nothing on screen. `warm_up` runs each
kernel once on tiny zero inputs, reporting progress per kernel; with a warm cache it takes
milliseconds per kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from archrun import quant
from archrun.kernels import elementwise, qmatrix
from archrun.kernels._jit import LANES

_N_IN = 256  # a multiple of every block size


def _matmul_paths(ggml_type: int) -> None:
    """Run the decode (integer) and prefill (tile + BLAS) paths of one weight type."""
    raw = np.zeros((LANES, quant.row_bytes(ggml_type, _N_IN)), np.uint8)
    w = qmatrix.prepare(raw, ggml_type, _N_IN)
    for n in (1, qmatrix.INT_MAX_TOKENS.get(ggml_type, 0) + 1):
        qmatrix.matmul(w, np.zeros((n, _N_IN), np.float32))


def _elementwise() -> None:
    x = np.ones((2, 2, 16), np.float32)
    elementwise.rms_norm(x[0], np.ones(16, np.float32), 1e-6)
    cs = np.ones((2, 4), np.float32)
    for neox in (True, False):
        elementwise.rope(x, cs, cs, 8, neox)
    pos = np.arange(2, dtype=np.int64)
    elementwise.attention(x, x, x, pos, pos, 0.25, 0)
    elementwise.swiglu(x[0], x[0])
    elementwise.geglu_tanh(x[0], x[0])


def warm_up(ggml_types: Iterable[int], progress: Callable[[str, int, int], None] | None = None,
            extra: Iterable[Callable[[], None]] = ()) -> None:
    """Compile/load the kernels of these weight types and the elementwise ops, then run the `extra`
    steps (e.g. a throwaway decode step of the model); progress per step."""
    types = sorted(t for t in set(ggml_types) if t in qmatrix.SUPPORTED_TYPES)
    steps: list[Callable[[], None]] = [_elementwise, *[lambda t=t: _matmul_paths(t) for t in types], *extra]
    for i, step in enumerate(steps):
        step()
        if progress:
            progress("compiling kernels (cached after the first run)", i + 1, len(steps))
