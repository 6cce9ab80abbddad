"""archrun-qwen's tiny HF fixtures beyond archrun's conformance kit (conftest.py): which cases they cover,
the layout llama.cpp's loaders read, random norm weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from archrun.conformance import hf

HERE = Path(__file__).resolve().parent
GOLDENS = HERE / "goldens"
SPEC = hf.load_module(HERE / "hf_arch.py")
NAMES = [f.name for f in SPEC.FIXTURES]


def test_fixtures_cover_every_architecture_tied_and_untied():
    archs = [f.arch for f in SPEC.FIXTURES]
    assert archs.count("qwen3") >= 3 and archs.count("qwen3moe") >= 2 and archs.count("qwen2") >= 1
    assert any("_tied" in n for n in NAMES) and any("untied" in n for n in NAMES)


@pytest.mark.parametrize("fixture", SPEC.FIXTURES, ids=NAMES)
def test_gguf_as_llama_cpp_loads_it(fixture):
    """Tensors and keys as llama.cpp's qwen2/qwen3/qwen3moe loaders read them."""
    if fixture.llama_cpp:
        pytest.skip(fixture.llama_cpp)
    cfg = hf.load_golden(GOLDENS / f"{fixture.name}.npz")["config"]
    keys, moe = {}, {}
    if fixture.arch == "qwen3moe":
        keys = {"expert_count": cfg["num_local_experts"], "expert_used_count": cfg["num_experts_per_tok"],
                "expert_feed_forward_length": cfg["moe_intermediate_size"]}
        moe = {"moe_layers": range(cfg["num_hidden_layers"]), "n_expert": cfg["num_local_experts"],
               "n_ff_expert": cfg["moe_intermediate_size"]}
    tensors = hf.llama_cpp_tensors(cfg, qkv_bias=fixture.arch == "qwen2", qk_norm=fixture.arch != "qwen2", **moe)
    hf.check_gguf_layout(GOLDENS / f"{fixture.name}.gguf", tensors, hf.llama_cpp_keys(fixture.arch, cfg, **keys))


def test_qwen3_norm_weights_are_random():
    """q/k norms (and the others) are not all ones."""
    for name in (f.name for f in SPEC.FIXTURES if f.arch == "qwen3"):
        for tname, w in hf.gguf_tensors(GOLDENS / f"{name}.gguf").items():
            if "norm" in tname:
                assert np.abs(w - 1.0).max() > 0.05 and abs(float(w.mean()) - 1.0) < 0.3, (name, tname)


