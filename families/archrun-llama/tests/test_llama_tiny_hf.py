"""archrun-llama's tiny HF fixtures beyond archrun's conformance kit (conftest.py): the layout llama.cpp's
llama loader reads, and the converter's Q/K permutation."""

from __future__ import annotations

from pathlib import Path

import pytest

from archrun.conformance import hf

HERE = Path(__file__).resolve().parent
GOLDENS = HERE / "goldens"
SPEC = hf.load_module(HERE / "hf_arch.py")
NAMES = [f.name for f in SPEC.FIXTURES]


@pytest.mark.parametrize("name", NAMES)
def test_gguf_as_llama_cpp_loads_it(name):
    cfg = hf.load_golden(GOLDENS / f"{name}.npz")["config"]
    keys = {"vocab_size": cfg["vocab_size"], "rope.dimension_count": hf.head_dim(cfg)}
    keys = hf.llama_cpp_keys("llama", cfg, **keys)
    hf.check_gguf_layout(GOLDENS / f"{name}.gguf", hf.llama_cpp_tensors(cfg), keys)


@pytest.mark.live
def test_q_and_k_rows_are_permuted(tmp_path):
    """llama.cpp's LlamaModel.permute on Q and K (by their own head counts), V untouched."""
    pytest.importorskip("transformers")
    model, _ = hf.build_tiny(SPEC.LLAMA, 1)
    got = hf.gguf_tensors(hf.convert(model, tmp_path / "l.gguf", SPEC.LLAMA))
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    attn = "model.layers.0.self_attn"
    assert (got["blk.0.attn_q.weight"] == hf.permute_qk(sd[f"{attn}.q_proj.weight"], 4)).all()
    assert (got["blk.0.attn_k.weight"] == hf.permute_qk(sd[f"{attn}.k_proj.weight"], 2)).all()
    assert (got["blk.0.attn_v.weight"] == sd[f"{attn}.v_proj.weight"]).all()
