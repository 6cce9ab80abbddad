"""kernels.matmul.f32_rows.dots8: eight rows' float32 dots in the lanes of one vector, each row's sum in element
order with every multiply and add rounded, so the bits of the plain loop, checked against a float32 loop in
Python (hand-derived order), on widths around the 8- and 16-element steps, rows of a wider array, any row."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from archrun.kernels._jit import JIT
from archrun.kernels.matmul.f32_rows import dots8

F32 = np.float32


@njit(**JIT)
def _run(W, r, x, out):
    dots8(W, r, x, out)


def _sequential(w: np.ndarray, x: np.ndarray) -> np.float32:
    s = F32(0.0)
    for a, b in zip(w, x, strict=True):
        s = F32(s + F32(a * b))
    return s


@pytest.mark.parametrize("n", [1, 7, 8, 9, 15, 16, 17, 24, 31, 33, 100])
def test_eight_rows_have_the_sequential_sums_bits(n):
    rng = np.random.default_rng(n)
    wide = (rng.standard_normal((19, n + 5)) * rng.uniform(0.01, 100, (19, 1))).astype(F32)
    W = wide[:, 3:3 + n]  # rows of a wider array: a row stride other than n
    x = rng.standard_normal(n).astype(F32)
    for r in (0, 3, 11):
        out = np.full(19, np.nan, F32)
        _run(W, r, x, out)
        want = np.array([_sequential(W[r + i], x) for i in range(8)], F32)
        np.testing.assert_array_equal(out[r:r + 8], want)
        assert np.isnan(out[:r]).all() and np.isnan(out[r + 8:]).all()  # only its eight rows


def test_signed_zero_and_cancellation_follow_the_order():
    """Sums whose rounding depends on the order: (big + 1) - big is 0 in element order, 1 in another."""
    W = np.zeros((8, 3), F32)
    W[:, 0], W[:, 1], W[:, 2] = 1e8, 1.0, -1e8
    W[1] = [-0.0, -0.0, -0.0]
    x = np.ones(3, F32)
    out = np.empty(8, F32)
    _run(W, 0, x, out)
    want = np.array([_sequential(W[i], x) for i in range(8)], F32)
    np.testing.assert_array_equal(out, want)
    assert out[0] == 0.0 and np.signbit(out[1]) == np.signbit(want[1])
