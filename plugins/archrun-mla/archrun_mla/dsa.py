"""DeepSeek Sparse Attention (DSA, DeepSeek-V3.2): MLA whose queries each read only the keys the lightning
indexer (archrun_mla.indexer) picks.

The layout is MLA's (archrun_mla.layout, a q LoRA required: the indexer's queries read rms(q_a h)) plus
the indexer's projections, which its qkv gives as side inputs after q, k, v (archrun.vocab.AttentionLayout):
the indexer query [n, Hi Di], key [n, Di] (layer-normed) and head weights [n, Hi] (/ sqrt(Hi)), all before
rope. The op ropes them (NEOX on the first r dims, the model's rope table: `bind`), caches the indexer
key beside the latent row (a slot row is r + c + Di floats), scores and attends: a query at position p
reads every key while p < top_k, else its top_k keys. On the fast backend a layer decodes fused (one kernel
call per token: archrun_mla.fused, kernels.dsa_layer) with the op-by-op path's bits.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np

from archrun.errors import MetadataError
from archrun_blocks import reference
from archrun_mla import indexer
from archrun_mla.attention import MlaAttention
from archrun_mla.layout import MlaLayout, _LoraQuery

F32 = np.float32
INDEXER_NORM_EPS = 1e-6  # HF's nn.LayerNorm(index_head_dim, eps=1e-6)


class DsaLayout(MlaLayout):
    """describe: MLA's geometry and the indexer's (heads, width, top-k); bind: the absorbed projections with
    the indexer's as side inputs."""

    def describe(self, ctx: Any) -> dict[str, Any]:
        """AttentionSpec fields of layer ctx.layer (see archrun.vocab.AttentionLayout)."""
        fields = super().describe(ctx)
        m, t, i, d = ctx.meta, ctx.tensors, ctx.layer, ctx.n_embd
        p = fields["params"]
        heads, width = m.get("attention.indexer.head_count", int), m.get("attention.indexer.key_length", int)
        top_k = m.get("attention.indexer.top_k", int)
        if not p["q_lora_rank"]:
            raise MetadataError("sparse attention's indexer reads the query LoRA: the file has no attn_q_a")
        if min(heads, top_k) < 1 or width <= p["qk_rope"]:
            raise MetadataError(f"indexer geometry is impossible: {heads} heads of width {width} "
                                f"(rope dims {p['qk_rope']}), top_k {top_k}")
        t.expect("indexer.attn_q_b", i, (p["q_lora_rank"], heads * width))
        t.expect("indexer.attn_k", i, (d, width))
        t.expect("indexer.k_norm", i, (width,))
        t.expect("indexer.k_norm.bias", i, (width,))
        t.expect("indexer.proj", i, (d, heads))
        fields["params"] = {**p, "index_heads": heads, "index_width": width, "index_top_k": top_k}
        return fields

    def bind(self, b: Any, spec: Any, i: int) -> tuple[Any, Any]:
        """(qkv, o) of layer i: qkv(h) -> (q, k, v, indexer query, indexer key, indexer head weights)."""
        qkv, o = super().bind(b, spec, i)
        side = _IndexerProjections(b.matrix("indexer.attn_q_b", i), b.matrix("indexer.attn_k", i),
                                   b.vector("indexer.k_norm", i), b.vector("indexer.k_norm.bias", i),
                                   b.matrix("indexer.proj", i), b.op("norm", "layer", INDEXER_NORM_EPS))
        return _DsaQkv(qkv, side), o


class _IndexerProjections:
    """r_q [n, q_lora], h [n, d] -> the indexer's query [n, Hi Di], key [n, Di], head weights [n, Hi]."""

    def __init__(self, q_b: Any, k: Any, k_norm: np.ndarray, k_norm_b: np.ndarray, proj: Any, norm: Any):
        self.q_b, self.k, self.k_norm, self.k_norm_b, self.proj, self.norm = q_b, k, k_norm, k_norm_b, proj, norm

    def __call__(self, r_q: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        w = self.proj(h)
        return self.q_b(r_q), self.norm(self.k(h), self.k_norm, self.k_norm_b), w * F32(1.0 / np.sqrt(w.shape[1]))


class _DsaQkv:
    """MLA's qkv (archrun_mla.layout._MlaQkv, its query a q LoRA) with the indexer's projections after it."""

    def __init__(self, mla: Any, side: _IndexerProjections):
        if not isinstance(mla.query, _LoraQuery):
            raise MetadataError("sparse attention's indexer reads the query LoRA: the file has no attn_q_a")
        self.mla, self.side = mla, side

    def __call__(self, h: np.ndarray) -> tuple[np.ndarray, ...]:
        r_q = self.mla.query.resid(h)
        return (*self.mla.project(h, self.mla.query.q_b(r_q)), *self.side(r_q, h))


class DsaSlot:
    """One layer's cache: the latent rows k [capacity, 1, r + c] (as MLA's) and the indexer keys
    ik [capacity, Di] (roped), a row of each per position."""

    def __init__(self, capacity: int, width: int, index_width: int):
        self.k = np.zeros((capacity, 1, width), F32)
        self.ik = np.zeros((capacity, index_width), F32)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.ik.nbytes


class DsaAttention(MlaAttention):
    """MLA over the keys the indexer picks: q [n, H, r + c], k [n, 1, r + c], then the indexer's query
    [n, Hi Di], key [n, Di] and weights [n, Hi] (side inputs, before rope) -> [n, H, c]."""

    def __init__(self, spec, attend=reference.attend, scores=indexer.index_scores):
        super().__init__(spec)
        self.attend, self.scores = attend, scores
        self.heads, self.width = int(spec.param("index_heads")), int(spec.param("index_width"))
        self.top_k = int(spec.param("index_top_k"))
        self.index_rope = None  # bound at load (`bind`): NEOX pairing on the model's rope table

    def bind(self, b: Any, layer: int) -> None:
        """The indexer's rope: the layer's rope table (its scaling and magnitude) with NEOX pairing."""
        table = b.d.rope_tables[self.spec.rope]
        if table.long_factors or table.n_rot != self.rope:
            raise MetadataError(f"layer {layer}: the indexer ropes its first {self.rope} dims with the model's "
                                f"rope table, which rotates {table.n_rot} (or is LongRoPE)")
        factors = b.vector(table.freq_factors) if table.freq_factors else None
        self.index_rope = b.op("rope", "neox", attrs.evolve(table, pairing="neox"), factors)

    def new_slot(self, capacity: int, max_rewind: int = 64) -> DsaSlot:
        """A latent and indexer-key cache of `capacity` positions (rewind is a length change: any depth)."""
        return DsaSlot(capacity, self.spec.head_dim, self.width)

    def __call__(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, slot: DsaSlot, start: int,
                 index_q: np.ndarray, index_k: np.ndarray, index_w: np.ndarray) -> np.ndarray:
        n, end = len(q), start + len(q)
        pos = np.arange(start, end)
        cos, sin = self.index_rope.cos_sin(pos)
        slot.k[start:end] = k
        slot.ik[start:end] = self.index_rope(index_k.reshape(n, 1, self.width), cos, sin)[:, 0]
        keys, s = slot.k[:end], self.spec
        dense = min(n, max(0, self.top_k - start))  # rows at positions < top_k see every key
        out = np.empty((n, s.n_head, keys.shape[2] - self.rope), F32)
        if dense:
            out[:dense] = self.attend(q[:dense], keys, keys[:, :, self.rope:], pos[:dense], np.arange(end),
                                      s.scale, 0, s.softcap)
        if dense < n:
            iq = self.index_rope(index_q[dense:].reshape(n - dense, self.heads, self.width), cos[dense:], sin[dense:])
            chosen = indexer.top_keys(self.scores(iq, index_w[dense:], slot.ik[:end], pos[dense:]), self.top_k)
            for row, picked in zip(range(dense, n), chosen, strict=True):
                sel = keys[picked]
                out[row:row + 1] = self.attend(q[row:row + 1], sel, sel[:, :, self.rope:], pos[row:row + 1], picked,
                                               s.scale, 0, s.softcap)
        return out


def dsa_reference(spec) -> DsaAttention:
    """The float32 numpy reference (archrun_blocks.reference.attend; the indexer scored in HF's order)."""
    return DsaAttention(spec)


class FastDsaAttention(DsaAttention):
    """DsaAttention on archrun-blocks' attention kernel and the chunked BLAS scorer, whose layer decodes fused:
    `fused_layer` (the whole layer's one-token kernel, archrun_mla.fused / kernels.dsa_layer) over the slot's
    latent rows and indexer keys (`slot_arrays`)."""

    def __init__(self, spec):
        from archrun_blocks import elementwise  # imported on use: loading the plugin compiles no kernel

        super().__init__(spec, elementwise.attention, indexer.index_scores_chunked)

    @staticmethod
    def slot_arrays(slot: DsaSlot) -> tuple:
        from archrun_mla import fused

        return fused.dsa_slot_arrays(slot)

    def fused_layer(self, qkv, o, common, moe, group_id=None) -> tuple | None:
        """(kernel, args, parallel) of this layer's fused decode step, or None (archrun_mla.fused)."""
        from archrun_mla import fused

        return fused.fused_dsa_layer(self, qkv, o, common, moe, group_id)


def dsa_fast(spec) -> DsaAttention:
    """The same op on archrun-blocks' attention kernel (numba) and the chunked BLAS scorer; its layer decodes
    fused."""
    return FastDsaAttention(spec)
