"""archrun family plugin for GLM-4.5 / GLM-4.5-Air (`glm4moe`; descriptions only, no math).

What glm4moe files do not say (llama.cpp src/models/glm4-moe.cpp, HF modeling_glm4_moe.py):
- rope pairing NEOX on the first rope.dimension_count dims (partial rope);
- expert gating is sigmoid when expert_gating_func is absent;
- the tensor named `post_attention_norm` is the *pre-FFN* norm (HF post_attention_layernorm):
  the role `ffn_norm` is remapped to it and there is no post-attention (sandwich) norm;
- block_count includes the nextn (MTP) layers; the trunk is block_count - nextn_predict_layers;
- the default block style is host_reference (the auditable host-side shape).

The MTP (nextn) draft head lives in archrun_glm4moe.mtp: MtpHead, MtpCache, verify; the plugin
registers it as the speculative-decoding drafter "mtp" (MtpDrafter). Tool calls are GLM-4.5's
<tool_call>/<arg_key>/<arg_value> syntax (archrun_glm4moe.tools).
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin
from archrun.hookspecs import hookimpl
from archrun_glm4moe.mtp import MtpCache, MtpDrafter, MtpHead, mtp_drafter, verify
from archrun_glm4moe.tools import Glm45ToolCalls

__all__ = ["HINTS", "MtpCache", "MtpDrafter", "MtpHead", "plugin", "verify"]

HINTS = {
    "glm4moe": FamilyHints(
        name="glm4moe",
        rope_pairing="neox",
        activation="silu",
        embed_scale=1.0,
        gating="sigmoid",
        block_style="host_reference",
        tensor_names={"ffn_norm": "blk.{i}.post_attention_norm.weight", "post_attn_norm": None},
        **TRANSFORMER,
    ),
}


class Glm4MoePlugin(FamilyPlugin):
    """The family hooks, plus the MTP head as the speculative-decoding drafter "mtp"."""

    @hookimpl
    def archrun_register_drafters(self, register) -> None:
        register("mtp", mtp_drafter, "self-speculation through the model's MTP (nextn) head; mtp:K picks block K")


plugin = Glm4MoePlugin(HINTS, tool_calls=Glm45ToolCalls())
