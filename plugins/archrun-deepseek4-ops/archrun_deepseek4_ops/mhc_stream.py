"""DeepSeek-V4's residual stream as a stream op: N hyper-connected streams (archrun_deepseek4_ops.mhc).

    enter:   S = the token embedding repeated N times                    [n, N, d]
    layer i: S = expand(S, attention(collapse(S)))  with the layer's hc_attn_* weights,
             then S = expand(S, ffn(collapse(S)))  with its hc_ffn_* weights
    leave:   the head's collapse (output_hc_*), before the trunk's final norm

`attention` and `ffn` are the block's branches (archrun.run.interpreter.StreamBlock: pre-norm, op,
post-norm; no residual, which the streams carry). Registered as stream="mhc". Tensor roles are llama.cpp's
gguf-py names (MODEL_TENSOR.HC_*): hc_attn_fn {N d, (2 + N) N}, hc_attn_base {(2 + N) N}, hc_attn_scale
{3}, the same hc_ffn_*, and output_hc_fn {N d, N}, output_hc_base {N}, output_hc_scale {1}; its layout
(`MhcLayout`) reads N, the Sinkhorn iterations and the epsilon from `hyper_connection.count`,
`.sinkhorn_iterations` and `.epsilon`. The gguf-py archrun pins (0.19) names neither these tensors nor
these keys: a family declares them (FamilyHints.metadata_keys, tensor_roles) as llama.cpp's gguf-py
spells them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from archrun_deepseek4_ops.mhc import HyperConnection, HyperHead

F32 = np.float32


class MhcLayout:
    """{"params": {n_stream, iters, hc_eps}} from the file's `hyper_connection.*` keys, its tensors checked
    (archrun.vocab.StreamLayout). A file stating a post-gate magnitude other than 2 or a low-rank mixing
    (llama.cpp's `hyper_connection.magnitude`, `.low_rank`) is not DeepSeek-V4's mHC and is refused; a stated
    `embedding_length_out` must be the streams' total width, count x embedding_length."""

    def describe(self, ctx: Any) -> dict[str, Any]:
        from archrun.errors import MetadataError

        m, t, d = ctx.meta, ctx.tensors, ctx.n_embd

        def key(name: str, kind: type, default: Any = ...) -> Any:
            try:
                return m.get(name, kind) if default is ... else m.get(name, kind, default)
            except KeyError:  # a key archrun's gguf-py does not name and the family did not declare
                if default is not ...:
                    return default
                raise MetadataError(f"stream 'mhc' needs the metadata key {name!r}, which archrun's gguf-py does "
                                    "not name (a family declares it: FamilyHints.metadata_keys)") from None

        n, iters, eps = key("hyper_connection.count", int), key("hyper_connection.sinkhorn_iterations", int), \
            key("hyper_connection.epsilon", float)
        if n < 1 or iters < 1 or not eps >= 0:
            raise MetadataError(f"stream 'mhc' needs at least one stream and one Sinkhorn iteration and an epsilon "
                                f">= 0: count {n}, sinkhorn_iterations {iters}, epsilon {eps}")
        if key("hyper_connection.magnitude", float, 2.0) != 2.0 or key("hyper_connection.low_rank", int, 0):
            raise MetadataError("stream 'mhc' is DeepSeek-V4's hyper-connections: a post-gate magnitude of 2 and "
                                "full-rank mixing (the file states hyper_connection.magnitude or .low_rank)")
        width = key("embedding_length_out", int, n * d)  # llama.cpp states the streams' total width
        if width != n * d:
            raise MetadataError(f"stream 'mhc': embedding_length_out {width} is not hyper_connection.count {n} x "
                                f"embedding_length {d}")
        k = (2 + n) * n
        for i in range(key("block_count", int)):
            for kind in ("attn", "ffn"):
                t.expect(f"hc_{kind}_fn", i, (n * d, k))
                t.expect(f"hc_{kind}_base", i, (k,))
                t.expect(f"hc_{kind}_scale", i, (3,))
        t.expect("output_hc_fn", None, (n * d, n))
        t.expect("output_hc_base", None, (n,))
        t.expect("output_hc_scale", None, (1,))
        return {"params": {"n_stream": n, "iters": iters, "hc_eps": eps}}


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
