"""Sliding-window layers keep a ring-buffer KV bounded by the window (tiny gemma3 fixtures from HF)."""

import numpy as np
import pytest
from support.tiny import TINY, fixtures, golden

import archrun
from archrun.conformance.hf import rel_err

NAMES = fixtures("gemma3")


@pytest.fixture(scope="module", params=NAMES)
def gemma(request):
    return request.param, archrun.load(TINY[request.param])


def sliding_bytes(model, cache):
    return sum(s.nbytes for s, lp in zip(cache.slots, model.plan.layers, strict=True) if lp.spec.attention.window)


def test_sliding_layers_exist_and_window_is_small(gemma):
    _, model = gemma
    windows = {lp.spec.attention.window for lp in model.plan.layers}
    assert 0 in windows and max(windows) <= 8  # both kinds; window crossed by 40 tokens


def test_sliding_memory_is_constant_beyond_the_window(gemma):
    _, model = gemma
    small, big = model.init_cache(100, max_rewind=4), model.init_cache(200, max_rewind=4)
    assert sliding_bytes(model, small) == sliding_bytes(model, big) > 0
    assert small.nbytes < big.nbytes  # global layers do grow


def test_token_by_token_through_the_ring_matches_hf(gemma):
    name, model = gemma
    ids, ref = golden(name)
    cache = model.init_cache(len(ids), max_rewind=2)
    steps = np.stack([model.forward_step([t], cache) for t in ids])
    assert rel_err(steps, ref) <= 1e-4
    chunked = model.init_cache(len(ids), max_rewind=2)
    parts = [model.forward_step(ids[i:i + 13], chunked, all_logits=True) for i in range(0, len(ids), 13)]
    assert rel_err(np.concatenate(parts), ref) <= 1e-4


def test_rewind_across_the_wrap_equals_recomputation(gemma):
    name, model = gemma
    ids, ref = golden(name)
    cache = model.init_cache(len(ids), max_rewind=5)
    model.forward_step(ids[:30], cache)             # ring of window+5 rows has wrapped several times
    cache.rewind(5)
    again = model.forward_step(ids[25:], cache, all_logits=True)
    assert rel_err(again, ref[25:]) <= 1e-4
    with pytest.raises(archrun.InvalidRequest, match="sliding-window"):
        cache.rewind(6)


def test_rewind_reach_shrinks_after_a_rewind_and_shorter_rewrite(gemma):
    name, model = gemma
    ids, ref = golden(name)
    cache = model.init_cache(len(ids), max_rewind=5)
    model.forward_step(ids[:30], cache)
    cache.rewind(5)
    model.forward_step(ids[25:27], cache)   # rows of positions 27..29 displaced older ones
    assert cache.max_rewind == 2
    with pytest.raises(archrun.InvalidRequest, match="sliding-window"):
        cache.rewind(3)
    cache.rewind(2)
    again = model.forward_step(ids[25:], cache, all_logits=True)
    assert rel_err(again, ref[25:]) <= 1e-4


def test_prefix_cache_recomputes_where_the_window_forbids_reuse(gemma):
    from archrun.run.cache import PrefixCache

    name, model = gemma
    ids, ref = golden(name)
    pc = PrefixCache(model.init_cache(len(ids), max_rewind=3))
    feed = pc.prepare(ids[:30])
    model.forward_step(feed, pc.cache)
    pc.fed(feed)
    assert pc.prepare([*ids[:28], 1]) == [1]            # 2 tokens back: within reach
    assert len(pc.cache) == 28
    feed = pc.prepare(ids[:20])                         # 8 back: past the ring's reach, start over
    assert feed == list(ids[:20]) and len(pc.cache) == 0
    logits = model.forward_step(feed, pc.cache)
    assert rel_err(logits, ref[19]) <= 1e-4
