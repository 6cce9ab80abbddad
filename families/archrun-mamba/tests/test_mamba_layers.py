"""mamba beyond the standard battery: every layer a Mamba mixer (Falcon-Mamba's with weightless dt/B/C norms), the
state in `archrun inspect`, and the epsilon of those norms (HF's 1e-6, not the model's 1e-5 llama.cpp takes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import archrun
from archrun.conformance.hf import rel_err

GOLDENS = Path(__file__).parent / "goldens"


@pytest.mark.parametrize("name,norms", [("mamba_k4_tied", 0), ("mamba_k3_n24", 0), ("falcon_mamba_k4", 2)])
def test_every_layer_is_a_mamba_mixer(name, norms):
    layers = archrun.load(GOLDENS / f"{name}.gguf", backend="reference").descriptor.layers
    assert [(ly.attention.kind, ly.attention.param("dt_b_c_norms"), ly.ffn) for ly in layers] == \
        [("mamba", norms, None)] * 3


def test_inspect_shows_the_state():
    from archrun.describe.inspect import inspect_model

    memory = inspect_model(GOLDENS / "mamba_k3_n24.gguf")["memory"]
    conv, ssm = 2 * 128, 128 * 24     # (K-1) x d_inner; d_inner x state
    assert memory == [{"kind": "mamba", "bytes_per_token": 0, "state_bytes": 4 * (conv + ssm),
                       "kv_bytes_per_token": {"f32": 0}}] * 3


def test_falcon_mamba_norms_take_hf_epsilon(monkeypatch):
    """With the model's epsilon (1e-5, llama.cpp's choice) the logits leave HF's by ~2.5e-4 of max |logit|."""
    import archrun_recurrent.mamba as mamba

    with np.load(GOLDENS / "falcon_mamba_k4.npz") as z:
        ids, ref = z["ids"].astype(np.int64), z["logits"]
    monkeypatch.setattr(mamba, "WEIGHTLESS_NORM_EPS", 1e-5)
    assert rel_err(archrun.load(GOLDENS / "falcon_mamba_k4.gguf", backend="reference").logits(ids), ref) > 1e-4
