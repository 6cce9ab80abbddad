"""The decode attention kernel (archrun_blocks.decode_attention) against the reference attention op."""

from __future__ import annotations

import numpy as np
import pytest

from archrun_blocks.decode_attention import attend_one, exp_shifted, visible_rows
from archrun_blocks.reference import attend

RNG = np.random.default_rng(3)


def test_exp_shifted_is_float32_accurate():
    x = np.concatenate([np.linspace(-86.0, 0.0, 4001), RNG.uniform(-30, 0, 997)]).astype(np.float32)
    p = x.copy()
    total = exp_shifted(p, np.float32(0.0), np.empty(len(p), np.int32))
    ref = np.exp(x.astype(np.float64))
    assert np.abs(p / ref - 1).max() < 5e-7  # a few float32 ulp (libm expf: ~1)
    assert total == pytest.approx(ref.sum(), rel=1e-6)
    tiny = np.array([-200.0, -1e30, -np.inf], np.float32)  # far below the max: (almost) zero weight
    exp_shifted(tiny, np.float32(0.0), np.empty(3, np.int32))
    assert np.all((tiny >= 0) & (tiny < 2e-38))


@pytest.mark.parametrize("softcap", [0.0, 2.5])
@pytest.mark.parametrize(("n_head", "n_kv", "hd", "vd", "count"),
                         [(9, 3, 64, 64, 150), (4, 1, 256, 256, 7), (2, 2, 24, 16, 1), (8, 2, 32, 32, 33),
                          (9, 3, 64, 64, 700), (4, 2, 32, 48, 513)])  # the last two: several key blocks
def test_attend_one_matches_reference(n_head, n_kv, hd, vd, count, softcap):
    cap = count + 9
    kc = RNG.standard_normal((cap, n_kv, hd)).astype(np.float32)
    vc = RNG.standard_normal((cap, n_kv, vd)).astype(np.float32)
    q = RNG.standard_normal(n_head * hd).astype(np.float32) * 2
    rows = RNG.permutation(cap)[:count].astype(np.int64)  # any rows, in any order (ring slots)
    out = np.empty(n_head * vd, np.float32)
    attend_one(q, kc, vc, rows, count, n_head, 0.125, softcap, out)
    ref = attend(q.reshape(1, n_head, hd), kc[rows], vc[rows], np.array([count]), np.arange(count), 0.125, 0,
                 softcap)
    np.testing.assert_allclose(out, ref.reshape(-1), rtol=0, atol=1e-5 * np.abs(ref).max())


def test_visible_rows_plain_window_and_ring():
    rows = np.empty(16, np.int64)
    none = np.empty(0, np.int64)
    assert list(rows[:visible_rows(none, False, 5, 0, rows)]) == [0, 1, 2, 3, 4, 5]
    assert list(rows[:visible_rows(none, False, 5, 3, rows)]) == [3, 4, 5]
    kpos = np.array([8, 9, 2, -1, 6, 7], np.int64)  # a ring after a rewind: 9 is stale, 2 too old
    assert list(rows[:visible_rows(kpos, True, 8, 4, rows)]) == [0, 4, 5]
    assert list(rows[:visible_rows(kpos, True, 8, 0, rows)]) == [0, 2, 4, 5]


@pytest.mark.parametrize("kind", ["f32", "f16"])
def test_the_score_kernel_dots_four_rows_with_two_heads(kind):
    """tile_simd.dots4x2: eight dot products of 2 query heads with 4 key rows read in place (float32, or f16
    bits widened exactly), against float64 on the same values; widths of 8 and 256 elements."""
    import numba

    from archrun_blocks.tile_simd import dots4x2

    @numba.njit
    def run(q, k, out):  # an intrinsic runs inside compiled code only
        dots4x2(q[0], q[1], k[0], k[1], k[2], k[3], out)

    for hd in (8, 256):
        q = RNG.standard_normal((2, hd)).astype(np.float32)
        kf = RNG.standard_normal((4, hd)).astype(np.float32)
        k = kf.astype(np.float16).view(np.uint16) if kind == "f16" else kf
        values = k.view(np.float16).astype(np.float64) if kind == "f16" else kf.astype(np.float64)
        out = np.full(8, np.nan, np.float32)
        run(q, k, out)
        want = (q.astype(np.float64) @ values.T).reshape(-1)
        np.testing.assert_allclose(out, want, rtol=0, atol=2e-6 * np.abs(q).sum(axis=1).max() * np.abs(values).max())


@pytest.mark.parametrize("kind", ["f32", "f16"])
def test_the_three_head_score_kernel_has_the_two_head_kernels_bits(kind):
    """tile_simd.dots4x3 (a GQA group of 3 without a repeated head): its twelve dots the bits of dots4x2's, so
    a score does not depend on the tile that computed it."""
    import numba

    from archrun_blocks.tile_simd import dots4x2, dots4x3

    @numba.njit
    def run(q, k, out3, out2a, out2b):  # an intrinsic runs inside compiled code only
        dots4x3(q[0], q[1], q[2], k[0], k[1], k[2], k[3], out3)
        dots4x2(q[0], q[1], k[0], k[1], k[2], k[3], out2a)
        dots4x2(q[2], q[2], k[0], k[1], k[2], k[3], out2b)

    for hd in (8, 64, 256):
        q = RNG.standard_normal((3, hd)).astype(np.float32)
        kf = RNG.standard_normal((4, hd)).astype(np.float32)
        k = kf.astype(np.float16).view(np.uint16) if kind == "f16" else kf
        out3 = np.full(13, np.nan, np.float32)  # one past the twelve: must stay untouched
        out2a, out2b = np.full(8, np.nan, np.float32), np.full(8, np.nan, np.float32)
        run(q, k, out3, out2a, out2b)
        assert np.array_equal(out3[:12].view(np.uint32), np.concatenate([out2a, out2b[:4]]).view(np.uint32))
        assert np.isnan(out3[12])
