"""Fast factories of the core vocabulary, backed by archrun.kernels (numba).

Each factory has the same contract as its reference twin in archrun_blocks.reference (the
plugin's tests check every pair on random inputs); only the inner computation is swapped
for a kernel. Shapes and validation stay with the callers, which build them from the
descriptor, so the kernels never see an unchecked index.
"""

from __future__ import annotations

import numpy as np

from archrun import kernels
from archrun.descriptor import AttentionSpec, MoeSpec, RopeSpec
from archrun.errors import ShapeMismatch
from archrun.kernels import moe as moe_kernels
from archrun.kernels import qmatrix
from archrun.kernels.block import ACT_GEGLU_TANH, ACT_SWIGLU, ActKernel, AttentionKernel, NormKernel, RopeKernel
from archrun.kernels.moe import GATING_SIGMOID, GATING_SOFTMAX, GatingKernel, MoeKernel
from archrun_blocks import reference

F32 = np.float32
_NO_POS = np.empty(0, np.int64)


def rms_norm(eps: float):
    """RMSNorm over the last axis (any leading shape)."""

    def norm(x: np.ndarray, w: np.ndarray) -> np.ndarray:
        shape = x.shape
        out = kernels.rms_norm(np.ascontiguousarray(x, dtype=F32).reshape(-1, shape[-1]), w, eps)
        return out.reshape(shape)

    norm.kernel = NormKernel(float(eps))  # lets archrun.fusion run it inside a fused decode block
    return norm


class _FastRope(reference.Rope):
    @property
    def kernel(self) -> RopeKernel:
        return RopeKernel(self.n_rot, self.neox)

    def __call__(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        return kernels.rope(np.ascontiguousarray(x, dtype=F32), cos, sin, self.n_rot, self.neox)


def rope_neox(spec: RopeSpec, freq_factors: np.ndarray | None = None) -> reference.Rope:
    return _FastRope(spec, freq_factors, neox=True)


def rope_norm(spec: RopeSpec, freq_factors: np.ndarray | None = None) -> reference.Rope:
    return _FastRope(spec, freq_factors, neox=False)


def _attend(q, k, v, q_pos, k_pos, scale: float, window: int) -> np.ndarray:
    return kernels.attention(np.ascontiguousarray(q), np.ascontiguousarray(k), np.ascontiguousarray(v),
                             np.ascontiguousarray(q_pos, dtype=np.int64),
                             np.ascontiguousarray(k_pos, dtype=np.int64), scale, window)


def _slot_arrays(slot) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """(k, v, pos, ring) of a KvSlot / RingKvSlot, as AttentionKernel.slot_arrays describes."""
    if isinstance(slot, reference.RingKvSlot):
        return slot.k, slot.v, slot.pos, True
    return slot.k, slot.v, _NO_POS, False


def causal_attention(spec: AttentionSpec) -> reference.CausalAttention:
    op = reference.CausalAttention(spec)
    op.attend = _attend
    op.kernel = AttentionKernel(float(spec.scale), int(spec.window), _slot_arrays)
    return op


def swiglu():
    def act(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        return kernels.swiglu(np.ascontiguousarray(gate), np.ascontiguousarray(up))

    act.kernel = ActKernel(ACT_SWIGLU)
    return act


def geglu_tanh():
    def act(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        return kernels.geglu_tanh(np.ascontiguousarray(gate), np.ascontiguousarray(up))

    act.kernel = ActKernel(ACT_GEGLU_TANH)
    return act


def gating_softmax():
    probs = reference.gating_softmax()
    probs.kernel = GatingKernel(GATING_SOFTMAX)  # lets the MoE kernel route inside numba
    return probs


def gating_sigmoid():
    probs = reference.gating_sigmoid()
    probs.kernel = GatingKernel(GATING_SIGMOID)
    return probs


# archrun-blocks' own reference gating and activation functions, recognised by their code (block
# style host_reference binds reference ops around the fast MoE op): the math the kernels compute.
_REFERENCE_KINDS = {reference.gating_softmax().__code__: GatingKernel(GATING_SOFTMAX),
                    reference.gating_sigmoid().__code__: GatingKernel(GATING_SIGMOID),
                    reference.swiglu().__code__: ActKernel(ACT_SWIGLU),
                    reference.geglu_tanh().__code__: ActKernel(ACT_GEGLU_TANH)}


def _described(op, cls: type):
    """The op's kernel description of type cls (its `kernel`, or that of this plugin's reference twin)."""
    k = getattr(op, "kernel", None)
    if not isinstance(k, cls):
        k = _REFERENCE_KINDS.get(getattr(op, "__code__", None))
    return k if isinstance(k, cls) else None


def _moe_arrays(w) -> tuple | None:
    """Kernel arrays of MoeWeights w (archrun.kernels.moe.moe_arrays), or None when a matrix is not
    prepared for the fast kernels."""
    shared = tuple(w.shared) if w.shared is not None else ()
    mats = [w.gate_inp, *w.gate, *w.up, *w.down, *shared]
    if any(m.prepared is None for m in mats):
        return None
    return moe_kernels.moe_arrays(w.gate_inp.prepared, w.gate_inp.bias, w.probs_bias,
                                  [m.prepared for m in w.gate], [m.prepared for m in w.up],
                                  [m.prepared for m in w.down],
                                  tuple(m.prepared for m in shared) if shared else None)


def _chunks(w) -> int:
    """Threads for the MoE products: one unless an expert matrix is big enough to split."""
    big = max(w.gate[0].prepared.nbytes, w.down[0].prepared.nbytes) >= qmatrix.PARALLEL_MIN_BYTES
    return qmatrix.current_threads() if big else 1


def moe_topk(spec: MoeSpec, gating, act):
    """reference.moe_topk computed by archrun.kernels.moe (routing and experts in one call).

    Needs kernel descriptions of the gating (GatingKernel) and of the activation (ActKernel),
    or this plugin's reference twins of them; otherwise, or with weights not prepared for the
    fast kernels, the reference op runs.
    The kernel arrays of a layer's MoeWeights are built on first use and kept (the op is
    bound to one layer); `moe.kernel.arrays(weights)` hands them to archrun.fusion.
    """
    gk, ak = _described(gating, GatingKernel), _described(act, ActKernel)
    ref = reference.moe_topk(spec, gating, act)
    if gk is None or ak is None:
        return ref
    bound: list = [None, None, 1]  # (weights, their kernel arrays, chunks) of the last weights seen

    def arrays(w) -> tuple | None:
        if bound[0] is not w:
            if w.gate_inp.n_out != spec.n_expert:
                raise ShapeMismatch(f"moe: {w.gate_inp.n_out} router rows, the descriptor says "
                                    f"{spec.n_expert} experts")
            a = _moe_arrays(w)
            bound[:] = [w, a, _chunks(w) if a is not None else 1]
        return bound[1]

    rp = (gk.kind, ak.kind, spec.n_expert_used, spec.n_group, spec.n_group_used, int(spec.weights_norm))
    scale = float(spec.weights_scale)

    def moe(x: np.ndarray, w) -> np.ndarray:
        a = arrays(w)
        if a is None:
            return ref(x, w)
        d = w.gate_inp.n_in
        if not isinstance(x, np.ndarray) or x.ndim != 2 or x.shape[1] != d:
            raise ShapeMismatch(f"moe: input {getattr(x, 'shape', None)} does not match [n, {d}]")
        x = np.ascontiguousarray(x, dtype=F32)
        out = np.empty_like(x)
        moe_kernels.moe_rows(x, out, *a, rp, scale, bound[2])
        return out

    moe.kernel = MoeKernel(rp, scale, arrays)
    return moe
