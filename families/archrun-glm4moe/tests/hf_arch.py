"""How llama.cpp's converter (``Glm4MoeModel``) treats HF glm4_moe, and archrun-glm4moe's tiny fixtures.

Used by ``archrun.conformance.hf``: ``tests/goldens/record.py`` records ``FIXTURES`` with it,
the tests rebuild and check them. Sigmoid router with a selection bias
(``e_score_correction_bias`` -> ``exp_probs_b``), shared experts, leading dense layers, partial
rope (``rope.dimension_count``), and MTP (nextn) layers: HF's ``Glm4MoeForCausalLM`` does not
build them (the checkpoint's ``model.layers.<n_layer>.*`` are ignored on load), so
``build_tiny`` attaches a random ``transformers.modeling_layers.MtpModel`` and ``convert`` writes
it under the checkpoint names llama.cpp maps: block ``n_layer + k`` with
``nextn.eh_proj/enorm/hnorm/shared_head_norm`` and, as released checkpoints ship them, copies of
the embedding (``nextn.embed_tokens``) and of the output head (``nextn.shared_head_head``).
"""

from __future__ import annotations

import re

import gguf

from archrun.conformance.hf import HfArch, HfMtp, TinyFixture


def _metadata(hp):
    head_dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
    factor = hp["rope_parameters"].get("partial_rotary_factor", 0.5)
    meta = {
        "add_rope_dimension_count": int(head_dim * factor),
        "add_expert_count": hp["n_routed_experts"],
        "add_expert_feed_forward_length": hp["moe_intermediate_size"],
        "add_expert_shared_count": hp["n_shared_experts"],
        "add_leading_dense_block_count": hp["first_k_dense_replace"],
        "add_expert_gating_func": gguf.ExpertGatingFuncType.SIGMOID,
        "add_expert_weights_scale": hp["routed_scaling_factor"],
        "add_expert_weights_norm": hp["norm_topk_prob"],
    }
    if hp.get("num_nextn_predict_layers") is not None:
        meta["add_nextn_predict_layers"] = hp["num_nextn_predict_layers"]
    return meta


def _mtp_tensors(model, hp, mtp, copies):
    """MtpModel weights under GLM-4.5 checkpoint names ``model.layers.<n_layer + k>.*``."""
    n_layer = hp["num_hidden_layers"]
    rename = {"post_norm.": "shared_head.norm.", "mtp_block.": ""}
    for name, tensor in mtp.state_dict().items():
        m = re.match(r"layers\.(\d+)\.(.*)", name)
        if m is None:
            continue  # embed_tokens / shared_head: the trunk's own, copied below
        rest = m.group(2)
        for old, new in rename.items():
            rest = rest.replace(old, new, 1) if rest.startswith(old) else rest
        yield f"model.layers.{n_layer + int(m.group(1))}.{rest}", tensor.detach().float()
    if copies:
        head = model.get_output_embeddings().weight
        for k in range(hp["num_nextn_predict_layers"]):
            bid = n_layer + k
            yield f"model.layers.{bid}.embed_tokens.weight", model.get_input_embeddings().weight.detach().float()
            yield f"model.layers.{bid}.shared_head.head.weight", head.detach().float()


GLM4MOE = HfArch(
    "glm4moe", "glm4_moe", "Glm4MoeForCausalLM", "Glm4MoeConfig",
    defaults={"num_hidden_layers": 3, "moe_intermediate_size": 16, "n_routed_experts": 8,
              "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1,
              "n_group": 1, "topk_group": 1, "norm_topk_prob": True, "routed_scaling_factor": 1.0,
              "use_qk_norm": False, "attention_bias": True, "partial_rotary_factor": 0.5,
              "num_nextn_predict_layers": 1, "rms_norm_eps": 1e-5},
    metadata=_metadata,
    tensor_renames={"e_score_correction_bias": "e_score_correction.bias"},
    mtp=HfMtp("num_nextn_predict_layers", _mtp_tensors),
)

ARCHES = (GLM4MOE,)

FIXTURES = (
    # sigmoid router + bias, shared experts, leading dense layers, partial rope, MTP
    TinyFixture("glm4moe_base", "glm4moe", 1, {"routed_scaling_factor": 2.5}),
    TinyFixture("glm4moe_qknorm_groups_tied", "glm4moe", 2,
                {"use_qk_norm": True, "n_group": 4, "topk_group": 2, "norm_topk_prob": False,
                 "first_k_dense_replace": 2, "tie_word_embeddings": True}),
    TinyFixture("glm4moe_hd24_shared2_nomtp", "glm4moe", 3,
                {"use_qk_norm": True, "n_group": 2, "topk_group": 1, "num_experts_per_tok": 3,
                 "routed_scaling_factor": 1.8, "head_dim": 24, "n_shared_experts": 2, "attention_bias": False,
                 "num_nextn_predict_layers": 0}),
    TinyFixture("glm4moe_prf025_nonorm_tied", "glm4moe", 4,
                {"norm_topk_prob": False, "routed_scaling_factor": 0.7, "partial_rotary_factor": 0.25,
                 "tie_word_embeddings": True, "num_key_value_heads": 1}),
)
