"""StateSlot: a recurrent layer's per-sequence state, rewindable by restoring kept copies.

A recurrent state (a convolution window, a state-space or delta-rule state) is a running
function of every token so far: it cannot be truncated like K/V rows. The slot keeps

- `state`: the arrays after the slot's `n` tokens (name -> array; the op updates them in place);
- a ring of copies after each of the last `recent` tokens (`keep(length)`, called by the op for
  the last tokens of each step), so the last `rewind_reach` tokens rewind exactly (speculative
  decoding rejects drafts from its last step);
- up to `max_checkpoints` copies at chosen lengths (`checkpoint(length)`, forwarded by
  archrun.run.cache.KvCache when a prompt has been fed), which a chat's next turn or a longer
  rewind returns to, then recomputes from.

It implements the stateful-slot protocol of archrun.run.cache (`can_restore`, `rewind_to`,
`checkpoint`, `checkpoints`, `rewind_reach`, `clear`, `nbytes`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from archrun.errors import InvalidRequest

F32 = np.float32
MAX_CHECKPOINTS = 4  # copies of the state kept at checkpoints (the oldest goes first)


class StateSlot:
    """State arrays of `shapes` (name -> shape), zero at length 0, plus rewind copies."""

    def __init__(self, shapes: Mapping[str, tuple[int, ...]], recent: int, max_checkpoints: int = MAX_CHECKPOINTS):
        self.state = {k: np.zeros(s, F32) for k, s in shapes.items()}
        self.size = recent + 1   # ring rows: the states at lengths lo..hi (hi = n), row = length % size
        self._ring = {k: np.zeros((self.size, *s), F32) for k, s in shapes.items()}
        self._saved: dict[int, dict[str, np.ndarray]] = {}
        self.max_checkpoints = max_checkpoints
        self.n = 0
        self._lo = 0

    @property
    def nbytes(self) -> int:
        """Bytes of the state, its ring of recent copies and its checkpoints."""
        live = sum(a.nbytes for a in self.state.values()) + sum(a.nbytes for a in self._ring.values())
        return live + sum(a.nbytes for copy in self._saved.values() for a in copy.values())

    @property
    def state_bytes(self) -> int:
        """Bytes of one copy of the state."""
        return sum(a.nbytes for a in self.state.values())

    # -- written by the op ----------------------------------------------------------------------

    def begin(self, start: int) -> None:
        """A step starts at `start`: the state must be the one after `start` tokens."""
        if start == 0 and self.n:
            self.clear()
        if start != self.n:
            raise InvalidRequest(f"a recurrent state of {self.n} tokens cannot continue at position {start} "
                                 "(rewind the cache first)")

    def keep(self, length: int) -> None:
        """Copy the current state as the state after `length` tokens. Lengths skipped since the
        last kept one leave a gap: the ring's reach starts again at `length`."""
        row = length % self.size
        for k, a in self.state.items():
            self._ring[k][row] = a
        self._mark(length)

    def step_arrays(self, start: int) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
        """For a one-token step at `start` computed by a kernel (a fused decode layer): begin(start) and the
        bookkeeping of keep(start + 1), whose copy the kernel makes. Per state array, in the order of
        `state`: (the array, its ring row for start + 1); the kernel updates the array in place, then
        copies it into the row."""
        self.begin(start)
        row = (start + 1) % self.size
        arrays = tuple((a, self._ring[k][row]) for k, a in self.state.items())
        self._mark(start + 1)
        return arrays

    def _mark(self, length: int) -> None:
        """The ring holds the state after `length` tokens, the slot's length now."""
        if length != self.n + 1:
            self._lo = length
        self.n = length
        self._lo = max(self._lo, length - self.size + 1)

    def first_kept(self, start: int, end: int) -> int:
        """The first length a step over positions start..end-1 keeps a copy at (the ring holds the rest)."""
        return max(start + 1, end - self.size + 1)

    def end(self, length: int) -> None:
        """The step ended at `length` (keeps its final state if the op has not)."""
        if self.n != length:
            self.keep(length)

    # -- the stateful-slot protocol (archrun.run.cache) -----------------------------------------------

    @property
    def rewind_reach(self) -> int:
        """How many of the last tokens can be forgotten exactly (the ring's copies)."""
        return self.n - self._lo

    @property
    def checkpoints(self) -> tuple[int, ...]:
        """Lengths whose state is kept beyond the ring."""
        return tuple(sorted(self._saved))

    def can_restore(self, length: int) -> bool:
        """Whether the state after `length` tokens can be restored."""
        return length == 0 or self._lo <= length <= self.n or length in self._saved

    def rewind_to(self, length: int) -> None:
        """Restore the state after `length` tokens (can_restore(length) must hold)."""
        if length == 0:
            self.clear()
        elif self._lo <= length <= self.n:
            for k, a in self.state.items():
                a[...] = self._ring[k][length % self.size]
        elif length in self._saved:
            for k, a in self.state.items():
                a[...] = self._saved[length][k]
            self._lo = length
            self.keep(length)
        else:
            raise InvalidRequest(f"a recurrent state of {self.n} tokens keeps no copy at {length} tokens")
        self.n = length
        for p in [p for p in self._saved if p > length]:
            del self._saved[p]

    def checkpoint(self, length: int) -> None:
        """Keep the current state (after `length` tokens) until it is among the oldest beyond
        max_checkpoints."""
        if length != self.n or length == 0 or length in self._saved:
            return
        self._saved[length] = {k: a.copy() for k, a in self.state.items()}
        while len(self._saved) > self.max_checkpoints:
            del self._saved[min(self._saved)]

    def clear(self) -> None:
        """Forget everything: the zero state at length 0."""
        for a in self.state.values():
            a[...] = 0.0
        for r in self._ring.values():
            r[0] = 0.0
        self._saved.clear()
        self.n = 0
        self._lo = 0
