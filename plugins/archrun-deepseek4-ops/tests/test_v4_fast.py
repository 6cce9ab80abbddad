"""attention="deepseek4"'s fast op (numba kernels) against its reference, and its bits: a row's output
depends on its inputs only (the same bits as a prompt, token by token, in chunks, and after a rewind)."""

from __future__ import annotations

import numpy as np
import pytest
from v4_layer import KINDS, archrun_layer, op_inputs, random_weights, run_op

from archrun.run.cache import KvCache
from archrun_deepseek4_ops.attention import FastV4Attention, V4Attention

F32 = np.float32
N = 41
SPANS = {"prompt": [slice(0, N)], "token_by_token": [slice(t, t + 1) for t in range(N)],
         "chunks": [slice(0, 3), slice(3, 13), slice(13, 14), slice(14, 30), slice(30, N)]}


def _setup(kind: int, seed: int = 0):
    w = random_weights(kind, seed)
    ref, fast = archrun_layer(w, V4Attention), archrun_layer(w, FastV4Attention)
    h = np.random.default_rng(seed + 100).standard_normal((N, 24)).astype(F32)
    return ref, fast, op_inputs(ref, h)


@pytest.mark.parametrize("spans", SPANS, ids=list(SPANS))
@pytest.mark.parametrize("kind", range(3), ids=KINDS)
def test_fast_equals_reference(kind, spans):
    ref, fast, x = _setup(kind)
    want = run_op(ref[1], x, SPANS["prompt"])
    got = run_op(fast[1], x, SPANS[spans])
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("kind", range(3), ids=KINDS)
def test_fast_bits_depend_on_the_row_only(kind):
    _, fast, x = _setup(kind, seed=1)
    op = fast[1]
    whole = run_op(op, x, SPANS["prompt"])
    for spans in ("token_by_token", "chunks"):
        np.testing.assert_array_equal(run_op(op, x, SPANS[spans]), whole)
    slot = op.new_slot(256, 16)  # a rewind: other rows fed past 20, then the true ones again
    cache = KvCache([slot], 256)
    run_op(op, x, [slice(0, 20)], slot)
    cache.advance(20)
    other = [np.flip(a[20:36], axis=0).copy() for a in x]
    np.concatenate([op(*(a[s] for a in other[:3]), slot, 20 + s.start, *(a[s] for a in other[3:]))
                    for s in (slice(0, 5), slice(5, 16))])
    cache.advance(16)
    cache.rewind(16)
    again = np.concatenate([op(*(a[20:N] for a in x[:3]), slot, 20, *(a[20:N] for a in x[3:]))])
    np.testing.assert_array_equal(again, whole[20:])
