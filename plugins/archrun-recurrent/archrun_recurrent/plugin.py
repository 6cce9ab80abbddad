"""Registers archrun-recurrent's vocabulary through the archrun_register_vocabulary hook."""

from __future__ import annotations

from archrun.contracts import OpCapabilities
from archrun.hookspecs import hookimpl
from archrun.vocab import Lazy, Op
from archrun_recurrent import deltanet, gated_attention, kda, mamba, mamba2, shortconv


@hookimpl
def archrun_register_vocabulary(register) -> None:
    register(Op("mixer", "shortconv", shortconv.shortconv_reference,
                Lazy("archrun_recurrent.shortconv:shortconv_fast"),
                "gated short convolution (LFM2): out_proj(C * conv(B * x)) over the last l_cache gated inputs",
                layout=shortconv.ShortConvLayout(), capabilities=OpCapabilities(fused_layer=True, slot_arrays=True)))
    register(Op("mixer", "mamba2", mamba2.mamba2_reference, Lazy("archrun_recurrent.mamba2:mamba2_fast"),
                "Mamba2 selective state-space mixer (SSD): conv1d, dt/A/D, gated grouped RMSNorm, a state per head",
                layout=mamba2.Mamba2Layout(),
                capabilities=OpCapabilities(fused_layer=True, fused_beside=True, slot_arrays=True)))
    register(Op("mixer", "gated_deltanet", deltanet.deltanet_reference,
                Lazy("archrun_recurrent.deltanet:deltanet_fast"),
                "gated DeltaNet (Qwen3-Next): conv, l2-normed q/k, beta/alpha gates, delta-rule state, gated norm",
                layout=deltanet.DeltaNetLayout(),
                capabilities=OpCapabilities(fused_layer=True, slot_arrays=True)))
    register(Op("attention", "gated_causal", gated_attention.gated_reference,
                Lazy("archrun_recurrent.gated_attention:gated_fast"),
                "causal attention whose output is gated by sigmoid(gate) from the query projection (Qwen3-Next)",
                layout=gated_attention.GatedAttentionLayout(),
                capabilities=OpCapabilities(fused=True, fused_for=True, pool_task=True, slot_arrays=True, kv_types=True,
                                            binds=True, fused_layer=True)))  # blocks' attention; gated layer kernel
    register(Op("attention", "gated_causal_gate_proj", gated_attention.gated_reference,
                Lazy("archrun_recurrent.gated_attention:gated_fast"),
                "causal attention whose output is gated by sigmoid(attn_gate h), a projection of its own (AFMoE)",
                layout=gated_attention.GateProjAttentionLayout(),
                capabilities=OpCapabilities(fused=True, fused_for=True, pool_task=True, slot_arrays=True, kv_types=True,
                                            binds=True, fused_layer=True)))  # as gated_causal
    register(Op("mixer", "gated_deltanet_tiled", deltanet.tiled_reference,
                Lazy("archrun_recurrent.deltanet:tiled_fast"),
                "gated DeltaNet whose value head j reads key head j % key heads (Qwen3.5 files' tiled order)",
                layout=deltanet.DeltaNetLayout(),
                capabilities=OpCapabilities(fused_layer=True, slot_arrays=True)))
    register(Op("mixer", "mamba", mamba.mamba_reference, Lazy("archrun_recurrent.mamba:mamba_fast"),
                "Mamba selective state-space mixer (Mamba, Falcon-Mamba, Jamba): conv1d, x/dt projections, dt/B/C "
                "norms, per-channel state",
                layout=mamba.MambaLayout(), capabilities=OpCapabilities(fused_layer=True, slot_arrays=True)))
    register(Op("mixer", "kda", kda.kda_reference, Lazy("archrun_recurrent.kda:kda_fast"),
                "Kimi Delta Attention (Kimi Linear): q/k/v short convs, l2-normed q/k, per-channel decay, delta-rule "
                "state, sigmoid-gated norm", layout=kda.KdaLayout(),
                capabilities=OpCapabilities(fused_layer=True, slot_arrays=True)))
