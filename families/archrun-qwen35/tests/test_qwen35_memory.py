"""qwen35 beyond the standard battery: tiled gated DeltaNet and gated attention layers in one cache (the layer kinds,
the state in `archrun inspect`, the value-head order). The memory battery (rewinds, checkpoints, a chat's prefix
reuse, speculative decoding's rejected drafts, chunked prefill) is the conformance kit's
(``archrun.conformance.memory``), run on every fixture here whose layers keep state."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import archrun
from archrun.conformance import hf

GOLDENS = Path(__file__).parent / "goldens"


@pytest.mark.parametrize("name", ["qwen35_dddA", "qwen35_dAdA_tied"])
def test_layers_choose_their_kind(name):
    model = archrun.load(GOLDENS / f"{name}.gguf", backend="reference")
    pattern = name.split("_")[1]
    assert [ly.attention.kind for ly in model.descriptor.layers] == \
        ["gated_causal" if k == "A" else "gated_deltanet_tiled" for k in pattern]


def test_inspect_shows_the_delta_state():
    from archrun.describe.inspect import inspect_model

    memory = inspect_model(GOLDENS / "qwen35_dddA.gguf")["memory"]
    conv, delta = 3 * (2 * 2 * 16 + 4 * 16), 4 * 16 * 16     # (K-1) x conv_dim; value heads x dk x dv
    assert memory[0] == {"kind": "gated_deltanet_tiled", "bytes_per_token": 0, "state_bytes": 4 * (conv + delta),
                         "kv_bytes_per_token": {"f32": 0}}
    rows = 2 * 2 * 32  # K and V rows of 2 kv heads x 32; q8_0: one block of 32 values = 34 bytes per head row
    assert memory[3] == {"kind": "gated_causal", "bytes_per_token": rows * 4, "state_bytes": 0,
                         "kv_bytes_per_token": {"f32": rows * 4, "f16": rows * 2, "q8_0": 2 * 2 * 34}}


def test_the_value_head_order_is_seen():
    """Reading the tiled file with grouped value heads (qwen3next's order) moves the logits far."""
    g = hf.load_golden(GOLDENS / "qwen35_dddA.npz")
    model = archrun.load(GOLDENS / "qwen35_dddA.gguf", backend="reference", hints={"recurrent": "gated_deltanet"})
    assert hf.rel_err(model.logits(g["ids"].astype(np.int64)), g["logits"]) > 10 * hf.TOLERANCE
