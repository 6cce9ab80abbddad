"""archrun-minimax's tiny fixtures: HF MiniMaxM2ForCausalLM, converted by llama.cpp's own converter.

Released MiniMax-M2 checkpoints state partial rope as `rotary_dim` (64 of head width 128, base
5e6), which llama.cpp's converter reads and transformers 5 folds into `partial_rotary_factor`:
`checkpoint_config` writes it back, and their `scoring_func: sigmoid` (the converter writes it as
`expert_gating_func`; transformers keeps no such field). The released model routes 8 of 256 experts; the fixtures keep
sigmoid routing with a selection bias, a quarter or half of the experts chosen.
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture


def _checkpoint_config(hp):
    return {"rotary_dim": int(hp["head_dim"] * hp["rope_parameters"]["partial_rotary_factor"]),
            "scoring_func": "sigmoid"}


MINIMAX_M2 = HfArch("minimax-m2", "minimax_m2", "MiniMaxM2ForCausalLM", "MiniMaxM2Config", converter="llama.cpp",
                    defaults={"num_hidden_layers": 2, "head_dim": 16, "partial_rotary_factor": 0.5,
                              "rope_theta": 5e6, "intermediate_size": 32, "num_local_experts": 8,
                              "num_experts_per_tok": 2},
                    checkpoint_config=_checkpoint_config)

ARCHES = (MINIMAX_M2,)

FIXTURES = (
    TinyFixture("minimax_m2_8experts_top2", "minimax-m2", 1),
    TinyFixture("minimax_m2_4experts_top2_mha", "minimax-m2", 2, {"num_local_experts": 4, "num_key_value_heads": 4,
                                                                   "head_dim": 32, "partial_rotary_factor": 0.25}),
)
