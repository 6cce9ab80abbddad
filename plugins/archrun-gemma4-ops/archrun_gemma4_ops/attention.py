"""Gemma 4's attention op: causal grouped-query attention whose last layers may reuse the keys and
values of an earlier layer (KV sharing).

llama.cpp gemma4-iswa.cpp (`hparams.has_kv(il)`), HF Gemma4TextAttention (`kv_sharing_modes`): with
`attention.shared_kv_layers` = S, the last S layers compute no keys or values and store nothing; each
attends its queries over the K/V the last earlier layer of its kind (sliding or full) attended over —
its source (`AttentionSpec.params["kv_source"]`, set by the layout). The source records, per cache
slot, the rows of its latest call (positions start..start+n-1 and the cached rows they saw); its
consumers, run later in the same forward pass at the same positions, attend over exactly those. A
consumer's own slot (`SharedSlot`) holds no rows: its layer costs no cache memory.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

from archrun.errors import InvalidRequest
from archrun_blocks import reference

F32 = np.float32
_BOUND: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # binder -> {layer: bound op}
_LOCK = threading.Lock()


class SharedSlot:
    """A consumer layer's slot: the source layer's slot, read only (no rows of its own)."""

    nbytes = 0

    def __init__(self, source):
        self.source = source


class Gemma4Attention(reference.CausalAttention):
    """Causal attention (reference.CausalAttention) with Gemma 4's KV sharing (module docstring)."""

    def __init__(self, spec, attend=reference.attend):
        super().__init__(spec)
        self.attend = attend  # [n,H,hd] x [T,KV,hd] x [T,KV,vd] -> [n,H,vd] (reference or kernel)
        self.kv_source = int(spec.param("kv_source")) if "kv_source" in dict(spec.params) else -1
        self.seen: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # slot -> rows of its last call
        self.made = threading.local()                  # .slot: the slot new_slot made last, in this thread
        self.layer = -1
        self._bound: dict | None = None                # this model's bound ops by layer (every layer's, once bound)
        self._source: Gemma4Attention | None = None
        self._feeds: bool | None = None

    def bind(self, binder, layer: int) -> None:
        """Record this layer's bound op with its model's. Layers may bind concurrently (in any order), so a
        consumer finds its source, and a source its consumers, on first use, when all are bound."""
        super().bind(binder, layer)
        with _LOCK:
            self._bound = _BOUND.setdefault(binder, {})
            self._bound[layer] = self
        self.layer = layer

    @property
    def source(self) -> Gemma4Attention | None:
        """The bound op of layer kv_source (None for a layer that computes its own keys)."""
        if self.kv_source >= 0 and self._source is None:
            source = (self._bound or {}).get(self.kv_source)
            if source is None or source.kv_source >= 0:
                raise InvalidRequest(f"layer {self.layer} reuses the keys of layer {self.kv_source}, which is not "
                                     "bound in its model or shares keys itself")
            self._source = source
        return self._source

    @property
    def feeds(self) -> bool:
        """Whether some layer of the model reads this layer's rows."""
        if self._feeds is None:
            self._feeds = any(op.kv_source == self.layer for op in (self._bound or {}).values())
        return self._feeds

    def new_slot(self, capacity: int, max_rewind: int = 64, kv_type: str = "f32"):
        """A consumer's SharedSlot on the slot its source made last in this thread (caches make their
        slots in layer order); else causal attention's slot."""
        if self.kv_source >= 0:
            made = getattr(self.source.made, "slot", None) if self._bound is not None else None  # unbound: inspect
            return SharedSlot(made)
        slot = super().new_slot(capacity, max_rewind, kv_type)
        self.made.slot = slot
        return slot

    def __call__(self, q, k, v, slot, start: int) -> np.ndarray:
        n = q.shape[0]
        q_pos = np.arange(start, start + n)
        if isinstance(slot, SharedSlot):
            seen = self.source.seen.get(slot.source) if slot.source is not None else None
            if seen is None or seen[0] != start or seen[1] != n:
                raise InvalidRequest(f"a KV-sharing layer ran at positions {start}..{start + n - 1} before its "
                                     f"source layer {self.kv_source} did")
            return self._attend(q, seen[2], seen[3], q_pos, seen[4])
        if not self.feeds:
            return super().__call__(q, k, v, slot, start)
        if isinstance(slot, reference.RingKvSlot):  # the rows the call sees: gathered before it writes
            old_k, old_v, old_pos = slot.gather(start)
            new_k, new_v = slot.stored(k, v)
            rows = (np.concatenate([old_k, new_k]), np.concatenate([old_v, new_v]), np.concatenate([old_pos, q_pos]))
            out = super().__call__(q, k, v, slot, start)
        else:
            out = super().__call__(q, k, v, slot, start)
            keys, values = slot.rows(start + n)
            rows = (keys, values, np.arange(start + n))
        self.seen[slot] = (start, n, *rows)
        return out


def gemma4_reference(spec) -> Gemma4Attention:
    """The float32 numpy reference (archrun_blocks.reference.attend)."""
    return Gemma4Attention(spec)


def gemma4_fast(spec) -> Gemma4Attention:
    """The same on archrun-blocks' attention kernel op by op; its layer decodes fused (`fused_layer`: one
    kernel call per layer, archrun_gemma4_ops.fused) over the slot's rows (`slot_arrays`: a layer reusing
    keys reads its source's slot), calling archrun-blocks' causal attention part (`fused`: the one-token
    attention of a layer computing its own keys, unscaled scores; float32 caches)."""
    from functools import partial

    from archrun.kernels.decode.parts import part
    from archrun_blocks import elementwise, parts  # imported on use: loading the plugin compiles no kernel
    from archrun_gemma4_ops import fused

    op = Gemma4Attention(spec, elementwise.attention)
    op.fused = part(parts.causal_attention, spec.scale, spec.window, spec.softcap)
    op.fused_layer = partial(fused.fused_layer, op)
    op.slot_arrays = fused.slot_arrays
    return op
