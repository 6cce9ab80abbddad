"""archrun-mpt's tiny fixtures: HF MptForCausalLM, converted by llama.cpp's own converter.

Released MPT checkpoints name their (remote-code) class `MPTForCausalLM`, the name llama.cpp's
converter knows; transformers' native class is `MptForCausalLM` with the same tensor names and
config fields: `checkpoint_config` states the released name. llama.cpp's converter writes
feed_forward_length = 4 * d_model (MPT's expansion ratio 4) and a LayerNorm epsilon of 1e-5.
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture


def _released_class(hp):
    return {"architectures": ["MPTForCausalLM"]}


MPT = HfArch("mpt", "mpt", "MptForCausalLM", "MptConfig", converter="llama.cpp",
             defaults={"num_hidden_layers": 2, "expansion_ratio": 4, "max_seq_len": 256, "layer_norm_epsilon": 1e-5,
                       "rms_norm_eps": None, "num_key_value_heads": None, "tie_word_embeddings": True},
             checkpoint_config=_released_class)

ARCHES = (MPT,)

FIXTURES = (
    TinyFixture("mpt_alibi", "mpt", 1),
    TinyFixture("mpt_alibi_clip_8head", "mpt", 2, {"num_attention_heads": 8, "num_hidden_layers": 3,
                                                    "attn_config": {"alibi": True, "alibi_bias_max": 8,
                                                                    "clip_qkv": 0.5}}),
)
