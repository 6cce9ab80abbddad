"""archrun-deepseek4's tiny fixtures: HF DeepseekV4ForCausalLM, converted by llama.cpp's own converter.

llama.cpp's converter reads only DeepSeek's own checkpoint layout. transformers' save writes DeepSeek's
names under a ``model.`` prefix: ``checkpoint_renames`` drops it, names the embedding and the final
hyper-connection collapse as DeepSeek does, and puts back the attention's ``kv_norm`` (the reverse of
transformers' ``.norm.`` -> ``.kv_norm.`` loading rule renames it too). The routed experts must come as
MXFP4 (``<expert>.w1`` codes with E8M0 ``.scale``, ``checkpoint_mxfp4``), which the converter repacks,
value for value, into GGUF MXFP4 experts: ``finish_weights`` puts the experts' float32 weights on the
MXFP4 grid (HF then computes with exactly the file's values) and draws each hash layer's ``tid2eid``
table (distinct experts per token). Every other tensor stays float32 (F32 in the file).
``checkpoint_config`` gives the converter the config fields released checkpoints carry and transformers 5
folds away: ``compress_ratios``, ``num_hash_layers`` and the flat ``rope_scaling`` (YaRN; the compressed
layers' rope only).

The fixtures store the converter's MXFP4 experts as float32, value for value (``f32_tensors``), so both
backends are held to HF's float32 logits: the fast backend runs MXFP4 experts as Q8_0 blocks on int8
activations, as llama.cpp does (about 1e-2 of the logits); test_deepseek4_mxfp4.py runs the experts as
MXFP4 again, requantized by gguf-py.

DeepSeek-V4-Flash's settings, scaled down: 4 hyper-connection streams (20 Sinkhorn iterations), one
shared K=V head with the rope on its trailing 8 of 32 dims, a q LoRA, sinks, a sliding window (8 of 128
there), grouped low-rank output (2 groups), sqrt-softplus routing (4 experts, 2 used) with a selection
bias, one shared expert, clamped SwiGLU (limit 10), hash-routed first layers, rope bases 10000 and
160000 (compressed layers, with YaRN factor 16 there); CSA layers (ratio 4, an indexer of 4 heads keeping
the top 4 compressed entries, so the selection drops entries from position 20 on) and HCA layers.
llama.cpp's loader takes the compression ratios 0, 4 and 128 only: the fixture with HCA ratio 8 (its
entries appear within the 40-token prompt) has HF as its only reference; the one with ratio 128 is
llama.cpp's shape.
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

YARN = {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 16, "beta_fast": 32.0,
        "beta_slow": 1.0}

LAYER_TYPES = {0: "sliding_attention", 4: "compressed_sparse_attention"}


def _rope(kw):
    kw["rope_theta"] = theta = kw.pop("rope_theta")
    return {**YARN, "rope_theta": theta}


def _layers(kw, ratios, n_hash):
    """HF's per-layer fields for DeepSeek's ``compress_ratios`` and ``num_hash_layers``."""
    hca = sorted({r for r in ratios if r not in LAYER_TYPES})
    kw = dict(kw, num_hidden_layers=len(ratios),
              layer_types=[LAYER_TYPES.get(r, "heavily_compressed_attention") for r in ratios],
              mlp_layer_types=["hash_moe"] * n_hash + ["moe"] * (len(ratios) - n_hash))
    kw["compress_rates"] = {"compressed_sparse_attention": 4, "heavily_compressed_attention": hca[0] if hca else 128}
    return kw


def _checkpoint_config(hp):
    """The fields of DeepSeek's config.json the converter reads and transformers' save does not write."""
    ratios = [{"sliding_attention": 0, **hp["compress_rates"]}[t] for t in hp["layer_types"]]
    compress = hp["rope_parameters"]["compress"]
    return {"compress_ratios": ratios, "num_hash_layers": hp["mlp_layer_types"].count("hash_moe"),
            "rope_scaling": {"type": "yarn", **{k: compress[k] for k in YARN if k != "rope_type"}},
            "rope_parameters": None}


def _finish_weights(model, seed: int) -> None:
    """Routed experts on the MXFP4 grid; each hash layer's token -> experts table, distinct experts per token."""
    import torch

    from archrun.conformance.hf.mxfp4 import round_to_mxfp4

    config = model.config
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            experts = layer.mlp.experts
            experts.gate_up_proj.copy_(round_to_mxfp4(experts.gate_up_proj))
            experts.down_proj.copy_(round_to_mxfp4(experts.down_proj))
            if layer.mlp.is_hash:
                gen = torch.Generator().manual_seed(seed * 7919 + i)
                table = torch.stack([torch.randperm(config.n_routed_experts, generator=gen)[:config.num_experts_per_tok]
                                     for _ in range(config.vocab_size)])
                layer.mlp.gate.tid2eid.copy_(table)


DEEPSEEK_V4 = HfArch(
    "deepseek4", "deepseek_v4", "DeepseekV4ForCausalLM", "DeepseekV4Config", converter="llama.cpp",
    defaults={"num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32, "partial_rotary_factor": 0.25,
              "q_lora_rank": 32, "o_groups": 2, "o_lora_rank": 16, "n_routed_experts": 4, "num_experts_per_tok": 2,
              "n_shared_experts": 1, "intermediate_size": 32, "moe_intermediate_size": 32, "routed_scaling_factor": 1.5,
              "scoring_func": "sqrtsoftplus", "swiglu_limit": 10.0, "hc_mult": 4, "hc_sinkhorn_iters": 20,
              "hc_eps": 1e-6, "sliding_window": 8, "index_n_heads": 4, "index_head_dim": 16, "index_topk": 4,
              "compress_rope_theta": 160000.0, "num_nextn_predict_layers": 0, "max_position_embeddings": 256},
    rope_parameters=_rope, checkpoint_config=_checkpoint_config, finish_weights=_finish_weights,
    checkpoint_renames={r"^model\.embed_tokens\.": "embed.", r"^model\.hc_head\.hc_": "hc_head_", r"^model\.": "",
                        r"\.attn\.norm\.weight$": ".attn.kv_norm.weight"},
    checkpoint_mxfp4=(r"\.ffn\.experts\.\d+\.w[123]\.weight$",), f32_tensors=("blk.*.ffn_*_exps.weight",),
    scalar_init={"hc.scale": (1.0, 0.25), "hc_head.hc_scale": (1.0, 0.25)})

ARCHES = (DEEPSEEK_V4,)


def _fixture(name, seed, ratios, n_hash, llama_cpp="", **overrides):
    return TinyFixture(name, "deepseek_v4", seed, _layers(overrides, ratios, n_hash), llama_cpp=llama_cpp)


FIXTURES = (
    # sliding, CSA and HCA (ratio 8) layers, the first hash-routed
    _fixture("deepseek4_csa_hca8", 1, (0, 4, 8), 1,
             llama_cpp="llama.cpp's loader takes the compression ratios 0, 4 and 128 only (this file has 8)"),
    # llama.cpp's shape: HCA ratio 128 (no entry within the prompt), two hash layers, an indexer of 4 heads
    # of 64 (llama.cpp rotates the indexer's queries and keys by a Hadamard matrix of 64 or more dims; with
    # 2 heads both often score 0 after the ReLU: ties HF's torch.topk breaks in no defined order), rank 8
    _fixture("deepseek4_csa_hca128", 2, (0, 4, 128), 2, index_head_dim=64, o_lora_rank=8),
)
