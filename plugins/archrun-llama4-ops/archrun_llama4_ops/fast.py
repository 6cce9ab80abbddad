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
from archrun.kernels.decode import pool
from archrun.kernels.decode.parts import Part, part, usable
from archrun.kernels.matmul import qmatrix
from archrun_blocks import decode_attention, elementwise, reference
from archrun_blocks import fast as blocks_fast
from archrun_blocks import moe_kernels as mk
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


class InputWeightedMoe:
    """ops.topk_input_weighted computed by kernels.moe (routing and experts in one call).

    Needs kernel parts of the gating and of the activation, and weights prepared for the fast kernels
    without expert biases; otherwise the numpy mixture (ops.topk_input_weighted, fast products) runs. The
    kernel arrays of a layer's MoeWeights are built on first use and kept (the op is bound to one layer).
    """

    def __init__(self, spec: MoeSpec, gating, act):
        self.ref = ops.topk_input_weighted(spec, gating, act)
        self.spec = spec
        self.gate_part = usable(getattr(gating, "fused", None), "gating")
        self.act_part = usable(getattr(act, "fused", None), "activation")
        self.rp = (spec.n_expert_used, spec.n_group, spec.n_group_used, int(spec.weights_norm))
        self.scale = float(spec.weights_scale)
        self._bound: list = [None, None]  # (weights, their kernel arrays) of the last weights seen

    def arrays(self, w) -> tuple | None:
        """moe_kernels.moe_arrays of w, or None when the kernel cannot run it."""
        if self.gate_part is None or self.act_part is None:
            return None
        if self._bound[0] is not w:
            if w.gate_inp.n_out != self.spec.n_expert:
                raise ShapeMismatch(f"moe: {w.gate_inp.n_out} router rows, the descriptor says "
                                    f"{self.spec.n_expert} experts")
            self._bound[:] = [w, _arrays(w)]
        return self._bound[1]

    def __call__(self, x: np.ndarray, w) -> np.ndarray:
        a = self.arrays(w)
        if a is None:
            return self.ref(x, w)
        d = w.gate_inp.n_in
        if not isinstance(x, np.ndarray) or x.ndim != 2 or x.shape[1] != d:
            raise ShapeMismatch(f"moe: input {getattr(x, 'shape', None)} does not match [n, {d}]")
        x = np.ascontiguousarray(x, dtype=F32)
        out = np.empty_like(x)
        chunks = qmatrix.current_threads() if _big(w) else 1
        moe_kernels.moe_rows(x, out, *a, self.rp, self.scale, self.gate_part.handle, self.gate_part.params,
                             self.act_part.handle, self.act_part.params, mk.NO_GIDS, chunks, pool.NO_POOL)
        return out

    def fused_layer(self, w, common, group_id=None) -> tuple | None:
        """(kernels.moe.decode_moe_layer, its arguments before the cache ones, whether the experts split over
        the threads), or None; group_id(ms, n_in) -> id registers the router's and experts' product groups
        with the decode pool (archrun.kernels.decode.fusion)."""
        a = self.arrays(w)
        if a is None:
            return None
        gids = mk.NO_GIDS if group_id is None else mk.pool_group_ids(
            a, [m.prepared for m in w.gate], [m.prepared for m in w.up], [m.prepared for m in w.down], group_id)
        return moe_kernels.decode_moe_layer, (common, *a, self.rp, self.scale, self.gate_part.handle,
                                              self.gate_part.params, self.act_part.handle, self.act_part.params,
                                              gids), _big(w)


def _arrays(w) -> tuple | None:
    """Kernel arrays of MoeWeights w (moe_kernels.moe_arrays), or None when a matrix is not prepared for the
    fast kernels or an expert has a bias (the kernels read none)."""
    shared = tuple(w.shared) if w.shared is not None else ()
    mats = [w.gate_inp, *w.gate, *w.up, *w.down, *shared]
    if any(m.prepared is None for m in mats) or any(m.bias is not None for m in mats[1:]):
        return None
    return mk.moe_arrays(w.gate_inp.prepared, w.gate_inp.bias, w.probs_bias,
                         [m.prepared for m in w.gate], [m.prepared for m in w.up], [m.prepared for m in w.down],
                         tuple(m.prepared for m in shared) if shared else None, w.shared_gate,
                         [m.pages for e in range(len(w.gate)) for m in (w.gate[e], w.up[e], w.down[e])])


def _big(w) -> bool:
    """Whether an expert matrix is big enough to split its products over the threads."""
    return max(w.gate[0].prepared.nbytes, w.down[0].prepared.nbytes) >= qmatrix.PARALLEL_MIN_BYTES


def topk_input_weighted(spec: MoeSpec, gating, act) -> InputWeightedMoe:
    return InputWeightedMoe(spec, gating, act)
