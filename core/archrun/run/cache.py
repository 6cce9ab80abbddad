"""KvCache: the interpreter's per-sequence memory. Each layer's slot is made by its block op.

A slot is whatever per-sequence state its op keeps: K/V rows, a ring of the last rows (sliding
windows), a recurrent state tensor, a convolution window. Slots say how they rewind, and the
cache answers for all of them:

- a slot without rewind attributes keeps one row per token (K/V): it truncates to any length
  (O(1): the cache only moves its length; later steps overwrite the rows past it);
- `max_rewind` (int): a ring keeping its window plus `max_rewind` rows: the last that many tokens
  can be forgotten exactly (the cache tracks how far, see `KvCache.max_rewind`);
- `can_restore(length) -> bool` and `rewind_to(length)`: state that cannot be truncated (a
  recurrent state is a running sum). Such a slot keeps copies of its state — after each of its
  last few tokens, and at checkpoints (`checkpoint(length)`, which the cache forwards) — and
  restores one of them; `rewind_reach` says how many of the last tokens it can forget exactly.
- `clear()`: forget everything; `nbytes`: bytes held.

Generic layers never assume a rewind: they ask `restore_point(length)` for the longest prefix
of at most `length` tokens the cache can return to, rewind there and recompute the rest.
`PrefixCache` pairs any Decoder cache with the token ids it holds, so a new prompt that shares
a prefix with them (the next chat turn, a shared system prompt) only computes what differs.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from archrun.errors import ContextOverflow, InvalidRequest, KvTypeUnsupported, ModelMismatch, check_count, shown

KV_TYPES = ("f32", "f16", "q8_0")  # K/V row formats init_cache knows by name (each op says which it stores)


def kv_options(kv_type: Any) -> dict[str, str]:
    """init_cache's keyword for kv_type ({} for f32, so a Decoder without kv types is called as before);
    KvTypeUnsupported for a name that is not a kv type."""
    if not isinstance(kv_type, str) or kv_type not in KV_TYPES:
        raise KvTypeUnsupported(f"kv_type must be one of {', '.join(KV_TYPES)}, got {shown(kv_type)}")
    return {} if kv_type == "f32" else {"kv_type": kv_type}


@attrs.frozen
class CacheOwner:
    """The identity and geometry of the model that made a cache (`Decoder.cache_owner`).

    `key` names the model: its file (device, inode, size, modification time) and its descriptor
    (block style aside), so the same file loaded again, on either backend, makes caches the other
    accepts (the tiered start switches backends mid-generation); `geometry` is what shapes its slots:
    the layer count and each layer's (attention kind, KV heads, key width, value width, window).
    """

    name: str                  # the model file's name, for messages
    key: str
    geometry: tuple

    def describe(self) -> str:
        """'NAME (L layers, KV heads x key/value widths ...)' for error messages."""
        kinds = dict.fromkeys(f"{kv}x{hd}/{vd}{f' window {w}' if w else ''}" for _, kv, hd, vd, w in self.geometry)
        return f"{self.name!r} ({len(self.geometry)} layers, KV heads x key/value widths {', '.join(kinds)})"


def _held(entry: tuple) -> Any:
    """The array a seal entry's holder holds now under its name."""
    return entry[1].get(entry[2])


def _signature(a: np.ndarray) -> tuple:
    """What a kernel relies on in an array besides its identity: shape, strides, dtype, writable."""
    return a.shape, a.strides, a.dtype, a.flags.writeable


def _seal(slots: Sequence[Any]) -> tuple:
    """What a cache's slots hold when made: (layer, holder, name, array, signature) of
    every numpy array a slot keeps as an attribute, in a dict attribute (a recurrent state's arrays) or in a
    slot it holds (PairSlot). `KvCache.verify` compares them: the kernels read and write these arrays by
    address and do not bounds-check, so an array replaced, resized or made non-contiguous is refused."""
    out = []

    def walk(layer: int, obj: Any, depth: int) -> None:
        held = getattr(obj, "__dict__", None)
        if not isinstance(held, dict):
            return
        for name, value in held.items():
            if isinstance(value, np.ndarray):
                out.append((layer, held, name, value, _signature(value)))
            elif isinstance(value, dict):
                for key, item in value.items():
                    if isinstance(item, np.ndarray):
                        out.append((layer, value, key, item, _signature(item)))
            elif depth < 2 and not isinstance(value, type) and hasattr(value, "__dict__") and hasattr(value, "nbytes"):
                walk(layer, value, depth + 1)  # a slot held by a slot (PairSlot's attention and mixer)

    for i, slot in enumerate(slots):
        walk(i, slot, 0)
    return tuple(out)


class KvCache:
    """Per-layer slots (layout declared by each layer's block op) plus the cached length.

    `owner` (a CacheOwner) is the model that made it (init_cache); every step of a model first
    checks it (`verify`): the same model (its file and geometry), the very slots and slot arrays
    made then, with their shapes, dtypes and strides. Checked once per step, a few comparisons a layer.
    """

    def __init__(self, slots: Sequence[Any], capacity: int, kv_type: str = "f32", owner: CacheOwner | None = None):
        self.slots = list(slots)
        self.capacity = capacity
        self.kv_type = kv_type  # how the slots store K/V rows (init_cache's kv_type)
        self.owner = owner
        self._n = 0
        self._peak = 0  # the longest length reached since the last clear (ring slots lose rows past it)
        self._stateful = [s for s in self.slots if callable(getattr(s, "can_restore", None))]
        self._made = (tuple(self.slots), capacity, kv_type, owner, _seal(self.slots))
        self._arrays = ([a for *_, a, _ in self._made[4]], [sig for *_, sig in self._made[4]])

    def verify(self, owner: CacheOwner | None = None) -> None:
        """Raise ModelMismatch unless this cache was made by `owner`'s model (when given) and still holds
        the slots and slot arrays it was made with (the same objects, shapes, dtypes and strides)."""
        slots, capacity, kv_type, made_by, seal = self._made
        if owner is not None and made_by is not owner and made_by != owner:
            if made_by is None:
                raise ModelMismatch(f"this cache was not made by a model's init_cache; model {owner.describe()} "
                                    "runs only on caches it made")
            if made_by.geometry != owner.geometry:
                raise ModelMismatch(f"this cache was made by model {made_by.describe()}, whose layers differ from "
                                    f"model {owner.describe()}'s: make one with this model's init_cache()")
            raise ModelMismatch(f"this cache was made by model {made_by.describe()}, not by {owner.describe()} "
                                "(same geometry, other weights): make one with this model's init_cache()")
        if (self.owner is not made_by or self.capacity != capacity or self.kv_type != kv_type
                or type(self._n) is not int or not 0 <= self._n <= capacity or len(self.slots) != len(slots)
                or any(a is not b for a, b in zip(self.slots, slots, strict=True))):
            raise ModelMismatch("this cache's slots, capacity, kv type or length were replaced after it was made "
                                "(make a new one with init_cache())")
        arrays, signatures = self._arrays
        if (any(map(operator.is_not, map(_held, seal), arrays))
                or list(map(_signature, arrays)) != signatures):  # one pass each: ~0.5 us an array
            for layer, holder, name, arr, signature in seal:
                if holder.get(name) is not arr or _signature(arr) != signature:
                    shape, strides, dtype, writeable = signature
                    raise ModelMismatch(f"layer {layer}'s cache array {name!r} was replaced or changed after the "
                                        f"cache was made (made as {dtype} {list(shape)}, strides {list(strides)}"
                                        f"{'' if writeable else ', read-only'}; make a new cache with init_cache())")

    def __len__(self) -> int:
        n = self._n
        if type(n) is not int or n < 0:
            raise ModelMismatch(f"this cache's length was replaced after it was made ({shown(n)}); make a new one")
        return n

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
        """How many of the last tokens can be forgotten exactly, to any length in between.

        A ring slot keeps its window plus `max_rewind` rows. Once the sequence has been longer
        than it is now (a rewind, then fewer tokens written), the rows of the forgotten tokens
        displaced older ones, so the reach shrinks by that difference until the next clear.
        A stateful slot states its own reach (`rewind_reach`: the states it keeps).
        """
        lost = self._peak - self._n
        limits = [s.max_rewind - lost for s in self.slots
                  if getattr(s, "max_rewind", None) is not None and s not in self._stateful]
        limits += [s.rewind_reach for s in self._stateful]
        return max(0, min([self._n, *limits]))

    def _ring_reaches(self, length: int) -> bool:
        """Whether every ring slot still holds what a cache of `length` tokens needs."""
        lost = self._peak - self._n
        return all(self._n - length <= s.max_rewind - lost for s in self.slots
                   if getattr(s, "max_rewind", None) is not None and s not in self._stateful)

    def can_restore(self, length: int) -> bool:
        """Whether the cache can return exactly to its first `length` tokens (0 always: a clear)."""
        length = check_count("length", length)
        if length == self._n or length == 0:
            return True
        if not 0 < length < self._n or not self._ring_reaches(length):
            return False
        return all(s.can_restore(length) for s in self._stateful)

    def restore_point(self, length: int) -> int:
        """The longest length <= `length` the cache can return to exactly (0: only a clear).

        Where the last tokens can be rewound one by one that is `length` itself; beyond that, the
        latest checkpoint the stateful slots all keep (a recomputation from there costs
        `length - restore_point(length)` tokens).
        """
        length = min(check_count("length", length), self._n)
        if self._n - length <= self.max_rewind or self.can_restore(length):
            return length
        kept = {p for s in self._stateful for p in getattr(s, "checkpoints", ())}
        return max((p for p in kept if p < length and self.can_restore(p)), default=0)

    def rewind(self, n: int) -> None:
        """Forget the last n tokens: O(1) for rows, a state copy for stateful slots.

        `n` must lead to a length the cache can restore (`restore_point(len(self) - n)`).
        """
        self.verify()
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= self._n:
            raise InvalidRequest(f"cannot rewind {shown(n)} tokens from a cache holding {self._n}")
        target = self._n - n
        if target == 0:
            self.clear()
            return
        if not self.can_restore(target):
            raise InvalidRequest(f"cannot rewind {n} tokens: sliding-window layers and recurrent states keep "
                                 f"{self.max_rewind} tokens of history (the nearest point the cache can return "
                                 f"to is {self.restore_point(target)} tokens)")
        for s in self._stateful:
            s.rewind_to(target)
        self._n = target

    def checkpoint(self) -> None:
        """Keep the current state as a restore point (stateful slots copy theirs; rows need nothing)."""
        self.verify()
        for s in self._stateful:
            s.checkpoint(self._n)

    def clear(self) -> None:
        """Forget everything."""
        for s in self._stateful:
            s.clear()
        self._n = 0
        self._peak = 0

    def copy_from(self, other: KvCache) -> bool:
        """Take the contents of `other`, a cache of the same model and geometry (one prompt's KV shared by
        several sequences); False, and nothing copied, when the two differ in anything but their arrays'
        contents (another model, capacity or kv type, recurrent state, slot fields)."""
        self.verify()
        other.verify()
        mine, theirs = self._arrays[0], other._arrays[0]
        same = (self.owner is other.owner or self.owner == other.owner) and not self._stateful and \
            (self.capacity, self.kv_type, len(mine)) == (other.capacity, other.kv_type, len(theirs)) and \
            self._arrays[1] == other._arrays[1] and list(map(_fields, self.slots)) == list(map(_fields, other.slots))
        if not same:
            return False
        for a, b in zip(mine, theirs, strict=True):
            np.copyto(a, b)
        self._n, self._peak = other._n, other._peak
        return True


def _fields(slot: Any) -> dict[str, Any]:
    """A slot's plain fields (numbers, strings, None): what its arrays' contents mean depends on them."""
    return {k: v for k, v in getattr(slot, "__dict__", {}).items() if v is None or isinstance(v, int | float | str)}


class PairSlot:
    """The slots of a block whose attention has a token mixer beside it: rows (`attention`) and a
    stateful slot (`mixer`). It rewinds as its mixer does (rows truncate anywhere)."""

    def __init__(self, attention: Any, mixer: Any):
        self.attention, self.mixer = attention, mixer

    @property
    def nbytes(self) -> int:
        return getattr(self.attention, "nbytes", 0) + getattr(self.mixer, "nbytes", 0)

    @property
    def state_bytes(self) -> int:
        return getattr(self.mixer, "state_bytes", 0)

    @property
    def rewind_reach(self) -> int:
        return self.mixer.rewind_reach

    @property
    def checkpoints(self) -> tuple[int, ...]:
        return self.mixer.checkpoints

    def can_restore(self, length: int) -> bool:
        return self.mixer.can_restore(length)

    def rewind_to(self, length: int) -> None:
        self.mixer.rewind_to(length)

    def checkpoint(self, length: int) -> None:
        self.mixer.checkpoint(length)

    def clear(self) -> None:
        self.mixer.clear()


def restore_point(cache: Any, length: int) -> int:
    """The longest length <= `length` any Decoder cache can return to exactly (0: start over).

    Caches that only state `max_rewind` return to any length within it.
    """
    _check_cache(cache)
    length = check_count("length", length)
    ask = getattr(cache, "restore_point", None)
    if ask is not None:
        return ask(length)
    return length if len(cache) - length <= cache.max_rewind else 0


def rewind_to(cache: Any, length: int) -> int:
    """Return `cache` to the longest prefix of at most `length` tokens it can restore; that length.

    The caller recomputes the tokens between it and `length`.
    """
    keep = restore_point(cache, length)
    if keep == 0:
        cache.clear()
    else:
        cache.rewind(len(cache) - keep)
    return keep


def _check_cache(cache: Any) -> None:
    """InvalidRequest unless `cache` is a model's cache (len, rewind, clear, and max_rewind or restore_point)."""
    needed = callable(getattr(type(cache), "__len__", None)) and all(
        callable(getattr(cache, name, None)) for name in ("rewind", "clear"))
    if not needed or not (hasattr(cache, "max_rewind") or callable(getattr(cache, "restore_point", None))):
        raise InvalidRequest(f"cache must be a model's cache (init_cache()), got {type(cache).__name__}")
    if isinstance(cache, KvCache):
        cache.verify()  # its own slots and arrays, before they are rewound


def _check_ids(ids: Any, what: str) -> list[int]:
    """Token ids as a list of non-negative ints (InvalidRequest otherwise)."""
    if isinstance(ids, str | bytes | bytearray) or not isinstance(ids, Sequence | np.ndarray | range):
        raise InvalidRequest(f"{what} must be a sequence of token ids, got {type(ids).__name__}")
    try:
        arr = np.asarray(ids)
    except Exception:  # noqa: BLE001 - ragged, self-referencing, items that fail to read
        raise InvalidRequest(f"{what} must be a sequence of token ids") from None
    if arr.ndim != 1 or (arr.size and (arr.dtype.kind not in "iu" or arr.min() < 0)):
        raise InvalidRequest(f"{what} must be a 1-D sequence of non-negative token ids")
    return [int(t) for t in arr]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id sequences."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class PrefixCache:
    """A Decoder cache plus the token ids it holds (`len(ids) == len(cache)` between steps).

    `prepare(prompt)` keeps the longest prefix the cache shares with `prompt` that it can return
    to (`restore_point`: any length within its rewind reach, else its latest checkpoint, else
    nothing) and returns the ids still to compute, so reuse is never wrong. At least the
    prompt's last token is always left to compute: its logits are what the next token is
    sampled from. When the prompt has been fed (in one step or in chunks), a cache that keeps
    checkpoints keeps one there: the next turn of a chat returns to it when its prompt differs
    from the generated text (e.g. a template that drops the previous turn's reasoning).
    """

    def __init__(self, cache: Any):
        _check_cache(cache)
        self.cache = cache
        self.ids: list[int] = []
        self._prompt_end = 0   # the length at which the prompt being fed is complete (0: none pending)
        self.recomputed = 0    # prompt tokens the last prepare() left to compute

    @property
    def capacity(self) -> int:
        """Tokens the cache can hold."""
        return self.cache.capacity

    def prepare(self, prompt: Sequence[int]) -> list[int]:
        """Rewind to the prefix shared with `prompt`; return the suffix of `prompt` to feed."""
        prompt = _check_ids(prompt, "prompt")
        _check_cache(self.cache)
        if not prompt:
            raise InvalidRequest("prepare needs a non-empty prompt")
        keep = rewind_to(self.cache, min(common_prefix(self.ids, prompt), len(prompt) - 1))
        del self.ids[keep:]
        self._prompt_end = len(prompt)
        self.recomputed = len(prompt) - keep
        return prompt[keep:]

    def fed(self, ids: Sequence[int]) -> None:
        """Record ids the model just appended to the cache."""
        self.ids.extend(_check_ids(ids, "ids"))
        if self._prompt_end and len(self.ids) >= self._prompt_end:
            self._prompt_end = 0
            keep = getattr(self.cache, "checkpoint", None)
            if keep is not None:
                keep()

    def copy_from(self, other: PrefixCache) -> bool:
        """Hold what `other` holds (KvCache.copy_from); False when the caches cannot be copied."""
        copy = getattr(self.cache, "copy_from", None)
        if copy is None or not copy(other.cache):
            return False
        self.ids = list(other.ids)
        self._prompt_end = 0
        return True

    def reset(self) -> None:
        """Forget everything (after a failed step, the cache's contents are unknown)."""
        self.cache.clear()
        self.ids.clear()
        self._prompt_end = 0
