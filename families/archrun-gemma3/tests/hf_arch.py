"""How llama.cpp's converter (``Gemma3Model``) treats HF gemma3_text, and archrun-gemma3's tiny fixtures.

Used by ``archrun.conformance.hf``: ``tests/goldens/record.py`` records ``FIXTURES`` with it,
the tests rebuild and check them. Gemma's HF RMSNorm is x*(1+w): the GGUF stores ``1 + w`` for
every ``*norm.weight`` (and the random ``w`` is drawn around 0). Two rope bases (full and
sliding layers). ``attention.sliding_window_pattern`` (a per-layer bool array) is written only
when the model's ``layer_types`` differ from Gemma 3's fixed period of 6, which llama.cpp
assumes otherwise (a deliberate addition: llama.cpp's converter never writes it). The tiny
models use ``query_pre_attn_scalar = head_dim`` so HF's attention scale equals llama.cpp's
``1/sqrt(head_dim)`` (no key carries it).
"""

from __future__ import annotations

from archrun.conformance.hf import HfArch, TinyFixture

_S, _F = "sliding_attention", "full_attention"


def _rope_parameters(kw):
    theta, local = kw.pop("rope_theta"), kw.pop("rope_local_base_freq")
    factor = kw.pop("rope_linear_factor", None)  # Gemma 3 4B/12B/27B: linear x8 on the global layers only
    full = {"rope_type": "linear", "factor": factor} if factor else {"rope_type": "default"}
    return {
        "full_attention": {**full, "rope_theta": theta},
        "sliding_attention": {"rope_type": "default", "rope_theta": local},
    }


def _metadata(hp):
    meta = {"add_key_length": hp["head_dim"], "add_value_length": hp["head_dim"]}
    if hp.get("final_logit_softcapping"):
        meta["add_final_logit_softcapping"] = hp["final_logit_softcapping"]
    meta["add_sliding_window"] = hp["sliding_window"]
    default_types = [_F if (i + 1) % 6 == 0 else _S for i in range(hp["num_hidden_layers"])]
    if hp["layer_types"] != default_types:  # llama.cpp assumes period 6 unless told (see module doc)
        meta["add_sliding_window_pattern"] = [t == _S for t in hp["layer_types"]]
    return meta


GEMMA3 = HfArch(
    "gemma3", "gemma3_text", "Gemma3ForCausalLM", "Gemma3TextConfig",
    defaults={"num_hidden_layers": 7, "intermediate_size": 48, "head_dim": 16, "query_pre_attn_scalar": 16,
              "sliding_window": 6, "tie_word_embeddings": True, "rope_theta": 1_000_000.0,
              "rope_local_base_freq": 10000.0, "hidden_activation": "gelu_pytorch_tanh"},
    metadata=_metadata, rope_parameters=_rope_parameters, norm_shift=1.0, norm_init=(0.0, 0.3),
)

ARCHES = (GEMMA3,)

FIXTURES = (
    # SWA/global interleave, local rope base, +1 norms, GeGLU, softcap
    TinyFixture("gemma3_period6_tied", "gemma3", 1),
    TinyFixture("gemma3_custom_pattern_softcap", "gemma3", 2,
                {"num_hidden_layers": 8, "sliding_window": 4, "layer_types": [_S, _S, _F, _S, _S, _F, _S, _F],
                 "final_logit_softcapping": 3.0, "tie_word_embeddings": False, "num_key_value_heads": 1,
                 "rope_theta": 20000.0, "rope_local_base_freq": 1000.0}),
    # the released 4B-27B rope: linear x8 on the global layers, the local layers plain (base 10000)
    TinyFixture("gemma3_linear8_global", "gemma3", 4, {"rope_linear_factor": 8.0, "num_hidden_layers": 6,
                                                       "sliding_window": 4}),
    # every bias transformers offers (attention_bias: q/k/v and o): HF is the only reference
    TinyFixture("gemma3_attention_bias", "gemma3", 3, {"attention_bias": True},
                llama_cpp="llama.cpp's gemma3 loader takes no attention biases (wrong tensor count)"),
)
