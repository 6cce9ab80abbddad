"""What MLA's fused decode layer (the fast op's `fused_layer`, archrun.kernels.decode.fusion) takes of a
layer's bound projections (archrun_mla.layout): product groups of its matrices (registered with the decode
pool when asked), the absorbed up-projections, the latent norms' part, and the layer's mixture of experts'
arguments when it has one (archrun-blocks' fast MoE: `ffn_args`). The sparse attention's layer
(archrun_mla.dsa: `fused_dsa_layer`) takes the same, and the lightning indexer's product groups, key norm,
rope part and numpy's sgemm (kernels.dsa_layer)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from archrun_mla.layout import _LoraQuery, _MlaOutput, _MlaQkv

_NO_POS = np.empty(0, np.int64)


def slot_arrays(slot: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """(k, v, pos, ring) of a LatentSlot as the fused block reads them: the [k_pe | latent] rows (their last c
    values are the values: v is the same array), no positions, not a ring."""
    return slot.k, slot.k, _NO_POS, False


def dsa_slot_arrays(slot: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """(k, v, pos, ring) of a DsaSlot as its fused layer reads them: the [k_pe | latent] rows, and in v's place
    the indexer keys [cap, 1, Di] (a view of the slot's), no positions, not a ring."""
    return slot.k, slot.ik.reshape(slot.ik.shape[0], 1, slot.ik.shape[1]), _NO_POS, False


def _prepared(*mats: Any) -> bool:
    return all(getattr(m, "prepared", None) is not None for m in mats)


def fused_layer(op: Any, qkv: Any, o: Any, common: Any, moe: Any,
                group_id: Callable | None = None) -> tuple | None:
    """(kernel, args, parallel) of the layer's decode step, or None when it must run op by op: a projection not
    prepared for the fast kernels, a query or output the layout did not bind (e.g. sparse attention's), widths
    numpy multiplies another way (a latent or value of one float), numpy's BLAS unknown, a mixture of experts
    without kernel arguments."""
    if type(qkv) is not _MlaQkv or type(o) is not _MlaOutput:
        return None
    return _fused(op, qkv, o, common, moe, group_id, None)


def fused_dsa_layer(op: Any, qkv: Any, o: Any, common: Any, moe: Any,
                    group_id: Callable | None = None) -> tuple | None:
    """(kernel, args, parallel) of a sparse-attention layer's decode step (kernels.dsa_layer), or None when it
    must run op by op: as fused_layer, or an indexer projection not prepared, its norm or rope without a part,
    numpy's sgemm unknown, or one indexer head (numpy then weighs the heads another way)."""
    from archrun_mla import dsa
    from archrun_mla.kernels import blas

    if type(qkv) is not dsa._DsaQkv or type(o) is not _MlaOutput or type(qkv.mla) is not _MlaQkv:
        return None
    side = qkv.side
    norm, rope = getattr(side.norm, "fused", None), getattr(op.index_rope, "fused", None)
    gemm = blas.sgemm()
    if (not _prepared(side.q_b, side.k, side.proj) or norm is None or rope is None or gemm is None
            or op.heads < 2 or op.top_k < 1):
        return None
    return _fused(op, qkv.mla, o, common, moe, group_id, (side, norm, rope, gemm))


def _fused(op: Any, qkv: _MlaQkv, o: _MlaOutput, common: Any, moe: Any, group_id: Callable | None,
           indexer: tuple | None) -> tuple | None:
    """fused_layer's answer, sparse attention's when `indexer` gives its (projections, norm part, rope part,
    sgemm)."""
    from archrun.kernels.decode.block import absent_matrix, uniform
    from archrun.kernels.decode.lists import typed_list
    from archrun.kernels.matmul.qmatrix import PARALLEL_MIN_BYTES
    from archrun_mla.kernels import blas, dsa_layer, mla_layer

    lora_q = isinstance(qkv.query, _LoraQuery)
    first = qkv.query.q_a if lora_q else qkv.query
    mats = [first, qkv.kv_a, o.o] + ([qkv.query.q_b] if lora_q else [])
    norm = getattr(qkv.norm, "fused", None)
    gemv = blas.sgemv()
    n_head, nope, lora = qkv.k_b_t.shape
    vd = o.v_b_t.shape[2]
    if not _prepared(*mats) or norm is None or gemv is None or min(lora, vd) < 2:
        return None
    ffn = None
    if moe is not None:
        ffn = getattr(moe.moe, "ffn_args", None)
        ffn = None if ffn is None else ffn(moe.weights, group_id)
        if ffn is None:
            return None
    absent = absent_matrix()
    proj_a = (uniform(first.prepared, first.bias), uniform(qkv.kv_a.prepared, qkv.kv_a.bias), absent)
    q_b = (uniform(qkv.query.q_b.prepared, qkv.query.q_b.bias), absent, absent) if lora_q else (absent,) * 3
    o_mat = (uniform(o.o.prepared, o.o.bias), absent, absent)
    gids = [-1, -1, -1]
    if group_id is not None:
        gids[0] = group_id(proj_a, first.n_in)
        gids[1] = group_id(q_b, qkv.query.q_b.n_in) if lora_q else -1
        gids[2] = group_id(o_mat, o.o.n_in)
    s = op.spec
    geo = np.array([n_head, nope, qkv.rope, lora, vd, qkv.query.q_a.n_out if lora_q else 0, *gids], np.int64)
    q_a_norm = qkv.query.q_a_norm if lora_q else np.empty(0, np.float32)
    args = (proj_a, q_b, o_mat, qkv.k_b_t, o.v_b_t, np.ascontiguousarray(q_a_norm, np.float32),
            np.ascontiguousarray(qkv.kv_a_norm, np.float32), geo, np.array([s.scale, s.softcap], np.float64),
            norm.value, norm.params, (gemv,))
    mla = typed_list([args])
    big = max(m.prepared.nbytes for m in mats) >= PARALLEL_MIN_BYTES
    layers = (mla_layer.decode_mla_layer, mla_layer.decode_mla_moe_layer)
    own = (common, mla)
    if indexer is not None:
        side, i_norm, i_rope, gemm = indexer
        idx_h = (uniform(side.k.prepared, side.k.bias), uniform(side.proj.prepared, side.proj.bias), absent)
        idx_q = (uniform(side.q_b.prepared, side.q_b.bias), absent, absent)
        i_gids = [-1, -1] if group_id is None else [group_id(idx_h, side.k.n_in), group_id(idx_q, side.q_b.n_in)]
        ig = np.array([op.heads, op.width, op.top_k, *i_gids], np.int64)
        # the op's own float32 scales (archrun_mla.dsa._IndexerProjections, indexer.index_scores_chunked)
        sc = np.array([1.0 / np.sqrt(op.heads), 1.0 / np.sqrt(op.width)]).astype(np.float32)
        own = (common, mla, typed_list([(idx_h, idx_q, np.ascontiguousarray(side.k_norm, np.float32),
                                         np.ascontiguousarray(side.k_norm_b, np.float32), ig, sc, i_norm.value,
                                         i_norm.params, i_rope.value, i_rope.params, (gemm,))]))
        layers = (dsa_layer.decode_dsa_layer, dsa_layer.decode_dsa_moe_layer)
        big = big or max(m.prepared.nbytes for m in (side.q_b, side.k, side.proj)) >= PARALLEL_MIN_BYTES
    if ffn is None:
        return layers[0], own, big
    moe_args, moe_big = ffn
    return layers[1], (*own, *moe_args), big or moe_big
