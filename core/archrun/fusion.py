"""Fused decode blocks: one jitted call per layer for a single token (the fused block style's fast path).

A layer can run fused when every op bound to it describes itself to the kernel through a
`kernel` attribute (archrun.kernels.block: NormKernel, RopeKernel, AttentionKernel,
ActKernel; archrun.kernels.moe: MoeKernel for a MoE FFN) and every weight is prepared for the
fast kernels. Dense layers run kernels.block.decode_block (as decode_layer, their arguments
in one typed list), MoE layers kernels.moe.decode_block_moe. Ops from other plugins that do not, and the reference
backend, keep the op-by-op path, which computes the same block. The core only moves these
descriptions and arrays into the kernel: it knows no math.

On more than one thread, the products of a dense model's one-token step (every layer's
product groups and the output head) are shared with a worker pool (kernels.pool.DecodePool):
`DecodeSteps.running()` wakes its workers for one step.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from numba.core.errors import TypingError

from archrun.errors import ContextOverflow
from archrun.kernels import block, moe, pool, qmatrix
from archrun.kernels.lists import typed_list
from archrun.weights import Matrix

_EMPTY_F32 = np.empty(0, np.float32)


def _vec(v: np.ndarray | None) -> np.ndarray:
    return _EMPTY_F32 if v is None else np.ascontiguousarray(v, dtype=np.float32)


def _uniforms(matrices: list[Matrix], width: int) -> tuple | None:
    """`width` uniform matrices (absent ones padding a stacked product), or None if one is not prepared."""
    prepared = [m.prepared for m in matrices]
    if any(q is None for q in prepared):
        return None
    us = [block.uniform(q, m.bias) for q, m in zip(prepared, matrices, strict=True)]
    return tuple(us + [block.absent_matrix()] * (width - len(us)))


class FusedBlock:
    """One layer's decode step as one kernel call: `fb(x, slot, start, angles)` updates x f32 [d] in place."""

    def __init__(self, kernel: Any, args: tuple, attention: block.AttentionKernel, rope: int, parallel: bool):
        self._kernel = kernel       # block.decode_block (decode_layer) or moe.decode_block_moe
        self._args = args           # (qkv, o, *ffn, vecs, geo, eps, scale); ffn: (gate_up, down) or the MoE arrays
        self._slot_arrays = attention.slot_arrays
        self._rope = rope           # index into the per-token rope angles (-1: no rope)
        self._parallel = parallel   # big enough to split products over the threads

    def __call__(self, x: np.ndarray, slot: Any, start: int, angles: list, par: tuple = pool.NO_POOL) -> None:
        k, v, kpos, ring = self._slot_arrays(slot)
        if ring:
            row = start % k.shape[0]
        elif start < k.shape[0]:
            row = start
        else:
            raise ContextOverflow(f"position {start} is past the cache slot's {k.shape[0]} rows")
        if self._rope >= 0:
            cos, sin = angles[self._rope]
            cos, sin = cos[0], sin[0]
        else:
            cos = sin = _EMPTY_F32
        chunks = qmatrix.current_threads() if self._parallel and par is pool.NO_POOL else 1
        self._kernel(x, *self._args, k, v, kpos, ring, row, start, cos, sin, chunks, par)


def _ffn_args(lp: Any) -> tuple[Any, tuple, int, int, bool] | None:
    """(kernel, ffn args, act kind, n_ff, parallel) of the layer's FFN, or None when it must run op by op."""
    from archrun.model import DenseFfn, MoeFfn

    if isinstance(lp.ffn, DenseFfn):
        act_k = getattr(lp.ffn.act, "kernel", None)
        gate_up = _uniforms(lp.ffn.gate_up.matrices, 3)
        down = _uniforms([lp.ffn.down], 3)
        if not isinstance(act_k, block.ActKernel) or gate_up is None or down is None:
            return None
        return block.decode_block, (gate_up, down), act_k.kind, lp.ffn.down.n_in, False
    if isinstance(lp.ffn, MoeFfn):
        moe_k = getattr(lp.ffn.moe, "kernel", None)
        arrays = moe_k.arrays(lp.ffn.weights) if isinstance(moe_k, moe.MoeKernel) else None
        if arrays is None:
            return None
        w = lp.ffn.weights
        big = max(w.gate[0].prepared.nbytes, w.down[0].prepared.nbytes) >= qmatrix.PARALLEL_MIN_BYTES
        return moe.decode_block_moe, (*arrays, moe_k.rp, moe_k.scale), moe_k.rp[moe.RP_ACT], 0, big
    return None


def _group_id(groups: list[tuple], ms: tuple, n_in: int) -> int:
    """Register a product group (3 uniform matrices of input width n_in) for the decode pool; its id."""
    groups.append((ms, n_in))
    return len(groups) - 1


def fuse_layer(lp: Any, norm: Any, ropes: list, groups: list[tuple] | None = None) -> FusedBlock | None:
    """The fused decode step of a bound layer (archrun.model.LayerPlan), or None when it must run op by op.

    groups: when given, the layer's dense product groups are appended (pool group ids).
    """
    a = lp.spec.attention
    rope = ropes[a.rope]
    norm_k = getattr(norm, "kernel", None)
    attn_k = getattr(lp.attention, "kernel", None)
    rope_k = getattr(rope, "kernel", None) if rope is not None else block.RopeKernel(0, False)
    if not (isinstance(norm_k, block.NormKernel) and isinstance(attn_k, block.AttentionKernel)
            and isinstance(rope_k, block.RopeKernel)):
        return None
    ffn = _ffn_args(lp)
    qkv = _uniforms(lp.qkv.matrices, 3)
    o = _uniforms([lp.o], 3)
    if ffn is None or qkv is None or o is None:
        return None
    kernel, ffn_args, act, n_ff, big_ffn = ffn
    vecs = tuple(_vec(v) for v in (lp.attn_norm, lp.q_norm, lp.k_norm, lp.post_attn_norm, lp.ffn_norm,
                                   lp.post_ffn_norm))
    ids = [-1] * 4  # pool groups of qkv, o, gate_up, down (dense layers only: experts use numba's threads)
    if groups is not None and kernel is block.decode_block:
        widths = (lp.qkv.matrices[0].n_in, lp.o.n_in, lp.ffn.gate_up.matrices[0].n_in, lp.ffn.down.n_in)
        ids = [_group_id(groups, ms, n_in) for ms, n_in in zip((qkv, o, *ffn_args), widths, strict=True)]
    geo = (a.n_head, a.n_head_kv, a.head_dim, a.v_head_dim, rope_k.n_rot, int(rope_k.neox), attn_k.window,
           act, n_ff, *ids)
    args = (qkv, o, *ffn_args, vecs, tuple(int(g) for g in geo), float(norm_k.eps), float(attn_k.scale))
    parallel = big_ffn or lp.o.prepared.nbytes >= qmatrix.PARALLEL_MIN_BYTES
    return FusedBlock(kernel, args, attn_k, a.rope if rope is not None else -1, parallel)


def fuse_layers(plan: Any, groups: list[tuple] | None = None) -> list[FusedBlock] | None:
    """Fused steps of every trunk layer, or None when any layer must run op by op."""
    blocks = []
    for lp in plan.layers:
        fb = fuse_layer(lp, plan.norm, plan.ropes, groups)
        if fb is None:
            return None
        blocks.append(fb)
    _share_dense_args(blocks)
    return blocks


def _share_dense_args(blocks: list[FusedBlock]) -> None:
    """Dense layers call block.decode_layer with their arguments in one typed list (when all of
    them have one numba type, as every dense layer built here does)."""
    dense = [fb for fb in blocks if fb._kernel is block.decode_block]
    if not dense:
        return
    try:
        layers = typed_list([fb._args for fb in dense])
    except TypingError:  # layers of different argument types: keep the per-layer arguments
        return
    for i, fb in enumerate(dense):
        fb._kernel, fb._args = block.decode_layer, (layers, np.int64(i))


class DecodeSteps:
    """A model's fused one-token step: its layers' FusedBlocks, the output head, and the worker pool
    that shares their products when the model is dense and runs on more than one thread."""

    def __init__(self, plan: Any):
        groups: list[tuple] = []
        self.blocks = fuse_layers(plan, groups)
        head = _uniforms([plan.output], 3) if self.blocks is not None else None
        self._head_id = _group_id(groups, head, plan.output.n_in) if head is not None else -1
        self._head = head
        self._output = plan.output
        dense = self.blocks is not None and all(fb._kernel in (block.decode_block, block.decode_layer)
                                                for fb in self.blocks)
        self._groups = groups if dense and head is not None and pool.enabled() else None
        self._pool: pool.DecodePool | None = None

    def _get_pool(self) -> pool.DecodePool | None:
        if self._pool is None and self._groups is not None:
            max_in = max(n_in for _, n_in in self._groups)
            max_out = max(sum(int(m[block._NOUT]) for m in ms) for ms, _ in self._groups)
            self._pool = pool.DecodePool([ms for ms, _ in self._groups], max_in, max_out, block.serve)
            self._pool.warm_up()  # compile the workers' loop here, not in a worker during a step
        return self._pool

    @contextmanager
    def running(self) -> Iterator[tuple]:
        """Kernel arguments of the pool for one step (pool.NO_POOL on one thread or without a pool)."""
        threads = qmatrix.current_threads()
        p = self._get_pool() if threads > 1 else None
        if p is None:
            self.rest()
            yield pool.NO_POOL
            return
        with p.running(threads) as par:
            yield par

    def rest(self) -> None:
        """Send the pool's spinning workers to sleep (before work that needs the cores, e.g. a prefill)."""
        if self._pool is not None:
            self._pool.rest()

    def head(self, hidden: np.ndarray, par: tuple) -> np.ndarray:
        """Logits f32 [n, vocab] = hidden [n, d] @ output.T (no softcap), through the pool when running."""
        if self._head is None:
            return self._output(hidden)
        x = np.ascontiguousarray(hidden, dtype=np.float32)
        y = np.empty((x.shape[0], self._output.n_out), np.float32)
        chunks = qmatrix.current_threads() if par is pool.NO_POOL else 1
        block.pooled_product(par, self._head_id, self._head, x, y, chunks)
        return y

