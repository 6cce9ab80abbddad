"""jamba beyond the standard battery: Mamba (per-channel state) and attention layers in one cache (the layer kinds,
the state in `archrun inspect`). The memory battery (rewinds, checkpoints, a chat's prefix reuse, speculative
decoding's rejected drafts, chunked prefill) is the conformance kit's (``archrun.conformance.memory``), run on
every fixture here whose layers keep state."""

from __future__ import annotations

from pathlib import Path

import pytest

import archrun

GOLDENS = Path(__file__).parent / "goldens"


@pytest.mark.parametrize("name", ["jamba_mmam_moe2", "jamba_ammm_k3"])
def test_layers_choose_their_kind(name):
    model = archrun.load(GOLDENS / f"{name}.gguf", backend="reference")
    pattern = name.split("_")[1]
    assert [ly.attention.kind for ly in model.descriptor.layers] == ["causal" if k == "a" else "mamba" for k in pattern]


def test_inspect_shows_the_per_channel_state():
    from archrun.describe.inspect import inspect_model

    memory = inspect_model(GOLDENS / "jamba_mmam_moe2.gguf")["memory"]
    inner = 2 * 64
    assert memory[0] == {"kind": "mamba", "bytes_per_token": 0, "state_bytes": 4 * (3 * inner + inner * 16),
                         "kv_bytes_per_token": {"f32": 0}}
