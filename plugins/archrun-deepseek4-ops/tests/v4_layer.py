"""Test helpers: HF DeepseekV4Attention layers of the three kinds on random weights, and archrun's
attention="deepseek4" bound on the same weights through its layout (a binder and compile context over
numpy arrays: tensor roles as gguf-py names them, shapes in ggml order)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from archrun.descriptor import AttentionSpec, RopeSpec
from archrun.errors import MetadataError
from archrun.io.weights import Matrix
from archrun.run.plan import Projections
from archrun_blocks import reference as blocks
from archrun_deepseek4_ops.attention import V4Attention, V4Layout

F32 = np.float32
D, H, HD, R, G, OR, QL, WINDOW = 24, 4, 16, 8, 2, 6, 12, 6
HI, DI, TOPK, CSA, HCA = 4, 12, 3, 4, 8
THETA, COMPRESS_THETA, EPS = 10000.0, 160000.0, 1e-6
YARN = dict(factor=16.0, original_max_position_embeddings=64, beta_fast=32.0, beta_slow=1.0)
KINDS = ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"]


def hf_layers(seed: int = 9):
    """(config, [DeepseekV4Attention of each kind]) with random float32 weights."""
    import torch
    from transformers import DeepseekV4Config
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as hf

    torch.manual_seed(seed)
    cfg = DeepseekV4Config(vocab_size=64, hidden_size=D, num_attention_heads=H, head_dim=HD, q_lora_rank=QL,
                           partial_rotary_factor=R / HD, o_groups=G, o_lora_rank=OR, sliding_window=WINDOW,
                           num_hidden_layers=3, layer_types=KINDS, rope_theta=THETA,
                           compress_rates={"compressed_sparse_attention": CSA, "heavily_compressed_attention": HCA},
                           compress_rope_theta=COMPRESS_THETA, rope_parameters={"rope_type": "yarn", **YARN},
                           max_position_embeddings=1024, index_n_heads=HI, index_head_dim=DI, index_topk=TOPK,
                           rms_norm_eps=EPS)
    cfg._attn_implementation = "eager"
    layers = []
    for i in range(3):
        attn = hf.DeepseekV4Attention(cfg, i).float().eval()
        with torch.no_grad():
            for name, p in attn.named_parameters():
                if name.endswith("norm.weight"):
                    p.normal_(1.0, 0.3)
                else:
                    p.normal_(0, 0.4)
        layers.append(attn)
    return cfg, layers


def weights(attn) -> dict[str, np.ndarray]:
    """The layer's tensors by role (numpy order)."""
    def a(t):
        return t.detach().numpy().astype(F32)

    w = {"attn_q_a": a(attn.q_a_proj.weight), "attn_q_a_norm": a(attn.q_a_norm.weight),
         "attn_q_b": a(attn.q_b_proj.weight), "attn_kv": a(attn.kv_proj.weight),
         "attn_kv_a_norm": a(attn.kv_norm.weight), "attn_sinks": a(attn.sinks),
         "attn_output_a": a(attn.o_a_proj.weight), "attn_output_b": a(attn.o_b_proj.weight)}
    c = attn.compressor
    if c is not None:
        w.update(attn_compressor_kv=a(c.kv_proj.weight), attn_compressor_gate=a(c.gate_proj.weight),
                 attn_compressor_ape=a(c.position_bias), attn_compressor_norm=a(c.kv_norm.weight))
        ix = getattr(c, "indexer", None)
        if ix is not None:
            w.update({"indexer.attn_q_b": a(ix.q_b_proj.weight), "indexer.proj": a(ix.scorer.weights_proj.weight),
                      "indexer_compressor_kv": a(ix.kv_proj.weight), "indexer_compressor_gate": a(ix.gate_proj.weight),
                      "indexer_compressor_ape": a(ix.position_bias), "indexer_compressor_norm": a(ix.kv_norm.weight)})
    return w


KEYS = {"rope.dimension_count": R, "attention.q_lora_rank": QL, "attention.sliding_window": WINDOW,
        "rope.freq_base": THETA, "attention.compress_rope_freq_base": COMPRESS_THETA, "rope.scaling.type": "yarn",
        "rope.scaling.factor": YARN["factor"], "rope.scaling.original_context_length": 64,
        "rope.scaling.yarn_beta_fast": 32.0, "rope.scaling.yarn_beta_slow": 1.0, "context_length": 1024,
        "attention.indexer.head_count": HI, "attention.indexer.key_length": DI, "attention.indexer.top_k": TOPK}


class Meta:
    def __init__(self, keys: dict):
        self.keys = keys

    def get(self, name, kind, default=...):
        if name in self.keys:
            return kind(self.keys[name])
        if default is ...:
            raise MetadataError(f"missing required metadata key {name!r}")
        return default


class Tensors:
    """Roles -> ggml shapes (numpy's reversed)."""

    def __init__(self, w: dict):
        self.w = w

    def has(self, role, layer=None):
        return role in self.w

    def shape(self, role, layer=None):
        from archrun.errors import MissingTensor

        if role not in self.w:
            raise MissingTensor(f"required tensor {role!r} is missing")
        return tuple(reversed(self.w[role].shape))

    def expect(self, role, layer, shape):
        from archrun.errors import ShapeMismatch

        if self.shape(role) != tuple(shape):
            raise ShapeMismatch(f"{role}: {self.shape(role)} != {tuple(shape)}")


class Binder:
    """What the layout and op bind, over numpy arrays (float32 matrices)."""

    def __init__(self, w: dict, pairing: str = "none"):
        self.w, self.backend = w, "reference"
        self.d = SimpleNamespace(norm_eps=EPS, rope_tables=[RopeSpec(pairing=pairing, n_rot=0 if pairing == "none"
                                                                     else R, freq_base=THETA)])

    def matrix(self, role, layer=None, bias_role=None, lazy=False):
        m = np.ascontiguousarray(self.w[role], F32)
        return Matrix(m.view(np.uint8).reshape(m.shape[0], -1), 0, m.shape[1], "reference", None, role)

    def projections(self, roles, layer):
        return Projections([self.matrix(r, layer) for r in roles])

    def vector(self, role, layer=None):
        return self.w[role].reshape(-1)

    def table(self, role, layer=None):
        return self.w[role]

    def op(self, slot, name, *args):
        assert (slot, name) == ("norm", "rms")
        return blocks.rms_norm(*args)


def spec_of(w: dict, keys: dict | None = None) -> AttentionSpec:
    ctx = SimpleNamespace(meta=Meta(KEYS if keys is None else keys), tensors=Tensors(w), layer=0, n_embd=D,
                          n_head=H, n_head_kv=H)
    return AttentionSpec(kind="deepseek4", n_head=H, **V4Layout().describe(ctx))


def archrun_layer(w: dict, factory=V4Attention):
    """(qkv, op, o) bound on the layer's weights."""
    spec = spec_of(w)
    b = Binder(w)
    qkv, o = V4Layout().bind(b, spec, 0)
    op = factory(spec)
    op.bind(b, 0)
    return qkv, op, o


def run(layer, h: np.ndarray, spans, slot=None, start: int = 0):
    """archrun's layer output for h [n, d] fed in spans (slices of h) from `start` on one slot."""
    qkv, op, o = layer
    slot = op.new_slot(256) if slot is None else slot
    outs = []
    for s in spans:
        q, k, v, *side = qkv(h[s])
        n = len(q)
        a = op(q.reshape(n, H, HD), k.reshape(n, 1, HD), v.reshape(n, 1, HD), slot, start + s.start, *side)
        outs.append(o(a.reshape(n, -1)))
    return np.concatenate(outs), slot


def selection_margin(layer, h: np.ndarray) -> float:
    """The smallest gap, over the queries of a CSA layer fed h from position 0 that see more entries than
    top_k, between their k-th and (k+1)-th best indexer scores (relative to the largest score): the
    selection is well defined (HF's torch.topk breaks ties in no defined order) when it is not ~0."""
    from archrun_deepseek4_ops.v4_attention import rope_trailing
    from archrun_mla.indexer import index_scores

    qkv, op, _ = layer
    _, slot = run(layer, h, [slice(0, len(h))])
    pos = np.arange(len(h))
    side = qkv(h)[3:]
    n_seen = len(h) // op.ratio
    iq = rope_trailing(side[4].reshape(len(h), op.index_heads, op.index_width), op.rope.angles(pos))
    scores = index_scores(iq, side[5], slot.index_entries[:n_seen], (pos + 1) // op.ratio - 1)
    gaps = [np.diff(np.sort(s[np.isfinite(s)])[::-1][op.top_k - 1:op.top_k + 1])[0]
            for s in scores if np.isfinite(s).sum() > op.top_k]
    return float(-max(gaps) / np.abs(scores[np.isfinite(scores)]).max())


def random_weights(kind: int, seed: int = 0, n_head: int = H, hd: int = HD) -> dict[str, np.ndarray]:
    """Random tensors (numpy order) of a layer of kind 0 (sliding), 1 (CSA) or 2 (HCA) in this module's
    geometry (without HF)."""
    rng = np.random.default_rng(seed)

    def m(*shape, s=0.4):
        return rng.normal(0, s, shape).astype(F32)

    w = {"attn_q_a": m(QL, D), "attn_q_a_norm": m(QL, s=0.3) + 1, "attn_q_b": m(n_head * hd, QL),
         "attn_kv": m(hd, D), "attn_kv_a_norm": m(hd, s=0.3) + 1, "attn_sinks": m(n_head),
         "attn_output_a": m(G * OR, n_head * hd // G), "attn_output_b": m(D, G * OR)}
    if kind:
        ratio, width = (CSA, 2 * hd) if kind == 1 else (HCA, hd)
        w.update(attn_compressor_kv=m(width, D), attn_compressor_gate=m(width, D), attn_compressor_ape=m(ratio, width),
                 attn_compressor_norm=m(hd, s=0.3) + 1)
    if kind == 1:
        w.update({"indexer.attn_q_b": m(HI * DI, QL), "indexer.proj": m(HI, D), "indexer_compressor_kv": m(2 * DI, D),
                  "indexer_compressor_gate": m(2 * DI, D), "indexer_compressor_ape": m(CSA, 2 * DI),
                  "indexer_compressor_norm": m(DI, s=0.3) + 1})
    return w


def op_inputs(layer, h: np.ndarray) -> list[np.ndarray]:
    """The op's inputs for h [n, d]: q [n, H, hd], k, v [n, 1, hd], then the side inputs."""
    qkv, op, _ = layer
    q, k, v, *side = qkv(h)
    n = len(h)
    return [q.reshape(n, op.spec.n_head, -1), k.reshape(n, 1, -1), v.reshape(n, 1, -1), *side]


def run_op(op, inputs: list[np.ndarray], spans, slot=None) -> np.ndarray:
    """The op's outputs [n, H, hd] over the rows of its inputs fed in spans, on one slot."""
    slot = op.new_slot(256) if slot is None else slot
    return np.concatenate([op(*(x[s] for x in inputs[:3]), slot, s.start, *(x[s] for x in inputs[3:]))
                           for s in spans])
