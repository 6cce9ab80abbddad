"""Llama 4's attention and expert routing (llama.cpp src/models/llama4.cpp, HF modeling_llama4.py).

Attention "llama4", per layer:
- rotary (chunked) layers, window W > 0: q and k (after rope) are L2-normalised per head,
  x / sqrt(mean(x^2) + eps) with the model's RMS epsilon and no weight (Llama4TextL2Norm; llama.cpp
  skips it for the 128-expert model); query i sees key j iff j <= i and j // W == i // W (chunks of
  W tokens, not a sliding window);
- NoPE (global) layers, W = 0: q is scaled by the temperature tuning
  1 + 0.1 log(floor((pos + 1) / 8192) + 1) (llama.cpp's fixed values for llama4), then causal.

MoE "topk_input_weighted": route as "topk" does (gating, top-k, optional renorm and scale), but each
selected expert reads its input times the routing weight and its output is summed unweighted
(HF Llama4TextMoe; llama.cpp build_moe_ffn weight_before_ffn); shared experts read x as is.
"""

from __future__ import annotations

import numpy as np

from archrun.errors import MetadataError
from archrun_blocks import reference

F32 = np.float32
TEMP_SCALE, TEMP_FLOOR = 0.1, 8192  # llama.cpp: f_attn_temp_scale, n_attn_temp_floor_scale for llama4
NO_QK_NORM_EXPERTS = 128            # llama.cpp: the 128-expert model (Maverick) has no q/k L2 norm


def l2_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """x [..., hd] / sqrt(mean(x^2) + eps) over the last axis (float32)."""
    return (x / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + F32(eps))).astype(F32)


def temperature(pos: np.ndarray) -> np.ndarray:
    """Query scale per position [n]: 1 + 0.1 log(floor((pos + 1) / 8192) + 1)."""
    return (1.0 + TEMP_SCALE * np.log(np.floor((pos + 1.0) / TEMP_FLOOR) + 1.0)).astype(F32)


class Llama4Attention(reference.CausalAttention):
    """Chunked attention (chunk = spec.window) on L2-normalised q/k, or global with tuned queries."""

    def __init__(self, spec, attend=reference.attend):
        if spec.sinks:
            raise MetadataError("attention 'llama4' has no attention sinks; the model has attn_sinks")
        super().__init__(spec)
        self.attend = attend  # [n,H,hd] x [T,KV,hd] x [T,KV,vd] -> [n,H,vd] (reference or kernel)
        self.chunk = spec.window
        self.eps, self.qk_norm = 1e-5, True

    def bind(self, binder, layer: int) -> None:
        """The model's RMS epsilon, and whether q/k are normalised (not in the 128-expert model)."""
        super().bind(binder, layer)
        d = binder.d
        self.eps = d.norm_eps
        self.qk_norm = not any(getattr(ly.ffn, "n_expert", 0) == NO_QK_NORM_EXPERTS for ly in d.layers)

    def __call__(self, q, k, v, slot, start: int, prepared: bool = False) -> np.ndarray:
        """Attend q [n, H, hd] from positions start.. over the slot's rows and k/v [n, KV, *] (stored first);
        prepared: q and k are already normalised / tuned (the fast op's kernel did it)."""
        if prepared:
            return super().__call__(q, k, v, slot, start)
        if self.chunk:
            if self.qk_norm:
                q, k = l2_norm(q, self.eps), l2_norm(k, self.eps)
        else:
            q = q * temperature(np.arange(start, start + len(q), dtype=np.float64))[:, None, None]
        return super().__call__(q, k, v, slot, start)

    def _attend(self, q, k, v, q_pos, k_pos) -> np.ndarray:
        s = self.spec
        if not self.chunk:
            return self.attend(q, k, v, q_pos, k_pos, s.scale, 0, s.softcap)
        out = np.empty((len(q), q.shape[1], v.shape[2]), F32)
        for c in np.unique(q_pos // self.chunk):  # the queries of one chunk see only its keys
            qi, ki = q_pos // self.chunk == c, k_pos // self.chunk == c
            out[qi] = self.attend(q[qi], k[ki], v[ki], q_pos[qi], k_pos[ki], s.scale, 0, s.softcap)
        return out


def llama4_reference(spec) -> Llama4Attention:
    """The float32 numpy reference (archrun_blocks.reference.attend per chunk)."""
    return Llama4Attention(spec)


def topk_input_weighted(spec, gating, act):
    """The mixture with routing weights on the experts' inputs (module docstring)."""

    def moe(x: np.ndarray, w) -> np.ndarray:
        ids, weights = reference.route(gating(w.gate_inp(x)), w.probs_bias, spec)  # [n, k] each
        out = np.zeros_like(x)
        for e in np.unique(ids):
            rows, slot = np.nonzero(ids == e)
            xe = x[rows] * weights[rows, slot][:, None]
            out[rows] += w.down[e](act(w.gate[e](xe), w.up[e](xe)))
        if w.shared is not None:
            out += reference.shared_experts(x, w, act)
        return out

    return moe
