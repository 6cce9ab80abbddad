"""DeepSeek-V4's residual stream as a stream op: N hyper-connected streams (archrun_deepseek4_ops.mhc).

    enter:   S = the token embedding repeated N times                    [n, N, d]
    layer i: S = expand(S, attention(collapse(S)))  with the layer's hc_attn_* weights,
             then S = expand(S, ffn(collapse(S)))  with its hc_ffn_* weights
    leave:   the head's collapse (output_hc_*), before the trunk's final norm

`attention` and `ffn` are the block's branches (archrun.run.interpreter.StreamBlock: pre-norm, op,
post-norm; no residual, which the streams carry). Tensor roles are llama.cpp's names: blk.N.hc_attn_fn /
_base / _scale, blk.N.hc_ffn_*, output_hc_fn / _base / _scale.

Not registered yet: the gguf-py archrun pins (0.19) names neither these tensors nor the
`hyper_connection.*` keys a layout would read N, the Sinkhorn iterations and the epsilon from.
"""

from __future__ import annotations

import numpy as np

from archrun_deepseek4_ops.mhc import HyperConnection, HyperHead

F32 = np.float32


class MhcStream:
    """The stream op: n_stream streams, Sinkhorn iterations and epsilon from the file; norm_eps the model's
    RMS epsilon (the streams' unweighted input norm)."""

    def __init__(self, descriptor, n_stream: int = 4, iters: int = 20, hc_eps: float = 1e-6,
                 fast: bool = False):
        self.d, self.n_layer = descriptor.n_embd, descriptor.n_layer
        self.norm_eps = float(descriptor.norm_eps)
        self.n, self.iters, self.hc_eps, self.fast = int(n_stream), int(iters), float(hc_eps), fast
        self.layers: list[tuple[HyperConnection, HyperConnection]] = []
        self.head: HyperHead | None = None

    def _connection(self, b, kind: str, i: int) -> HyperConnection:
        c = HyperConnection(b.table(f"hc_{kind}_fn", i), b.vector(f"hc_{kind}_base", i),
                            b.vector(f"hc_{kind}_scale", i), self.iters, self.hc_eps, self.norm_eps, self.fast)
        if (c.n, c.d) != (self.n, self.d):
            from archrun.errors import ShapeMismatch

            raise ShapeMismatch(f"layer {i}: hc_{kind} mixes {c.n} streams of {c.d}, the model has {self.n} of "
                                f"{self.d}")
        return c

    def bind(self, b) -> None:
        self.layers = [(self._connection(b, "attn", i), self._connection(b, "ffn", i)) for i in range(self.n_layer)]
        self.head = HyperHead(b.table("output_hc_fn"), b.vector("output_hc_base"), b.vector("output_hc_scale"),
                              self.hc_eps, self.norm_eps)

    def enter(self, x: np.ndarray, ids: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.repeat(np.asarray(x, F32)[:, None, :], self.n, axis=1))

    @staticmethod
    def _around(conn: HyperConnection, streams: np.ndarray, branch) -> np.ndarray:
        pre, post, comb = conn.weights(streams)
        return conn.expand(streams, post, comb, branch(conn.collapse(streams, pre)))

    def layer(self, i: int, streams: np.ndarray, block) -> np.ndarray:
        attn, ffn = self.layers[i]
        return self._around(ffn, self._around(attn, streams, block.attention), block.ffn)

    def leave(self, streams: np.ndarray) -> np.ndarray:
        return self.head(streams)


def mhc_stream_fast(descriptor, n_stream: int = 4, iters: int = 20, hc_eps: float = 1e-6) -> MhcStream:
    """The fast op: the per-token weights, collapse and mixing in numba kernels."""
    return MhcStream(descriptor, n_stream, iters, hc_eps, fast=True)
