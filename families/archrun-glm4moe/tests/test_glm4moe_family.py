"""What the glm4moe family hook supplies, measured on the tiny HF fixtures (goldens/)."""

from pathlib import Path

import numpy as np
import pytest

import archrun
from archrun.errors import MissingTensor, UnsupportedArchitecture
from archrun.family import TRANSFORMER, FamilyHints
from archrun.hookspecs import hookimpl
from archrun.plugins import make_plugin_manager

TINY = Path(__file__).resolve().parent / "goldens"
NAMES = sorted(p.stem for p in TINY.glob("glm4moe_*.gguf"))


def golden(name):
    z = np.load(TINY / f"{name}.npz")
    return z["ids"].astype(np.int64), z["logits"]


def rel_err(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


# The conventions every family states (glm4moe's are a transformer's: NEOX, SiLU, unscaled embeddings).
CONVENTIONS = dict(rope_pairing="neox", activation="silu", embed_scale=1.0, **TRANSFORMER)


@pytest.mark.parametrize("name", NAMES)
def test_without_the_family_nothing_is_assumed(name):
    pm = make_plugin_manager(names=["blocks"])
    with pytest.raises(UnsupportedArchitecture, match="'glm4moe'.*rope_pairing"):
        archrun.load(TINY / f"{name}.gguf", plugins=pm)


@pytest.mark.parametrize("name", NAMES)
def test_the_conventions_alone_miss_the_pre_ffn_norm(name):
    """Stated conventions without the role remap do not give the HF model: its pre-FFN norm is stored
    under post_attention_norm."""
    ids, ref = golden(name)
    pm = make_plugin_manager(names=["blocks"])
    try:
        model = archrun.load(TINY / f"{name}.gguf", plugins=pm, hints=CONVENTIONS, backend="reference")
    except MissingTensor:
        return
    assert rel_err(model.logits(ids), ref) > 1e-2


class OnlyTheRemap:
    """Beyond the conventions, the one thing the family must supply: the pre-FFN norm is stored as
    post_attention_norm."""

    @hookimpl
    def archrun_describe_family(self, architecture):
        return FamilyHints(name="remap-only", **CONVENTIONS,
                           tensor_names={"ffn_norm": "blk.{i}.post_attention_norm.weight", "post_attn_norm": None})


@pytest.mark.parametrize("name", NAMES)
def test_the_role_remap_is_all_the_family_must_supply(name):
    # Everything else is in the file: expert_gating_func=2 (sigmoid), expert_weights_norm/scale,
    # expert groups, leading_dense_block_count, rope.dimension_count (partial rope), nextn_predict_layers.
    ids, ref = golden(name)
    pm = make_plugin_manager(names=["blocks"], extra=[OnlyTheRemap()])
    model = archrun.load(TINY / f"{name}.gguf", plugins=pm)
    assert rel_err(model.logits(ids), ref) <= 1e-4


@pytest.mark.parametrize("name", NAMES)
def test_fused_style_runs_glm4moe_correctly(name):
    ids, ref = golden(name)
    fused = archrun.load(TINY / f"{name}.gguf", block_style="fused")
    assert fused.descriptor.block_style == "fused"
    assert rel_err(fused.logits(ids), ref) <= 1e-4  # the style guards are the conformance kit's
    assert archrun.load(TINY / f"{name}.gguf").descriptor.block_style == "host_reference"
