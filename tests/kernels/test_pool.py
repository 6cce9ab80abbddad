"""The decode worker pool (kernels.decode.pool, kernels.atomics): products shared with spinning workers.

A pooled product runs the same kernels on the same row groups as a single thread, only split
into chunks claimed by whichever thread is free, so its result must be bit-identical; the
workers must really take part (the statistic of chunks they computed), a busy pool must be
refused rather than shared, and collected pools must stop their threads. The model-level test
needs two numba threads (it runs in the bounds-checked two-thread pass of `make test`).
"""

from __future__ import annotations

import gc
import threading
import time

import numba
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T
from support.gguf_fixtures import random_quant_tensor
from support.pool_check import assert_pool_matches_one_thread

from archrun.kernels import atomics
from archrun.kernels.decode import block, layer, pool
from archrun.kernels.matmul import dots, qmatrix

pytestmark = pytest.mark.skipif(not pool.enabled(), reason="the pool needs the JIT (its atomics are intrinsics)")


def _matrix(rng, t, n_out, n_in):
    if t == T.F32:
        raw = (rng.standard_normal((n_out, n_in)) * 0.1).astype(np.float32).view(np.uint8)
    elif t == T.F16:
        raw = (rng.standard_normal((n_out, n_in)) * 0.1).astype(np.float16).view(np.uint8)
    else:
        raw = random_quant_tensor(rng, t, (n_out, n_in)).data.reshape(n_out, -1)
    return qmatrix.prepare(np.ascontiguousarray(raw), int(t), n_in)


def _group(rng, types, n_outs, n_in, bias=False):
    us = [block.uniform(_matrix(rng, t, n, n_in), rng.standard_normal(n).astype(np.float32) if bias else None)
          for t, n in zip(types, n_outs, strict=True)]
    return tuple(us + [block.absent_matrix()] * (3 - len(us)))


def test_atomics():
    from numba import njit

    from archrun.kernels import atomics

    @njit
    def run(a):
        atomics.store(a, 0, 5)
        old = atomics.add(a, 0, 3)
        swapped = atomics.cas(a, 0, 8, 11)
        refused = atomics.cas(a, 0, 8, 12)
        atomics.pause()
        return old, swapped, refused, atomics.load(a, 0), atomics.ticks() >= 0

    a = np.zeros(4, np.int64)
    assert run(a) == (5, True, False, 11, True)
    assert a[0] == 11


CASES = [
    ([T.Q4_1], [1536], 576, False),
    ([T.Q8_0, T.Q8_0, T.Q8_0], [512, 128, 128], 512, True),  # q, k, v with biases
    ([T.Q4_K, T.Q6_K], [768, 768], 256, False),
    ([T.Q5_0], [700], 896, False),                          # rows not a multiple of the lane group
    ([T.F16], [512], 320, False),
    ([T.F32], [300], 256, True),
]


def _reference(group, x, n_out):
    ref = np.empty((1, n_out), np.float32)
    block.pooled_product(pool.NO_POOL, 0, group, x, ref, 1)  # no pool: product_rows on this thread
    assert np.isfinite(ref).all()
    return ref


@pytest.mark.parametrize(("types", "n_outs", "n_in", "bias"), CASES, ids=lambda v: str(v))
def test_pooled_product_is_bit_identical(types, n_outs, n_in, bias):
    rng = np.random.default_rng(sum(n_outs) + n_in)
    groups = [_group(rng, types, n_outs, n_in, bias), _group(rng, [T.Q4_0], [64], 64)]
    p = pool.DecodePool(groups, max_in=n_in, max_out=sum(n_outs), serve=layer.serve)
    p.warm_up()
    x = rng.standard_normal((1, n_in)).astype(np.float32)
    ref = _reference(groups[0], x, sum(n_outs))
    got = np.empty_like(ref)
    with p.running(2) as par:
        assert par is not pool.NO_POOL
        for _ in range(20):  # whoever is free computes each chunk: the same sums either way
            got[:] = np.nan
            block.pooled_product(par, 0, groups[0], x, got, 1)
            assert np.array_equal(got, ref)


@pytest.mark.parametrize(("types", "n_outs", "n_in", "bias"), CASES[:3], ids=lambda v: str(v))
def test_a_job_left_to_the_worker(types, n_outs, n_in, bias):
    """Published and not claimed by the caller: the worker computes every chunk, exactly."""
    rng = np.random.default_rng(7)
    group = _group(rng, types, n_outs, n_in, bias)
    p = pool.DecodePool([group], max_in=n_in, max_out=sum(n_outs), serve=layer.serve)
    p.warm_up()
    x = rng.standard_normal((1, n_in)).astype(np.float32)
    ref, n_chunks = _reference(group, x, sum(n_outs)), 5
    with p.running(2) as par:
        ctrl, pxf, xq, dq, hq, py = par
        xs, ys = pxf[:n_in].reshape(1, n_in), py[:sum(n_outs)].reshape(1, sum(n_outs))
        xs[:] = x
        X, DX, QH = pool.quantized_views(xq, dq, hq, 1, n_in)
        dots.quantize_act(xs, X, DX, QH)
        block.publish_product(ctrl, 0, n_chunks, xs, ys)
        deadline = time.monotonic() + 30
        while p.ctrl[pool.DONE] < n_chunks and time.monotonic() < deadline:
            p.wake(1)  # a worker that went back to sleep before the job came
            time.sleep(0.001)
        got = ys.copy()
    block._add_biases(group, got)
    assert p.worker_chunks == n_chunks
    assert np.array_equal(got, ref)


def test_a_product_takes_one_chunk_a_thread_and_only_heads_are_cut_finer():
    """Every chunk starts its streams cold: a group takes one contiguous chunk per thread, and only a group over
    POOL_CHUNK_BYTES a thread (an output head) is cut into chunks of about that size."""
    rng = np.random.default_rng(3)
    layer_group = _group(rng, [T.Q4_1, T.Q4_1], [1536, 1536], 576)  # ~1.2 MB: a gate/up pair
    assert block._group_bytes(layer_group) < 2 * block.POOL_CHUNK_BYTES
    assert [block._pool_chunks(layer_group, t) for t in (2, 3, 4)] == [2, 3, 4]
    head = _group(rng, [T.Q8_0], [8192], 2048)  # ~18 MB
    n = block._group_bytes(head) // block.POOL_CHUNK_BYTES
    assert n > 2 and block._pool_chunks(head, 2) == n and block._pool_chunks(head, 8) == 8


def test_small_or_unknown_products_stay_on_the_calling_thread():
    rng = np.random.default_rng(1)
    groups = [_group(rng, [T.Q4_0], [64], 64)]  # 2 KB of weights: below POOL_MIN_GROUP_BYTES
    p = pool.DecodePool(groups, 64, 64, layer.serve)
    x = rng.standard_normal((1, 64)).astype(np.float32)
    ref, got = np.empty((1, 64), np.float32), np.empty((1, 64), np.float32)
    block.pooled_product(pool.NO_POOL, 0, groups[0], x, ref, 1)
    with p.running(2) as par:
        block.pooled_product(par, 0, groups[0], x, got, 1)
        block.pooled_product(par, -1, groups[0], x, got, 1)  # no group id: not the pool's
        time.sleep(0.01)
    assert np.array_equal(got, ref) and p.worker_chunks == 0


def test_a_busy_pool_is_not_shared():
    rng = np.random.default_rng(2)
    p = pool.DecodePool([_group(rng, [T.Q8_0], [256], 256)], 256, 256, layer.serve)
    with p.running(2) as outer:
        with p.running(2) as inner:  # e.g. a second thread stepping the same model
            assert inner is pool.NO_POOL
        assert outer is not pool.NO_POOL
    with p.running(1) as single:
        assert single is pool.NO_POOL


def test_workers_stop_when_the_pool_is_collected():
    rng = np.random.default_rng(3)
    p = pool.DecodePool([_group(rng, [T.Q8_0], [256], 256)], 256, 256, layer.serve)
    with p.running(3):
        pass
    threads = list(p.threads)
    assert len(threads) == 2 and all(t.is_alive() for t in threads)
    del p
    gc.collect()
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads)


@pytest.mark.skipif(not atomics._X86, reason="the stall guard reads the x86 time-stamp counter")
def test_a_stalled_task_wait_backs_off():
    """A publisher that waited long for a task's chunks (a worker descheduled while holding one) computes the
    next BACKOFF_TASKS tasks alone, then shares again; a short wait starts no backoff."""
    ctrl = np.zeros(pool.CTRL_SIZE, np.int64)
    ctrl[pool.THREADS], ctrl[pool.DONE] = 2, 1
    pool.wait_task(ctrl, 1)  # done already: no wait, no backoff (and the wait is compiled before the timed one)
    assert pool.share_task(ctrl)
    ctrl[pool.DONE] = 0
    late = threading.Timer(0.05, lambda: ctrl.__setitem__(pool.DONE, 1))  # the chunk is done 50 ms later
    late.start()
    pool.wait_task(ctrl, 1)
    late.join()
    assert [pool.share_task(ctrl) for _ in range(pool.BACKOFF_TASKS + 1)] == [False] * pool.BACKOFF_TASKS + [True]


@pytest.fixture
def two_threads():
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs two numba threads (NUMBA_NUM_THREADS=1 here)")
    before = qmatrix.current_threads()
    yield
    qmatrix.set_threads(before)


def test_model_decode_on_the_pool_equals_one_thread(synth_model, two_threads):
    from support.fused import _model

    m = _model(synth_model, T.Q4_1)
    ids = [3, 1, 4, 1, 5, 9, 2, 6]

    def decode(threads):
        qmatrix.set_threads(threads)
        cache = m.init_cache(16)
        return [m.forward_step([t], cache) for t in ids]

    assert_pool_matches_one_thread(decode, lambda: m._decode._pool.worker_chunks)


@pytest.mark.parametrize("kv_type", ["f32", "q8_0"])
def test_long_context_attention_on_the_pool_equals_one_thread(synth_model, two_threads, kv_type):
    """Past SPLIT_MIN_ROWS cached tokens the attention part splits its keys into chunks that the pool's worker shares
    (a pool task): the logits are the bits of one thread, through one-token steps and a batch of rows."""
    from support.fused import _model

    m = _model(synth_model, T.Q4_1, n_ctx=2048)
    prompt = np.random.default_rng(5).integers(0, 96, size=1200).tolist()
    ids = [3, 1, 4, 1, 5]

    def decode(threads):
        qmatrix.set_threads(threads)
        cache = m.init_cache(1300, kv_type=kv_type)
        m.forward_step(prompt, cache)
        return [m.forward_step([t], cache) for t in ids]

    one = assert_pool_matches_one_thread(decode, lambda: m._decode._pool.worker_task_chunks)
    if kv_type == "f32":  # a span of rows (the rows kernel: f32 caches): each row is its one-token step
        for threads in (1, 2):
            qmatrix.set_threads(threads)
            cache = m.init_cache(1300)
            m.forward_step(prompt, cache)
            rows = m.forward_step_batch_spans([ids], [cache], all_logits=True)[0]
            assert np.array_equal(rows, np.stack(one))


def test_read_ahead_covers_every_line_of_a_group():
    """prefetch_group walks a group's arrays as one sequence of 64-byte lines (each array from a line boundary):
    its count is the arrays' lines, and any window of it is a hint that changes nothing."""
    rng = np.random.default_rng(5)
    group = _group(rng, [T.Q4_K, T.Q8_0], [96, 64], 256, bias=True)
    lines = sum(-(-a.nbytes // 64) for m in group for a in m[1:11] if isinstance(a, np.ndarray))
    assert block.prefetch_group(group, 0, 0) == lines
    before = [a.copy() for m in group for a in m[1:12] if isinstance(a, np.ndarray)]
    for lo, hi in ((0, lines), (3, 7), (lines - 1, lines + 100)):
        assert block.prefetch_group(group, lo, hi) == lines
    assert all(np.array_equal(a, b) for a, b in zip(before, [a for m in group for a in m[1:12]
                                                           if isinstance(a, np.ndarray)], strict=True))


def test_products_with_and_without_read_ahead_are_the_same_bits():
    rng = np.random.default_rng(6)
    groups = [_group(rng, [T.Q4_1, T.Q8_0], [512, 256], 576) for _ in range(3)]
    x = rng.standard_normal((1, 576)).astype(np.float32)
    refs = [_reference(g, x, 768) for g in groups]
    for read_ahead in (0, 64 << 10, 4 << 20):
        p = pool.DecodePool(groups, max_in=576, max_out=768, serve=layer.serve, read_ahead=read_ahead)
        p.warm_up()
        assert p.ctrl[pool.READ_AHEAD] == read_ahead // 64
        with p.running(2) as par:
            for _ in range(10):
                for gid, g in enumerate(groups):
                    got = np.full((1, 768), np.nan, np.float32)
                    block.pooled_product(par, gid, g, x, got, 1)
                    assert np.array_equal(got, refs[gid])
