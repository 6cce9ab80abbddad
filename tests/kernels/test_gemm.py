"""The prefill int8 GEMM (kernels.matmul.gemm): simd's tiles against the loop tile, and whole products.

A tile's int32 block sums are exact in every version, so on inputs whose float scaling is exact
too (scales that are small powers of two, integer activation sums) every SIMD tile must return
the very floats of the loop version; on random scales they agree to float32 rounding. Whole
products are checked against gguf-py's dequantization with the activation replaced by its Q8_0
quantization, as test_kernels does for the decode path. Also run with NUMBA_BOUNDSCHECK=1, and
with NUMBA_DISABLE_JIT=1 (the loop tile only, small sizes).
"""

from __future__ import annotations

import numba
import numpy as np
import pytest
from numba import njit
from support.quant_rows import T, dense, q8_activation, random_rows, rel_err, tie_rows

from archrun import kernels
from archrun.kernels._jit import LANES
from archrun.kernels.matmul import gemm, qmatrix, simd
from archrun.kernels.matmul.simd import GEMM_TOKENS, HALVES, MIN, ONE

SMALL = numba.config.DISABLE_JIT
KINDS = {ONE: "one", MIN: "min", HALVES: "halves"}


# (blocks, padded tokens, first token) of the tile comparisons: whole tiles of GEMM_TOKENS tokens
TILE_CASES = ((1, GEMM_TOKENS, 0), (3, 2 * GEMM_TOKENS, GEMM_TOKENS), (9, 3 * GEMM_TOKENS, 2 * GEMM_TOKENS))


def _isas():
    return [isa for isa, present in (("vnni", simd.VNNI), ("avx2", simd.AVX2)) if present]


def _tile_fn(kind: int, isa: str):
    return getattr(simd, f"tile_{KINDS[kind]}_{isa}")


def _umax(kind: int, isa: str) -> int:
    """The largest field a tile takes: Q8_0's w + 128 only with VNNI; AVX2's tiles add 4 quads'
    vpmaddubsw pairs as int16 (fields of at most 5 bits; Q6_K's halves: 2 quads, 6 bits)."""
    return 255 if isa == "vnni" else 63 if kind == HALVES else 31


def _loop_fn(kind: int):
    return getattr(gemm, f"tile_{KINDS[kind]}_loops")


def _compare(kind: int, isa: str):
    return _compare_fns(_tile_fn(kind, isa), _loop_fn(kind))


def _compare_fns(tile, loops):
    @njit
    def run(U, XQ, OFF, DXT, A, M, MS, t0):
        got = np.empty((GEMM_TOKENS, LANES), np.float32)
        ref = np.empty((GEMM_TOKENS, LANES), np.float32)
        tile(U, XQ, OFF, DXT, A, M, MS, t0, got)
        loops(U, XQ, OFF, DXT, A, M, MS, t0, ref)
        return got, ref

    return run


def _inputs(rng, nb: int, n_pad: int, umax: int, exact: bool, extreme: str):
    """Random tile inputs: field bytes in 0..umax, activation bytes in -127..127."""
    qb = rng.integers(0, umax + 1, (nb, 8 * LANES, 4))
    xb = rng.integers(-127, 128, (nb, n_pad, 8, 4))
    if extreme == "max":
        qb[:] = umax
        xb[:] = 127
    elif extreme == "signs":
        qb[:] = umax
        xb = np.where(rng.random(xb.shape) < 0.5, -127, 127)
    U = (qb.astype(np.uint32) << (8 * np.arange(4, dtype=np.uint32))).sum(-1).astype(np.uint32)
    XQ = ((xb & 255).astype(np.uint32) << (8 * np.arange(4, dtype=np.uint32))).sum(-1).astype(np.uint32)
    XQ = XQ.view(np.int32)
    OFF = rng.integers(-(1 << 19), 1 << 19, (nb, n_pad, 2)).astype(np.int32)
    if exact:  # every product and partial sum a float32 integer
        DXT = rng.choice(np.array([0.5, 1.0, 2.0], np.float32), (nb, n_pad))
        A = rng.choice(np.array([0.0, 0.25, 1.0], np.float32), (nb, 2, LANES))
        M = rng.integers(-4, 5, (nb, LANES)).astype(np.float32)
        MS = rng.integers(-64, 65, (nb, n_pad)).astype(np.float32)
    else:
        DXT = rng.random((nb, n_pad), np.float32) * 0.01
        A = rng.standard_normal((nb, 2, LANES), np.float32) * 0.01
        M = rng.standard_normal((nb, LANES), np.float32) * 0.01
        MS = rng.standard_normal((nb, n_pad), np.float32)
    return U, XQ, OFF, DXT, A, M, MS


@pytest.mark.skipif(not _isas(), reason="no AVX2 here (or the JIT is off)")
@pytest.mark.parametrize("isa", ["vnni", "avx2"])
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("extreme", ["random", "max", "signs"])
def test_simd_tile_equals_loop_tile_exactly(isa, kind, extreme):
    if isa not in _isas():
        pytest.skip(f"no {isa} here")
    rng = np.random.default_rng(kind * 10 + len(extreme))
    umax = _umax(kind, isa)
    run = _compare(kind, isa)
    for nb, n_pad, t0 in TILE_CASES:
        args = _inputs(rng, nb, n_pad, umax, exact=True, extreme=extreme)
        got, ref = run(*args, t0)
        assert np.array_equal(got, ref), f"nb={nb} t0={t0}"


@pytest.mark.skipif(not _isas(), reason="no AVX2 here (or the JIT is off)")
@pytest.mark.parametrize("isa", ["vnni", "avx2"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_simd_tile_matches_loop_tile_on_random_scales(isa, kind):
    if isa not in _isas():
        pytest.skip(f"no {isa} here")
    rng = np.random.default_rng(kind)
    args = _inputs(rng, 7, 2 * GEMM_TOKENS, min(63, _umax(kind, isa)), exact=False, extreme="random")
    got, ref = _compare(kind, isa)(*args, GEMM_TOKENS)
    assert np.abs(got - ref).max() <= 1e-6 * np.abs(ref).max()


@pytest.mark.skipif(not simd.AVX2 or simd.VNNI, reason="the SIGNED tile is AVX2's Q8_0 (VNNI takes w + 128)")
@pytest.mark.parametrize("extreme", ["random", "max", "signs"])
def test_signed_tile_equals_loop_tile_exactly(extreme):
    """Q8_0 on AVX2: |w| x sign(x, w) in vpmaddubsw, every weight byte in -128..127 (|-128| = 128 included)."""
    rng = np.random.default_rng(len(extreme))
    run = _compare_fns(simd.tile_signed_avx2, gemm.tile_signed_loops)
    for nb, n_pad, t0 in TILE_CASES:
        U, XQ, OFF, DXT, A, M, MS = _inputs(rng, nb, n_pad, 0, exact=True, extreme=extreme)
        w = rng.integers(-128, 128, (nb, 8 * LANES, 4))
        xb = XQ.view(np.uint32)
        if extreme != "random":
            w[:] = -128
            w[:, ::3] = 127
        shifts = 8 * np.arange(4, dtype=np.uint32)
        mag = (np.abs(w).astype(np.uint32) << shifts).sum(-1).astype(np.uint32)
        raw = ((w & 255).astype(np.uint32) << shifts).sum(-1).astype(np.uint32)
        U = np.concatenate([mag, raw], axis=1)
        OFF[:] = 0
        got, ref = run(U, xb.view(np.int32), OFF, DXT, A, M, MS, t0)
        assert np.array_equal(got, ref), f"nb={nb} t0={t0}"


GEMM_NAMES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]


@pytest.mark.parametrize("name", GEMM_NAMES)
def test_gemm_entries_match_quantized_reference(name):
    """Every entry (the loop tile without the JIT) = x's Q8_0 blocks @ gguf-py's weights."""
    t = int(T[name])
    if gemm.ISA and t not in gemm.TYPES:
        pytest.skip(f"{name} keeps the float path on {gemm.ISA}")
    rng = np.random.default_rng(t)
    n_in = 256 if name.endswith("_K") else (64 if SMALL else 96)
    n_out, tokens = (37, (5,)) if SMALL else (71, (25, 66))
    raw = random_rows(name, n_out, n_in, rng)
    w = kernels.prepare(raw, t, n_in)
    ref_w = dense(raw, name, n_in)
    for n in tokens:
        x = rng.standard_normal((n, n_in), np.float32)
        for chunks in (1, 2):
            out = np.full((n, n_out), np.nan, np.float32)
            gemm._ALL[t](*w.arrays, x, out, chunks)
            keep = np.setdiff1d(np.arange(n), tie_rows(x))
            assert rel_err(out[keep], (q8_activation(x) @ ref_w.T)[keep]) < 1e-5, (n, chunks)


@pytest.mark.skipif(SMALL, reason="the prefill path needs the JIT's SIMD tiles")
def test_matmul_takes_the_gemm_for_many_tokens():
    assert gemm.ISA in ("avx512vnni", "avx2") if simd.AVX2 else gemm.ISA == ""
    for t in gemm.TYPES:
        assert qmatrix.quantizes_activations(qmatrix.QMatrix(t, 1, 32, 0, (np.zeros((1, 1, 1)),)), 500)
