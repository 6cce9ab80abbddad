"""The AVX2 block dots (kernels.matmul.simd) against the portable loops they replace, exactly.

Each intrinsic must return the very integers of its loop version (dots._sum4, dots._sum5,
the quad loop, dots._sum4_halves, dots._sum2_halves, dots._bytes_halves_loops) on random blocks
and on the extremes (fields all at their maximum, activations at +-127, 5-bit half sums at the
edge of int16, Q6_K's two-quad int16 pair sums at their largest): the kernels scale those integers the same
way, so whole products stay bit-identical to the portable path (test_kernels.py checks them
against gguf-py). Skipped where the host has no AVX2 or the JIT is off.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from archrun.kernels._jit import LANES, QB
from archrun.kernels.matmul import dots, simd

pytestmark = pytest.mark.skipif(not simd.AVX2, reason="no AVX2 here (or the JIT is off)")


@njit
def _nibbles(w, X, c):
    XP = dots.nibble_pairs(X)
    got, ref = np.empty(LANES, np.int16), np.empty(LANES, np.int16)
    simd.nibbles_dot(w, X[0, 0], XP[0, 0], c, got)
    dots._sum4(w, X[0, 0], c, ref)
    return got, ref


@njit
def _fives(w, X, c0, c1):
    XP = dots.five_pairs(X)
    got_a, got_b = np.empty(LANES, np.int16), np.empty(LANES, np.int16)
    ref_a, ref_b = np.empty(LANES, np.int16), np.empty(LANES, np.int16)
    simd.fives_dot(w, X[0, 0], XP[0, 0], c0, c1, got_a, got_b)
    dots._sum5(w, X[0, 0], c0, c1, ref_a, ref_b)
    return got_a, got_b, ref_a, ref_b


@njit
def _quads(w, x8):
    got, ref = np.empty(LANES, np.int32), np.empty(LANES, np.int32)
    simd.q8_quads_dot(w, x8, got)
    dots._quads_dot_loops(w, x8, ref)
    return got, ref


@njit
def _nibbles_halves(w, X, c0, c1):
    XP = dots.nibble_pairs(X)
    got_a, got_b = np.empty(LANES, np.int16), np.empty(LANES, np.int16)
    ref_a, ref_b = np.empty(LANES, np.int16), np.empty(LANES, np.int16)
    simd.nibbles_halves_dot(w, X[0, 0], XP[0, 0], c0, c1, got_a, got_b)
    dots._sum4_halves(w, X[0, 0], c0, c1, ref_a, ref_b)
    return got_a, got_b, ref_a, ref_b


@njit
def _crumbs(w, X):
    XP = dots.crumb_pairs(X)
    got_a, got_b = np.empty(LANES, np.int16), np.empty(LANES, np.int16)
    ref_a, ref_b = np.empty(LANES, np.int16), np.empty(LANES, np.int16)
    simd.crumbs_dot(w, X[0, 0], XP[0, 0], got_a, got_b)
    dots._sum2_halves(w, X[0, 0], ref_a, ref_b)
    return got_a, got_b, ref_a, ref_b


@njit
def _byte_halves(w, x8):
    got_a, got_b = np.empty(LANES, np.int32), np.empty(LANES, np.int32)
    ref_a, ref_b = np.empty(LANES, np.int32), np.empty(LANES, np.int32)
    simd.bytes_halves_dot(w, x8, got_a, got_b)
    dots._bytes_halves_loops(w, x8, ref_a, ref_b)
    return got_a, got_b, ref_a, ref_b


def _activations(rng, kind):
    if kind == "random":
        x = rng.integers(-127, 128, QB)
    elif kind == "max":
        x = np.full(QB, 127)
    else:
        x = np.where(rng.random(QB) < 0.5, -127, 127)
    return x.astype(np.int16).reshape(1, 1, QB)


KINDS = ["random", "max", "signs"]


@pytest.mark.parametrize("kind", KINDS)
def test_nibbles_dot(kind):
    rng = np.random.default_rng(1)
    for _ in range(20):
        w = rng.integers(0, 1 << 16, 8 * LANES).astype(np.uint16)
        if kind == "max":
            w[:] = 0xFFFF
        X = _activations(rng, kind)
        got, ref = _nibbles(w, X, np.int64(8 * int(X.sum())))  # the Q4_0 offset: wraps on purpose
        assert np.array_equal(got, ref)


@pytest.mark.parametrize("kind", KINDS)
def test_fives_dot(kind):
    rng = np.random.default_rng(2)
    for _ in range(20):
        w = (rng.integers(0, 1 << 15, 11 * LANES)).astype(np.uint16)
        if kind == "max":
            w[:] = 0x7FFF
        X = _activations(rng, kind)
        c0, c1 = 16 * int(X[0, 0, :16].sum()), 16 * int(X[0, 0, 16:].sum())
        got_a, got_b, ref_a, ref_b = _fives(w, X, np.int64(c0), np.int64(c1))
        assert np.array_equal(got_a, ref_a) and np.array_equal(got_b, ref_b)


@pytest.mark.parametrize("kind", KINDS)
def test_q8_quads_dot(kind):
    rng = np.random.default_rng(3)
    for _ in range(20):
        w = rng.integers(-128, 128, QB * LANES).astype(np.int8)
        if kind == "max":
            w[:] = -128
        x8 = _activations(rng, kind)[0, 0].astype(np.int8)
        got, ref = _quads(w, x8)
        assert np.array_equal(got, ref)
        rows = w.reshape(QB // 4, LANES, 4).transpose(1, 0, 2).reshape(LANES, QB)  # quad layout -> rows
        assert np.array_equal(got, rows.astype(np.int64) @ x8.astype(np.int64))


@pytest.mark.parametrize("kind", KINDS)
def test_nibbles_halves_dot(kind):
    """Q3_K: 4-bit fields in 0..7, offset 4 * (half sum of x) per 16-element half."""
    rng = np.random.default_rng(4)
    for _ in range(20):
        w = rng.integers(0, 1 << 16, 8 * LANES).astype(np.uint16) & 0x7777  # 3-bit values in nibbles
        if kind == "max":
            w[:] = 0x7777
        X = _activations(rng, kind)
        c0, c1 = 4 * int(X[0, 0, :16].sum()), 4 * int(X[0, 0, 16:].sum())
        got_a, got_b, ref_a, ref_b = _nibbles_halves(w, X, np.int64(c0), np.int64(c1))
        assert np.array_equal(got_a, ref_a) and np.array_equal(got_b, ref_b)
        q = np.stack([(w.reshape(8, LANES) >> (4 * t)) & 15 for t in range(4)], -1)  # [word, lane, field]
        rows = q.transpose(1, 0, 2).reshape(LANES, QB).astype(np.int64) - 4
        x = X[0, 0].astype(np.int64)
        assert np.array_equal(got_a, rows[:, :16] @ x[:16]) and np.array_equal(got_b, rows[:, 16:] @ x[16:])


@pytest.mark.parametrize("kind", KINDS)
def test_crumbs_dot(kind):
    """Q2_K: 2-bit fields, no offset, per 16-element half."""
    rng = np.random.default_rng(5)
    for _ in range(20):
        w = rng.integers(0, 1 << 16, 4 * LANES).astype(np.uint16)
        if kind == "max":
            w[:] = 0xFFFF
        X = _activations(rng, kind)
        got_a, got_b, ref_a, ref_b = _crumbs(w, X)
        assert np.array_equal(got_a, ref_a) and np.array_equal(got_b, ref_b)
        q = np.stack([(w.reshape(4, LANES) >> (2 * t)) & 3 for t in range(8)], -1)
        rows = q.transpose(1, 0, 2).reshape(LANES, QB).astype(np.int64)
        x = X[0, 0].astype(np.int64)
        assert np.array_equal(got_a, rows[:, :16] @ x[:16]) and np.array_equal(got_b, rows[:, 16:] @ x[16:])


@pytest.mark.parametrize("kind", KINDS)
def test_bytes_halves_dot(kind):
    """Q6_K: byte fields in 0..63, element-major; every lane distinct (the in-register transpose)."""
    rng = np.random.default_rng(6)
    for i in range(20):
        w = rng.integers(0, 64, QB * LANES).astype(np.uint8)
        if kind == "max":
            w[:] = 63
        elif kind == "signs" and i % 2:  # one lane at the maximum, the others zero: catches a lane mix-up
            w[:] = 0
            w[np.arange(QB) * LANES + i % LANES] = 63
        x8 = _activations(rng, kind)[0, 0].astype(np.int8)
        got_a, got_b, ref_a, ref_b = _byte_halves(w, x8)
        assert np.array_equal(got_a, ref_a) and np.array_equal(got_b, ref_b)
        rows = w.reshape(QB, LANES).T.astype(np.int64)  # element-major -> rows
        x = x8.astype(np.int64)
        assert np.array_equal(got_a, rows[:, :16] @ x[:16]) and np.array_equal(got_b, rows[:, 16:] @ x[16:])


@pytest.mark.skipif(not simd.F16C, reason="no F16C here (or the JIT is off)")
def test_half_to_float_block_equals_the_bit_moves_for_every_half():
    """dequant's F16C block conversion gives the bit moves' float32 bits for all 65536 halves (subnormals,
    both zeros and infinities included; NaNs stay NaNs, their payloads aside)."""
    from archrun.kernels.matmul import dequant

    halves = np.arange(1 << 16, dtype=np.uint16)
    got, ref = np.empty(halves.shape, np.float32), np.empty(halves.shape, np.float32)
    dequant._f16_block_f16c(halves, got.view(np.uint32), got)
    dequant._f16_block_bits(halves, ref.view(np.uint32), ref)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), ref[~nan].view(np.uint32))
    assert np.array_equal(ref[~nan], halves.view(np.float16)[~nan].astype(np.float32))  # and both are exact


def _half_weights(bf16: bool, n_out: int, n_in: int, rng: np.random.Generator):
    """(packed lanes, float64 values) of random 16-bit float weights [n_out, n_in]."""
    from gguf import GGMLQuantizationType

    from archrun import kernels
    from archrun.io import quant

    t = GGMLQuantizationType.BF16 if bf16 else GGMLQuantizationType.F16
    f = rng.standard_normal((n_out, n_in)).astype(np.float32)
    bits = (f.view(np.uint32) >> 16).astype(np.uint16) if bf16 else f.astype(np.float16).view(np.uint16)
    raw = bits.view(np.uint8)
    return kernels.prepare(raw, int(t), n_in).arrays[0], quant.dequantize(raw, int(t), (n_out, n_in)).astype(np.float64)


@pytest.mark.skipif(not simd.F16C, reason="no F16C here")
@pytest.mark.parametrize("bf16", [False, True], ids=["f16", "bf16"])
def test_half_register_tiles_match_the_float64_product_and_each_row_alone(bf16):
    """floatmm's register tiles: every row of a product of 1..13 rows (every tile shape of simd.HALF_TILES:
    whole groups and half-group lane passes, 6 + 6 + 1 rows included) is the same bits as that row alone,
    and all are within float32 rounding of the float64 product (an odd n_out: the last group's padding
    lanes are not written); a strided activation takes the scratch loops, also close."""
    from archrun.kernels.matmul import floatmm

    rng = np.random.default_rng(5)
    W, dense = _half_weights(bf16, 70, 96, rng)
    x = rng.standard_normal((13, 96)).astype(np.float32)
    ref = x.astype(np.float64) @ dense.T
    for n in range(1, 14):
        out = np.full((n, 70), np.nan, np.float32)
        floatmm.half_run(W, bf16, x[:n], out, 1)
        assert np.abs(out - ref[:n]).max() <= 1e-5 * np.abs(ref).max()
        for i in range(n):
            alone = np.empty((1, 70), np.float32)
            floatmm.half_run(W, bf16, x[i:i + 1], alone, 1)
            assert np.array_equal(alone[0].view(np.uint32), out[i].view(np.uint32)), (n, i)
    strided = np.empty((3, 192), np.float32)[:, ::2]
    strided[:] = x[:3]
    out = np.empty((3, 70), np.float32)
    floatmm.half(W, bf16, strided, 0, W.shape[0], out)
    assert np.abs(out - ref[:3]).max() <= 1e-5 * np.abs(ref).max()


def _quantized_weights(t: int, n_out: int, n_in: int, rng: np.random.Generator):
    """(prepared kernel arrays, float64 values) of random weights [n_out, n_in] quantized to ggml type t."""
    from gguf import quants

    from archrun import kernels
    from archrun.io import quant

    raw = quants.quantize(rng.standard_normal((n_out, n_in)).astype(np.float32), t).view(np.uint8)
    return kernels.prepare(raw, int(t), n_in).arrays, quant.dequantize(raw, int(t), (n_out, n_in)).astype(np.float64)


@pytest.mark.skipif(not simd.VNNI, reason="no AVX-512 VNNI here")
@pytest.mark.parametrize("t", [3, 8], ids=["Q4_1", "Q8_0"])
def test_row_tiles_give_each_row_its_bits_alone_and_the_quantized_product(t):
    """dots' VNNI row tiles (Q4_1, Q8_0): in a product of 1..9 rows (tiles of 4, 2 and 1) every row is the
    same bits as that row alone; every row equals the float64 product of the dequantized weights with the
    row's 8-bit activation blocks to float32 rounding (the block sums are exact integers), and the lane
    loops give the same values to that rounding. An odd n_out leaves the last group's padding unwritten."""
    rng = np.random.default_rng(11)
    arrays, dense = _quantized_weights(t, 70, 96, rng)
    x = rng.standard_normal((9, 96)).astype(np.float32)
    X, DX, QH = dots._quantized(x)
    xq = X.astype(np.float64) * DX.astype(np.float64)[:, :, None]  # the activation blocks the kernels multiply
    ref = xq.reshape(9, 96) @ dense.T
    loops = {3: dots._q4_1_loops, 8: dots._q8_0_loops}[t]
    tiles = {3: dots._q4_1_tiles, 8: dots._q8_0_tiles}[t]

    def product(rows):
        Xr, DXr, QHr = dots._quantized(rows)
        out = np.full((rows.shape[0], 70), np.nan, np.float32)
        tiles(*arrays, Xr, DXr, QHr, 0, arrays[0].shape[0], out)
        return out

    for n in range(1, 10):
        out = product(x[:n])
        assert np.abs(out - ref[:n]).max() <= 1e-5 * np.abs(ref).max(), n
        for i in range(n):
            assert np.array_equal(product(x[i:i + 1])[0].view(np.uint32), out[i].view(np.uint32)), (n, i)
    lo = np.empty((9, 70), np.float32)
    loops(*arrays, X, DX, QH, 0, arrays[0].shape[0], lo)
    assert np.abs(lo - ref).max() <= 1e-5 * np.abs(ref).max()
