"""What Gemma 4's fused decode layer (the fast op's `fused_layer`, archrun.kernels.decode.fusion) takes of a
layer's bound projections (archrun_gemma4_ops.layout): the product groups of its matrices (registered with the
decode pool when asked), its q/k norm weights, the norm's part and the op's attention part (`op.fused`:
archrun-blocks' causal attention part) (kernels.gemma4_layer). The cache reaches the kernel through
`slot_arrays`: a layer that reuses an earlier layer's keys reads that layer's slot."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from archrun.errors import InvalidRequest
from archrun_blocks import reference
from archrun_gemma4_ops.attention import SharedSlot
from archrun_gemma4_ops.layout import Gemma4Qkv

_NO_POS = np.empty(0, np.int64)
_NO_VEC = np.empty(0, np.float32)


def slot_arrays(slot: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """(k, v, pos, ring) of the layer's slot as the fused block reads them: a KvSlot's rows (position p at row
    p), a RingKvSlot's (each row's position in pos), and for a layer reusing keys (SharedSlot) its source's."""
    if isinstance(slot, SharedSlot):
        if slot.source is None:
            raise InvalidRequest("a KV-sharing layer's slot has no source slot: its cache was not made by its model")
        slot = slot.source
    if isinstance(slot, reference.RingKvSlot):
        return slot.k, slot.v, slot.pos, True
    return slot.k, slot.v, _NO_POS, False


def _prepared(*mats: Any) -> bool:
    return all(getattr(m, "prepared", None) is not None for m in mats)


def fused_layer(op: Any, qkv: Any, o: Any, common: Any, moe: Any, group_id: Callable | None = None) -> tuple | None:
    """(kernel, args, parallel) of the layer's decode step (kernels.gemma4_layer), or None when it must run op by
    op: a mixture of experts (Gemma 4's `gemma4_moe` applies its own FFN norms), projections the layout did not
    bind, a matrix not prepared for the fast kernels, a norm or the attention without a part, attention sinks."""
    from archrun.kernels.decode.block import absent_matrix, uniform
    from archrun.kernels.decode.lists import typed_list
    from archrun.kernels.decode.parts import usable
    from archrun.kernels.matmul.qmatrix import PARALLEL_MIN_BYTES
    from archrun_gemma4_ops.kernels import gemma4_layer

    s = op.spec
    if moe is not None or type(qkv) is not Gemma4Qkv or s.sinks or s.alibi_max_bias:
        return None
    own_kv = qkv.k is not None
    if own_kv != (op.kv_source < 0):
        return None  # projections that do not match the op's key sharing (the layout binds both from one spec)
    mats = [qkv.q[0]] + ([qkv.k[0]] if own_kv else []) + ([qkv.v] if own_kv and qkv.v is not None else [])
    norm = usable(getattr(qkv.norm, "fused", None), "norm")
    if not _prepared(*mats, o) or norm is None:
        return None
    absent = absent_matrix()
    group = tuple(uniform(m.prepared, m.bias) for m in mats)
    group = group + (absent,) * (3 - len(group))
    o_mat = (uniform(o.prepared, o.bias), absent, absent)
    gids = [-1, -1]
    if group_id is not None:
        gids = [group_id(group, qkv.q[0].n_in), group_id(o_mat, o.n_in)]
    attn = usable(op.fused, "attention")
    if attn is None:
        return None
    geo = np.array([s.n_head, s.n_head_kv, s.head_dim, int(own_kv), int(own_kv and qkv.v is None), *gids], np.int64)
    # writable copies: every layer's tuple then has one numba type (one compile of the kernel)
    k_norm = np.array(qkv.k[1], np.float32) if own_kv else _NO_VEC
    own = typed_list([(group, o_mat, np.array(qkv.q[1], np.float32), k_norm, np.array(qkv.unit, np.float32), geo,
                       norm.value, norm.params, attn.value, attn.params)])
    big = max(m.prepared.nbytes for m in (*mats, o)) >= PARALLEL_MIN_BYTES
    return gemma4_layer.gemma4_layer, (common, own), big
