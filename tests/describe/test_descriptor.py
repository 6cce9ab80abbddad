import re

import attrs
import pytest

from archrun.descriptor import AttentionSpec, Descriptor, FfnSpec, LayerSpec, MoeSpec, RopeSpec


def _layer(**kw):
    a = dict(kind="causal", n_head=4, n_head_kv=2, head_dim=16, v_head_dim=16, scale=0.25)
    a.update(kw)
    return LayerSpec(attention=AttentionSpec(**a), ffn=FfnSpec(activation="silu", n_ff=32))


def _desc(**kw):
    d = dict(architecture="x", n_vocab=10, n_embd=64, n_ctx=128, layers=(_layer(),),
             rope_tables=(RopeSpec(pairing="neox", n_rot=16, freq_base=1e4),), norm="rms")
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
        _desc(layers=())
    with pytest.raises(TypeError):
        Descriptor(architecture="x", n_vocab=10, n_embd=64, n_ctx=128, layers=(_layer(),),
                   rope_tables=(RopeSpec(pairing="neox", n_rot=16, freq_base=1e4),))  # no norm
    with pytest.raises(ValueError):
        RopeSpec(pairing="neox", n_rot=15, freq_base=1e4)
    with pytest.raises(ValueError):
        MoeSpec(kind="topk", activation="silu", n_expert=4, n_expert_used=5, n_ff=8, gating="softmax",
                weights_norm=True)
    with pytest.raises(ValueError):
        MoeSpec(kind="topk", activation="silu", n_expert=6, n_expert_used=2, n_ff=8, gating="softmax",
                weights_norm=True, n_group=4, n_group_used=2)


def test_vocabulary_values_are_names_checked_against_the_registry():
    """A choice is any name (the descriptor knows no vocabulary); the plan refuses names no plugin provides."""
    from archrun.errors import UnknownVocabulary
    from archrun.plugins import make_plugin_manager
    from archrun.run.bind import vocabulary_of
    from archrun.vocab import build_vocabulary

    vocab = build_vocabulary(make_plugin_manager(names=["blocks"]))
    d = _desc(block_style="turbo", rope_tables=(RopeSpec(pairing="diagonal", n_rot=16, freq_base=1e4),))
    wanted = vocabulary_of(d)
    assert ("block_style", "turbo") in wanted and ("rope", "diagonal") in wanted
    assert ("activation", "silu") in wanted and ("norm", "rms") in wanted
    with pytest.raises(UnknownVocabulary, match="rope='diagonal'.*neox, norm"):
        vocab.entry("rope", "diagonal")
    with pytest.raises(UnknownVocabulary, match="block_style='turbo'"):
        vocab.entry("block_style", "turbo")


# Descriptor fields whose value names a vocabulary op -> the slot it names.
VOCABULARY_FIELDS = {
    ("Descriptor", "norm"): "norm", ("Descriptor", "softcap"): "softcap", ("Descriptor", "block_style"): "block_style",
    ("Descriptor", "final_norm"): "norm", ("Descriptor", "stream"): "stream",
    ("LayerSpec", "residual"): "residual", ("AttentionSpec", "kind"): "attention",
    ("FfnSpec", "activation"): "activation", ("MoeSpec", "kind"): "moe", ("MoeSpec", "activation"): "activation",
    ("MoeSpec", "gating"): "gating", ("RopeSpec", "pairing"): "rope",
}
# str fields that are not vocabulary: a name, a validated enumeration, tensor roles
PLAIN_STR_FIELDS = {("Descriptor", "architecture"), ("Descriptor", "pooling"), ("RopeSpec", "scaling"),
                    ("RopeSpec", "freq_factors"),
                    ("RopeSpec", "long_factors"), ("RopeSpec", "short_factors")}


def test_every_descriptor_field_is_documented():
    """docs/descriptor.md documents every field of every attrs class of archrun.descriptor in its class's
    section, with a meaning, names the slot of every field whose value is a vocabulary name, and
    documents no field that does not exist."""
    from pathlib import Path

    from archrun.vocab import SLOTS

    doc = (Path(__file__).parents[2] / "docs" / "descriptor.md").read_text()
    classes = _descriptor_classes()
    assert {Descriptor, LayerSpec, AttentionSpec, FfnSpec, MoeSpec, RopeSpec} <= set(classes)
    for cls in classes:
        assert f"## {cls.__name__}\n" in doc, f"docs/descriptor.md has no section '## {cls.__name__}'"
        rows = _rows(_section(doc, cls.__name__))
        stale = set(rows) - {f.name for f in attrs.fields(cls)}
        assert not stale, f"docs/descriptor.md documents {cls.__name__} fields that do not exist: {sorted(stale)}"
        for f in attrs.fields(cls):
            key = (cls.__name__, f.name)
            where = f"{cls.__name__}.{f.name}"
            assert f.name in rows, f"{where} is not documented in docs/descriptor.md"
            meaning = rows[f.name]
            assert len(meaning.split()) >= 2, f"{where}: no meaning in docs/descriptor.md"
            if str(f.type).startswith("str") and key not in PLAIN_STR_FIELDS:
                assert key in VOCABULARY_FIELDS, f"{where} is a str: add it to VOCABULARY_FIELDS or PLAIN_STR_FIELDS"
            if key in VOCABULARY_FIELDS:
                slot = VOCABULARY_FIELDS[key]
                assert slot in SLOTS
                assert meaning.startswith(f"[{slot}]"), f"{where}: docs/descriptor.md must name its slot [{slot}]"


def _descriptor_classes() -> list[type]:
    """Every attrs class archrun.descriptor defines (the descriptor and its parts)."""
    import inspect

    from archrun import descriptor

    return [cls for _, cls in inspect.getmembers(descriptor, inspect.isclass)
            if attrs.has(cls) and cls.__module__ == descriptor.__name__]


def _section(doc: str, name: str) -> str:
    """The text of the `## <name>` section of docs/descriptor.md (up to the next heading)."""
    start = doc.index(f"## {name}\n")
    end = doc.find("\n## ", start + 1)
    return doc[start:end if end >= 0 else len(doc)]


def _rows(section: str) -> dict[str, str]:
    """field -> meaning cell of a section's table rows `| `field` | meaning | ... |`."""
    out = {}
    for line in section.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        if len(cells) >= 2 and cells[0].startswith("`"):
            for name in cells[0].replace("`", "").split(","):
                out[name.strip()] = cells[1]
    return out
