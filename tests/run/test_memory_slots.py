"""archrun.run.cache's slot protocol: stateful slots (restored from kept copies) beside row slots, and
the generic layers asking the cache where it can return to."""

from __future__ import annotations

import pytest

from archrun.errors import InvalidRequest
from archrun.run.cache import KvCache, PrefixCache, restore_point, rewind_to


class Rows:
    """A K/V slot: truncates anywhere."""

    nbytes = 10


class State:
    """A stateful slot keeping the last `reach` lengths and explicit checkpoints."""

    nbytes = 4

    def __init__(self, reach: int):
        self.reach, self.n, self.saved, self.cleared = reach, 0, set(), 0

    def write(self, n):  # what an op does during a step
        self.n = n

    @property
    def rewind_reach(self):
        return min(self.reach, self.n)

    @property
    def checkpoints(self):
        return tuple(self.saved)

    def can_restore(self, length):
        return self.n - length <= self.reach or length in self.saved

    def rewind_to(self, length):
        self.n = length

    def checkpoint(self, length):
        self.saved.add(length)

    def clear(self):
        self.n, self.cleared = 0, self.cleared + 1


def _cache(reach=2):
    state = State(reach)
    return KvCache([Rows(), state], 100), state


def _step(cache, state, n):
    state.write(len(cache) + n)
    cache.advance(n)


def test_stateful_slot_bounds_the_rewind_and_checkpoints_extend_it():
    cache, state = _cache()
    _step(cache, state, 10)
    assert cache.max_rewind == 2 and cache.restore_point(8) == 8 and cache.restore_point(7) == 0
    cache.checkpoint()
    _step(cache, state, 10)
    assert cache.restore_point(15) == 10 and cache.nbytes == 14
    cache.rewind(10)
    assert len(cache) == 10 and state.n == 10
    with pytest.raises(InvalidRequest, match="recurrent"):
        cache.rewind(5)
    cache.rewind(10)                       # to 0: a clear
    assert state.cleared == 1 and len(cache) == 0


def test_prefix_cache_checkpoints_where_the_prompt_ends_and_recomputes_from_there():
    cache, state = _cache()
    pc = PrefixCache(cache)
    prompt = list(range(12))
    assert pc.prepare(prompt) == prompt
    for a in range(0, 12, 5):              # fed in chunks, as the server does
        feed = prompt[a:a + 5]
        _step(cache, state, len(feed))
        pc.fed(feed)
    assert state.saved == {12}
    for t in (50, 51, 52, 53):             # the reply
        _step(cache, state, 1)
        pc.fed([t])
    assert pc.prepare([*prompt, 60, 61, 62]) == [60, 61, 62] and pc.recomputed == 3 and len(cache) == 12


def test_restore_point_of_a_cache_that_only_states_max_rewind():
    class Plain:
        max_rewind = 3

        def __init__(self):
            self.n = 10

        def __len__(self):
            return self.n

        def rewind(self, n):
            self.n -= n

        def clear(self):
            self.n = 0

    plain = Plain()
    assert restore_point(plain, 7) == 7 and restore_point(plain, 6) == 0
    assert rewind_to(plain, 8) == 8 and len(plain) == 8
    assert rewind_to(plain, 2) == 0 and len(plain) == 0


def test_a_pair_slot_rewinds_as_its_mixer_does():
    from archrun.run.cache import PairSlot

    state = State(2)
    pair = PairSlot(Rows(), state)
    cache = KvCache([pair], 100)
    _step(cache, state, 10)
    assert pair.nbytes == 14 and cache.max_rewind == 2 and cache.restore_point(5) == 0
    cache.checkpoint()
    _step(cache, state, 5)
    assert cache.restore_point(12) == 10
    cache.rewind(5)
    assert state.n == 10
    cache.clear()
    assert state.cleared == 1
