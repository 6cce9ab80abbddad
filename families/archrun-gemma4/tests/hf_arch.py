"""How llama.cpp's converter (``Gemma4Model``) treats HF gemma4_text, and archrun-gemma4's tiny fixtures.

Used by ``archrun.conformance.hf``: ``tests/goldens/record.py`` records ``FIXTURES`` with it, the
tests rebuild and check them. Gemma 4's HF RMSNorm is x*w (no +1): the GGUF stores w as is. The
converter writes both layer kinds' head widths (``key_length``, ``key_length_swa``), per-layer KV
head counts when the global layers have their own, both rope widths (the global layers' proportional
rope as a full-width rope whose unrotated pairs get frequency factor 1e30 in ``rope_freqs``), the
sliding-window pattern, the KV-shared layer count and the per-layer input width.
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture
from archrun.conformance.hf.models import N_VOCAB

_S, _F = "sliding_attention", "full_attention"


def _rope_parameters(kw):
    theta, local = kw.pop("rope_theta"), kw.pop("rope_local_base_freq")
    partial = kw.pop("global_partial_rotary_factor")
    return {
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": partial, "rope_theta": theta},
        "sliding_attention": {"rope_type": "default", "rope_theta": local},
    }


GEMMA4 = HfArch(
    "gemma4", "gemma4_text", "Gemma4ForCausalLM", "Gemma4TextConfig", converter="llama.cpp",
    defaults={"num_hidden_layers": 6, "hidden_size": 64, "intermediate_size": 48, "head_dim": 16,
              "global_head_dim": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
              "sliding_window": 6, "tie_word_embeddings": True, "rope_theta": 1_000_000.0,
              "rope_local_base_freq": 10000.0, "global_partial_rotary_factor": 0.25,
              "hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": 30.0,
              "hidden_size_per_layer_input": 0, "num_kv_shared_layers": 0,
              "layer_types": [_S, _S, _F, _S, _S, _F]},
    rope_parameters=_rope_parameters, norm_init=(1.0, 0.3), scalar_init={"layer_scalar": (1.0, 0.3)},
)

ARCHES = (GEMMA4,)

FIXTURES = (
    # both layer kinds with their own head widths, proportional rope on the global layers, tied, softcap
    TinyFixture("gemma4_dense", "gemma4", 1),
    # the 31B / 26B attention: global layers reuse their keys as values (no v_proj) with one KV head;
    # the default period-6 pattern, untied head
    TinyFixture("gemma4_k_eq_v", "gemma4", 2, {"attention_k_eq_v": True, "num_global_key_value_heads": 1,
                                               "num_hidden_layers": 8, "tie_word_embeddings": False,
                                               "layer_types": [_S] * 5 + [_F, _S, _F]}),
    # the E2B / E4B layout: the last 3 layers reuse the keys and values of the last sliding (3) and
    # full (4) layer that compute their own (llama.cpp assumes those are the last two), double-wide MLPs
    TinyFixture("gemma4_kv_shared", "gemma4", 3, {"num_hidden_layers": 8, "num_kv_shared_layers": 3,
                                                  "use_double_wide_mlp": True, "sliding_window": 4,
                                                  "layer_types": [_S, _S, _F, _S, _F, _S, _S, _F]}),
    # E2B / E4B: per-layer inputs (a token table of 8 values a layer plus a projection of the embeddings,
    # gating a projection added after each block, before the layer scalar), KV sharing, double-wide MLPs
    TinyFixture("gemma4_ple", "gemma4", 4, {"hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": N_VOCAB,
                                            "num_hidden_layers": 7, "num_kv_shared_layers": 3,
                                            "use_double_wide_mlp": True, "sliding_window": 4,
                                            "layer_types": [_S, _S, _S, _F, _S, _S, _F]}),
    # 26B-A4B: every layer a dense MLP beside routed experts (own norms; the router on the unnormed stream,
    # softmax top 2 of 4 renormalized, per-expert scales), global layers reusing keys as values
    TinyFixture("gemma4_moe", "gemma4", 5, {"enable_moe_block": True, "num_experts": 4, "top_k_experts": 2,
                                            "moe_intermediate_size": 16, "attention_k_eq_v": True,
                                            "num_global_key_value_heads": 1}),
)
