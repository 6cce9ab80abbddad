"""Shared numba options and layout constants of the kernels."""

from __future__ import annotations

# Every kernel: cached per CPU model, fast float math, releases the GIL.
JIT = dict(cache=True, fastmath=True, nogil=True)
# Kernels that split output rows over numba's thread pool.
JIT_PAR = dict(JIT, parallel=True)

# Output rows are interleaved in groups of LANES: one SIMD lane per row, so a 32-element
# block of all rows of a group is dotted with one activation block without horizontal sums.
LANES = 32
# Quantized activations and repacked weights use 32-element blocks for every type.
QB = 32
