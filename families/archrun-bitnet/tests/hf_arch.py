"""archrun-bitnet's tiny fixtures: HF BitNetForCausalLM as transformers runs released BitNet b1.58
checkpoints (its linears but the head swapped for `AutoBitLinear` in online mode: weights ternarized
per tensor, inputs quantized to int8 per token), converted by llama.cpp's own converter (which
stores the ternarized weights). The converter of llama-cpp-python 0.3.36 maps the sub-layer norms by
the names of the 1bitLLM checkpoints only (2B-4T's `attn_sub_norm`/`ffn_sub_norm` it cannot map): the
fixtures' saved tensors carry those names."""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture


def _online_bitlinear(model) -> None:
    """Every linear but the head becomes transformers' AutoBitLinear in online mode, as
    `BitNetQuantConfig(linear_class="autobitlinear", quantization_mode="online")` makes it (weights kept)."""
    import torch
    from transformers.integrations.bitnet import AutoBitLinear

    # transformers compiles its quantizers (torch.compile); compiled, their rounding of x * 127 / max|x|
    # can land on the other side of .5 than the eager code's: the eager code is the reference
    torch.compiler.set_stance("force_eager")
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and not name.endswith("lm_head"):
            module.__class__ = AutoBitLinear
            module.online_quant, module.rms_norm = True, None


BITNET = HfArch(
    "bitnet", "bitnet", "BitNetForCausalLM", "BitNetConfig", converter="llama.cpp", eval_model=_online_bitlinear,
    # llama.cpp 0.3.36's converter maps the sub-layer norms by the 1bitLLM checkpoints' names only
    checkpoint_renames={r"\.self_attn\.attn_sub_norm\.": ".self_attn.inner_attn_ln.",
                        r"\.mlp\.ffn_sub_norm\.": ".mlp.ffn_layernorm."},
    # bitnet-b1.58-2B-4T scaled down: 4 query heads per KV head, FFN 2.7x, relu2, tied, base 500000
    defaults={"num_hidden_layers": 2, "head_dim": 16, "num_attention_heads": 4, "num_key_value_heads": 1,
              "intermediate_size": 176, "hidden_act": "relu2", "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
              "tie_word_embeddings": True, "max_position_embeddings": 4096})

ARCHES = (BITNET,)

_LLAMA_CPP = ("llama.cpp 0.3.36 runs BitNet's float weights without the int8 activation quantization HF applies "
              "(and SiLU where 2B-4T's relu2 is)")

# HF's int8 activation quantization rounds x * 127 / max|x| to integers: an activation that lands within
# float32 noise (~1e-5 of a step at |x * s| ~ 100) of a .5 tie rounds either way in two float32
# implementations, and that one step moves the logits by ~1e-3. A random 40-token fixture has ~50k such
# activations, so its closest one lies ~1e-5 from a tie: the seeds below keep every one >= 3e-5 away
# (3.4e-5 and 5e-5; about half of all seeds do), so the fixtures test the math, not a coin toss.
FIXTURES = (
    TinyFixture("bitnet_2b4t", "bitnet", 5, llama_cpp=_LLAMA_CPP),
    # three layers, 2 KV heads, a wider FFN
    TinyFixture("bitnet_3layer_kv2", "bitnet", 9, {"num_hidden_layers": 3, "num_key_value_heads": 2,
                                                   "intermediate_size": 256}, llama_cpp=_LLAMA_CPP),
)
