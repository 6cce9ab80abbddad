"""archrun-gemma3's tiny HF fixtures beyond archrun's conformance kit (conftest.py): the layout llama.cpp's
gemma3 loader reads, the sliding-window pattern key, norms stored as 1 + w."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from archrun.conformance import hf

HERE = Path(__file__).resolve().parent
GOLDENS = HERE / "goldens"
SPEC = hf.load_module(HERE / "hf_arch.py")
NAMES = [f.name for f in SPEC.FIXTURES]
PATTERN_KEY = "gemma3.attention.sliding_window_pattern"


@pytest.mark.parametrize("name", [f.name for f in SPEC.FIXTURES if not f.llama_cpp])
def test_gguf_as_llama_cpp_loads_it(name):
    cfg = hf.load_golden(GOLDENS / f"{name}.npz")["config"]
    keys = {"attention.sliding_window": cfg["sliding_window"],
            "rope.freq_base_swa": cfg["rope_parameters"]["sliding_attention"]["rope_theta"]}
    if cfg["final_logit_softcapping"]:
        keys["final_logit_softcapping"] = cfg["final_logit_softcapping"]
    tensors = hf.llama_cpp_tensors(cfg, qk_norm=True, sandwich_norms=True)
    hf.check_gguf_layout(GOLDENS / f"{name}.gguf", tensors, hf.llama_cpp_keys("gemma3", cfg, **keys))


@pytest.mark.parametrize("name", NAMES)
def test_pattern_key_only_when_not_period_6(name):
    cfg = hf.load_golden(GOLDENS / f"{name}.npz")["config"]
    kv = hf.gguf_kv(gguf.GGUFReader(GOLDENS / f"{name}.gguf"))
    default = [(i + 1) % 6 != 0 for i in range(cfg["num_hidden_layers"])]
    is_swa = [t == "sliding_attention" for t in cfg["layer_types"]]
    assert (PATTERN_KEY in kv) == (is_swa != default)
    if PATTERN_KEY in kv:
        assert [bool(v) for v in kv[PATTERN_KEY]] == is_swa
    assert is_swa.count(False) >= 1 and is_swa.count(True) >= 1  # both layer kinds appear


def test_both_pattern_cases_are_covered():
    has_key = [PATTERN_KEY in hf.gguf_kv(gguf.GGUFReader(GOLDENS / f"{n}.gguf")) for n in NAMES]
    assert any(has_key) and not all(has_key)


@pytest.mark.parametrize("name", NAMES)
def test_norm_weights_are_stored_plus_one(name):
    """Norms are stored as 1 + w with w random (not all zero)."""
    for tname, w in hf.gguf_tensors(GOLDENS / f"{name}.gguf").items():
        if "norm" in tname:
            assert np.abs(w - 1.0).max() > 0.05 and abs(float(w.mean()) - 1.0) < 0.3, (name, tname)


@pytest.mark.live
def test_norms_get_plus_one_and_tied_head_is_dropped(tmp_path):
    pytest.importorskip("transformers")
    model, _ = hf.build_tiny(SPEC.GEMMA3, 1)
    got = hf.gguf_tensors(hf.convert(model, tmp_path / "g.gguf", SPEC.GEMMA3))
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    np.testing.assert_allclose(got["blk.2.attn_q_norm.weight"], sd["model.layers.2.self_attn.q_norm.weight"] + 1)
    assert "output.weight" not in got
