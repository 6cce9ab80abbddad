"""DeepSeek-V4's attention on its sliding-only layers (compress ratio 0), reference math over a whole prompt.

Shapes: n tokens, H heads of width hd (the last r of them rotary), one shared K/V head, d width, G output
groups of rank R. From the layer's normed input h [n, d] (HF DeepseekV4Attention; llama.cpp deepseek4):

    q  = unweighted_rms_per_head(q_b(rms(q_a(h), q_a_norm)))          [n, H, hd]
    kv = rms(kv_proj(h), kv_norm)                                      [n, hd]   (key and value alike)
    q, kv: rope on the trailing r dims, pairs (2i, 2i + 1), theta^(-2i / r) at each token's position
    a  = softmax over the keys within `window` positions (and the head's sink logit) of q . kv / sqrt(hd)
         -> sum of the weights times kv                                [n, H, hd]
    a: its trailing r dims rotated back (-angle at the query's position): values carry their key's rope
    out = o_b(concat_g(a_g @ o_a_g.T))                                 a_g: heads g H/G .. (g+1) H/G - 1

The whole-prompt math attention="deepseek4" (archrun_deepseek4_ops.attention) was built from.
"""

from __future__ import annotations

import numpy as np

from archrun_deepseek4_ops.mhc import unweighted_rms

F32 = np.float32


def rope_angles(pos: np.ndarray, rope_dim: int, theta: float) -> np.ndarray:
    """Angles [n, r/2]: pos * theta^(-2i / r)."""
    inv = 1.0 / theta ** (np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim)
    return np.outer(np.asarray(pos, np.float64), inv)


def rope_trailing(x: np.ndarray, angles: np.ndarray, sign: float = 1.0) -> np.ndarray:
    """x [n, ..., hd] with its trailing r = 2 angles.shape[-1] dims rotated pairwise (2i, 2i + 1) by
    sign * angles [n, r/2] (the same angle for every head)."""
    r = 2 * angles.shape[-1]
    cos = np.cos(angles).astype(F32).reshape(len(x), *([1] * (x.ndim - 2)), -1)
    sin = (sign * np.sin(angles)).astype(F32).reshape(cos.shape)
    out = np.array(x, F32)
    even, odd = x[..., -r::2], x[..., -r + 1::2]
    out[..., -r::2] = even * cos - odd * sin
    out[..., -r + 1::2] = odd * cos + even * sin
    return out


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return unweighted_rms(x, eps) * w


def sliding_attention(h: np.ndarray, w: dict, pos: np.ndarray, window: int, theta: float, rope_dim: int,
                      n_head: int, n_groups: int, eps: float) -> np.ndarray:
    """The layer's output [n, d] for the prompt h [n, d] at positions pos [n] (w: the layer's q_a, q_a_norm,
    q_b, kv, kv_norm, sinks [H], o_a [G R, H hd / G], o_b [d, G R] as float32 arrays)."""
    n = len(h)
    hd = w["kv"].shape[0]
    q = (_rms(h @ w["q_a"].T, w["q_a_norm"], eps) @ w["q_b"].T).reshape(n, n_head, hd)
    q = unweighted_rms(q, eps)
    kv = _rms(h @ w["kv"].T, w["kv_norm"], eps)
    ang = rope_angles(pos, rope_dim, theta)
    q, kv = rope_trailing(q, ang), rope_trailing(kv, ang)
    scores = np.einsum("qhd,kd->hqk", q, kv) * F32(hd ** -0.5)  # [H, n, n]
    dist = pos[:, None] - pos[None, :]
    scores = np.where((dist >= 0) & (dist < window), scores, F32(-np.inf))
    sinks = np.broadcast_to(w["sinks"].astype(F32)[:, None, None], (n_head, n, 1))
    logits = np.concatenate([scores, sinks], axis=-1)
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs = (e / e.sum(axis=-1, keepdims=True))[..., :-1]
    a = rope_trailing(np.einsum("hqk,kd->qhd", probs, kv), ang, sign=-1.0)  # [n, H, hd]
    grouped = a.reshape(n, n_groups, -1)
    o_a = w["o_a"].reshape(n_groups, -1, grouped.shape[-1])  # [G, R, H hd / G]
    low = np.einsum("ngi,gri->ngr", grouped, o_a).reshape(n, -1)
    return (low @ w["o_b"].T).astype(F32)
