"""archrun-glm4moe's tiny HF fixtures beyond archrun's conformance kit (conftest.py): which cases they cover,
the layout llama.cpp's glm4moe loader reads, the converter's expert split, router bias and MTP names."""

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


def test_fixtures_cover_mtp_and_no_mtp():
    assert len(NAMES) >= 4
    with_mtp = ["mtp_logits" in hf.load_golden(GOLDENS / f"{n}.npz") for n in NAMES]
    assert any(with_mtp) and not all(with_mtp)


@pytest.mark.parametrize("name", NAMES)
def test_gguf_as_llama_cpp_loads_it(name):
    cfg = hf.load_golden(GOLDENS / f"{name}.npz")["config"]
    n_nextn = cfg["num_nextn_predict_layers"]
    keys = {"rope.dimension_count": int(hf.head_dim(cfg) * cfg["rope_parameters"]["partial_rotary_factor"]),
            "expert_count": cfg["n_routed_experts"], "expert_used_count": cfg["num_experts_per_tok"],
            "expert_feed_forward_length": cfg["moe_intermediate_size"],
            "expert_shared_count": cfg["n_shared_experts"],
            "leading_dense_block_count": cfg["first_k_dense_replace"],
            "expert_group_count": cfg["n_group"], "expert_group_used_count": cfg["topk_group"],
            "expert_gating_func": 2, "expert_weights_scale": cfg["routed_scaling_factor"],
            "expert_weights_norm": cfg["norm_topk_prob"], "nextn_predict_layers": n_nextn}
    tensors = hf.llama_cpp_tensors(
        cfg, qkv_bias=cfg["attention_bias"], qk_norm=cfg["use_qk_norm"], ffn_norm="post_attention_norm",
        moe_layers=range(cfg["first_k_dense_replace"], cfg["num_hidden_layers"] + n_nextn),
        n_expert=cfg["n_routed_experts"], n_ff_expert=cfg["moe_intermediate_size"],
        n_ff_shared=cfg["moe_intermediate_size"] * cfg["n_shared_experts"], router_bias=True, n_nextn=n_nextn)
    hf.check_gguf_layout(GOLDENS / f"{name}.gguf", tensors, hf.llama_cpp_keys("glm4moe", cfg, n_nextn, **keys))


@pytest.mark.live
def test_experts_router_bias_and_mtp_are_converted(tmp_path):
    """Spot checks against the HF state: expert split, router bias, MTP block under nextn names."""
    pytest.importorskip("transformers")
    glm, cfg = hf.build_tiny(SPEC.GLM4MOE, 1)
    got = hf.gguf_tensors(hf.convert(glm, tmp_path / "m.gguf", SPEC.GLM4MOE))
    sd = {k: v.numpy() for k, v in glm.state_dict().items()}
    gate_up, n_ff = sd["model.layers.1.mlp.experts.gate_up_proj"], cfg.moe_intermediate_size
    np.testing.assert_array_equal(got["blk.1.ffn_gate_exps.weight"], gate_up[:, :n_ff])
    np.testing.assert_array_equal(got["blk.1.ffn_up_exps.weight"], gate_up[:, n_ff:])
    np.testing.assert_array_equal(got["blk.1.exp_probs_b.bias"], sd["model.layers.1.mlp.gate.e_score_correction_bias"])
    mtp = {k: v.numpy() for k, v in glm.archrun_mtp.state_dict().items()}
    np.testing.assert_array_equal(got["blk.3.nextn.eh_proj.weight"], mtp["layers.0.eh_proj.weight"])
    np.testing.assert_array_equal(got["blk.3.nextn.shared_head_norm.weight"], mtp["layers.0.post_norm.weight"])
    np.testing.assert_array_equal(got["blk.3.attn_q.weight"], mtp["layers.0.mtp_block.self_attn.q_proj.weight"])


@pytest.mark.live
def test_mtp_copies_are_optional(tmp_path):
    pytest.importorskip("transformers")
    model, _ = hf.build_tiny(SPEC.GLM4MOE, 2, tie_word_embeddings=True)
    path = hf.convert(model, tmp_path / "q.gguf", SPEC.GLM4MOE, mtp_copies=False)
    names = {t.name for t in gguf.GGUFReader(path).tensors}
    assert "blk.3.nextn.embed_tokens.weight" not in names and "blk.3.nextn.eh_proj.weight" in names
    assert "blk.3.nextn.shared_head_head.weight" not in names
