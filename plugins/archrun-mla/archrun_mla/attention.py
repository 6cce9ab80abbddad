"""MLA's attention op: one cached [k_pe | latent] row per token, shared by every head.

After the layout's absorption (archrun_mla.layout) MLA is multi-query attention whose single
key head is [k_pe | latent] (r + c wide) and whose value is the latent (the key row's last c
values). The cache stores the key row only: (kv_lora_rank + rope dims) values per token per
layer, as llama.cpp's MLA cache does, instead of H (p + r + v) for the expanded heads.
"""

from __future__ import annotations

import numpy as np

from archrun.errors import MetadataError
from archrun_blocks import reference

F32 = np.float32


class LatentSlot:
    """One layer's cache: k [capacity, 1, r + c] (a row per position); the values are its last c."""

    def __init__(self, capacity: int, width: int):
        self.k = np.zeros((capacity, 1, width), F32)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes


class MlaAttention:
    """Causal attention of H absorbed query heads [n, H, r + c] over the latent cache -> [n, H, c]."""

    def __init__(self, spec, attend=reference.attend):
        if spec.window or spec.alibi_max_bias:
            raise MetadataError("attention 'mla' has no sliding window or ALiBi bias; the model states "
                                f"window {spec.window}, max_alibi_bias {spec.alibi_max_bias}")
        self.spec = spec
        self.rope = int(spec.param("qk_rope"))  # the key row's first r values are k_pe, the rest the latent
        self.attend = attend  # [n,H,hd] x [T,1,hd] x [T,1,c] -> [n,H,c]

    def new_slot(self, capacity: int, max_rewind: int = 64) -> LatentSlot:
        """A latent cache of `capacity` positions (rewind is a length change: any depth)."""
        return LatentSlot(capacity, self.spec.head_dim)

    def __call__(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, slot: LatentSlot, start: int) -> np.ndarray:
        """q [n, H, r + c], k [n, 1, r + c] (v, the latent, is k's tail and not stored twice)."""
        end = start + len(q)
        slot.k[start:end] = k
        keys = slot.k[:end]
        s = self.spec
        return self.attend(q, keys, keys[:, :, self.rope:], np.arange(start, end), np.arange(end),
                           s.scale, 0, s.softcap)


def mla_reference(spec) -> MlaAttention:
    """The float32 numpy reference (archrun_blocks.reference.attend)."""
    return MlaAttention(spec)


class FastMlaAttention(MlaAttention):
    """MlaAttention on archrun-blocks' attention kernel, whose layer decodes fused: `fused_layer` (the whole
    layer's one-token kernel, archrun_mla.fused) over the slot's rows (`slot_arrays`)."""

    def __init__(self, spec):
        from archrun_blocks import elementwise  # imported on use: loading the plugin compiles no kernel

        super().__init__(spec, elementwise.attention)

    @staticmethod
    def slot_arrays(slot: LatentSlot) -> tuple:
        from archrun_mla import fused

        return fused.slot_arrays(slot)

    def fused_layer(self, qkv, o, common, moe, group_id=None) -> tuple | None:
        """(kernel, args, parallel) of this layer's fused decode step, or None (archrun_mla.fused)."""
        from archrun_mla import fused

        return fused.fused_layer(self, qkv, o, common, moe, group_id)


def mla_fast(spec) -> MlaAttention:
    """The same op on archrun-blocks' attention kernel (numba); its layer decodes fused."""
    return FastMlaAttention(spec)
