"""DeepSeek-V4's heavily compressed attention (HCA) keys: one entry per closed window of m tokens.

From the layer's normed input h [n, d] at positions 0..n-1 (HF DeepseekV4HCACompressor; llama.cpp
deepseek4 `attn_compressor_*`): per window w of m tokens (complete windows only),

    c_w = rms(sum_j softmax_j(gate_j + B_j) * kv_j, norm)     kv_j = wkv h_j, gate_j = wgate h_j   [hd]
                                                              softmax over the window's j, per channel;
                                                              B [m, hd] the learned position bias
    c_w: rope on its trailing r dims at position w m (the layer's "compress" table: its own theta, YaRN)

and query t sees entry w when w < (t + 1) // m (its window closed at or before t). The entries join the
layer's sliding-window keys (K = V).

Reference math over a whole prompt from position 0; not yet an op: the rewindable state (the open
window's projections, the emitted entries), the overlapping CSA windows and their indexer remain.
"""

from __future__ import annotations

import numpy as np

from archrun_deepseek4_ops.mhc import unweighted_rms
from archrun_deepseek4_ops.v4_attention import rope_trailing

F32 = np.float32


def hca_entries(h: np.ndarray, w: dict, rate: int, inv_freq: np.ndarray, eps: float) -> np.ndarray:
    """The compressed entries [n // rate, hd] of the prompt h [n, d] (w: wkv [hd, d], wgate [hd, d],
    ape [rate, hd], norm [hd]); inv_freq [r/2] the compress rope table's frequencies (its cos/sin magnitude
    is 1: HF pins V4's YaRN attention factor to 1)."""
    n_win = len(h) // rate
    hd = w["wkv"].shape[0]
    if n_win == 0:
        return np.zeros((0, hd), F32)
    used = h[: n_win * rate]
    kv = (used @ w["wkv"].T).reshape(n_win, rate, hd)
    gate = (used @ w["wgate"].T).reshape(n_win, rate, hd) + w["ape"]
    e = np.exp(gate - gate.max(axis=1, keepdims=True))
    pooled = (kv * (e / e.sum(axis=1, keepdims=True))).sum(axis=1)
    c = unweighted_rms(pooled, eps) * w["norm"]
    angles = np.outer(np.arange(n_win, dtype=np.float64) * rate, inv_freq)
    return rope_trailing(c, angles)


def visible(pos: np.ndarray, n_entries: int, rate: int) -> np.ndarray:
    """[n, n_entries] bool: query at pos sees entry w when w < (pos + 1) // rate."""
    return np.arange(n_entries)[None, :] < ((np.asarray(pos) + 1) // rate)[:, None]
