"""How llama.cpp's converter (``Gemma3NModel``) treats HF gemma3n_text, and archrun-gemma3n's tiny fixtures.

Used by ``archrun.conformance.hf``: ``tests/goldens/record.py`` records ``FIXTURES`` with it, the
tests rebuild and check them. Gemma 3n's HF RMSNorm is x*w (no +1): the GGUF stores w as is. The
converter writes the sliding-window pattern, the KV-shared layer count, the per-layer input width,
AltUp's stream count and active stream, and each layer's activation-sparsity multiplier (the normal
quantile of its sparsity: -inf for dense layers); it stacks the AltUp projections into one tensor each.
The fixtures keep the released E2B/E4B settings, scaled down: 4 streams, every 5th layer global,
the last layers reusing keys and values, the first layers' FFN gate sparse at 0.95, final softcap 30,
rope bases 1e6 (global) and 1e4 (sliding).
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture
from archrun.conformance.hf.models import N_VOCAB

_S, _F = "sliding_attention", "full_attention"


def _rope_parameters(kw):
    theta, local = kw.pop("rope_theta"), kw.pop("rope_local_base_freq")
    return {"full_attention": {"rope_type": "default", "rope_theta": theta},
            "sliding_attention": {"rope_type": "default", "rope_theta": local}}


def _pattern(n: int) -> list[str]:
    return [_F if (i + 1) % 5 == 0 else _S for i in range(n)]


GEMMA3N = HfArch(
    "gemma3n", "gemma3n_text", "Gemma3nForCausalLM", "Gemma3nTextConfig", converter="llama.cpp",
    defaults={"num_hidden_layers": 10, "hidden_size": 32, "intermediate_size": 64, "head_dim": 8,
              "num_attention_heads": 4, "num_key_value_heads": 2, "sliding_window": 6,
              "tie_word_embeddings": True, "rope_theta": 1_000_000.0, "rope_local_base_freq": 10000.0,
              "hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": 30.0,
              "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": N_VOCAB, "laurel_rank": 8,
              "altup_num_inputs": 4,
              "num_kv_shared_layers": 4, "layer_types": _pattern(10),
              "activation_sparsity_pattern": [0.95] * 3 + [0.0] * 7},
    rope_parameters=_rope_parameters, norm_init=(1.0, 0.3),
    # trained AltUp routers and scales are far from a fan-in draw: at N(0, 1/sqrt(d)) the routed
    # coefficients would be ~1e-3 and the per-layer branch scaled to nothing (HF's init: zeros). A random
    # deep Gemma 3n is chaotic in float32 (the sparse gate's cut cancels, the unscaled scores amplify):
    # with unit post-norms HF float32 is 3e-4..3e-3 off its own float64 run at 22 layers; with the
    # branches' post-norms ~0.3 (each block a small update of the streams, as trained models are) and
    # small prediction coefficients it stays within ~1e-5
    scalar_init={"correct_output_scale": (0.5, 0.2), "modality_router.weight": (0.0, 1.0),
                 "prediction_coefs.weight": (0.0, 0.2), "post_attention_layernorm.weight": (0.3, 0.1),
                 "post_feedforward_layernorm.weight": (0.3, 0.1), "post_per_layer_input_norm.weight": (0.3, 0.1)},
)

ARCHES = (GEMMA3N,)

_NO_LLAMA_CPP = ("llama.cpp's gemma3n loader hard-codes E2B/E4B sizes: a per-layer input width of 256 and the KV of "
                 "the first 20 layers (n_layer_kv_from_start); a tiny file with them takes over 6 MB")

FIXTURES = (
    # E2B's layout in 10 layers: SSSSF SSSSF, the last 4 reuse layer 5's (sliding) and 4's (full) keys
    # and values, the first 3 FFN gates sparse
    TinyFixture("gemma3n_e2b_layout", "gemma3n", 1, llama_cpp=_NO_LLAMA_CPP),
    # 7 layers SSSSF SS, the last 2 reuse layer 3's keys and values, the first 2 gates sparse; AltUp's
    # second stream active; untied head, narrower per-layer inputs and FFN
    TinyFixture("gemma3n_active1_untied", "gemma3n", 2, {
        "num_hidden_layers": 7, "num_kv_shared_layers": 2, "layer_types": _pattern(7), "altup_active_idx": 1,
        "activation_sparsity_pattern": [0.95] * 2 + [0.0] * 5, "intermediate_size": 48,
        "hidden_size_per_layer_input": 4, "tie_word_embeddings": False}, llama_cpp=_NO_LLAMA_CPP),
)
