"""The layouts of attention="deepseek4" and stream="mhc": what they read from a file's keys and tensors, and
the typed errors for files that do not fit (before any op runs)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from v4_layer import CSA, DI, HCA, HD, HI, KEYS, QL, TOPK, WINDOW, Binder, Meta, Tensors, hf_layers, spec_of, weights

from archrun.descriptor import AttentionSpec
from archrun.errors import MetadataError, ShapeMismatch
from archrun_deepseek4_ops.attention import V4Attention
from archrun_deepseek4_ops.mhc_stream import MhcLayout

F32 = np.float32


class _GgufPy019Meta(Meta):
    """Metadata as archrun's pinned gguf-py sees it: names it does not spell are a KeyError."""

    UNNAMED = ("attention.compress_rope_freq_base", "hyper_connection.count", "hyper_connection.sinkhorn_iterations",
               "hyper_connection.epsilon", "hyper_connection.magnitude", "hyper_connection.low_rank")

    def get(self, name, kind, default=...):
        if name in self.UNNAMED:
            raise KeyError(name)
        return super().get(name, kind, default)


@pytest.fixture(scope="module")
def tensors():
    _, attn = hf_layers()
    return [weights(a) for a in attn]


def test_describe_states_each_layer_kind(tensors):
    sliding, csa, hca = (dict(spec_of(w).params) for w in tensors)
    common = {"q_lora_rank": QL, "rope_dim": 8, "window": WINDOW, "o_groups": 2, "o_lora_rank": 6}
    assert sliding == {**common, "ratio": 0, "overlap": 0, "rope_base": 10000.0}
    yarn = {"rope_base": 160000.0, "yarn_factor": 16.0, "original_context": 64, "beta_fast": 32.0, "beta_slow": 1.0}
    assert hca == {**common, **yarn, "ratio": HCA, "overlap": 0}
    assert csa == {**common, **yarn, "ratio": CSA, "overlap": 1, "index_heads": HI, "index_width": DI,
                   "index_top_k": TOPK}
    spec = spec_of(tensors[0])
    assert (spec.n_head_kv, spec.head_dim, spec.v_head_dim, spec.scale) == (1, HD, HD, pytest.approx(HD ** -0.5))


def _ctx(w, meta=None):
    return SimpleNamespace(meta=meta or Meta(KEYS), tensors=Tensors(w), layer=0, n_embd=24, n_head=4, n_head_kv=4)


def test_bad_files_are_refused_at_compile_time(tensors):
    from archrun_deepseek4_ops.attention import V4Layout

    layout = V4Layout()
    with pytest.raises(MetadataError, match="compress_rope_freq_base"):
        layout.describe(_ctx(tensors[2], _GgufPy019Meta(KEYS)))
    layout.describe(_ctx(tensors[0], _GgufPy019Meta(KEYS)))  # a sliding-only layer does not read it
    bad = dict(tensors[2], attn_compressor_ape=np.zeros((HCA, HD + 1), F32))
    with pytest.raises(MetadataError, match="position bias"):
        layout.describe(_ctx(bad))
    bad = dict(tensors[0], attn_output_a=np.zeros((12, 7), F32))
    with pytest.raises(MetadataError, match="output groups"):
        layout.describe(_ctx(bad))
    bad = dict(tensors[1], **{"indexer.proj": np.zeros((HI + 1, 24), F32)})
    with pytest.raises(ShapeMismatch):
        layout.describe(_ctx(bad))
    with pytest.raises(MetadataError, match="geometry"):
        layout.describe(_ctx(tensors[0], Meta({**KEYS, "rope.dimension_count": 7})))


def test_the_op_refuses_a_model_rope_and_a_foreign_window(tensors):
    spec = spec_of(tensors[0])
    with pytest.raises(MetadataError, match="rope"):
        V4Attention(spec).bind(Binder(tensors[0], pairing="norm"), 0)
    fields = {f: getattr(spec, f) for f in ("n_head", "n_head_kv", "head_dim", "v_head_dim", "scale", "params")}
    with pytest.raises(MetadataError, match="window"):
        V4Attention(AttentionSpec(kind="deepseek4", window=WINDOW + 1, **fields))


def _hc_tensors(n: int, d: int, layers: int) -> dict:
    k = (2 + n) * n
    t = {f"hc_{kind}_{part}": np.zeros(shape, F32) for kind in ("attn", "ffn")
         for part, shape in (("fn", (k, n * d)), ("base", (k,)), ("scale", (3,)))}
    t.update(output_hc_fn=np.zeros((n, n * d), F32), output_hc_base=np.zeros(n, F32), output_hc_scale=np.ones(1, F32))
    return t


HC_KEYS = {"hyper_connection.count": 4, "hyper_connection.sinkhorn_iterations": 20, "hyper_connection.epsilon": 1e-6,
           "block_count": 2}


def test_mhc_layout_reads_the_hyper_connection_keys():
    ctx = SimpleNamespace(meta=Meta(HC_KEYS), tensors=Tensors(_hc_tensors(4, 24, 2)), layer=-1, n_embd=24)
    assert MhcLayout().describe(ctx) == {"params": {"n_stream": 4, "iters": 20, "hc_eps": 1e-6}}
    ctx.meta = _GgufPy019Meta(HC_KEYS)
    with pytest.raises(MetadataError, match="hyper_connection.count"):
        MhcLayout().describe(ctx)
    ctx.meta = Meta({**HC_KEYS, "hyper_connection.magnitude": 1.0})
    with pytest.raises(MetadataError, match="magnitude"):
        MhcLayout().describe(ctx)
    ctx.meta = Meta({**HC_KEYS, "hyper_connection.count": 3})
    with pytest.raises(ShapeMismatch):
        MhcLayout().describe(ctx)
    ctx.meta = Meta({**HC_KEYS, "embedding_length_out": 4 * 24})
    assert MhcLayout().describe(ctx)["params"]["n_stream"] == 4
    ctx.meta = Meta({**HC_KEYS, "embedding_length_out": 3 * 24})
    with pytest.raises(MetadataError, match="embedding_length_out"):
        MhcLayout().describe(ctx)


class _RatiosMeta(Meta):
    """Metadata with llama.cpp's per-layer `attention.compress_ratios` (the compiler's per_layer)."""

    def has(self, name):
        return name in self.keys

    def per_layer(self, name, n, default=...):
        value = self.keys[name]
        if len(value) != n:
            raise MetadataError(f"{name} must be {n} integers")
        return tuple(value)


def test_stated_ratios_and_output_geometry_must_match_the_tensors(tensors):
    from archrun_deepseek4_ops.attention import V4Layout

    ratios = {**KEYS, "block_count": 3, "attention.compress_ratios": [0, CSA, HCA]}
    for i, w in enumerate(tensors):
        ctx = _ctx(w, _RatiosMeta(ratios))
        ctx.layer = i
        V4Layout().describe(ctx)
    ctx = _ctx(tensors[2], _RatiosMeta({**ratios, "attention.compress_ratios": [0, CSA, 128]}))
    ctx.layer = 2
    with pytest.raises(MetadataError, match="compress_ratios"):
        V4Layout().describe(ctx)
    with pytest.raises(MetadataError, match="output_lora_rank"):
        V4Layout().describe(_ctx(tensors[0], Meta({**KEYS, "attention.output_lora_rank": 7})))
