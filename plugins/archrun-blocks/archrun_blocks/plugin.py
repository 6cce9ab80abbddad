"""Registers archrun-blocks' vocabulary through the archrun_register_vocabulary hook."""

from __future__ import annotations

from archrun.contracts import OpCapabilities
from archrun.hookspecs import hookimpl
from archrun.vocab import Lazy, Op
from archrun_blocks import act_quant, encoder, no_mixer, reference, xielu
from archrun_blocks.data_plugin import (  # noqa: F401 - the data hooks, registered with this module
    archrun_register_layer_patterns,
    archrun_register_pre_tokenizers,
    archrun_register_tokenizer_models,
)


def _fast(name: str) -> Lazy:
    """archrun_blocks.fast.<name>, imported (and its kernels compiled) when a model first binds it."""
    return Lazy(f"archrun_blocks.fast:{name}")


#: what the bound ops of each kind carry (archrun.contracts)
PART = OpCapabilities(fused=True)  # a kernel part for the fused decode path
ATTENTION = OpCapabilities(fused=True, fused_for=True, pool_task=True, slot_arrays=True, kv_types=True, binds=True)


@hookimpl
def archrun_register_vocabulary(register) -> None:
    register(Op("norm", "rms", reference.rms_norm, _fast("rms_norm"),
                "RMSNorm over the last axis (+ bias if present)", capabilities=PART))
    register(Op("norm", "layer", reference.layer_norm, _fast("layer_norm"), "LayerNorm over the last axis (+ bias)",
                capabilities=PART))
    register(Op("norm", "rms_1p", reference.rms_norm_1p, _fast("rms_norm_1p"),
                "RMSNorm with unit-offset weights (1 + w)", capabilities=PART))
    register(Op("norm", "layer_1p", reference.layer_norm_1p, _fast("layer_norm_1p"),
                "LayerNorm with unit-offset weights (LayerNorm1p)", capabilities=PART))
    register(Op("rope", "neox", reference.rope_neox, _fast("rope_neox"), "rotate (x[i], x[i+n_rot/2])",
                capabilities=PART))
    register(Op("rope", "norm", reference.rope_norm, _fast("rope_norm"), "rotate (x[2i], x[2i+1])", capabilities=PART))
    register(Op("attention", "causal", reference.CausalAttention, _fast("causal_attention"),
                "causal grouped-query attention, optional sliding window and score softcap", capabilities=ATTENTION))
    register(Op("attention", "alibi", reference.AlibiAttention, _fast("alibi_attention"),
                "causal grouped-query attention with ALiBi position biases (attention.max_alibi_bias)",
                capabilities=ATTENTION))
    register(Op("attention", "bidirectional", encoder.BidirectionalAttention,
                Lazy("archrun_blocks.encoder:bidirectional_attention"),
                "grouped-query attention in which every query sees the whole sequence (encoders): not causal",
                capabilities=OpCapabilities(kv_types=True, binds=True, causal=False)))
    register(Op("activation", "silu", reference.silu, _fast("silu"), "x * sigmoid(x) (gated: SwiGLU)",
                capabilities=PART))
    register(Op("activation", "gelu_tanh", reference.gelu_tanh, _fast("gelu_tanh"), "tanh-approximated GELU",
                capabilities=PART))
    register(Op("activation", "gelu", reference.gelu, _fast("gelu"), "exact (erf) GELU", capabilities=PART))
    register(Op("activation", "relu2", reference.relu2, _fast("relu2"), "squared ReLU", capabilities=PART))
    register(Op("activation", "xielu", xielu.xielu, Lazy("archrun_blocks.xielu_part:xielu_fast"),
                "xIELU with the file's learned per-layer alpha_n, alpha_p, beta, eps (Apertus)",
                layout=xielu.XieluLayout(), capabilities=PART))
    register(Op("activation", "swiglu_oai", reference.swiglu_oai, _fast("swiglu_oai"),
                "gpt-oss's clamped SwiGLU: min(x, 7) sigmoid(1.702 min(x, 7)) (clip(up, -7, 7) + 1)",
                capabilities=PART))
    register(Op("residual", "sequential", reference.Sequential, _fast("sequential"),
                "x + attn(norm x), then + ffn(norm of that), optional residual scale",
                capabilities=OpCapabilities(fused=True, fused_input=True)))
    register(Op("residual", "parallel", reference.Parallel, _fast("parallel"),
                "x + attn(norm x) + ffn(norm x), optional residual scale",
                capabilities=OpCapabilities(fused=True, fused_input=True, ffn_reads_input=True)))
    register(Op("residual", "post_norm", encoder.PostNorm, None,
                "norm(x + attn(x)), then norm(that + ffn(that)): BERT's post-norm block, its norms bound per layer",
                capabilities=OpCapabilities(binds=True)))
    register(Op("gating", "softmax", reference.gating_softmax, _fast("gating_softmax"),
                "softmax over experts (GGUF 1)", capabilities=PART))
    register(Op("gating", "sigmoid", reference.gating_sigmoid, _fast("gating_sigmoid"), "sigmoid per expert (GGUF 2)",
                capabilities=PART))
    register(Op("gating", "sparsemixer", reference.gating_sparsemixer, _fast("gating_sparsemixer"),
                "PhiMoE's sparsemixer: the best two experts, each weighted by a softmax over the experts within "
                "a relative gap of it (2 x 0.01), the others 0", capabilities=PART))
    register(Op("moe", "topk", reference.moe_topk, _fast("moe_topk"),
                "top-k routing with optional selection bias, group limit, renorm, scale, shared experts",
                capabilities=OpCapabilities(act_part=True, fused_layer=True)))
    register(Op("softcap", "tanh", reference.softcap_tanh, None, "c * tanh(logits / c)"))
    register(Op("norm", "rms_act8", act_quant.rms_act8, Lazy("archrun_blocks.act_quant_part:rms_act8_fast"),
                "RMSNorm, then each row quantized to int8 by its absmax (BitNet b1.58's activations)",
                capabilities=PART))
    register(Op("mixer", "no_mixer", no_mixer.NoMixer, None,
                "no token mixer: adds nothing, keeps nothing (an FFN-only block, e.g. Nemotron-H's MLP layers)",
                layout=no_mixer.NoMixerLayout(), capabilities=OpCapabilities(empty=True)))
