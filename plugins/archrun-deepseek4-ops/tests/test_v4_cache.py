"""attention="deepseek4"'s cache slot: the bytes a token adds (what `archrun inspect` shows) and rewinds
through archrun's KvCache: returning to any length within reach (mid-window, at a window's close, past
several windows) and decoding on gives the very bits of a cache that never went past it."""

from __future__ import annotations

import numpy as np
import pytest
from v4_layer import CSA, DI, HCA, HD, KINDS, WINDOW, archrun_layer, hf_layers, run, weights

from archrun.errors import InvalidRequest
from archrun.run.cache import KvCache

F32 = np.float32
N, REWIND = 40, 16


@pytest.fixture(scope="module")
def layers():
    cfg, attn = hf_layers()
    return [archrun_layer(weights(a)) for a in attn]


def _per_token(op, n_ctx: int) -> tuple[int, int]:
    """(bytes per token, fixed bytes) as archrun inspect measures them (archrun.describe.inspect)."""
    full, less = op.new_slot(n_ctx, 0), op.new_slot(n_ctx - 1, 0)
    return full.nbytes - less.nbytes, full.nbytes - (full.nbytes - less.nbytes) * n_ctx


def test_memory_per_token(layers):
    """Sliding layers hold a ring of window rows (nothing per token); compressed layers add hd / m floats a
    token (CSA also Di / m for the indexer's entries) beside their ring of rows."""
    (_, sliding, _), (_, csa, _), (_, hca, _) = layers
    assert _per_token(sliding, 4096) == (0, WINDOW * HD * 4 + WINDOW * 8)
    assert _per_token(csa, 4096)[0] == (HD + DI) * 4 // CSA
    assert _per_token(hca, 4096)[0] == HD * 4 // HCA
    ring = max(WINDOW, 2 * CSA)
    assert _per_token(csa, 4096)[1] == ring * (HD + 4 * HD + 4 * DI) * 4 + ring * 8
    small = csa.new_slot(5, 64)  # a ring no smaller than the capacity: rewinds anywhere
    assert small.size == 5 and small.max_rewind is None
    assert csa.new_slot(4096, 64).max_rewind == 64


def _state(slot) -> dict[str, np.ndarray]:
    return {k: v.copy() for k, v in vars(slot).items() if isinstance(v, np.ndarray)}


@pytest.mark.parametrize("kind", range(3), ids=KINDS)
@pytest.mark.parametrize("length", [9, 12, 16, 17, 23])
def test_rewind_gives_the_bits_of_never_going_past(layers, kind, length):
    """Feed [0, length), then other tokens up to `length + REWIND`, rewind to `length` and feed the true
    rest: the outputs and the slot's rows and entries equal those of feeding [0, length) then the rest."""
    layer = layers[kind]
    op = layer[1]
    rng = np.random.default_rng(length)
    h = rng.standard_normal((N, 24)).astype(F32)
    other = rng.standard_normal((REWIND, 24)).astype(F32)
    spans = [slice(0, length)]
    rest = [slice(0, 5), slice(5, 6), slice(6, N - length)]

    slot = op.new_slot(64, REWIND)
    cache = KvCache([slot], 64)
    run(layer, h, spans, slot)
    cache.advance(length)
    run(layer, other, [slice(0, 7), slice(7, REWIND)], slot, start=length)
    cache.advance(REWIND)
    assert cache.can_restore(length) and cache.max_rewind == REWIND
    cache.rewind(REWIND)
    got, _ = run(layer, h[length:], rest, slot, start=length)

    fresh = op.new_slot(64, REWIND)
    run(layer, h, spans, fresh)
    want, _ = run(layer, h[length:], rest, fresh, start=length)
    np.testing.assert_array_equal(got, want)
    mine, theirs = _state(slot), _state(fresh)
    for name in ("entries", "index_entries"):
        if name in mine:
            np.testing.assert_array_equal(mine[name][:N // op.ratio], theirs[name][:N // op.ratio])
    held = slot.pos >= 0
    assert sorted(slot.pos[held]) == sorted(fresh.pos[fresh.pos >= 0])
    for name in ("kv", "ckv", "cgate", "ikv", "igate"):
        if name in mine:
            by_pos = dict(zip(slot.pos[held], mine[name][held], strict=True))
            for p, row in zip(fresh.pos[fresh.pos >= 0], theirs[name][fresh.pos >= 0], strict=True):
                np.testing.assert_array_equal(by_pos[p], row)


def test_rewind_past_the_ring_is_refused(layers):
    """KvCache refuses a rewind past the ring's reach; the op refuses to continue where it holds no rows."""
    layer = layers[1]
    op = layer[1]
    h = np.random.default_rng(0).standard_normal((N, 24)).astype(F32)
    slot = op.new_slot(64, 4)
    cache = KvCache([slot], 64)
    run(layer, h, [slice(0, N)], slot)
    cache.advance(N)
    assert cache.max_rewind == 4 and not cache.can_restore(N - 5) and cache.restore_point(N - 5) == 0
    with pytest.raises(InvalidRequest):
        run(layer, h[:1], [slice(0, 1)], slot, start=N + 3)
    with pytest.raises(InvalidRequest):
        run(layer, h[:1], [slice(0, 1)], slot, start=N - 20)


@pytest.mark.parametrize("kind", range(3), ids=KINDS)
def test_a_cleared_cache_forgets_the_previous_sequence(layers, kind):
    """KvCache.clear() leaves the ring's rows in place: a new sequence from position 0 never reads them."""
    layer = layers[kind]
    op = layer[1]
    rng = np.random.default_rng(kind)
    old, new = (rng.standard_normal((N, 24)).astype(F32) for _ in range(2))
    slot = op.new_slot(64, 4)
    cache = KvCache([slot], 64)
    run(layer, old, [slice(0, N)], slot)
    cache.advance(N)
    cache.clear()
    spans = [slice(0, 9), slice(9, 10), slice(10, 27)]
    got, _ = run(layer, new, spans, slot)
    want, _ = run(layer, new, spans, op.new_slot(64, 4))
    np.testing.assert_array_equal(got, want)
