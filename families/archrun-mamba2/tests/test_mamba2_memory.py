"""mamba2 beyond the standard battery: every layer a Mamba2 block without FFN, and its fixed state in `archrun
inspect`. The memory battery (rewinds, checkpoints, a chat's prefix reuse, speculative decoding's rejected drafts,
chunked prefill) is the conformance kit's (``archrun.conformance.memory``), run on every fixture here whose layers
keep state."""

from __future__ import annotations

from pathlib import Path

import pytest

import archrun

GOLDENS = Path(__file__).parent / "goldens"


@pytest.mark.parametrize("name", ["mamba2_g1_k4", "mamba2_g2_k3_tied"])
def test_every_layer_is_a_mamba2_block_without_ffn(name):
    model = archrun.load(GOLDENS / f"{name}.gguf", backend="reference")
    assert all(ly.attention.kind == "mamba2" and ly.ffn is None for ly in model.descriptor.layers)


def test_inspect_shows_a_fixed_state_and_no_per_token_bytes():
    from archrun.describe.inspect import inspect_model

    memory = inspect_model(GOLDENS / "mamba2_g1_k4.gguf")["memory"]
    conv, ssm = 3 * (128 + 2 * 16), 8 * 16 * 16   # (K-1) x conv_dim; heads x head_dim x state
    assert memory == [{"kind": "mamba2", "bytes_per_token": 0, "state_bytes": 4 * (conv + ssm),
                       "kv_bytes_per_token": {"f32": 0}}] * 3
