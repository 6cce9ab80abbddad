"""falcon-h1 beyond the standard battery: attention and Mamba2 side by side in every block (a PairSlot per layer):
the layer kinds, the state in `archrun inspect`, a mixer beside sliding-window attention refused. The memory
battery (rewinds, checkpoints, a chat's prefix reuse, speculative decoding's rejected drafts, chunked prefill, a
batch keeping each state) is the conformance kit's (``archrun.conformance.memory``), run on every fixture here
whose layers keep state."""

from __future__ import annotations

from pathlib import Path

import pytest

import archrun

GOLDENS = Path(__file__).parent / "goldens"


@pytest.fixture(scope="module", params=["falcon_h1_g1", "falcon_h1_g2_norm"])
def loaded(request):
    return request.param, archrun.load(GOLDENS / f"{request.param}.gguf", backend="reference")


def test_every_block_runs_mamba2_beside_its_attention(loaded):
    _, model = loaded
    assert all(ly.attention.kind == "causal" and ly.parallel.kind == "mamba2" for ly in model.descriptor.layers)


def test_inspect_shows_rows_and_state():
    from archrun.describe.inspect import inspect_model

    memory = inspect_model(GOLDENS / "falcon_h1_g1.gguf")["memory"]
    conv, ssm = 3 * (128 + 2 * 16), 8 * 16 * 16
    rows = 2 * 2 * 16 * 4  # K and V, 2 kv heads x 16, float32 (the mixer stores f32 only, so the pair does)
    assert memory == [{"kind": "causal+mamba2", "bytes_per_token": rows, "state_bytes": 4 * (conv + ssm),
                       "kv_bytes_per_token": {"f32": rows}}] * 3


def test_a_mixer_beside_sliding_window_attention_is_refused(tmp_path):
    """Its slot rewinds as the mixer's state does, which a ring of K/V rows could not follow: refused at load."""
    from archrun.conformance.gguf_edit import rewrite_gguf
    from archrun.errors import MetadataError

    edited = rewrite_gguf(GOLDENS / "falcon_h1_g1.gguf", tmp_path / "sliding.gguf",
                          add_keys={"falcon-h1.attention.sliding_window": 8,
                                    "falcon-h1.attention.sliding_window_pattern": [True, True, True]})
    with pytest.raises(MetadataError, match="sliding-window"):
        archrun.load(edited, backend="reference")
