import attrs
import pytest

from archrun.descriptor import AttentionSpec, Descriptor, FfnSpec, LayerSpec, MoeSpec, RopeSpec


def _layer(**kw):
    a = dict(kind="causal", n_head=4, n_head_kv=2, head_dim=16, v_head_dim=16, scale=0.25)
    a.update(kw)
    return LayerSpec(attention=AttentionSpec(**a), ffn=FfnSpec(kind="swiglu", n_ff=32))


def _desc(**kw):
    d = dict(architecture="x", n_vocab=10, n_embd=64, n_ctx=128, layers=(_layer(),),
             rope_tables=(RopeSpec(pairing="neox", n_rot=16, freq_base=1e4),))
    d.update(kw)
    return Descriptor(**d)


def test_valid_descriptor_is_frozen_and_evolvable():
    d = _desc()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        d.n_vocab = 3
    assert attrs.evolve(d, block_style="host_reference").block_style == "host_reference"
    assert d.n_layer == 1 and d.layers[0].attention.group == 2
    assert d.tensor_name("attn_q", 3) == "blk.3.attn_q.weight"
    assert d.to_dict()["tensor_names"]["output"] == "output.weight"


@pytest.mark.parametrize("bad", [
    dict(n_head_kv=3),          # does not divide 4 heads
    dict(n_head=0),
    dict(rope=1),               # names a rope table that does not exist
])
def test_bad_attention_geometry_is_rejected(bad):
    with pytest.raises((ValueError, TypeError)):
        _desc(layers=(_layer(**bad),))


def test_bad_values_are_rejected():
    with pytest.raises(ValueError):
        _desc(block_style="turbo")
    with pytest.raises(ValueError):
        _desc(layers=())
    with pytest.raises(ValueError):
        RopeSpec(pairing="neox", n_rot=15, freq_base=1e4)
    with pytest.raises(ValueError):
        RopeSpec(pairing="diagonal", n_rot=16, freq_base=1e4)
    with pytest.raises(ValueError):
        MoeSpec(kind="topk", expert_kind="swiglu", n_expert=4, n_expert_used=5, n_ff=8, gating="softmax",
                weights_norm=True)
    with pytest.raises(ValueError):
        MoeSpec(kind="topk", expert_kind="swiglu", n_expert=6, n_expert_used=2, n_ff=8, gating="softmax",
                weights_norm=True, n_group=4, n_group_used=2)


def test_every_descriptor_field_is_documented():
    from pathlib import Path

    from archrun.descriptor import AttentionSpec, Descriptor, FfnSpec, LayerSpec, MoeSpec, RopeSpec

    doc = (Path(__file__).parents[1] / "docs" / "descriptor.md").read_text()
    for cls in (Descriptor, LayerSpec, AttentionSpec, FfnSpec, MoeSpec, RopeSpec):
        for f in attrs.fields(cls):
            assert f"`{f.name}`" in doc, f"{cls.__name__}.{f.name} is not documented in docs/descriptor.md"
