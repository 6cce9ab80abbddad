"""Fast factories of the core vocabulary, backed by archrun.kernels (numba).

Each factory has the same contract as its reference twin in archrun_blocks.reference (the
plugin's tests check every pair on random inputs); only the inner computation is swapped
for a kernel. Shapes and validation stay with the callers, which build them from the
descriptor, so the kernels never see an unchecked index.
"""

from __future__ import annotations

import numpy as np

from archrun import kernels
from archrun.descriptor import AttentionSpec, RopeSpec
from archrun.kernels.block import ACT_GEGLU_TANH, ACT_SWIGLU, ActKernel, AttentionKernel, NormKernel, RopeKernel
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
