"""kimi-linear beyond the standard battery: KDA and MLA layers in one cache (the layer kinds, the state and the
latent rows in `archrun inspect`), and the MLA layers' missing rotary embedding (the kit has no pairing to flip
"none" to). The memory battery (rewinds, checkpoints, a chat's prefix reuse, speculative
decoding's rejected drafts, chunked prefill) is the conformance kit's (``archrun.conformance.memory``), run on
every fixture here whose layers keep state."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import archrun
from archrun.conformance.hf import rel_err

GOLDENS = Path(__file__).parent / "goldens"


@pytest.mark.parametrize("name", ["kimi_linear_kkkm", "kimi_linear_mkkm_k3"])
def test_layers_choose_their_kind(name):
    model = archrun.load(GOLDENS / f"{name}.gguf", backend="reference")
    pattern = name.split("_")[2].upper()
    assert [ly.attention.kind for ly in model.descriptor.layers] == \
        ["mla_fixed_lora_eps" if k == "M" else "kda" for k in pattern]


def test_inspect_shows_the_delta_state_and_the_latent_rows():
    from archrun.describe.inspect import inspect_model

    memory = inspect_model(GOLDENS / "kimi_linear_kkkm.gguf")["memory"]
    conv, delta = 3 * 3 * 4 * 16, 4 * 16 * 16     # (K-1) x (q|k|v channels); heads x dk x dv
    assert memory[0] == {"kind": "kda", "bytes_per_token": 0, "state_bytes": 4 * (conv + delta),
                         "kv_bytes_per_token": {"f32": 0}}
    row = 32 + 8  # one [k_pe | latent] row per token: kv_lora_rank + rope dims, shared by every head
    assert memory[3] == {"kind": "mla_fixed_lora_eps", "bytes_per_token": 4 * row, "state_bytes": 0,
                         "kv_bytes_per_token": {"f32": 4 * row}}


def test_mla_layers_have_no_rotary_embedding():
    """Rotating the MLA layers' rope dims (as DeepSeek's do) moves the logits far from HF's."""
    with np.load(GOLDENS / "kimi_linear_mkkm_k3.npz") as z:
        ids, ref = z["ids"].astype(np.int64), z["logits"]
    rotated = archrun.load(GOLDENS / "kimi_linear_mkkm_k3.gguf", backend="reference", hints={"rope_pairing": "norm"})
    assert rel_err(rotated.logits(ids), ref) > 1e-2
