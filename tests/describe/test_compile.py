"""The metadata compiler on synthetic GGUFs written with gguf.GGUFWriter."""

import warnings

import numpy as np
import pytest

from archrun.describe.compile import compile_gguf, describe
from archrun.descriptor import MoeSpec
from archrun.errors import (
    ArchrunWarning,
    MetadataError,
    MissingTensor,
    ShapeMismatch,
    UnknownVocabulary,
    UnsupportedArchitecture,
)


def test_qwen3_layout_compiles(synth_model):
    path = synth_model(arch="qwen3", head_dim=16, n_embd=32, n_head=4)  # head_dim != n_embd / n_head
    d = describe(path)
    a = d.layers[0].attention
    assert (a.n_head, a.n_head_kv, a.head_dim, a.qk_norm, a.qkv_bias) == (4, 2, 16, True, False)
    assert d.rope_tables[0].pairing == "neox" and d.rope_tables[0].n_rot == 16
    assert d.n_layer == 2 and not d.tied_output and d.block_style == "fused"


def test_structure_is_inferred_from_tensor_presence(synth_model):
    d = describe(synth_model(arch="qwen2", qk_norm=False, qkv_bias=True, tied=True))
    a = d.layers[0].attention
    assert a.qkv_bias and not a.qk_norm and d.tied_output


def test_moe_layout_compiles_with_family_renormalisation(synth_model):
    d = describe(synth_model(arch="qwen3moe", n_expert=4, n_expert_used=2))
    ffn = d.layers[0].ffn
    assert isinstance(ffn, MoeSpec)
    assert (ffn.n_expert, ffn.n_expert_used, ffn.n_ff, ffn.gating, ffn.weights_norm) == (4, 2, 16, "softmax", True)


MYSTERY_HINTS = {"rope_pairing": "neox", "attention": "causal", "activation": "silu", "residual": "sequential",
                 "embed_scale": 1.0}


def test_unknown_architecture_names_the_missing_conventions(synth_model):
    """No family describes 'mystery': nothing is assumed; one error names every missing convention."""
    path = synth_model(arch="mystery")
    with pytest.raises(UnsupportedArchitecture, match="no installed family plugin describes architecture "
                                                      "'mystery'") as e:
        compile_gguf(path)
    for name in MYSTERY_HINTS:
        assert name in str(e.value)
    for given in MYSTERY_HINTS:  # any one left out is named alone
        partial = {k: v for k, v in MYSTERY_HINTS.items() if k != given}
        with pytest.raises(UnsupportedArchitecture, match=f"missing: {given} ") as e:
            compile_gguf(path, hints=partial)
        assert all(f"{k} (" not in str(e.value) for k in partial)


def test_unknown_architecture_compiles_and_loads_with_hints(synth_model):
    import archrun

    path = synth_model(arch="mystery")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = compile_gguf(path, hints=MYSTERY_HINTS)
    d = result.descriptor
    assert result.family == "mystery" and result.hints.generic
    assert d.rope_tables[0].pairing == "neox" and d.layers[0].ffn.activation == "silu"
    assert (d.layers[0].residual, d.layers[0].attention.kind, d.embed_scale) == ("sequential", "causal", 1.0)
    m = archrun.load(path, backend="reference", hints=MYSTERY_HINTS)
    assert np.isfinite(m.logits([1, 2, 3])).all()


def test_unused_keys_are_reported(synth_model):
    path = synth_model(key_overrides={"attention.relative_buckets_count": 32})  # a T5 key no decoder reads
    with pytest.warns(ArchrunWarning, match="qwen3.attention.relative_buckets_count"):
        result = compile_gguf(path)
    assert result.unused_keys == ("qwen3.attention.relative_buckets_count",)


def test_known_file_has_no_warnings(synth_model):
    path = synth_model()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compile_gguf(path)


@pytest.mark.parametrize("key", ["embedding_length", "block_count", "context_length", "attention.head_count",
                                 "attention.layer_norm_rms_epsilon"])
def test_missing_required_key_is_named(synth_model, key):
    with pytest.raises(MetadataError, match=f"qwen3.{key}"):
        compile_gguf(synth_model(drop_keys=(key,)))


@pytest.mark.parametrize("overrides, match", [
    ({"attention.head_count": 0}, "head_count"),
    ({"attention.head_count_kv": 3}, "does not divide"),
    ({"block_count": 100000}, "block_count"),
    ({"context_length": 2**40}, "context_length"),
    ({"embedding_length": "wide"}, "expected int"),
    ({"attention.layer_norm_rms_epsilon": -1.0}, "epsilon"),
])
def test_bad_metadata_values(synth_model, overrides, match):
    with pytest.raises(MetadataError, match=match):
        compile_gguf(synth_model(key_overrides=overrides))


def test_missing_tensor_is_named(synth_model):
    with pytest.raises(MissingTensor, match="blk.1.attn_k.weight"):
        compile_gguf(synth_model(drop_tensors=("blk.1.attn_k.weight",)))


def test_shape_contradicting_metadata(synth_model):
    bad = np.zeros((16, 32), np.float32)  # attn_k should be (n_head_kv*head_dim=32, n_embd=32)
    with pytest.raises(ShapeMismatch, match="blk.0.attn_k.weight"):
        compile_gguf(synth_model(tensor_overrides={"blk.0.attn_k.weight": bad}))


def test_unknown_vocabulary_value_fails_at_load(synth_model):
    import archrun

    path = synth_model(arch="qwen3moe", n_expert=4, key_overrides={"expert_gating_func": 7})
    with pytest.raises(UnknownVocabulary, match="gating='gguf_7'.*sigmoid, softmax"):
        archrun.load(path)


def test_family_hook_supplies_what_files_omit(synth_model):
    from archrun.plugins import make_plugin_manager

    path = synth_model(arch="llama", qk_norm=False)
    result = compile_gguf(path)
    assert result.family == "llama" and result.descriptor.rope_tables[0].pairing == "norm"
    pm = make_plugin_manager(names=["blocks"])  # no family plugin for llama: nothing is assumed
    with pytest.raises(UnsupportedArchitecture, match="rope_pairing"):
        compile_gguf(path, plugins=pm)
    hints = dict(MYSTERY_HINTS, rope_pairing="norm")
    assert compile_gguf(path, plugins=pm, hints=hints).descriptor == result.descriptor
    # a caller's hint goes on top of the family's
    assert compile_gguf(path, hints={"rope_pairing": "neox"}).descriptor.rope_tables[0].pairing == "neox"


def test_archrun_describe_family_firstresult_prefers_later_plugin(synth_model):
    from archrun.family import TRANSFORMER, FamilyHints
    from archrun.hookspecs import hookimpl
    from archrun.plugins import make_plugin_manager

    class Override:
        @hookimpl
        def archrun_describe_family(self, architecture):
            if architecture != "qwen3":
                return None
            return FamilyHints(name="mine", rope_pairing="norm", activation="silu", embed_scale=1.0, **TRANSFORMER)

    pm = make_plugin_manager(extra=[Override()])
    result = compile_gguf(synth_model(), plugins=pm)
    assert result.family == "mine" and result.descriptor.rope_tables[0].pairing == "norm"


def test_file_stated_multipliers_are_read(synth_model):
    """granite-style `embedding_scale` / `residual_scale` keys: read from the file, and an embedding scale
    of 2 computes what doubled embeddings compute (an untied output head keeps the logits comparable)."""
    import archrun

    keys = {"embedding_scale": 2.0, "residual_scale": 0.5}
    scaled = synth_model(arch="llama", qk_norm=False, key_overrides=keys)
    d = describe(scaled)
    assert d.embed_scale == 2.0 and {layer.residual_scale for layer in d.layers} == {0.5}
    only_res = synth_model(arch="llama", qk_norm=False, key_overrides={"residual_scale": 0.5},
                           transform=lambda t: {**t, "token_embd.weight": t["token_embd.weight"] * 2})
    ids = [1, 5, 9, 3]
    for backend in ("reference", "fast"):
        a = archrun.load(scaled, backend=backend).logits(ids)
        b = archrun.load(only_res, backend=backend).logits(ids)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(b).max())
