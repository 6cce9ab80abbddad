"""DeepSeek-V4's heavily compressed attention (HCA) keys: one entry per closed window of m tokens.

From the layer's normed input h [n, d] at positions 0..n-1 (HF DeepseekV4HCACompressor; llama.cpp
deepseek4 `attn_compressor_*`): per window w of m tokens (complete windows only),

    c_w = rms(sum_j softmax_j(gate_j + B_j) * kv_j, norm)     kv_j = wkv h_j, gate_j = wgate h_j   [hd]
                                                              softmax over the window's j, per channel;
                                                              B [m, hd] the learned position bias
    c_w: rope on its trailing r dims at position w m (the layer's "compress" table: its own theta, YaRN)

and query t sees entry w when w < (t + 1) // m (its window closed at or before t). The entries join the
layer's sliding-window keys (K = V).

Compressed sparse attention (CSA) layers pool overlapping windows: wkv, wgate and B have 2 hd rows, and
entry w pools 2 m slots, the first hd channels of window w - 1's tokens (none for w = 0) beside the last hd
channels of window w's. A lightning indexer (its own overlapping compressor of index width, queries from
the attention's q LoRA roped at the query's position, head weights from h) scores the entries a query
sees and keeps its top k (archrun_mla.indexer's scoring and selection); the query attends to those only.

Reference math over a whole prompt from position 0; the op (archrun_deepseek4_ops.attention) emits the
same entries window by window from its cache.
"""

from __future__ import annotations

import numpy as np

from archrun_deepseek4_ops.mhc import unweighted_rms
from archrun_deepseek4_ops.v4_attention import rope_trailing

F32 = np.float32


def hca_entries(h: np.ndarray, w: dict, rate: int, inv_freq: np.ndarray, eps: float,
                overlap: bool = False) -> np.ndarray:
    """The compressed entries [n // rate, hd] of the prompt h [n, d] (w: wkv [hd, d], wgate [hd, d],
    ape [rate, hd], norm [hd]; with overlap, CSA's windows: wkv, wgate [2 hd, d], ape [rate, 2 hd]);
    inv_freq [r/2] the compress rope table's frequencies (its cos/sin magnitude is 1: HF pins V4's YaRN
    attention factor to 1)."""
    n_win = len(h) // rate
    hd = w["norm"].shape[0]
    if n_win == 0:
        return np.zeros((0, hd), F32)
    used = h[: n_win * rate]
    kv = (used @ w["wkv"].T).reshape(n_win, rate, -1)
    gate = (used @ w["wgate"].T).reshape(n_win, rate, -1) + w["ape"]
    if overlap:  # slots: window w - 1's first halves, then window w's second halves
        first_kv = np.concatenate([np.zeros_like(kv[:1, :, :hd]), kv[:-1, :, :hd]])
        first_gate = np.concatenate([np.full_like(gate[:1, :, :hd], -np.inf), gate[:-1, :, :hd]])
        kv = np.concatenate([first_kv, kv[:, :, hd:]], axis=1)
        gate = np.concatenate([first_gate, gate[:, :, hd:]], axis=1)
    e = np.exp(gate - gate.max(axis=1, keepdims=True))
    pooled = (kv * (e / e.sum(axis=1, keepdims=True))).sum(axis=1)
    c = unweighted_rms(pooled, eps) * w["norm"]
    angles = np.outer(np.arange(n_win, dtype=np.float64) * rate, inv_freq)
    return rope_trailing(c, angles)


def visible(pos: np.ndarray, n_entries: int, rate: int) -> np.ndarray:
    """[n, n_entries] bool: query at pos sees entry w when w < (pos + 1) // rate."""
    return np.arange(n_entries)[None, :] < ((np.asarray(pos) + 1) // rate)[:, None]


def csa_selected(h: np.ndarray, q_lora: np.ndarray, w: dict, pos: np.ndarray, rate: int, inv_freq: np.ndarray,
                 top_k: int, n_head: int, eps: float) -> np.ndarray:
    """[n, n // rate] bool: the entries each query of a CSA layer attends to (visible and among its top_k by
    the indexer's score). h [n, d] the layer's normed input, q_lora [n, q_lora_rank] the attention's normed
    q LoRA; w: the indexer's compressor (wkv, wgate, ape, norm as for hca_entries with overlap), q_b
    [Hi Di, q_lora_rank] and proj [Hi, d]."""
    from archrun_mla.indexer import index_scores, top_keys

    keys = hca_entries(h, w, rate, inv_freq, eps, overlap=True)                          # [T, Di]
    q = (q_lora @ w["q_b"].T).reshape(len(h), n_head, -1)
    q = rope_trailing(q, np.outer(np.asarray(pos, np.float64), inv_freq))
    weights = (h @ w["proj"].T) * F32(n_head ** -0.5)
    seen = visible(pos, len(keys), rate)
    chosen = np.zeros_like(seen)
    if len(keys) == 0:
        return chosen
    scores = index_scores(q.astype(F32), weights.astype(F32), keys, (np.asarray(pos) + 1) // rate - 1)
    if len(keys) <= top_k:
        return seen
    np.put_along_axis(chosen, top_keys(scores, top_k), True, axis=1)
    return chosen & seen
