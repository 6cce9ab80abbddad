"""lfm2 beyond the standard battery: per-layer kinds from the head counts, and the short convolutions' state in
`archrun inspect`. The memory battery (rewinds, checkpoints, a chat's prefix reuse, speculative decoding's
rejected drafts, chunked prefill, a batch keeping each state) is the conformance kit's
(``archrun.conformance.memory``), run on every fixture here whose layers keep state."""

from __future__ import annotations

from pathlib import Path

import pytest

import archrun

GOLDENS = Path(__file__).parent / "goldens"


@pytest.fixture(scope="module", params=["lfm2_ccac", "lfm2_acca_l4"])
def loaded(request):
    return request.param, archrun.load(GOLDENS / f"{request.param}.gguf", backend="reference")


def test_layers_choose_their_kind_from_head_count_kv(loaded):
    name, model = loaded
    kinds = [layer.attention.kind for layer in model.descriptor.layers]
    pattern = name.split("_")[1]
    assert kinds == ["shortconv" if k == "c" else "causal" for k in pattern]


def test_inspect_shows_each_layers_kind_and_its_state_bytes():
    from archrun.describe.inspect import inspect_model, render_text

    info = inspect_model(GOLDENS / "lfm2_ccac.gguf")
    d, kv = 64, 2 * 16  # width; kv heads x head_dim
    conv = {"kind": "shortconv", "bytes_per_token": 0, "state_bytes": 2 * d * 4, "kv_bytes_per_token": {"f32": 0}}
    assert info["memory"] == [
        conv, conv,                                                             # (l_cache - 1) rows of d
        {"kind": "causal", "bytes_per_token": 2 * kv * 4, "state_bytes": 0,      # a K and a V row per token
         "kv_bytes_per_token": {"f32": 2 * kv * 4, "f16": 2 * kv * 2}},         # (q8_0: head_dim 16 < 32)
        conv,
    ]
    text = render_text(info)
    assert "memory 0-1     shortconv: 0 B/token, state 512 B" in text
    assert "per sequence  256 B/token + 1536 B of state" in text
