"""The descriptor: a model as data.

A `Descriptor` holds every structural choice of a decoder-only transformer as plain,
validated, frozen values. Each field that names a choice is a vocabulary value, a name in
one of the registry's slots (archrun.vocab.SLOTS), that the plan resolves to a registered op
once, at load: norm kind (slot "norm"), rope pairing ("rope"), attention kind ("attention"),
FFN activation ("activation"), residual topology ("residual"), MoE router ("moe", "gating"),
logit softcap ("softcap") and block style ("block_style"). Structure found by tensor
presence is plain data: biases, q/k norms, sandwich norms, gated or plain FFN, fused QKV and
packed gate|up projections, a learned position table. Per-layer geometry is a tuple of
`LayerSpec`, so interleaved sliding/global layers, NoPE layers, leading dense layers and
per-layer head counts are data.

Build descriptors with `archrun.describe.compile.describe(path)` (or `compile_gguf` for the full
report); variants with `attrs.evolve`. Never construct one from raw metadata.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import attrs
from attrs import field, frozen
from attrs import validators as v
from gguf.constants import MODEL_TENSOR, TENSOR_NAMES

_pos_int = [v.instance_of(int), v.gt(0)]
_nonneg_int = [v.instance_of(int), v.ge(0)]
_pos_float = [v.instance_of(float), v.gt(0.0)]

# Tensor roles of a model -> (gguf-py's MODEL_TENSOR, suffix): the GGUF names the standard layout
# uses, spelled by gguf-py's TENSOR_NAMES. A family plugin may remap a role (e.g. glm4moe's pre-FFN
# norm is stored under `post_attention_norm`); the interpreter only ever asks for roles.
_T = MODEL_TENSOR
_ROLES: dict[str, tuple[MODEL_TENSOR, str]] = {
    "token_embd": (_T.TOKEN_EMBD, "weight"), "position_embd": (_T.POS_EMBD, "weight"),
    "output_norm": (_T.OUTPUT_NORM, "weight"),
    "output_norm.bias": (_T.OUTPUT_NORM, "bias"), "output": (_T.OUTPUT, "weight"),
    "output.bias": (_T.OUTPUT, "bias"),
    "rope_freqs": (_T.ROPE_FREQS, "weight"), "rope_factors_long": (_T.ROPE_FACTORS_LONG, "weight"),
    "rope_factors_short": (_T.ROPE_FACTORS_SHORT, "weight"),
    "token_embd_norm": (_T.TOKEN_EMBD_NORM, "weight"), "token_embd_norm.bias": (_T.TOKEN_EMBD_NORM, "bias"),
    "attn_norm": (_T.ATTN_NORM, "weight"), "attn_norm.bias": (_T.ATTN_NORM, "bias"),
    "attn_qkv": (_T.ATTN_QKV, "weight"), "attn_qkv.bias": (_T.ATTN_QKV, "bias"),
    "attn_q": (_T.ATTN_Q, "weight"), "attn_k": (_T.ATTN_K, "weight"), "attn_v": (_T.ATTN_V, "weight"),
    "attn_q.bias": (_T.ATTN_Q, "bias"), "attn_k.bias": (_T.ATTN_K, "bias"), "attn_v.bias": (_T.ATTN_V, "bias"),
    "attn_output": (_T.ATTN_OUT, "weight"), "attn_output.bias": (_T.ATTN_OUT, "bias"),
    "attn_q_norm": (_T.ATTN_Q_NORM, "weight"), "attn_k_norm": (_T.ATTN_K_NORM, "weight"),
    "post_attn_norm": (_T.ATTN_POST_NORM, "weight"),
    "ffn_norm": (_T.FFN_NORM, "weight"), "ffn_norm.bias": (_T.FFN_NORM, "bias"),
    "post_ffn_norm": (_T.FFN_POST_NORM, "weight"),
    "ffn_gate": (_T.FFN_GATE, "weight"), "ffn_up": (_T.FFN_UP, "weight"), "ffn_down": (_T.FFN_DOWN, "weight"),
    "ffn_gate.bias": (_T.FFN_GATE, "bias"), "ffn_up.bias": (_T.FFN_UP, "bias"), "ffn_down.bias": (_T.FFN_DOWN, "bias"),
    "ffn_gate_inp": (_T.FFN_GATE_INP, "weight"), "ffn_gate_inp.bias": (_T.FFN_GATE_INP, "bias"),
    "exp_probs_b": (_T.FFN_EXP_PROBS_B, "bias"),
    "ffn_gate_exps": (_T.FFN_GATE_EXP, "weight"), "ffn_up_exps": (_T.FFN_UP_EXP, "weight"),
    "ffn_down_exps": (_T.FFN_DOWN_EXP, "weight"),
    "ffn_gate_exps.bias": (_T.FFN_GATE_EXP, "bias"), "ffn_up_exps.bias": (_T.FFN_UP_EXP, "bias"),
    "ffn_down_exps.bias": (_T.FFN_DOWN_EXP, "bias"), "attn_sinks": (_T.ATTN_SINKS, "weight"),
    "ffn_gate_shexp.bias": (_T.FFN_GATE_SHEXP, "bias"), "ffn_up_shexp.bias": (_T.FFN_UP_SHEXP, "bias"),
    "ffn_down_shexp.bias": (_T.FFN_DOWN_SHEXP, "bias"),
    "ffn_gate_inp_shexp": (_T.FFN_GATE_INP_SHEXP, "weight"),
    "ffn_gate_shexp": (_T.FFN_GATE_SHEXP, "weight"), "ffn_up_shexp": (_T.FFN_UP_SHEXP, "weight"),
    "ffn_down_shexp": (_T.FFN_DOWN_SHEXP, "weight"),
    "nextn.eh_proj": (_T.NEXTN_EH_PROJ, "weight"), "nextn.enorm": (_T.NEXTN_ENORM, "weight"),
    "nextn.hnorm": (_T.NEXTN_HNORM, "weight"), "nextn.embed_tokens": (_T.NEXTN_EMBED_TOKENS, "weight"),
    "nextn.shared_head_head": (_T.NEXTN_SHARED_HEAD_HEAD, "weight"),
    "nextn.shared_head_norm": (_T.NEXTN_SHARED_HEAD_NORM, "weight"),
}
DEFAULT_TENSOR_NAMES: Mapping[str, str] = MappingProxyType(
    {role: TENSOR_NAMES[t].replace("{bid}", "{i}") + "." + suffix for role, (t, suffix) in _ROLES.items()}
)


def _gguf_roles() -> dict[str, str]:
    """Every tensor gguf-py names, as a role: its name without `blk.{bid}.` (+ `.bias` for its bias).
    Roles outside DEFAULT_TENSOR_NAMES (e.g. an attention layout's own tensors, `attn_kv_a_mqa`)
    resolve here, so a vocabulary plugin binds them without a core table entry."""
    roles: dict[str, str] = {}
    for name in TENSOR_NAMES.values():
        role = name.removeprefix("blk.{bid}.")
        template = name.replace("{bid}", "{i}")
        roles.setdefault(role, template + ".weight")
        roles.setdefault(role + ".bias", template + ".bias")
    return roles


GGUF_TENSOR_ROLES: Mapping[str, str] = MappingProxyType(_gguf_roles())


# Tensors a file may carry that no plan uses, by glob: loading them only warns. Every other tensor a
# plan does not bind fails the load (UnexpectedTensor): running without it would be silently wrong.
IGNORED_TENSORS: tuple[str, ...] = (
    TENSOR_NAMES[MODEL_TENSOR.ATTN_ROT_EMBD].replace("{bid}", "*") + ".*",  # rotary caches of old converters
)


def _frozen_mapping(value: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(value))


def _params(value: Any) -> tuple[tuple[str, float], ...]:
    """Layout parameters as sorted (name, number) pairs, from a mapping or pairs (a JSON round trip)."""
    items = value.items() if isinstance(value, Mapping) else value
    return tuple(sorted((str(k), float(x)) for k, x in items))


@frozen
class RopeSpec:
    """One rotary-embedding table.

    pairing: the rope op (slot "rope"), e.g. "norm" rotates (x[2i], x[2i+1]) and "neox"
    (x[i], x[i + n_rot/2]); "none" (NO_ROPE) means no rotary embedding (NoPE layers).
    Only the first `n_rot` dims of each head rotate; theta_i = pos * freq_base^(-2i/n_rot), then
    scaled (archrun_blocks.rope_scaling, HF transformers' semantics): "linear" divides by
    scaling_factor; "yarn" mixes interpolated and extrapolated frequencies between the
    beta_fast/beta_slow correction dims (ext_factor 0: plain interpolation) and scales cos/sin
    by its magnitude (attn_factor replaces the default 0.1 ln(factor) + 1), its correction dims
    rounded to whole dims unless `truncate` is False (HF's `truncate`); "longrope" divides
    by the long_factors tensor when `context` exceeds original_context, else short_factors.
    freq_factors (a tensor of per-frequency divisors, how llama3 scaling ships) applies to any
    kind; attn_scale multiplies the cos/sin magnitude of any kind.
    """

    pairing: str = field(validator=v.instance_of(str))
    n_rot: int = field(validator=_nonneg_int)
    freq_base: float = field(converter=float, validator=_pos_float)
    scaling: str = field(default="none", validator=v.in_(("none", "linear", "yarn", "longrope")))
    scaling_factor: float = field(default=1.0, converter=float, validator=_pos_float)
    original_context: int = field(default=0, validator=_nonneg_int)
    freq_factors: str | None = field(default=None)  # role of a tensor of per-frequency divisors
    context: int = field(default=0, validator=_nonneg_int)  # the context the table serves (longrope)
    beta_fast: float = field(default=32.0, converter=float)
    beta_slow: float = field(default=1.0, converter=float)
    ext_factor: float = field(default=1.0, converter=float)
    attn_factor: float | None = field(default=None)
    attn_scale: float = field(default=1.0, converter=float, validator=_pos_float)
    long_factors: str | None = field(default=None)   # tensor role (longrope)
    short_factors: str | None = field(default=None)  # tensor role (longrope)
    truncate: bool = field(default=True, validator=v.instance_of(bool))  # yarn: floor/ceil the correction dims

    @n_rot.validator
    def _even(self, _attr, value: int) -> None:
        if value % 2:
            raise ValueError(f"rope n_rot must be even, got {value}")


NO_ROPE = "none"  # RopeSpec.pairing of a table that rotates nothing


@frozen
class AttentionSpec:
    """Attention geometry of one layer. `window` 0 means global (full causal).

    scale multiplies the q.k scores (an attention multiplier is just another scale);
    softcap > 0 caps scores to softcap * tanh(s / softcap); qkv_packed: q|k|v come from one
    fused attn_qkv tensor. alibi_max_bias: the ALiBi maximum bias (llama.cpp's f_max_alibi_bias),
    read by attention ops that add per-head linear position biases (e.g. "alibi"). sinks: each
    head's softmax also counts a learned logit (`attn_sinks` [H], gpt-oss) that takes probability
    mass and contributes no value; the attention op binds the tensor.
    An attention op with its own projection layout (archrun.vocab.AttentionLayout, e.g. MLA's
    compressed latents) states head_dim / v_head_dim / n_head_kv as its attention and cache see
    them, and the numbers its projections need in `params`.
    """

    kind: str = field(validator=v.instance_of(str))  # vocabulary slot "attention" ("mixer" when mixer)
    n_head: int = field(validator=_pos_int)
    n_head_kv: int = field(validator=_pos_int)
    head_dim: int = field(validator=_pos_int)  # key/query width per head
    v_head_dim: int = field(validator=_pos_int)
    scale: float = field(converter=float, validator=_pos_float)
    rope: int = field(default=0, validator=_nonneg_int)  # index into Descriptor.rope_tables
    window: int = field(default=0, validator=_nonneg_int)
    qk_norm: bool = field(default=False, validator=v.instance_of(bool))
    qk_norm_full: bool = field(default=False, validator=v.instance_of(bool))  # q/k norms span all heads
    qk_norm_per_head: bool = field(default=False, validator=v.instance_of(bool))  # a weight row per head ({hd, H})
    qk_norm_after_rope: bool = field(default=False, validator=v.instance_of(bool))  # q/k norms follow rope
    clamp_kqv: float = field(default=0.0, converter=float, validator=v.ge(0.0))  # Q/K/V clipped to [-c, c]; 0 off
    qkv_bias: bool = field(default=False, validator=v.instance_of(bool))
    output_bias: bool = field(default=False, validator=v.instance_of(bool))
    softcap: float = field(default=0.0, converter=float, validator=v.ge(0.0))
    qkv_packed: bool = field(default=False, validator=v.instance_of(bool))
    alibi_max_bias: float = field(default=0.0, converter=float, validator=v.ge(0.0))
    sinks: bool = field(default=False, validator=v.instance_of(bool))  # learned per-head sink logits (attn_sinks)
    # numbers an attention op with its own projection layout (archrun.vocab.AttentionLayout) needs, by name
    params: tuple[tuple[str, float], ...] = field(default=(), converter=_params)
    # kind names a token mixer (vocabulary slot "mixer"): the op is the layer's whole mixer, binds its own
    # tensors and keeps its own state; its layout (archrun.vocab.MixerLayout) states params (conv taps,
    # state sizes, inner widths), and the heads only when it has them
    mixer: bool = field(default=False, validator=v.instance_of(bool))

    @n_head_kv.validator
    def _divides(self, _attr, value: int) -> None:
        if self.n_head % value:
            raise ValueError(f"n_head_kv {value} does not divide n_head {self.n_head}")

    @property
    def slot(self) -> str:
        """The vocabulary slot `kind` names: "mixer" for a token mixer, else "attention"."""
        return "mixer" if self.mixer else "attention"

    @property
    def group(self) -> int:
        """Query heads per kv head."""
        return self.n_head // self.n_head_kv

    def param(self, name: str) -> float:
        """The layout parameter `name` (KeyError when the layout did not state it)."""
        for key, value in self.params:
            if key == name:
                return value
        raise KeyError(f"{'mixer' if self.mixer else 'attention'} {self.kind!r} has no parameter {name!r}")


def _named_values(pairs: Any) -> tuple[tuple[str, float], ...]:
    """(name, value) pairs as a tuple of (str, float) tuples (also after a JSON round trip's lists)."""
    return tuple((str(k), float(x)) for k, x in pairs)


@frozen
class FfnSpec:
    """A dense FFN: gated down(act(gate x) * up x), or plain down(act(up x)).

    activation names the slot "activation" op; activation_params: its per-layer parameters as (name,
    value) pairs when the op reads its own from the file (archrun.vocab.ActivationLayout; passed to its
    factory as keywords), else empty; gated is found by the presence of a gate
    projection; packed: gate|up come from one ffn_up tensor of 2 n_ff outputs. Biases (found by
    tensor presence) are added to the gate, up and down products that have one.
    """

    activation: str = field(validator=v.instance_of(str))  # vocabulary slot "activation"
    n_ff: int = field(validator=_pos_int)
    activation_params: tuple[tuple[str, float], ...] = field(default=(), converter=_named_values)
    gated: bool = field(default=True, validator=v.instance_of(bool))
    packed: bool = field(default=False, validator=v.instance_of(bool))
    gate_bias: bool = field(default=False, validator=v.instance_of(bool))
    up_bias: bool = field(default=False, validator=v.instance_of(bool))
    down_bias: bool = field(default=False, validator=v.instance_of(bool))


@frozen
class MoeSpec:
    """A mixture-of-experts FFN (llama.cpp build_moe_ffn semantics).

    gating follows GGUF's expert_gating_func numbering by name ("softmax" = 1,
    "sigmoid" = 2). router_bias: an `exp_probs_b` bias added for selection only.
    n_group/n_group_used: group-limited top-k (group score = sum of the top-2 scores).
    weights_norm renormalises the selected weights; weights_scale multiplies them.
    n_shared experts of width n_ff_shared run on the same input and are added; with shared_gate
    their output is scaled by sigmoid(x . w) first (w: `ffn_gate_inp_shexp`, Qwen2-MoE).
    gate_bias/up_bias/down_bias: each expert's projection adds its row of `ffn_*_exps.bias`
    ({n_ff or d, E}, by presence; gpt-oss); shared_bias: the shared experts' gate, up and down
    projections add `ffn_{gate,up,down}_shexp.bias`. packed: the gate and up projections are one
    tensor (`ffn_gate_up_exps`, by presence; Gemma 4).
    """

    kind: str = field(validator=v.instance_of(str))  # vocabulary slot "moe"
    activation: str = field(validator=v.instance_of(str))  # slot "activation" of each (gated) expert
    # as FfnSpec's
    activation_params: tuple[tuple[str, float], ...] = field(default=(), converter=_named_values, kw_only=True)
    n_expert: int = field(validator=_pos_int)
    n_expert_used: int = field(validator=_pos_int)
    n_ff: int = field(validator=_pos_int)
    gating: str = field(validator=v.instance_of(str))  # vocabulary slot "gating"
    weights_norm: bool = field(validator=v.instance_of(bool))
    weights_scale: float = field(default=1.0, converter=float, validator=_pos_float)
    router_bias: bool = field(default=False, validator=v.instance_of(bool))
    router_input_bias: bool = field(default=False, validator=v.instance_of(bool))
    n_group: int = field(default=1, validator=_pos_int)
    n_group_used: int = field(default=1, validator=_pos_int)
    n_shared: int = field(default=0, validator=_nonneg_int)
    n_ff_shared: int = field(default=0, validator=_nonneg_int)
    shared_gate: bool = field(default=False, validator=v.instance_of(bool))
    gate_bias: bool = field(default=False, validator=v.instance_of(bool))
    up_bias: bool = field(default=False, validator=v.instance_of(bool))
    down_bias: bool = field(default=False, validator=v.instance_of(bool))
    shared_bias: bool = field(default=False, validator=v.instance_of(bool))  # ffn_*_shexp.bias
    # the experts' gate and up projections in one {d, 2 n_ff, E} tensor, `ffn_gate_up_exps` (gate rows first)
    packed: bool = field(default=False, validator=v.instance_of(bool), kw_only=True)
    # the mixture op's own per-layer parameters, read from the file by its layout (archrun.vocab.MoeLayout)
    params: tuple[tuple[str, float], ...] = field(default=(), converter=_named_values, kw_only=True)

    @n_expert_used.validator
    def _used(self, _attr, value: int) -> None:
        if value > self.n_expert:
            raise ValueError(f"expert_used_count {value} > expert_count {self.n_expert}")

    @n_group_used.validator
    def _groups(self, _attr, value: int) -> None:
        if self.n_expert % self.n_group or value > self.n_group:
            raise ValueError(f"bad expert groups: {self.n_group} groups, {value} used, {self.n_expert} experts")


@frozen
class LayerSpec:
    """One decoder block: a = [post_attn_norm](Attn(attn_norm(x))); f = [post_ffn_norm](FFN(ffn_norm(g)));
    the residual op (slot "residual") says what g is and how x, a and f combine, e.g.
    "sequential": g = x + s a, out = g + s f; "parallel": g = x, out = x + s (a + f).

    ffn_norm False: the FFN reads the attention's normed input (a parallel block with one norm).
    attn_norm False: the block has no pre-norms at all (attention reads x, the FFN reads g as is;
    post-norms only, as OLMo 2). residual_scale s multiplies each branch before it joins the stream.
    ffn None: the block has no FFN (a state-space block: out = combine(x, a, 0)).
    parallel: a token mixer (slot "mixer", e.g. Mamba2) running beside the attention on the same
    normed input; a is then the sum of both outputs (Falcon-H1).
    attn_sub_norm: the attention output passes through the norm op (weight `attn_sub_norm`) before
    its output projection; ffn_sub_norm: the FFN's hidden act(gate)*up does (weight `ffn_sub_norm`)
    before its down projection (BitNet's sub-layer norms).
    """

    attention: AttentionSpec = field(validator=v.instance_of(AttentionSpec))
    ffn: FfnSpec | MoeSpec | None = field(validator=v.optional(v.instance_of((FfnSpec, MoeSpec))))
    post_attn_norm: bool = field(default=False, validator=v.instance_of(bool))
    post_ffn_norm: bool = field(default=False, validator=v.instance_of(bool))
    residual: str = field(default="sequential", validator=v.instance_of(str))  # vocabulary slot "residual"
    residual_scale: float = field(default=1.0, converter=float)
    ffn_norm: bool = field(default=True, validator=v.instance_of(bool))
    attn_norm: bool = field(default=True, validator=v.instance_of(bool))
    norm_bias: bool = field(default=False, validator=v.instance_of(bool))  # attn/ffn norms carry biases
    parallel: AttentionSpec | None = field(default=None, validator=v.optional(v.instance_of(AttentionSpec)))
    attn_sub_norm: bool = field(default=False, validator=v.instance_of(bool))
    ffn_sub_norm: bool = field(default=False, validator=v.instance_of(bool))

    @property
    def is_moe(self) -> bool:
        return isinstance(self.ffn, MoeSpec)


@frozen
class Descriptor:
    """A decoder-only transformer as data (see module docstring).

    layers are the trunk's blocks; `nextn_layers` are the multi-token-prediction (MTP) blocks
    that follow them in the file (block indices n_layer, n_layer+1, ...), not part of the trunk.
    position_embedding: a learned absolute position table (role "position_embd", [positions, d])
    is added to the token embeddings at each position; its rows bound the positions.
    embed_norm: the (scaled, position-added) embeddings pass through the norm op with the
    `token_embd_norm` weight (and bias). token_types: row 0 of the `token_types` table (BERT's
    segment embeddings; every token is "sentence A", as llama.cpp feeds them) is added to every
    token's embedding. output_norm False: the trunk ends without a final norm (post-norm encoders,
    whose blocks end normed). causal False: the file states `attention.causal` false (an encoder):
    its attention ops must be bidirectional and the model embeds, it does not generate. pooling:
    how the file says a sequence's hidden states become one embedding (`pooling_type`, GGUF's
    numbering by name: none, mean, cls, last, rank; archrun.generation.embedding). norm_weights False: norms
    have no learned weight (unit scale; OLMo's non-parametric LayerNorm), so no norm weight tensors
    exist. final_norm: the norm op (slot "norm") of the trunk's final norm when it is not `norm`
    ("": the model's norm op). stream: the op (slot "stream") carrying the residual stream through the
    blocks when it is more than one array, with its parameters from the file (`stream_params`, sorted
    (name, value) pairs); "": one stream, block by block.
    """

    architecture: str = field(validator=v.instance_of(str))
    n_vocab: int = field(validator=_pos_int)
    n_embd: int = field(validator=_pos_int)
    n_ctx: int = field(validator=_pos_int)
    layers: tuple[LayerSpec, ...] = field(
        converter=tuple, validator=v.deep_iterable(v.instance_of(LayerSpec), v.min_len(1))
    )
    rope_tables: tuple[RopeSpec, ...] = field(
        converter=tuple, validator=v.deep_iterable(v.instance_of(RopeSpec), v.min_len(1))
    )
    norm: str = field(validator=v.instance_of(str))  # vocabulary slot "norm"
    norm_eps: float = field(default=1e-6, converter=float, validator=_pos_float)
    embed_scale: float = field(default=1.0, converter=float, validator=_pos_float)
    tied_output: bool = field(default=False, validator=v.instance_of(bool))
    logit_scale: float = field(default=1.0, converter=float, validator=_pos_float)  # multiplies the logits
    logit_softcap: float = field(default=0.0, converter=float, validator=v.ge(0.0))
    softcap: str = field(default="tanh", validator=v.instance_of(str))  # vocabulary slot "softcap"
    output_norm_bias: bool = field(default=False, validator=v.instance_of(bool))
    output_bias: bool = field(default=False, validator=v.instance_of(bool))  # an `output.bias` on the head
    position_embedding: bool = field(default=False, validator=v.instance_of(bool))
    embed_norm: bool = field(default=False, validator=v.instance_of(bool))
    embed_norm_bias: bool = field(default=False, validator=v.instance_of(bool))
    norm_weights: bool = field(default=True, validator=v.instance_of(bool))
    token_types: bool = field(default=False, validator=v.instance_of(bool))
    output_norm: bool = field(default=True, validator=v.instance_of(bool))
    final_norm: str = field(default="", validator=v.instance_of(str))  # vocabulary slot "norm"; "": norm
    causal: bool = field(default=True, validator=v.instance_of(bool))
    pooling: str = field(default="none", validator=v.in_(("none", "mean", "cls", "last", "rank")))
    block_style: str = field(default="fused", validator=v.instance_of(str))  # vocabulary slot "block_style"
    stream: str = field(default="", validator=v.instance_of(str))  # vocabulary slot "stream"; "": one stream
    stream_params: tuple[tuple[str, float], ...] = field(default=(), converter=tuple)
    nextn_layers: tuple[LayerSpec, ...] = field(
        default=(), converter=tuple, validator=v.deep_iterable(v.instance_of(LayerSpec))
    )
    tensor_names: Mapping[str, str | None] = field(default=DEFAULT_TENSOR_NAMES, converter=_frozen_mapping)
    ignored_tensors: tuple[str, ...] = field(default=IGNORED_TENSORS, converter=tuple)  # glob patterns

    @layers.validator
    def _rope_refs(self, _attr, layers: tuple[LayerSpec, ...]) -> None:
        for i, layer in enumerate(layers):
            if layer.attention.rope >= len(self.rope_tables):  # NoPE layers name a NO_ROPE table
                raise ValueError(f"layer {i} names rope table {layer.attention.rope}, which does not exist")

    @property
    def n_layer(self) -> int:
        """Number of trunk layers."""
        return len(self.layers)

    @property
    def n_nextn(self) -> int:
        """Number of MTP blocks after the trunk."""
        return len(self.nextn_layers)

    def tensor_name(self, role: str, layer: int | None = None) -> str:
        """The GGUF tensor name holding `role` (in block `layer` for per-block roles)."""
        template = self.tensor_names[role] if role in self.tensor_names else GGUF_TENSOR_ROLES[role]
        if template is None:
            raise KeyError(f"{self.architecture} has no tensor of role {role!r}")
        return template.format(i=layer) if "{i}" in template else template

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view (tensor_names as a plain dict)."""
        d = attrs.asdict(self, recurse=True)
        d["tensor_names"] = dict(self.tensor_names)
        return d


def default_attention_scale(head_dim: int) -> float:
    """1/sqrt(head_dim): the scale every target architecture uses unless a family says otherwise."""
    return 1.0 / math.sqrt(head_dim)
