"""The multi-row decode products (kernels.rowdots): each weight block unpacked once for several rows.

Two exact properties, no tolerance:
- simd.rows_dot_* (vpdpbusd) return the very int32 sums of their loop versions, on random and on extreme
  bytes (fields 255 with activations +-127: Q8_0's unpacked q + 128);
- every row of a rowdots kernel's product is bit-identical to the per-row decode kernel (dots.py) on that
  row alone, for every type rowdots takes: the float32 steps are the same functions on the same integers.
The per-row kernels themselves are checked against gguf-py in test_kernels. Also run with NUMBA_BOUNDSCHECK=1
and with NUMBA_DISABLE_JIT=1 (the loop sums, small sizes).
"""

from __future__ import annotations

import numba
import numpy as np
import pytest
from numba import njit
from test_kernels import T, random_rows

from archrun.kernels import block, dots, qmatrix, rowdots, simd
from archrun.kernels._jit import LANES

SMALL = numba.config.DISABLE_JIT
NAMES = {2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K"}
ROWS = (2, 5) if SMALL else (2, 3, 8, 17)


def _dots_kernel(kind: int):
    return getattr(dots, NAMES[kind].lower())


@pytest.mark.skipif(not simd.VNNI, reason="the rows sums' SIMD version needs AVX-512 VNNI")
@pytest.mark.parametrize("halves", [False, True], ids=["one", "halves"])
@pytest.mark.parametrize("extreme", ["random", "max", "min"])
def test_simd_rows_sums_equal_the_loop_version(halves, extreme):
    simd_fn = simd.rows_dot_halves_vnni if halves else simd.rows_dot_one_vnni
    loop_fn = rowdots.rows_dot_halves_loops if halves else rowdots.rows_dot_one_loops

    @njit
    def run(U, XQ, OFF):
        got = np.full((XQ.shape[0], 2, LANES), 7, np.int32)
        ref = np.full((XQ.shape[0], 2, LANES), 7, np.int32)
        simd_fn(U, XQ, OFF, got)
        loop_fn(U, XQ, OFF, ref)
        return got, ref

    rng = np.random.default_rng(3)
    n = 9
    ub = rng.integers(0, 256, (8 * LANES, 4)).astype(np.uint8)
    xb = rng.integers(-127, 128, (n, 8, 4)).astype(np.int8)
    if extreme != "random":
        ub[:] = 255
        xb[:] = 127 if extreme == "max" else -127
    U = np.ascontiguousarray(ub).view(np.uint32).reshape(8 * LANES)
    XQ = np.ascontiguousarray(xb).view(np.int32).reshape(n, 8)
    OFF = rng.integers(-40000, 40000, (n, 2)).astype(np.int32)
    got, ref = run(U, XQ, OFF)
    np.testing.assert_array_equal(got, ref)
    if not halves:
        assert np.all(got[:, 1] == 7)  # `one` leaves the second part alone


def _case(kind: int, n_rows: int, n_out: int, n_in: int, seed: int):
    rng = np.random.default_rng(seed)
    w = qmatrix.prepare(random_rows(NAMES[kind], n_out, n_in, rng), int(T[NAMES[kind]]), n_in)
    x = (rng.standard_normal((n_rows, n_in)) * rng.uniform(0.1, 4.0, (n_rows, 1))).astype(np.float32)
    x[0, :32] = 0  # an all-zero activation block (scale 0)
    return w, x


@pytest.mark.parametrize("kind", sorted(rowdots.KERNELS), ids=[NAMES[k] for k in sorted(rowdots.KERNELS)])
@pytest.mark.parametrize("n_rows", ROWS)
def test_each_row_is_the_per_row_kernels_bits(kind, n_rows):
    n_in = 256 if kind >= 11 else 96
    n_out = 2 * LANES + 5  # a partial last group
    w, x = _case(kind, n_rows, n_out, n_in if not SMALL else (256 if kind >= 11 else 64), seed=kind * 31 + n_rows)
    X, DX, QH = dots._quantized(x)
    ng = w.arrays[0].shape[0]
    got = np.full((n_rows, w.n_out), np.nan, np.float32)
    rowdots.KERNELS[kind](*w.arrays, X, DX, QH, 0, ng, got)
    for t in range(n_rows):
        one = np.full((1, w.n_out), np.nan, np.float32)
        _dots_kernel(kind)(*w.arrays, X[t:t + 1], DX[t:t + 1], QH[t:t + 1], 0, ng, one)
        assert got[t].tobytes() == one[0].tobytes(), f"row {t} of {n_rows}"


def test_takes_the_gemm_types_from_their_min_rows_on():
    assert not any(rowdots.takes(k, 1) for k in range(-1, 20))  # one row: the per-row kernels (one-token bits)
    assert not rowdots.takes(10, 64)  # Q2_K: no unpacker
    assert not rowdots.takes(0, 64) and not rowdots.takes(1, 64)  # float matrices
    if simd.VNNI:
        for k in rowdots.KERNELS:
            assert rowdots.takes(k, rowdots.MIN_ROWS[k]) and not rowdots.takes(k, rowdots.MIN_ROWS[k] - 1)
    else:
        assert rowdots.MIN_ROWS.min() > 1 << 32  # without VNNI every product keeps the per-row kernels


@pytest.mark.parametrize("kind", [3, 12, 14], ids=["Q4_1", "Q4_K", "Q6_K"])
def test_a_product_group_of_rows_equals_its_rows_one_at_a_time(kind):
    """The fused decode's product group (kernels.block.product_rows): several rows at once take rowdots where
    it applies, one row the per-row kernels; the same bits either way."""
    n_in = 256
    w, x = _case(kind, 6, 3 * LANES, n_in, seed=kind)
    ms = (block.uniform(w), block.absent_matrix(), block.absent_matrix())
    y = np.empty((6, w.n_out), np.float32)
    block.product_rows(ms, x, y, 1)
    for t in range(6):
        y1 = np.empty((1, w.n_out), np.float32)
        block.product_rows(ms, np.ascontiguousarray(x[t:t + 1]), y1, 1)
        assert y[t].tobytes() == y1[0].tobytes()
