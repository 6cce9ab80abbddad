"""The lightning indexer of DeepSeek Sparse Attention (DSA, DeepSeek-V3.2): which cached keys each query reads.

Per token (HF modeling_deepseek_v32.py DeepseekV32Indexer, llama.cpp src/models/deepseek32.cpp), with
Hi indexer heads of width Di whose first r dims rotate (NEOX pairing, the model's rope table), from the
layer's normed input h and the attention's normed query LoRA r_q = rms(q_a h):

    q_i     = indexer.attn_q_b r_q                     [Hi, Di]   (rope on each head's first r dims)
    k_i     = layer_norm(indexer.attn_k h) (+ bias)    [Di]       (rope on its first r dims; cached)
    w       = indexer.proj h / sqrt(Hi)                [Hi]
    score_t = sum_h w_h relu(q_i,h . k_i,t) / sqrt(Di)            for every cached key t <= the query's position

and the query attends only over its `top_k` best-scoring keys (every visible key while it sees no more
than top_k). llama.cpp's Hadamard rotation of q_i and k_i and DeepSeek's fp8 scoring change no score
beyond rounding (the rotation is orthogonal; HF skips both): scores are float32 here as in HF.

Ties at the k-th place (exact zeros of the ReLU) HF breaks in no defined order (torch.topk); archrun gives
them to the earlier position. The fixtures keep a margin at the k-th place (docs/families.md).
"""

from __future__ import annotations

import numpy as np

F32 = np.float32
SCORE_BUDGET = 1 << 22  # floats of one [rows, Hi, T] block of per-head scores (a long context's would not fit)


def index_scores(q: np.ndarray, w: np.ndarray, keys: np.ndarray, q_pos: np.ndarray) -> np.ndarray:
    """Reference: scores [m, T] of queries q [m, Hi, Di] (roped) with weights w [m, Hi] (already / sqrt(Hi))
    over keys [T, Di] (roped), -inf past each query's position q_pos [m]; in HF's order (every head's
    ReLU'd dot products, weighted, summed), SCORE_BUDGET floats of per-head scores at a time."""
    m, n_head, width = q.shape
    out = np.empty((m, len(keys)), F32)
    for a, b in _row_blocks(m, n_head * len(keys)):
        dots = np.einsum("mhd,td->mht", q[a:b], keys, dtype=F32) * F32(1.0 / np.sqrt(width))
        out[a:b] = np.einsum("mh,mht->mt", w[a:b], np.maximum(dots, F32(0)), dtype=F32)
    return _causal(out, q_pos)


def index_scores_chunked(q: np.ndarray, w: np.ndarray, keys: np.ndarray, q_pos: np.ndarray) -> np.ndarray:
    """The same scores through one BLAS product per block of queries (the keys scaled once, not every
    product)."""
    m, n_head, width = q.shape
    t = len(keys)
    out = np.empty((m, t), F32)
    keys_t = np.ascontiguousarray((keys * F32(1.0 / np.sqrt(width))).T)     # [Di, T]
    for a, b in _row_blocks(m, n_head * t):
        dots = np.ascontiguousarray(q[a:b]).reshape(-1, width) @ keys_t     # [(b-a) Hi, T]
        np.maximum(dots, F32(0), out=dots)
        out[a:b] = np.matmul(w[a:b, None, :], dots.reshape(b - a, n_head, t))[:, 0]
    return _causal(out, q_pos)


def _row_blocks(m: int, per_row: int) -> list[tuple[int, int]]:
    """[a, b) blocks of m query rows whose per-head scores (per_row floats a row) fit SCORE_BUDGET."""
    rows = max(1, SCORE_BUDGET // max(1, per_row))
    return [(a, min(m, a + rows)) for a in range(0, m, rows)]


def _causal(scores: np.ndarray, q_pos: np.ndarray) -> np.ndarray:
    scores[np.arange(scores.shape[1])[None, :] > q_pos[:, None]] = -np.inf
    return scores


def top_keys(scores: np.ndarray, k: int) -> np.ndarray:
    """The k best keys of each row of scores [m, T] (T > k), ascending: int64 [m, k]. Ties at the k-th
    place go to the earlier positions."""
    kth = -np.partition(-scores, k - 1, axis=1)[:, k - 1:k]                 # [m, 1] the k-th best score
    above = scores > kth
    tied = scores == kth
    room = k - above.sum(axis=1, keepdims=True)                             # how many tied keys fit
    chosen = above | (tied & (np.cumsum(tied, axis=1) <= room))
    return np.nonzero(chosen)[1].reshape(len(scores), k).astype(np.int64)
