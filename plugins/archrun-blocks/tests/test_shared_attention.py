"""One-token decode attention shared with a running decode pool by kv head (archrun_blocks.decode_attention):
at any number of visible rows, kv-head ranges (times row chunks past SPLIT_MIN_ROWS) claimed by the worker
and by the caller in any mix give the bits of one thread without a pool, for every kv type, with ALiBi
biases, a softcap and sink logits; a layer of one kv head is not split by head."""

from __future__ import annotations

import zlib

import numba
import numpy as np
import pytest

from archrun.kernels.decode import block, layer, pool
from archrun.kernels.decode.parts import NO_TASK
from archrun.kernels.matmul import qmatrix
from archrun_blocks import reference
from archrun_blocks.decode_attention import (
    SHARE_MIN_WORK,
    SPLIT_MIN_ROWS,
    attend_biased,
    attend_chunk,
    attend_sinks,
    attend_split,
    kv_ranges,
    split_sinks,
)

pytestmark = pytest.mark.skipif(not pool.enabled(), reason="the pool needs the JIT (its atomics are intrinsics)")

F32 = np.float32
TRIES, RUNS = 200, 20  # steps until the worker has taken part, attentions per step


@pytest.fixture(autouse=True)
def _threads():
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs two numba threads (NUMBA_NUM_THREADS=1 here)")


def _rng(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _inputs(rng, kv_type, count, n_head, n_kv, hd, vd, alibi):
    cap = count + 19
    raw = []
    for width in (hd, vd):
        vals = rng.standard_normal((cap, n_kv, width)).astype(F32)
        raw.append(np.ascontiguousarray(reference.NumpyKvCodec.encode(kv_type, vals)) if kv_type != "f32" else vals)
    q = (rng.standard_normal(n_head * hd) * 2).astype(F32)
    rows = rng.permutation(cap)[:count].astype(np.int64)  # any rows, in any order (ring slots)
    slopes = rng.uniform(0.01, 0.5, n_head) if alibi else np.empty(0, np.float64)
    dist = -rng.uniform(0, count, count).astype(F32) if alibi else np.empty(0, F32)
    return q, raw[0], raw[1], rows, slopes, dist


@pytest.fixture(scope="module")
def decode_pool():
    """A decode pool with the attention's task (id 0) and one small product group."""
    rng = np.random.default_rng(5)
    w = np.ascontiguousarray(rng.standard_normal((32, 32)).astype(F32).view(np.uint8))
    group = (block.uniform(qmatrix.prepare(w, 0, 32)), block.absent_matrix(), block.absent_matrix())
    p = pool.DecodePool([group], 32, 32, layer.serve, (attend_chunk,))
    p.warm_up()
    return p


def _shared_matches_one_thread(p, run, one, expect_worker):
    """run(out, ctrl, task) on the running 2-thread pool gives one's bits, every time; the worker computed
    chunks of it (when expect_worker) within TRIES steps of RUNS runs (it is woken at each step's start and
    may wait for a core on a busy host), else none at all (the attention stays whole on the step's thread)."""
    before = p.worker_task_chunks
    for _ in range(TRIES if expect_worker else 1):
        with p.running(2) as par:
            for _ in range(RUNS):
                got = np.full_like(one, np.nan)
                run(got, par[0], np.int64(0))
                assert np.array_equal(got.view(np.uint32), one.view(np.uint32))
        if p.worker_task_chunks > before:
            break
    if expect_worker:
        assert p.worker_task_chunks > before
    else:
        assert p.worker_task_chunks == before


# (rows, query heads, kv heads, hd): SmolLM2's heads (9 of 64 over 3 kv heads) in a short context (below
# SHARE_MIN_WORK: whole), at the least shared work, at the split, one past it and over several row chunks; wide
# heads in a short context (shared by kv head)
SHAPES = [(5, 9, 3, 64), (64, 9, 3, 64), (SPLIT_MIN_ROWS, 9, 3, 64), (SPLIT_MIN_ROWS + 1, 9, 3, 64), (300, 9, 3, 64),
          (5, 48, 3, 256)]


def _worker_expected(count, n_head, n_kv, hd, vd):
    """Whether the split has at least two chunks (else it runs whole on the calling thread)."""
    nch = 1 if count <= SPLIT_MIN_ROWS else -(-count // 128)
    return nch * kv_ranges(count, nch, n_head, n_kv, hd, vd) >= 2


@pytest.mark.parametrize("alibi", [False, True])
@pytest.mark.parametrize("kv_type", ["f32", "f16", "q8_0"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_shared_by_kv_head_is_bit_identical(decode_pool, shape, kv_type, alibi):
    count, n_head, n_kv, hd = shape
    vd = hd
    rng = _rng(shape, kv_type, alibi)
    q, kc, vc, rows, slopes, dist = _inputs(rng, kv_type, count, n_head, n_kv, hd, vd, alibi)
    softcap = 4.0 if alibi else 0.0
    one = np.full(n_head * vd, np.nan, F32)
    attend_split(q, kc, vc, rows, count, n_head, 0.125, softcap, slopes, dist, one, *NO_TASK)
    if count <= SPLIT_MIN_ROWS:  # the one-pass code's bits, with or without a pool
        whole = np.full_like(one, np.nan)
        attend_biased(q, kc, vc, rows, count, n_head, 0.125, softcap, slopes, dist, whole)
        assert np.array_equal(whole.view(np.uint32), one.view(np.uint32))

    def run(out, ctrl, task):
        attend_split(q, kc, vc, rows, count, n_head, 0.125, softcap, slopes, dist, out, ctrl, task)

    _shared_matches_one_thread(decode_pool, run, one, _worker_expected(count, n_head, n_kv, hd, vd))


@pytest.mark.parametrize("count", [5, SPLIT_MIN_ROWS, 300])
def test_one_kv_head_is_not_split_by_head(decode_pool, count):
    """One kv head (MQA) of 8 query heads: whole up to SPLIT_MIN_ROWS rows, by row chunk past it."""
    n_head, hd = 8, 64
    q, kc, vc, rows, slopes, dist = _inputs(_rng("mqa", count), "f32", count, n_head, 1, hd, hd, False)
    one = np.full(n_head * hd, np.nan, F32)
    attend_split(q, kc, vc, rows, count, n_head, 0.125, 0.0, slopes, dist, one, *NO_TASK)

    def run(out, ctrl, task):
        attend_split(q, kc, vc, rows, count, n_head, 0.125, 0.0, slopes, dist, out, ctrl, task)

    _shared_matches_one_thread(decode_pool, run, one, count > SPLIT_MIN_ROWS)


@pytest.mark.parametrize("kv_type", ["f32", "q8_0"])
@pytest.mark.parametrize("count", [5, 100, 300])
def test_sinks_shared_by_kv_head_are_bit_identical(decode_pool, count, kv_type):
    """split_sinks (gpt-oss's sink logits; one far above every score): the bits of one thread, and up to
    SPLIT_MIN_ROWS rows those of attend_sinks."""
    n_head, n_kv, hd = 8, 4, 64
    rng = _rng("sinks", count, kv_type)
    q, kc, vc, rows, slopes, dist = _inputs(rng, kv_type, count, n_head, n_kv, hd, hd, False)
    sinks = rng.standard_normal(n_head) * 2
    sinks[1] = 30.0
    one = np.full(n_head * hd, np.nan, F32)
    split_sinks(q, kc, vc, rows, count, n_head, 0.125, 0.0, slopes, dist, sinks, one, *NO_TASK)
    if count <= SPLIT_MIN_ROWS:
        whole = np.full_like(one, np.nan)
        attend_sinks(q, kc, vc, rows, count, n_head, 0.125, 0.0, slopes, dist, sinks, whole)
        assert np.array_equal(whole.view(np.uint32), one.view(np.uint32))

    def run(out, ctrl, task):
        split_sinks(q, kc, vc, rows, count, n_head, 0.125, 0.0, slopes, dist, sinks, out, ctrl, task)

    _shared_matches_one_thread(decode_pool, run, one, _worker_expected(count, n_head, n_kv, hd, hd))


def test_ranges_reach_the_least_work():
    """Within one row chunk every kv head alone once its work reaches SHARE_MIN_WORK, fewer, wider ranges
    below, one for a single kv head; past one row chunk whole rows (one range)."""
    per_row = 3 * 128  # 3 query heads of hd = vd = 64
    assert kv_ranges(-(-SHARE_MIN_WORK // per_row), 1, 9, 3, 64, 64) == 3
    assert kv_ranges(-(-SHARE_MIN_WORK // per_row) // 2, 1, 9, 3, 64, 64) == 2  # two kv heads, then one
    assert kv_ranges(1, 1, 9, 3, 64, 64) == 1
    assert kv_ranges(300, 3, 8, 1, 64, 64) == 1
    assert kv_ranges(SPLIT_MIN_ROWS, 1, 48, 16, 128, 128) == 16
    assert kv_ranges(2 * 128, 2, 9, 3, 64, 64) == 1
    assert kv_ranges(200 * 128, 200, 32, 8, 128, 128) == 1
