"""KvCache: the interpreter's per-sequence cache. Each layer's slot is made by its attention op.

Rewind is O(1): it only moves the length; the rows past it are overwritten by later steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from archrun.errors import ContextOverflow, InvalidRequest


class KvCache:
    """Per-layer slots (layout declared by each layer's attention op) plus the cached length."""

    def __init__(self, slots: Sequence[Any], capacity: int):
        self.slots = list(slots)
        self.capacity = capacity
        self._n = 0

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

    @property
    def max_rewind(self) -> int:
        """How many tokens can be rewound exactly (bounded by ring-buffer slots of windowed layers)."""
        limits = [s.max_rewind for s in self.slots if getattr(s, "max_rewind", None) is not None]
        return min([self._n, *limits])

    def rewind(self, n: int) -> None:
        """Forget the last n tokens (O(1))."""
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= self._n:
            raise InvalidRequest(f"cannot rewind {n!r} tokens from a cache holding {self._n}")
        if n > self.max_rewind:
            raise InvalidRequest(f"cannot rewind {n} tokens: sliding-window layers keep only "
                                 f"{self.max_rewind} tokens of history beyond their window")
        self._n -= n

    def clear(self) -> None:
        """Forget everything."""
        self._n = 0
