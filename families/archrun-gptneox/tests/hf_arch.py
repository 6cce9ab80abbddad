"""archrun-gptneox's tiny fixtures: HF GPTNeoXForCausalLM, converted by llama.cpp's own converter.

llama.cpp's converter reads `rotary_pct` from config.json, which released GPT-NeoX checkpoints
carry and transformers 5 no longer writes (it keeps `partial_rotary_factor` in its rope
parameters): `checkpoint_config` adds it back, as the released files have it.
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture


def _rotary_pct(hp):
    return {"rotary_pct": hp["rope_parameters"].get("partial_rotary_factor", 1.0)}


GPTNEOX = HfArch("gptneox", "gpt_neox", "GPTNeoXForCausalLM", "GPTNeoXConfig", converter="llama.cpp",
                 defaults={"num_hidden_layers": 2, "layer_norm_eps": 1e-5, "rms_norm_eps": None,
                           "num_key_value_heads": None, "partial_rotary_factor": 0.25, "hidden_act": "gelu"},
                 checkpoint_config=_rotary_pct)

ARCHES = (GPTNEOX,)

FIXTURES = (
    TinyFixture("gptneox_parallel_rot25", "gpt_neox", 1),
    TinyFixture("gptneox_sequential_rot50", "gpt_neox", 2, {"use_parallel_residual": False,
                                                             "partial_rotary_factor": 0.5, "num_hidden_layers": 3}),
)
