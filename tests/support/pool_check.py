"""Shared check for pooled decode tests (a plain module: `conftest` names collide across test dirs)."""

from __future__ import annotations


def assert_pool_matches_one_thread(decode, worker_count) -> list:
    """decode(threads) -> logits arrays: two threads give the bits of one, and the pool's worker took part
    (worker_count() > 0) within 20 tries (the worker is woken at each step's start). Returns one thread's."""
    import numpy as np

    one = decode(1)
    for _ in range(20):
        two = decode(2)
        for a, b in zip(one, two, strict=True):
            assert np.array_equal(a, b)
        if worker_count():
            break
    assert worker_count() > 0
    return one
