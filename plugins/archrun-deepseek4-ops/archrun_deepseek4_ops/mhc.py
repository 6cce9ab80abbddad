"""Manifold-constrained hyper-connections (mHC, DeepSeek-V4): N residual streams around every sub-layer.

Shapes: n tokens, N streams (`hyper_connection.count`), d width. Around each sub-layer (attention, FFN) a
layer holds fn [(2 + N) N, N d], base [(2 + N) N] and scale [3] (`hc_attn_*`, `hc_ffn_*`). From the streams
S [n, N, d] of a token (HF DeepseekV4HyperConnection; float32):

    m = rms(S flattened, no weight) @ fn.T                       [n, (2 + N) N]
    pre  = sigmoid(m[:N] scale0 + base[:N]) + hc_eps              [n, N]
    post = 2 sigmoid(m[N:2N] scale1 + base[N:2N])                 [n, N]
    comb = softmax_rows(m[2N:] scale2 + base[2N:]) + hc_eps       [n, N, N], then made doubly stochastic:
           columns normalised, then (rows, columns) normalised iters - 1 times (each sum + hc_eps)
    h = sum_j pre_j S_j                                           the sub-layer's input [n, d]
    S'_k = post_k y + sum_j comb[j, k] S_j                        y = the sub-layer's output [n, d]

The trunk's end collapses the streams once more with its own head (hc_fn [N, N d], hc_base [N],
hc_scale [1]): pre = sigmoid(m scale + base) + hc_eps, h = sum_j pre_j S_j (DeepseekV4HyperHead).
The first layer's streams are the token embedding repeated N times.

`HyperConnection` / `HyperHead` are the reference ops (numpy); `fast=True` computes the per-token
weights, the collapse and the mixing in numba kernels (archrun_deepseek4_ops.kernels.mhc), the
projection on numpy's BLAS either way.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return F32(1.0) / (F32(1.0) + np.exp(-x))


def unweighted_rms(flat: np.ndarray, eps: float) -> np.ndarray:
    """flat [n, k] / sqrt(mean(flat^2) + eps) per row, float32."""
    return flat / np.sqrt(np.mean(flat * flat, axis=-1, keepdims=True) + F32(eps))


def sinkhorn(comb: np.ndarray, iters: int, eps: float) -> np.ndarray:
    """comb [n, N, N] positive: columns normalised, then rows and columns iters - 1 times (sum + eps)."""
    e = F32(eps)
    comb = comb / (comb.sum(axis=-2, keepdims=True) + e)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(axis=-1, keepdims=True) + e)
        comb = comb / (comb.sum(axis=-2, keepdims=True) + e)
    return comb


def _check(streams: np.ndarray, n_stream: int, width: int) -> np.ndarray:
    from archrun.errors import ShapeMismatch

    if not isinstance(streams, np.ndarray) or streams.ndim != 3 or streams.shape[1:] != (n_stream, width):
        raise ShapeMismatch(f"mhc: streams {getattr(streams, 'shape', None)} do not match [n, {n_stream}, {width}]")
    return np.ascontiguousarray(streams, F32)


class HyperConnection:
    """One sub-layer's mixing weights (fn, base, scale as the file stores them) and what it computes."""

    def __init__(self, fn: np.ndarray, base: np.ndarray, scale: np.ndarray, iters: int, hc_eps: float,
                 norm_eps: float, fast: bool = False):
        from archrun.errors import ShapeMismatch

        self.fn, self.base, self.scale = (np.ascontiguousarray(a, F32) for a in (fn, base, scale))
        k = self.base.shape[0]
        self.n = int(round((k + 1) ** 0.5)) - 1  # k = (2 + N) N
        if self.n < 1 or (2 + self.n) * self.n != k or self.fn.shape[0] != k or self.fn.shape[1] % self.n \
                or self.scale.shape != (3,):
            raise ShapeMismatch(f"mhc: fn {self.fn.shape}, base {self.base.shape}, scale {self.scale.shape} are not "
                                "[(2+N)N, N d], [(2+N)N], [3]")
        if iters < 1:
            raise ValueError(f"mhc: {iters} Sinkhorn iterations (at least 1)")
        self.d = self.fn.shape[1] // self.n
        self.iters, self.hc_eps, self.norm_eps, self.fast = int(iters), float(hc_eps), float(norm_eps), fast

    def mixes(self, streams: np.ndarray) -> np.ndarray:
        """m [n, (2 + N) N]: the unweighted-RMS-normed flat streams through fn."""
        flat = streams.reshape(len(streams), -1)
        return unweighted_rms(flat, self.norm_eps) @ self.fn.T

    def weights(self, streams: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(pre [n, N], post [n, N], comb [n, N, N]) of streams [n, N, d]."""
        s = _check(streams, self.n, self.d)
        m, n_s = self.mixes(s), self.n
        if self.fast:
            from archrun_deepseek4_ops.kernels.mhc import hc_weights

            pre, post, comb = np.empty((len(s), n_s), F32), np.empty((len(s), n_s), F32), np.empty(
                (len(s), n_s, n_s), F32)
            hc_weights(np.ascontiguousarray(m), self.base, self.scale, self.iters, self.hc_eps, pre, post, comb)
            return pre, post, comb
        b, sc = self.base, self.scale
        pre = _sigmoid(m[:, :n_s] * sc[0] + b[:n_s]) + F32(self.hc_eps)
        post = F32(2.0) * _sigmoid(m[:, n_s:2 * n_s] * sc[1] + b[n_s:2 * n_s])
        logits = (m[:, 2 * n_s:] * sc[2] + b[2 * n_s:]).reshape(-1, n_s, n_s)
        e = np.exp(logits - logits.max(axis=-1, keepdims=True))
        comb = e / e.sum(axis=-1, keepdims=True) + F32(self.hc_eps)
        return pre, post, sinkhorn(comb, self.iters, self.hc_eps)

    def collapse(self, streams: np.ndarray, pre: np.ndarray) -> np.ndarray:
        """h [n, d] = sum_j pre_j S_j: the sub-layer's input."""
        if self.fast:
            from archrun_deepseek4_ops.kernels.mhc import hc_collapse

            out = np.empty((len(streams), self.d), F32)
            hc_collapse(_check(streams, self.n, self.d), np.ascontiguousarray(pre, F32), out)
            return out
        return np.einsum("nj,njd->nd", pre, streams).astype(F32)

    def expand(self, streams: np.ndarray, post: np.ndarray, comb: np.ndarray, y: np.ndarray) -> np.ndarray:
        """S' [n, N, d]: S'_k = post_k y + sum_j comb[j, k] S_j (y [n, d] the sub-layer's output)."""
        if self.fast:
            from archrun_deepseek4_ops.kernels.mhc import hc_expand

            out = np.empty_like(_check(streams, self.n, self.d))
            hc_expand(np.ascontiguousarray(streams, F32), np.ascontiguousarray(post, F32),
                      np.ascontiguousarray(comb, F32), np.ascontiguousarray(y, F32), out)
            return out
        return (post[:, :, None] * y[:, None, :] + np.einsum("njk,njd->nkd", comb, streams)).astype(F32)


class HyperHead:
    """The trunk's final collapse of the streams (hc_fn [N, N d], hc_base [N], hc_scale [1])."""

    def __init__(self, fn: np.ndarray, base: np.ndarray, scale: np.ndarray, hc_eps: float, norm_eps: float):
        from archrun.errors import ShapeMismatch

        self.fn, self.base, self.scale = (np.ascontiguousarray(a, F32) for a in (fn, base, scale))
        self.n = self.base.shape[0]
        if self.fn.shape[0] != self.n or self.fn.shape[1] % max(self.n, 1) or self.scale.shape != (1,):
            raise ShapeMismatch(f"mhc head: fn {self.fn.shape}, base {self.base.shape}, scale {self.scale.shape} "
                                "are not [N, N d], [N], [1]")
        self.d, self.hc_eps, self.norm_eps = self.fn.shape[1] // self.n, float(hc_eps), float(norm_eps)

    def __call__(self, streams: np.ndarray) -> np.ndarray:
        s = _check(streams, self.n, self.d)
        m = unweighted_rms(s.reshape(len(s), -1), self.norm_eps) @ self.fn.T
        pre = _sigmoid(m * self.scale[0] + self.base) + F32(self.hc_eps)
        return np.einsum("nj,njd->nd", pre, s).astype(F32)
