"""The fast ops of archrun-llama4-ops, backed by its numba kernels (archrun_llama4_ops.kernels); imported when
a model first binds one, so loading the plugin compiles no kernel.

Each carries what the fused decode path runs (archrun.kernels.decode.fusion, docs/plugins.md): the attention
its kernel parts (`fused`; `fused_for` caches of other kv types), its cache arrays (`slot_arrays`) and the pool
task of its long-context chunks (`pool_task`); the mixture its layer kernel (`fused_layer`) and the activation
part it runs (`act_part`).
The op-by-op paths run the same kernels (the query/key preparation over rows, the mixture over rows), so
a token's result has the same bits either way.
"""

from __future__ import annotations

import numpy as np

from archrun.descriptor import AttentionSpec, MoeSpec
from archrun.errors import ShapeMismatch
from archrun.kernels.decode.parts import Part, part
from archrun_blocks import decode_attention, elementwise, reference
from archrun_blocks import fast as blocks_fast
from archrun_llama4_ops import ops
from archrun_llama4_ops.kernels import attention as ak
from archrun_llama4_ops.kernels import moe as moe_kernels

F32 = np.float32
_NO_POS = np.empty(0, np.int64)


def slot_arrays(slot) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """(k, v, pos, ring) of a KvSlot (pos empty, row r holds position r) or RingKvSlot (pos: each row's
    position, -1 empty; position p at row p % size)."""
    if isinstance(slot, reference.RingKvSlot):
        return slot.k, slot.v, slot.pos, True
    return slot.k, slot.v, _NO_POS, False


class Llama4Attention(ops.Llama4Attention):
    """ops.Llama4Attention with archrun-blocks' attention kernel, its q/k preparation by this package's kernel
    (kernels.attention.prepare_rows), and the kernel part of the fused decode path."""

    def __init__(self, spec: AttentionSpec):
        super().__init__(spec, elementwise.attention)
        self.codec = blocks_fast.KernelKvCodec  # stored rows of other kv types converted by kernels (same bits)
        self.pool_task = decode_attention.attend_chunk  # the part's chunks of a long context (decode pool task)
        self.slot_arrays = slot_arrays  # the fused block reads and writes the cache through these

    @property
    def params(self) -> np.ndarray:
        """The part's parameters (kernels.attention P_*), with the bound epsilon and q/k norm choice."""
        s = self.spec
        return np.array([s.scale, self.chunk, s.softcap, self.eps, 1.0 if self.qk_norm else 0.0], np.float64)

    @property
    def fused(self) -> Part:
        """The one-token part (kernels.attention.llama4_attention) with this layer's parameters."""
        return part(ak.llama4_attention, *self.params)

    def fused_for(self, kv_type: str) -> Part | None:
        """The part over caches of kv_type (f32, f16, q8_0: kernels.kv_attention), or None for another."""
        if kv_type == "f32":
            return self.fused
        from archrun_llama4_ops.kernels import kv_attention

        fn = getattr(kv_attention, f"llama4_attention_{kv_type}", None)
        return None if fn is None else part(fn, *self.params)

    def __call__(self, q, k, v, slot, start: int) -> np.ndarray:
        n, n_kv, hd = k.shape
        if q.ndim != 3 or q.shape[0] != n or q.shape[2] != hd or v.shape[:2] != (n, n_kv):
            raise ShapeMismatch(f"attention 'llama4': q {q.shape}, k {k.shape}, v {v.shape} do not match")
        q = np.array(q, dtype=F32, order="C")  # prepared in place: copies
        k = np.array(k, dtype=F32, order="C")
        ak.prepare_rows(self.params, q.reshape(n, -1), k, np.int64(start))
        return ops.Llama4Attention.__call__(self, q, k, v, slot, start, prepared=True)


def llama4_attention(spec: AttentionSpec) -> Llama4Attention:
    return Llama4Attention(spec)


class InputWeightedMoe(blocks_fast.FastMoe):
    """ops.topk_input_weighted computed by kernels.moe (routing and experts in one call): archrun-blocks' fast
    mixture with this package's kernels, which take the same arguments.

    Needs kernel parts of the gating and of the activation, and weights prepared for the fast kernels
    without expert biases; otherwise the numpy mixture (ops.topk_input_weighted, fast products) runs. The
    kernel arrays of a layer's MoeWeights are built on first use and kept (the op is bound to one layer).
    It offers no `ffn_args`: another op's layer kernel runs archrun-blocks' output-weighted mixture, not this.
    """

    kernels = (moe_kernels.moe_rows, moe_kernels.decode_moe_layer)
    reference_mixture = staticmethod(ops.topk_input_weighted)
    ffn_args = None

    def weight_arrays(self, w) -> tuple | None:
        """archrun-blocks' arrays, or None when an expert has a bias (an input-weighted mixture has none)."""
        mats = [*w.gate, *w.up, *w.down, *(w.shared or ())]
        return None if any(m.bias is not None for m in mats) else super().weight_arrays(w)


def topk_input_weighted(spec: MoeSpec, gating, act) -> InputWeightedMoe:
    return InputWeightedMoe(spec, gating, act)
