"""The tiled many-query attention (archrun_blocks.prefill_attention) against float64 softmax attention
written here, and against the per-query path it replaces from TILE_MIN_QUERIES queries on: causal
prompts, windows, ring-ordered key positions, softcap, ALiBi, GQA groups, head sizes that are not a
multiple of four, and query/key counts that are not multiples of the tile sizes."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from archrun_blocks import elementwise, prefill_attention

SMALL = numba.config.DISABLE_JIT  # pure-Python kernels: keep sizes tiny
F32 = np.float32


def _attention64(q, k, v, q_pos, k_pos, scale, window, softcap=0.0, slopes=None):
    """softmax(scale * q k^T (capped, biased), masked to k_pos <= q_pos inside the window) v, in float64."""
    n, n_head, _ = q.shape
    group = n_head // k.shape[1]
    out = np.empty((n, n_head, v.shape[2]))
    visible = (k_pos[None, :] <= q_pos[:, None]) & ((window == 0) | (k_pos[None, :] > q_pos[:, None] - window))
    for h in range(n_head):
        s = q[:, h].astype(np.float64) @ k[:, h // group].astype(np.float64).T * scale
        if softcap > 0:
            s = softcap * np.tanh(s / softcap)
        if slopes is not None:
            s = s + float(slopes[h]) * (k_pos[None, :] - q_pos[:, None])
        s = np.where(visible, s, -np.inf)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        out[:, h] = (p / p.sum(axis=1, keepdims=True)) @ v[:, h // group].astype(np.float64)
    return out


def _case(rng, n, n_keys, n_head, n_kv, hd, vd, ring):
    q = rng.standard_normal((n, n_head, hd)).astype(F32)
    k = rng.standard_normal((n_keys, n_kv, hd)).astype(F32)
    v = rng.standard_normal((n_keys, n_kv, vd)).astype(F32)
    if ring:  # a ring's rows hold positions in rotated order; the queries are the latest positions
        k_pos = np.roll(np.arange(n_keys, dtype=np.int64), rng.integers(1, n_keys))
    else:
        k_pos = np.arange(n_keys, dtype=np.int64)
    q_pos = np.arange(n_keys - n, n_keys, dtype=np.int64)
    return q, k, v, q_pos, k_pos


def _tiled(q, k, v, q_pos, k_pos, scale, window, softcap=0.0, slopes=None):
    out = np.empty((q.shape[0], q.shape[1], v.shape[2]), F32)
    s = np.empty(0) if slopes is None else slopes.astype(np.float64)
    prefill_attention.attend_tiled(q, k, v, q_pos, k_pos, scale, window, softcap, s, out)
    return out


SHAPES = [  # n queries, keys, heads, kv heads, head dim, value dim, ring
    (5, 9, 4, 2, 8, 8, False),
    (37, 37, 3, 3, 10, 6, False),       # hd not a multiple of 4, MHA
    (70, 133, 9, 3, 64, 64, False),     # a prompt after cached rows; > one tile, > two key blocks
    (66, 150, 7, 1, 16, 16, True),      # MQA, a ring
    (33, 97, 4, 1, 256, 256, False),    # Gemma-like head dim
]


@pytest.mark.parametrize("shape", SHAPES[:2] if SMALL else SHAPES)
@pytest.mark.parametrize("window,softcap,alibi", [(0, 0.0, False), (23, 0.0, False), (0, 30.0, False),
                                                 (0, 0.0, True), (40, 20.0, True)])
def test_tiled_attention_is_softmax_attention(shape, window, softcap, alibi):
    rng = np.random.default_rng(len(shape) * 7 + window)
    n, n_keys, n_head, n_kv, hd, vd, ring = shape
    q, k, v, q_pos, k_pos = _case(rng, n, n_keys, n_head, n_kv, hd, vd, ring)
    q *= 2  # sharper softmax: the online max matters
    slopes = rng.uniform(0.02, 0.5, n_head).astype(F32) if alibi else None
    scale = 1 / np.sqrt(hd)
    got = _tiled(q, k, v, q_pos, k_pos, scale, window, softcap, slopes)
    np.testing.assert_allclose(got, _attention64(q, k, v, q_pos, k_pos, scale, window, softcap, slopes),
                               rtol=0, atol=2e-5)


@pytest.mark.skipif(SMALL, reason="many queries: slow without the JIT")
def test_long_prompts_take_the_tiles_and_agree_with_the_per_query_path(monkeypatch):
    rng = np.random.default_rng(3)
    q, k, v, q_pos, k_pos = _case(rng, 300, 300, 9, 3, 64, 64, False)
    tiled = elementwise.attention(q, k, v, q_pos, k_pos, 0.125, 0)
    monkeypatch.setattr(elementwise, "TILE_MIN_QUERIES", 10**9)
    per_query = elementwise.attention(q, k, v, q_pos, k_pos, 0.125, 0)
    assert not np.array_equal(tiled, per_query)  # two paths (another summation order)...
    np.testing.assert_allclose(tiled, per_query, rtol=0, atol=2e-6)  # ...one result to float32 rounding
    np.testing.assert_allclose(tiled, _attention64(q, k, v, q_pos, k_pos, 0.125, 0), rtol=0, atol=2e-6)


def test_zigzag_order_visits_every_tile_once():
    for n_tiles, n_kv in ((1, 1), (4, 3), (7, 2)):
        seen = sorted(prefill_attention._task(t, n_tiles, n_kv) for t in range(n_tiles * n_kv))
        assert seen == [(qt, kv) for qt in range(n_tiles) for kv in range(n_kv)]


def _tile_operands(rng, k):
    """A [6, k + 5], B [k + 3, 40] and C [7, 30] float32: the tiles' views are taken inside them."""
    return (rng.standard_normal((6, k + 5)).astype(F32), rng.standard_normal((k + 3, 40)).astype(F32),
            rng.standard_normal((7, 30)).astype(F32))


@pytest.mark.parametrize("accumulate", [False, True])
def test_the_register_tile_is_a_float32_matrix_product_of_strided_views(accumulate):
    """tile_simd's C[4, 16] (+)= A[4, K] @ B[K, 16] on views inside larger arrays (row strides of their own):
    float64 products to float32 rounding, and nothing outside the tile written."""
    from archrun_blocks.tile_simd import mm4x16, mm4x16_acc

    @numba.njit
    def tile(a, b, c, accumulate):  # an intrinsic runs inside compiled code only
        if accumulate:
            mm4x16_acc(a, b, c)
        else:
            mm4x16(a, b, c)

    rng = np.random.default_rng(3)
    for k in (1, 7, 64):
        a, b, c = _tile_operands(rng, k)
        before = c.copy()
        tile(a[1:5, 2:2 + k], b[3:3 + k, 9:25], c[2:6, 5:21], accumulate)
        want = a[1:5, 2:2 + k].astype(np.float64) @ b[3:3 + k, 9:25].astype(np.float64)
        if accumulate:
            want += before[2:6, 5:21]
        np.testing.assert_allclose(c[2:6, 5:21], want, rtol=0, atol=1e-5 * (1 + np.abs(want).max()))
        c[2:6, 5:21] = before[2:6, 5:21]
        assert np.array_equal(c, before)


def test_the_three_row_tile_has_the_four_row_tiles_bits():
    """tile_simd.mm3x16_acc (a GQA group of 3 in the decode value mix, without a padding row): each output the
    bits of mm4x16_acc's, over strided views, and nothing outside its 3 x 16 written."""
    from archrun_blocks.tile_simd import mm3x16_acc, mm4x16_acc

    @numba.njit
    def tiles(a, b, c3, c4):  # an intrinsic runs inside compiled code only
        mm3x16_acc(a[:3], b, c3)
        mm4x16_acc(a, b, c4)

    rng = np.random.default_rng(5)
    for k in (1, 8, 33):
        a, b, c = _tile_operands(rng, k)
        c4 = c.copy()
        before = c.copy()
        tiles(a[1:5, 2:2 + k], b[3:3 + k, 9:25], c[2:5, 5:21], c4[2:6, 5:21])
        assert np.array_equal(c[2:5, 5:21].view(np.uint32), c4[2:5, 5:21].view(np.uint32))
        c[2:5, 5:21] = before[2:5, 5:21]
        assert np.array_equal(c, before)
