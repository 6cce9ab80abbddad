"""KvCache: the interpreter's per-sequence cache. Each layer's slot is made by its attention op.

Rewind is O(1): it only moves the length; the rows past it are overwritten by later steps.
`PrefixCache` pairs any Decoder cache with the token ids it holds, so a new prompt that shares
a prefix with them (the next chat turn, a shared system prompt) only computes what differs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from archrun.errors import ContextOverflow, InvalidRequest, shown


class KvCache:
    """Per-layer slots (layout declared by each layer's attention op) plus the cached length."""

    def __init__(self, slots: Sequence[Any], capacity: int):
        self.slots = list(slots)
        self.capacity = capacity
        self._n = 0
        self._peak = 0  # the longest length reached since the last clear (ring slots lose rows past it)

    def __len__(self) -> int:
        return self._n

    @property
    def nbytes(self) -> int:
        """Bytes held by all slots."""
        return sum(getattr(s, "nbytes", 0) for s in self.slots)

    def check_room(self, n: int) -> None:
        """Raise ContextOverflow unless n more tokens fit."""
        if self._n + n > self.capacity:
            raise ContextOverflow(
                f"{self._n} cached + {n} new tokens exceed the cache capacity of {self.capacity} tokens"
            )

    def advance(self, n: int) -> None:
        """Record that n more tokens were written (called by the interpreter after a step)."""
        self.check_room(n)
        self._n += n
        self._peak = max(self._peak, self._n)

    @property
    def max_rewind(self) -> int:
        """How many tokens can be rewound exactly (bounded by ring-buffer slots of windowed layers).

        A ring slot keeps its window plus `max_rewind` rows. Once the sequence has been longer
        than it is now (a rewind, then fewer tokens written), the rows of the forgotten tokens
        displaced older ones, so the reach shrinks by that difference until the next clear.
        """
        lost = self._peak - self._n
        limits = [s.max_rewind - lost for s in self.slots if getattr(s, "max_rewind", None) is not None]
        return max(0, min([self._n, *limits]))

    def rewind(self, n: int) -> None:
        """Forget the last n tokens (O(1))."""
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= self._n:
            raise InvalidRequest(f"cannot rewind {shown(n)} tokens from a cache holding {self._n}")
        if n > self.max_rewind:
            raise InvalidRequest(f"cannot rewind {n} tokens: sliding-window layers keep only "
                                 f"{self.max_rewind} tokens of history beyond their window")
        self._n -= n

    def clear(self) -> None:
        """Forget everything."""
        self._n = 0
        self._peak = 0


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id sequences."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class PrefixCache:
    """A Decoder cache plus the token ids it holds (`len(ids) == len(cache)` between steps).

    `prepare(prompt)` keeps the longest prefix the cache shares with `prompt` (rewinding the
    rest, O(1)) and returns the ids still to compute; where the cache cannot rewind that far
    (sliding-window layers keep only a few rows beyond their window) it starts over instead,
    so reuse is never wrong. At least the prompt's last token is always left to compute: its
    logits are what the next token is sampled from.
    """

    def __init__(self, cache: Any):
        self.cache = cache
        self.ids: list[int] = []

    @property
    def capacity(self) -> int:
        """Tokens the cache can hold."""
        return self.cache.capacity

    def prepare(self, prompt: Sequence[int]) -> list[int]:
        """Rewind to the prefix shared with `prompt`; return the suffix of `prompt` to feed."""
        prompt = [int(t) for t in prompt]
        keep = min(common_prefix(self.ids, prompt), len(prompt) - 1)
        drop = len(self.ids) - keep
        if drop > self.cache.max_rewind:
            self.cache.clear()
            keep = 0
        else:
            self.cache.rewind(drop)
        del self.ids[keep:]
        return prompt[keep:]

    def fed(self, ids: Sequence[int]) -> None:
        """Record ids the model just appended to the cache."""
        self.ids.extend(int(t) for t in ids)

    def reset(self) -> None:
        """Forget everything (after a failed step, the cache's contents are unknown)."""
        self.cache.clear()
        self.ids.clear()
