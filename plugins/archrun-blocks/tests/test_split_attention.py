"""Long-context decode attention in chunks (archrun_blocks.decode_attention.attend_split), shared with the
decode pool as its task (attend_chunk).

Above SPLIT_MIN_ROWS visible rows the keys go in chunks of CHUNK_ROWS rows whose softmax partials are
merged in chunk order: the result must be attention to float32 rounding (against a float64 numpy
softmax over the values the cache rows hold), the same bits with and without the pool, whichever
thread ran a chunk; and the op's kernel part (store the row, select the visible ones, attend) must be
attention over the rows its slot holds across chunk boundaries, in plain slots, in rings with a window
and after a rewind.
"""

from __future__ import annotations

import zlib

import numba
import numpy as np
import pytest

from archrun.descriptor import AttentionSpec
from archrun.kernels.decode import block, layer, pool
from archrun.kernels.decode.parts import NO_TASK
from archrun.kernels.matmul import qmatrix
from archrun_blocks import fast, reference
from archrun_blocks.decode_attention import (
    CHUNK_ROWS,
    SPLIT_MIN_ROWS,
    attend_biased,
    attend_chunk,
    attend_split,
    chunk_rows,
)

RNG = np.random.default_rng(11)


@pytest.fixture(autouse=True)
def _seeded(request):
    """Each test's own random stream (by its name): its data does not depend on which tests ran before
    it in the process (pytest-xdist workers run other subsets in other orders)."""
    global RNG
    RNG = np.random.default_rng(zlib.crc32(request.node.name.encode()))


F32 = np.float32
# counts: just above the split, a chunk boundary and one past it, several chunks with a short last one
# (pure-Python kernels, NUMBA_DISABLE_JIT: the first only)
COUNTS = [SPLIT_MIN_ROWS + 1, 3 * CHUNK_ROWS, 3 * CHUNK_ROWS + 1, 4 * CHUNK_ROWS + 77]
COUNTS = COUNTS[:1] if numba.config.DISABLE_JIT else COUNTS
# the parts' tests store a few hundred tokens op by op first: minutes in pure Python
needs_jit = pytest.mark.skipif(numba.config.DISABLE_JIT, reason="cached tokens op by op: minutes without the JIT")


def _cache(kv_type, cap, n_kv, width):
    """A cache array of kv_type [cap, n_kv, stored] and the float32 values its rows hold (numpy codec)."""
    vals = RNG.standard_normal((cap, n_kv, width)).astype(F32)
    raw = np.ascontiguousarray(reference.NumpyKvCodec.encode(kv_type, vals))
    return raw, np.ascontiguousarray(reference.NumpyKvCodec.decode(kv_type, raw), F32)


def _attention64(q, kf, vf, rows, n_head, scale, softcap, slopes, dist):
    """Grouped-query softmax attention in float64 (hand-derived: scores, cap, ALiBi bias, softmax, mix)."""
    n_kv, hd = kf.shape[1], kf.shape[2]
    group = n_head // n_kv
    q2 = q.reshape(n_head, hd).astype(np.float64)
    out = []
    for h in range(n_head):
        k = kf[rows, h // group].astype(np.float64)
        v = vf[rows, h // group].astype(np.float64)
        s = k @ q2[h] * scale
        if softcap > 0:
            s = softcap * np.tanh(s / softcap)
        if len(slopes):
            s = s + slopes[h] * dist.astype(np.float64)
        w = np.exp(s - s.max())
        out.append(w @ v / w.sum())
    return np.concatenate(out)


def _inputs(kv_type, count, n_head=6, n_kv=2, hd=64, vd=32, alibi=False):
    cap = count + 37
    kc, kf = _cache(kv_type, cap, n_kv, hd)
    vc, vf = _cache(kv_type, cap, n_kv, vd)
    q = (RNG.standard_normal(n_head * hd) * 2).astype(F32)
    rows = RNG.permutation(cap)[:count].astype(np.int64)  # any rows, in any order (ring slots)
    slopes = RNG.uniform(0.01, 0.5, n_head) if alibi else np.empty(0, np.float64)
    dist = -RNG.uniform(0, count, count).astype(F32) if alibi else np.empty(0, F32)
    return q, kc, vc, kf, vf, rows, slopes, dist


@pytest.mark.parametrize("alibi", [False, True])
@pytest.mark.parametrize("softcap", [0.0, 4.0])
@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("kv_type", ["f32", "f16", "q8_0"])
def test_split_is_attention_to_float32_rounding(kv_type, count, softcap, alibi):
    q, kc, vc, kf, vf, rows, slopes, dist = _inputs(kv_type, count, alibi=alibi)
    n_head, vd = 6, 32
    out = np.full(n_head * vd, np.nan, F32)
    attend_split(q, kc, vc, rows, count, n_head, 0.125, softcap, slopes, dist, out, *NO_TASK)
    want = _attention64(q, kf, vf, rows, n_head, 0.125, softcap, slopes, dist)
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-5 * np.abs(want).max())
    # the one-pass code of short contexts: both are float32 roundings of the same attention, each within
    # the bound above of the float64 value, so they may differ by up to their two errors (over 300
    # seeds: up to 2.5e-6 of the largest output, 0.25 of the bound above for either one alone)
    one_pass = np.empty_like(out)
    attend_biased(q, kc, vc, rows, count, n_head, 0.125, softcap, slopes, dist, one_pass)
    np.testing.assert_allclose(one_pass, want, rtol=0, atol=1e-5 * np.abs(want).max())
    np.testing.assert_allclose(out, one_pass, rtol=0, atol=1e-5 * np.abs(one_pass).max())


def test_chunks_grow_past_the_pools_limit():
    """Past MAX_CHUNKS chunks of CHUNK_ROWS the chunks double (the pool publishes at most MAX_CHUNKS), and
    the split over such a count is still attention to float32 rounding."""
    limit = CHUNK_ROWS * pool.MAX_CHUNKS
    assert [chunk_rows(n) for n in (1, CHUNK_ROWS + 1, limit, limit + 1, 2 * limit + 1)] == [
        CHUNK_ROWS, CHUNK_ROWS, CHUNK_ROWS, 2 * CHUNK_ROWS, 3 * CHUNK_ROWS]
    if numba.config.DISABLE_JIT:
        return  # 32k rows in pure Python: minutes
    count = limit + 1
    q, kc, vc, kf, vf, rows, slopes, dist = _inputs("f16", count, n_head=2, n_kv=1, hd=32, vd=16)
    out = np.full(2 * 16, np.nan, F32)
    attend_split(q, kc, vc, rows, count, 2, 0.125, 0.0, slopes, dist, out, *NO_TASK)
    want = _attention64(q, kf, vf, rows, 2, 0.125, 0.0, slopes, dist)
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-5 * np.abs(want).max())


def _pool():
    """A decode pool with the split attention's task (id 0) and one small product group."""
    w = np.ascontiguousarray(RNG.standard_normal((32, 32)).astype(F32).view(np.uint8))
    group = (block.uniform(qmatrix.prepare(w, 0, 32)), block.absent_matrix(), block.absent_matrix())
    p = pool.DecodePool([group], 32, 32, layer.serve, (attend_chunk,))
    p.warm_up()
    return p


@pytest.mark.skipif(not pool.enabled(), reason="the pool needs the JIT (its atomics are intrinsics)")
@pytest.mark.parametrize("kv_type", ["f32", "f16", "q8_0"])
def test_split_on_the_pool_is_bit_identical(kv_type):
    """Chunks claimed by the worker and by the caller, in any mix: the same bits as one thread."""
    count = 8 * CHUNK_ROWS + 5
    q, kc, vc, _, _, rows, slopes, dist = _inputs(kv_type, count, alibi=True)
    n_head, vd = 6, 32
    one = np.empty(n_head * vd, F32)
    attend_split(q, kc, vc, rows, count, n_head, 0.125, 0.0, slopes, dist, one, *NO_TASK)
    p = _pool()
    for _ in range(200):  # until the worker has taken part (it is woken at each step's start)
        got = np.full(n_head * vd, np.nan, F32)
        with p.running(2) as par:
            attend_split(q, kc, vc, rows, count, n_head, 0.125, 0.0, slopes, dist, got, par[0], np.int64(0))
        assert np.array_equal(got.view(np.uint32), one.view(np.uint32))
        if p.worker_task_chunks:
            break
    assert p.worker_task_chunks > 0


def _part_run(make, spec, kv_type, cap, max_rewind, t0, positions):
    """The op's kernel part for kv_type: t0 cached tokens (stored op by op), then one token at each of
    `positions` (a position below the last one is a rewind), each against a float64 softmax over the rows
    the slot holds at positions (pos - window, pos] (which position each row holds tracked here)."""
    fst = make(spec)
    fs = fst.new_slot(cap, max_rewind, **({} if kv_type == "f32" else {"kv_type": kv_type}))
    part = fst.fused if kv_type == "f32" else fst.fused_for(kv_type)
    heads, kv, hd, vd = spec.n_head, spec.n_head_kv, spec.head_dim, spec.v_head_dim
    slopes = np.asarray(getattr(fst, "slopes", ()), np.float64)

    def r(*shape):
        return RNG.standard_normal(shape).astype(F32)

    fst(r(t0, heads, hd), r(t0, kv, hd), r(t0, kv, vd), fs, 0)
    kc, vc, kpos, ring = fst.slot_arrays(fs)
    held = {(p % kc.shape[0] if ring else p): p for p in range(t0)}  # cache row -> the position it holds
    for pos in positions:
        q, k, v = r(heads * hd) * 2, r(kv * hd), r(kv * vd)
        row = pos % kc.shape[0] if ring else pos
        out = np.full(heads * vd, np.nan, F32)
        part.fn(part.params, q, k, v, kc, vc, kpos, bool(ring), row, pos, out, *NO_TASK)
        held[row] = pos
        rows = np.array([i for i, p in held.items() if p <= pos and (not spec.window or p > pos - spec.window)])
        kf = reference.NumpyKvCodec.decode(kv_type, kc) if kv_type != "f32" else kc
        vf = reference.NumpyKvCodec.decode(kv_type, vc) if kv_type != "f32" else vc
        dist = np.array([held[i] - pos for i in rows], F32)
        want = _attention64(q, kf, vf, rows, heads, spec.scale, spec.softcap, slopes, dist)
        np.testing.assert_allclose(out, want, rtol=0, atol=1e-5 * max(1.0, np.abs(want).max()),
                                   err_msg=f"{kv_type} position {pos}")


OPS = {"causal": fast.causal_attention, "alibi": fast.alibi_attention}


@needs_jit
@pytest.mark.parametrize("kind", ["causal", "alibi"])
@pytest.mark.parametrize("kv_type", ["f32", "f16", "q8_0"])
def test_part_over_a_long_plain_slot(kind, kv_type):
    """Global attention from SPLIT_MIN_ROWS - 1 cached tokens on: the last one-pass step, the first split
    ones, a chunk boundary crossed, then a rewind back below the split."""
    spec = AttentionSpec(kind=kind, n_head=4, n_head_kv=2, head_dim=32, v_head_dim=32, scale=32 ** -0.5,
                         alibi_max_bias=8.0 if kind == "alibi" else 0.0, softcap=5.0 if kind == "alibi" else 0.0)
    t0 = SPLIT_MIN_ROWS - 1
    _part_run(OPS[kind], spec, kv_type, 2 * SPLIT_MIN_ROWS, 8, t0,
              [t0, t0 + 1, t0 + 2, t0 + 1, t0 + 2, t0 - 3, t0 - 2])


@needs_jit
@pytest.mark.parametrize("kv_type", ["f32", "q8_0"])
def test_part_over_a_long_ring(kv_type):
    """A sliding layer's ring of window + 6 rows: positions wrap past the cap, the visible rows are listed
    in ring order (not position order) and cross chunk boundaries; then a rewind of 4 (the ring then holds
    rows of positions past the current one, which must stay invisible)."""
    window = SPLIT_MIN_ROWS + CHUNK_ROWS + 3
    spec = AttentionSpec(kind="causal", n_head=4, n_head_kv=1, head_dim=32, v_head_dim=32, scale=32 ** -0.5,
                         window=window)
    t0 = window + 40
    _part_run(OPS["causal"], spec, kv_type, 4 * SPLIT_MIN_ROWS, 6, t0,
              [t0, t0 + 1, t0 + 2, t0 + 3, t0 + 4, t0 + 1, t0 + 2])
