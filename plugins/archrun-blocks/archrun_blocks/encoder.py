"""The vocabulary of encoders (BERT-style models): bidirectional attention and the post-norm block.

`bidirectional` is the causal attention of archrun_blocks with every query placed at the sequence's
last position, so each one sees every stored key (llama.cpp's non-causal mask): the same scores,
softmax and kernels, only the mask differs. Its fast twin runs archrun_blocks' attention kernel on
the same positions. It declares `causal = False`: the interpreter refuses to generate with it and
runs a sequence in one pass.

`post_norm` is the residual topology of the original Transformer and BERT: each branch joins the
stream before a norm, g = norm1(x + s a), out = norm2(g + s f); the norms are the block's own
(`attn_output_norm`, `layer_output_norm`, with biases where the file has them), bound at load.
"""

from __future__ import annotations

import numpy as np

from archrun.descriptor import AttentionSpec
from archrun.errors import MetadataError
from archrun_blocks import reference

F32 = np.float32


class BidirectionalAttention(reference.CausalAttention):
    """Grouped-query attention in which every query sees every stored key (an encoder's)."""

    causal = False

    def __init__(self, spec: AttentionSpec):
        super().__init__(spec)
        if spec.window or spec.sinks:
            raise MetadataError(f"attention {spec.kind!r} sees the whole sequence: it has no sliding window "
                                f"(got {spec.window}) and no attention sinks")

    def new_slot(self, capacity: int, max_rewind: int = 64, kv_type: str = "f32") -> reference.KvSlot:
        """A plain K/V slot for `capacity` positions (no window, so never a ring)."""
        if kv_type not in self.kv_types:
            raise MetadataError(f"attention {self.spec.kind!r} stores no kv type {kv_type!r} (it has {self.kv_types})")
        return reference.KvSlot(capacity, self.spec.n_head_kv, self.spec.head_dim, self.spec.v_head_dim, kv_type,
                                self.codec)

    def __call__(self, q, k, v, slot: reference.KvSlot, start: int) -> np.ndarray:
        """Store k/v at rows start.., then attend every query over all rows 0..start+n-1: [n, H, vd]."""
        end = start + q.shape[0]
        slot.put(start, k, v)
        keys, values = slot.rows(end)
        return self._attend(q, keys, values, np.full(q.shape[0], end - 1), np.arange(end))


def bidirectional_attention(spec: AttentionSpec) -> BidirectionalAttention:
    """The fast twin: archrun_blocks' attention kernel and kernel row codec (no fused decode part: an
    encoder never decodes one token at a time)."""
    from archrun_blocks import fast

    op = BidirectionalAttention(spec)
    op.attend = fast._attend
    op.codec = fast.KernelKvCodec
    return op


class PostNorm:
    """x -> g = norm1(x + s attn(x)) -> norm2(g + s ffn(g)): each branch joins the stream, then a norm."""

    ffn_reads_input = False

    def __init__(self, scale: float = 1.0):
        self.scale = F32(scale)
        self.norm = None  # the model's norm op, bound with the weights

    def bind(self, binder, layer: int) -> None:
        """Bind the block's norms: `attn_output_norm` after the attention, `layer_output_norm` after the FFN
        (each with its bias when the file has one), through the model's norm op."""
        d = binder.d
        self.norm = binder.op("norm", d.norm, d.norm_eps)
        self.attn_norm = _norm_weights(binder, "attn_output_norm", layer)
        self.out_norm = _norm_weights(binder, "layer_output_norm", layer)

    def ffn_input(self, x: np.ndarray, a: np.ndarray) -> np.ndarray:
        return self.norm(x + a * self.scale, *self.attn_norm)

    def combine(self, x: np.ndarray, a: np.ndarray, f: np.ndarray) -> np.ndarray:
        return self.norm(self.ffn_input(x, a) + f * self.scale, *self.out_norm)


def _norm_weights(binder, role: str, layer: int) -> tuple[np.ndarray, np.ndarray | None]:
    """(weight [d], bias [d] or None) of a norm; the bias by presence."""
    has_bias = binder.d.tensor_name(f"{role}.bias", layer) in binder.gguf.tensors
    return binder.vector(role, layer), binder.vector(f"{role}.bias", layer) if has_bias else None
