"""qwen3next beyond the standard battery: gated DeltaNet and gated attention layers in one cache (the layer kinds,
the state in `archrun inspect`). The memory battery (rewinds, checkpoints, a chat's prefix reuse, speculative
decoding's rejected drafts, chunked prefill) is the conformance kit's (``archrun.conformance.memory``), run on
every fixture here whose layers keep state."""

from __future__ import annotations

from pathlib import Path

import pytest

import archrun

GOLDENS = Path(__file__).parent / "goldens"


@pytest.mark.parametrize("name", ["qwen3next_dddA", "qwen3next_dAdA_k3"])
def test_layers_choose_their_kind(name):
    model = archrun.load(GOLDENS / f"{name}.gguf", backend="reference")
    pattern = name.split("_")[1]
    assert [ly.attention.kind for ly in model.descriptor.layers] == \
        ["gated_causal" if k == "A" else "gated_deltanet" for k in pattern]


def test_inspect_shows_the_delta_state():
    from archrun.describe.inspect import inspect_model

    memory = inspect_model(GOLDENS / "qwen3next_dddA.gguf")["memory"]
    conv, delta = 3 * (2 * 2 * 16 + 4 * 16), 4 * 16 * 16     # (K-1) x conv_dim; value heads x dk x dv
    assert memory[0] == {"kind": "gated_deltanet", "bytes_per_token": 0, "state_bytes": 4 * (conv + delta),
                         "kv_bytes_per_token": {"f32": 0}}
    rows = 2 * 2 * 16  # K and V rows of 2 kv heads x 16 (no q8_0: 16 is not a multiple of its 32-value blocks)
    assert memory[3] == {"kind": "gated_causal", "bytes_per_token": rows * 4, "state_bytes": 0,
                         "kv_bytes_per_token": {"f32": rows * 4, "f16": rows * 2}}
