"""archrun family plugin for BERT-style encoders (descriptions only, no math).

What `bert` and `nomic-bert` files do not say (llama.cpp src/models/bert.cpp, HF modeling_bert.py and
modeling_nomic_bert.py): attention is bidirectional (the files say so in `attention.causal`; the op
is archrun-blocks' "bidirectional"); blocks are post-norm (norm(x + attn), then norm(that + ffn),
with the blocks' `attn_output_norm` and `layer_output_norm`: residual "post_norm") with no pre-norms
and no final norm; the embeddings add row 0 of `token_types` and pass through `token_embd_norm` (both
by tensor presence). BERT adds learned positions (`position_embd`) and its FFN is plain exact GELU
(HF's "gelu"; llama.cpp's LLM_FFN_GELU computes the tanh approximation, a difference of ~1e-3 in
the activations); nomic-bert rotates Q/K with NeoX-paired rope (HF `rotary_emb_interleaved` false)
and its FFN is SwiGLU (`ffn_gate`, by presence). Neither has an output head: they embed
(`archrun.embed`) and refuse to generate (archrun.errors.NotGenerative).
"""

from __future__ import annotations

from archrun.family import FamilyHints, FamilyPlugin

_ENCODER = dict(attention="bidirectional", residual="post_norm", pre_norms=False, embed_scale=1.0,
                moe="topk", softcap="tanh", tensor_names={"output_norm": None})

HINTS = {
    "bert": FamilyHints(name="bert", rope_pairing="none", activation="gelu", **_ENCODER),
    "nomic-bert": FamilyHints(name="nomic-bert", rope_pairing="neox", activation="silu", **_ENCODER),
}

plugin = FamilyPlugin(HINTS)
