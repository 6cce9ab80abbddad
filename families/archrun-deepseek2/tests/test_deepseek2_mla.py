"""deepseek2 beyond the standard battery: the compressed latent cache, the legacy `attn_kv_b` layout,
and what a deepseek2 file does without the MLA vocabulary package."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import archrun
from archrun.conformance.gguf_edit import rewrite_gguf
from archrun.errors import UnknownVocabulary
from archrun.io.ggufset import open_gguf
from archrun.plugins import installed_plugins, make_plugin_manager

GOLDENS = Path(__file__).parent / "goldens"
TOLERANCE = 1e-4  # of the logit range, as the battery


def _relative(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.parametrize("name", ["deepseek3_qlora", "deepseek3_lite_groups"])
def test_cache_holds_latent_and_rope_key_only(name):
    """bytes per token per layer = (kv_lora_rank + rope dims) x 4 (float32): no expanded K/V heads."""
    model = archrun.load(GOLDENS / f"{name}.gguf")
    meta = model.gguf.metadata
    lora, rope = meta["deepseek2.attention.kv_lora_rank"], meta["deepseek2.rope.dimension_count"]
    n_layer = meta["deepseek2.block_count"]
    cache = model.init_cache(40)
    assert cache.nbytes == 40 * n_layer * (lora + rope) * 4
    expanded = meta["deepseek2.attention.head_count"] * (
        meta["deepseek2.attention.key_length_mla"] + meta["deepseek2.attention.value_length_mla"])
    assert lora + rope < expanded  # what the compression buys on this fixture


def _legacy_copy(src: Path, dst: Path) -> Path:
    """src with attn_k_b/attn_v_b joined back into the pre-MLA `attn_kv_b` {kv_lora, H (nope + v)}:
    the inverse of llama.cpp's converter split (k_b = kv_b[:, :nope] transposed, v_b = kv_b[:, nope:])."""
    with open_gguf(src) as g:
        meta = g.metadata
        n_head = meta["deepseek2.attention.head_count"]
        k_mla, v_mla = meta["deepseek2.attention.key_length_mla"], meta["deepseek2.attention.value_length_mla"]
        tensors = {}
        for i in range(meta["deepseek2.block_count"]):
            k_b = g.dequantize(f"blk.{i}.attn_k_b.weight")      # [H, lora, nope]
            v_b = g.dequantize(f"blk.{i}.attn_v_b.weight")      # [H, v, lora]
            kv_b = np.concatenate([k_b.transpose(0, 2, 1), v_b], axis=1)  # [H, nope + v, lora]
            tensors[f"blk.{i}.attn_kv_b.weight"] = kv_b.reshape(-1, kv_b.shape[-1]).astype(np.float32)
    keys = {"deepseek2.attention.key_length": k_mla, "deepseek2.attention.value_length": v_mla,
            "deepseek2.attention.head_count_kv": n_head}
    # legacy files predate the *_mla keys
    return rewrite_gguf(src, dst, drop_tensors=("attn_k_b", "attn_v_b"), add_keys=keys, add_tensors=tensors,
                        drop_keys=("deepseek2.attention.key_length_mla", "deepseek2.attention.value_length_mla"))


@pytest.mark.parametrize("backend", ["reference", "fast"])
@pytest.mark.parametrize("name", ["deepseek3_qlora", "deepseek2_lite_softmax"])
def test_legacy_kv_b_layout_matches_hf(tmp_path, name, backend):
    """A pre-MLA file (unsplit attn_kv_b, per-head key/value lengths) runs the same latent attention
    and matches the HF golden of the model it came from."""
    path = _legacy_copy(GOLDENS / f"{name}.gguf", tmp_path / f"{name}.gguf")
    golden = np.load(GOLDENS / f"{name}.npz")
    model = archrun.load(path, backend=backend)
    assert model.descriptor.layers[0].attention.param("legacy_kv_b") == 1.0
    assert _relative(model.logits(golden["ids"]), golden["logits"]) <= TOLERANCE


def test_without_the_mla_package_the_load_names_it():
    """deepseek2 needs attention='mla_fixed_lora_eps'; with archrun-mla not loaded the error says so, before
    any weight."""
    names = [n for n in installed_plugins() if n != "mla"]
    with pytest.raises(UnknownVocabulary, match="attention='mla_fixed_lora_eps'"):
        archrun.load(GOLDENS / "deepseek3_qlora.gguf", plugins=make_plugin_manager(names))
