"""LFM2's gated short convolution: a token mixer whose memory is the last L-1 gated inputs.

Per layer, with d the model width and L = `shortconv.l_cache` taps (llama.cpp
src/models/lfm2.cpp build_shortconv_block, HF modeling_lfm2.py Lfm2ShortConv):

    B | C | x = in_proj h                       [n, 3d] -> three [n, d]
    u         = B * x                           [n, d]
    ext       = [state ; u]                     [L-1+n, d]  (state: the previous L-1 rows of u, zeros at first)
    conv[t]   = sum_j w[:, j] * ext[t + j]      [n, d]      (causal depthwise convolution, w = shortconv.conv [d, L])
    out       = out_proj (C * conv)             [n, d]

and the new state is ext's last L-1 rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from archrun.errors import MetadataError
from archrun_recurrent.fused import FusedMixer
from archrun_recurrent.state import StateSlot

F32 = np.float32


class ShortConvLayout:
    """A token mixer's layout (slot "mixer", archrun.vocab.MixerLayout): describe states its geometry."""

    def describe(self, ctx: Any) -> dict[str, Any]:
        """The spec fields of a short-convolution layer (archrun.vocab.MixerLayout): its taps and width."""
        m, t, i, d = ctx.meta, ctx.tensors, ctx.layer, ctx.n_embd
        taps = m.get("shortconv.l_cache", int)
        if not 2 <= taps <= 64:
            raise MetadataError(f"{m.key('shortconv.l_cache')!r} = {taps}: a short convolution needs 2..64 taps")
        t.expect("shortconv.in_proj", i, (d, 3 * d))
        t.expect("shortconv.conv", i, (taps, d))
        t.expect("shortconv.out_proj", i, (d, d))
        return {"params": {"l_cache": taps, "width": d}}  # no heads: a depthwise convolution over d channels


def conv_reference(ext: np.ndarray, w: np.ndarray, c: np.ndarray) -> np.ndarray:
    """c * causal depthwise convolution: ext [L-1+n, d], w [d, L], c [n, d] -> [n, d]."""
    n, taps = len(c), w.shape[1]
    acc = np.zeros_like(c)
    for j in range(taps):
        acc += ext[j:j + n] * w[:, j]
    return c * acc


class ShortConv:
    """The bound short-convolution mixer of one layer: mix(h [n, d], slot, start) -> [n, d]."""

    def __init__(self, spec: Any, conv: Callable[..., np.ndarray] = conv_reference):
        self.taps = int(spec.param("l_cache"))
        self.width = int(spec.param("width"))
        self.conv = conv
        self.in_proj = self.out_proj = None
        self.w: np.ndarray | None = None

    def bind(self, binder: Any, layer: int) -> None:
        """Bind the layer's in_proj, convolution taps [d, L] and out_proj (once, at load)."""
        self.in_proj = binder.matrix("shortconv.in_proj", layer)
        self.w = np.ascontiguousarray(binder.table("shortconv.conv", layer).reshape(self.width, self.taps))
        self.out_proj = binder.matrix("shortconv.out_proj", layer)

    def new_slot(self, capacity: int, max_rewind: int = 64) -> StateSlot:
        """The layer's state: the last L-1 gated inputs [L-1, d], with copies for the last max_rewind tokens."""
        return StateSlot({"conv": (self.taps - 1, self.width)}, recent=max_rewind)

    def mix(self, h: np.ndarray, slot: StateSlot, start: int) -> np.ndarray:
        """Append h [n, d] (normed inputs at positions start..) to the layer's state; the mixer output [n, d]."""
        slot.begin(start)
        d, n = self.width, len(h)
        bcx = self.in_proj(h)                                    # [n, 3d]
        ext = np.concatenate([slot.state["conv"], bcx[:, :d] * bcx[:, 2 * d:]])   # [L-1+n, d]
        y = self.conv(ext, self.w, np.ascontiguousarray(bcx[:, d:2 * d]))
        self._keep(slot, ext, start, start + n)
        return self.out_proj(y)

    def _keep(self, slot: StateSlot, ext: np.ndarray, start: int, end: int) -> None:
        """The state after each of the step's last tokens (ext's L-1 rows ending there) into the ring."""
        state = slot.state["conv"]
        for length in range(slot.first_kept(start, end), end + 1):
            state[...] = ext[length - start:length - start + self.taps - 1]
            slot.keep(length)
        slot.end(end)


def shortconv_reference(spec: Any) -> ShortConv:
    """The float32 numpy reference."""
    return ShortConv(spec)


class FastShortConv(FusedMixer, ShortConv):
    """The mixer with its gated convolution in a numba kernel, and its whole decode layer as one kernel
    (`fused_layer`, archrun.kernels.decode.fusion): the fused one-token step computes the same bits."""

    def __init__(self, spec: Any):
        from archrun_recurrent.kernels import conv  # imported on use: loading the plugin compiles no kernel

        super().__init__(spec, conv.gated_conv)

    def _fused_parts(self) -> tuple:
        from archrun_recurrent.kernels.shortconv_layer import shortconv_layer

        return shortconv_layer, (self.in_proj, self.out_proj), (self.w,)


def shortconv_fast(spec: Any) -> ShortConv:
    """The same mixer with its gated convolution in a numba kernel; its layer decodes fused."""
    return FastShortConv(spec)
