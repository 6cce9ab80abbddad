"""Registers archrun-mla's vocabulary through the archrun_register_vocabulary hook."""

from __future__ import annotations

from archrun.contracts import OpCapabilities
from archrun.hookspecs import hookimpl
from archrun.vocab import Op
from archrun_mla import attention, dsa
from archrun_mla.layout import MlaLayout

# the fast op's layer decodes fused: its whole one-token kernel (archrun_mla.fused) over the latent slot's rows
_FUSED = OpCapabilities(fused_layer=True, slot_arrays=True)


@hookimpl
def archrun_register_vocabulary(register) -> None:
    register(Op("attention", "mla", attention.mla_reference, attention.mla_fast,
                "multi-head latent attention (DeepSeek-V2/V3): absorbed scoring over a cached "
                "[k_pe | latent] row per token", layout=MlaLayout(), capabilities=_FUSED))
    register(Op("attention", "mla_fixed_lora_eps", attention.mla_reference, attention.mla_fast,
                "multi-head latent attention whose q_a/kv_a norms use epsilon 1e-6, not the model's (HF's Kimi "
                "Linear, DeepSeek-V2/V3, GLM-4.7-Flash)", layout=MlaLayout(lora_norm_eps=1e-6),
                capabilities=_FUSED))
    register(Op("attention", "mla_dsa", dsa.dsa_reference, dsa.dsa_fast,
                "DeepSeek sparse attention (DeepSeek-V3.2): MLA (q_a/kv_a norms at epsilon 1e-6) over the top-k keys "
                "a lightning indexer picks per query; the indexer's keys are cached beside the latent",
                layout=dsa.DsaLayout(lora_norm_eps=1e-6),
                capabilities=OpCapabilities(binds=True, fused_layer=True, slot_arrays=True)))
