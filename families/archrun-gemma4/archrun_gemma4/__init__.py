"""archrun family plugin for Gemma 4 text models (descriptions only, no math).

What gemma4 files do not say (llama.cpp src/models/gemma4-iswa.cpp, HF modeling_gemma4.py):
- attention `gemma4` (archrun-gemma4-ops: each layer kind's head width, keys reused as values
  where a layer has no attn_v, RMS-normed values, unscaled scores); the file states the kinds
  (`attention.sliding_window_pattern`), both widths (`key_length`, `key_length_swa`) and both
  rope widths (`rope.dimension_count`, `rope.dimension_count_swa`);
- rope pairing NEOX; the global layers' proportional rope is a full-width rope whose unrotated
  pairs carry frequency factor 1e30 (`rope_freqs`, global layers only); the sliding layers rotate
  plain with `rope.freq_base_swa` (`swa_rope="plain"`, as HF's default rope there);
- residual `gemma4_scaled`: sandwich norms by presence, the block's output times the layer's
  `layer_output_scale`;
- token embeddings scaled by sqrt(n_embd); GeGLU with tanh-GELU; norms stored as is (x * w);
- the chat template comes with the file (released models carry one);
- per-layer inputs (E2B/E4B: `embedding_length_per_layer_input` > 0) through the stream op `gemma4_ple`
  (archrun-gemma4-ops), which adds each layer's term after the block and before the layer scalar; files
  without them decline it and run one stream;
- the 26B-A4B mixture blocks through the mixture op `gemma4_moe` (archrun-gemma4-ops): a dense MLP beside
  softmax top-k experts (renormalized, times the per-expert scales `ffn_down_exps.scale`) routed on the
  unnormed stream (`ffn_gate_inp.scale`), each half with its own norms; the experts' gate and up
  projections in one `ffn_gate_up_exps` tensor.

The plugin registers the speculative-decoding drafter `gemma4-assistant:PATH`: a Gemma 4 assistant file
(llama.cpp's `gemma4-assistant`) drafting from the target's hidden states and keys/values
(archrun_gemma4.assistant; its math is archrun-gemma4-ops').
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin
from archrun.hookspecs import hookimpl
from archrun_gemma4.assistant import AssistantDrafter, assistant_drafter

__all__ = ["HINTS", "AssistantDrafter", "plugin"]

HINTS = {
    "gemma4": FamilyHints(
        name="gemma4",
        **{**TRANSFORMER, "attention": "gemma4", "residual": "gemma4_scaled", "moe": "gemma4_moe"},
        rope_pairing="neox",
        activation="gelu_tanh",
        embed_scale="sqrt_n_embd",
        swa_rope="plain",
        stream="gemma4_ple",
        gating="softmax",
        moe_weights_norm=True,
        tensor_roles={"ffn_gate_inp.scale": "blk.{i}.ffn_gate_inp.scale",
                      "ffn_down_exps.scale": "blk.{i}.ffn_down_exps.scale"},
    ),
}


class Gemma4Plugin(FamilyPlugin):
    """The family hooks, plus Gemma 4's assistant as the speculative-decoding drafter "gemma4-assistant"."""

    @hookimpl
    def archrun_register_drafters(self, register) -> None:
        register("gemma4-assistant", assistant_drafter,
                 "a Gemma 4 assistant file drafting from the gemma4 target's hidden states and keys/values: "
                 "gemma4-assistant:PATH")


plugin = Gemma4Plugin(HINTS)
