"""nemotron_h beyond the standard battery: each layer's kind from the file's per-layer keys (Mamba2, attention,
or no token mixer at all), and the memory `archrun inspect` states for each kind."""

from __future__ import annotations

from pathlib import Path

import pytest

import archrun
from archrun.describe.inspect import inspect_model
from archrun.descriptor import FfnSpec

GOLDENS = Path(__file__).parent / "goldens"
PATTERNS = {"nemotron_h_8b_pattern": "M-M*-M-", "nemotron_h_nano_pattern": "*-MM-*M"}
KIND = {"M": "mamba2", "*": "causal", "-": "no_mixer"}


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_layers_choose_their_kind(name):
    layers = archrun.load(GOLDENS / f"{name}.gguf", backend="reference").descriptor.layers
    assert [ly.attention.kind for ly in layers] == [KIND[c] for c in PATTERNS[name]]
    # an MLP layer: a plain squared-ReLU MLP reading the block's one norm; the others: no FFN
    assert [isinstance(ly.ffn, FfnSpec) and not ly.ffn.gated and ly.ffn.activation == "relu2" and not ly.ffn_norm
            for ly in layers] == [c == "-" for c in PATTERNS[name]]
    assert all(ly.ffn is None for ly, c in zip(layers, PATTERNS[name], strict=True) if c != "-")


def test_inspect_states_each_kinds_memory():
    memory = inspect_model(GOLDENS / "nemotron_h_8b_pattern.gguf")["memory"]
    by_kind = {m["kind"]: (m["bytes_per_token"], m["state_bytes"]) for m in memory}
    assert by_kind["no_mixer"] == (0, 0)                      # no token mixer: nothing kept
    assert by_kind["causal"] == (2 * 1 * 16 * 4, 0)       # K and V rows: 1 KV head of 16, float32
    assert by_kind["mamba2"][0] == 0 and by_kind["mamba2"][1] > 0  # a fixed state, nothing per token
