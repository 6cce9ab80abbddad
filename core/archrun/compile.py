"""The metadata compiler: GGUF metadata + tensor presence -> Descriptor.

`compile_gguf` reads the standard `<arch>.*` key layout for whatever architecture a file
names and infers structure from which tensors exist (q/k norms, QKV biases, expert
stacks, router bias, shared experts, sandwich norms). What a file cannot say comes from
the family plugin answering `archrun_describe_family` (a `FamilyHints`); a file whose
architecture has no family plugin compiles with generic assumptions, listed in a warning.
Every metadata key that is not used is reported; a required key that is missing fails
loudly, naming it.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np
import pluggy
from attrs import field, frozen
from attrs import validators as v

from archrun.descriptor import (
    DEFAULT_TENSOR_NAMES,
    AttentionSpec,
    Descriptor,
    FfnSpec,
    LayerSpec,
    MoeSpec,
    RopeSpec,
    default_attention_scale,
)
from archrun.errors import ArchrunWarning, MetadataError, MissingTensor, ShapeMismatch
from archrun.ggufio import GGUFFile, open_gguf

# Sanity bounds (BAD_INPUTS M1): larger values are hostile or corrupt, not models.
MAX_LAYERS = 1024
MAX_CONTEXT = 1 << 24
MAX_WIDTH = 1 << 18
MAX_HEADS = 4096
MAX_EXPERTS = 4096

GATING = {1: "softmax", 2: "sigmoid"}  # GGUF expert_gating_func numbering
_hookimpl = pluggy.HookimplMarker("archrun")


@frozen
class FamilyHints:
    """What a family plugin says about an architecture that its GGUF files do not.

    Data only. `defaults` maps key suffixes (without the `<arch>.` prefix) to values used
    when the file omits them; `tensor_names` remaps tensor roles (see
    archrun.descriptor.DEFAULT_TENSOR_NAMES; None: the architecture has no such tensor);
    `swa_period` P > 0 makes layer i sliding iff i % P < P - 1 unless the file has
    attention.sliding_window_pattern.
    """

    name: str = field(validator=v.instance_of(str))
    rope_pairing: str = field(default="neox", validator=v.in_(("norm", "neox", "none")))
    defaults: Mapping[str, Any] = field(factory=dict, converter=lambda d: MappingProxyType(dict(d)))
    tensor_names: Mapping[str, str | None] = field(factory=dict, converter=lambda d: MappingProxyType(dict(d)))
    ffn_kind: str = "swiglu"
    embed_scale: str = field(default="none", validator=v.in_(("none", "sqrt_n_embd")))
    swa_period: int = 0
    block_style: str = "fused"
    gating: str = "softmax"
    moe_weights_norm: bool = False
    chat_template: str | None = None
    generic: bool = False  # True only for the built-in fallback


class FamilyPlugin:
    """A family plugin made from architecture -> FamilyHints: implements both family hooks.

    A family package needs only `plugin = FamilyPlugin({...})` and the entry point
    `[project.entry-points.archrun] name = "package:plugin"`.
    """

    def __init__(self, hints: Mapping[str, FamilyHints]):
        self.hints = MappingProxyType(dict(hints))

    @_hookimpl
    def archrun_describe_family(self, architecture: str) -> FamilyHints | None:
        return self.hints.get(architecture)

    @_hookimpl
    def archrun_families(self) -> list[str]:
        return sorted(self.hints)


GENERIC_HINTS = FamilyHints(name="generic", generic=True)
GENERIC_ASSUMPTIONS = (
    "rope pairing NEOX (x[i], x[i+n_rot/2])",
    "gated FFN is SwiGLU",
    "no embedding scale",
    "MoE gating softmax unless expert_gating_func says otherwise",
    "MoE weights not renormalised unless expert_weights_norm says so",
    "block style fused",
)


@frozen
class CompileResult:
    """A descriptor plus what the compiler noticed on the way."""

    descriptor: Descriptor
    family: str  # name of the FamilyHints used ("generic" when no plugin knew the architecture)
    unused_keys: tuple[str, ...]
    assumptions: tuple[str, ...]
    chat_template: str | None = None  # a family default, for files that carry none


class _Meta:
    """Typed, use-tracking access to `<arch>.*` metadata keys."""

    def __init__(self, gguf: GGUFFile, arch: str, defaults: Mapping[str, Any]):
        self.gguf, self.arch, self.defaults = gguf, arch, defaults
        self.used: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.arch}.{name}"

    def has(self, name: str) -> bool:
        return self.key(name) in self.gguf.metadata

    def get(self, name: str, kind: type, default: Any = ...) -> Any:
        key = self.key(name)
        if key not in self.gguf.metadata:
            if name in self.defaults:
                return self.defaults[name]
            if default is ...:
                raise MetadataError(f"missing required metadata key {key!r}")
            return default
        self.used.add(key)
        return _typed(key, self.gguf.metadata[key], kind)

    def per_layer(self, name: str, n: int, default: Any = ...) -> tuple[int, ...]:
        """An int key that may also be a per-layer array of length n."""
        key = self.key(name)
        value = self.gguf.metadata.get(key)
        if isinstance(value, np.ndarray):
            self.used.add(key)
            if value.ndim != 1 or len(value) != n or value.dtype.kind not in "iu":
                raise MetadataError(f"{key!r} must be an integer or {n} integers, got {value.dtype}[{len(value)}]")
            return tuple(int(x) for x in value)
        return (self.get(name, int, default),) * n


def _typed(key: str, value: Any, kind: type) -> Any:
    if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if kind is int and isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    if kind is bool and isinstance(value, (bool, np.bool_)):
        return bool(value)
    if kind is str and isinstance(value, str):
        return value
    raise MetadataError(f"metadata key {key!r} has type {type(value).__name__}, expected {kind.__name__}")


def _bounded(key: str, value: int, lo: int, hi: int) -> int:
    if not lo <= value <= hi:
        raise MetadataError(f"metadata key {key!r} = {value} is outside [{lo}, {hi}]")
    return value


class _Tensors:
    """Presence and shape checks against the file's tensor table (shapes in ggml order)."""

    def __init__(self, gguf: GGUFFile, names: Mapping[str, str]):
        self.gguf, self.names = gguf, names

    def name(self, role: str, layer: int | None = None) -> str | None:
        t = self.names[role]
        if t is None:  # the family says this architecture has no such tensor
            return None
        return t.format(i=layer) if "{i}" in t else t

    def has(self, role: str, layer: int | None = None) -> bool:
        name = self.name(role, layer)
        return name is not None and name in self.gguf.tensors

    def shape(self, role: str, layer: int | None = None) -> tuple[int, ...]:
        name = self.name(role, layer)
        if name not in self.gguf.tensors:
            raise MissingTensor(f"required tensor {name!r} is missing")
        return self.gguf.tensors[name].shape

    def expect(self, role: str, layer: int | None, shape: tuple[int, ...]) -> None:
        got = self.shape(role, layer)
        if tuple(got) != tuple(shape):
            raise ShapeMismatch(
                f"tensor {self.name(role, layer)!r} has shape {tuple(got)}, metadata implies {tuple(shape)}"
            )


def compile_gguf(source: Any, plugins: Any = None, block_style: str | None = None) -> CompileResult:
    """Compile a GGUF file (path or open GGUFFile) into a Descriptor; see the module docstring.

    plugins: a pluggy PluginManager (default: archrun.plugins.default_plugin_manager()).
    block_style: override the family's block style ("fused" | "host_reference").
    """
    if isinstance(source, (str, os.PathLike)):
        with open_gguf(source) as gguf:
            return compile_gguf(gguf, plugins, block_style)
    gguf: GGUFFile = source
    arch = _typed("general.architecture", _require(gguf, "general.architecture"), str)
    hints = _family_hints(arch, plugins)
    meta = _Meta(gguf, arch, hints.defaults)
    tensors = _Tensors(gguf, {**DEFAULT_TENSOR_NAMES, **hints.tensor_names})
    try:
        descriptor = _build(meta, tensors, hints, block_style)
    except (ValueError, TypeError) as e:  # a descriptor validator refused a value from the file
        raise MetadataError(f"{arch}: metadata describes an impossible model: {e.args[0]}") from None
    unused = _unused_keys(gguf, meta.used)
    assumptions = GENERIC_ASSUMPTIONS if hints.generic else ()
    _warn(arch, unused, assumptions)
    return CompileResult(descriptor, hints.name, unused, assumptions, hints.chat_template)


def _require(gguf: GGUFFile, key: str) -> Any:
    if key not in gguf.metadata:
        raise MetadataError(f"missing required metadata key {key!r}")
    return gguf.metadata[key]


def _family_hints(arch: str, plugins: Any) -> FamilyHints:
    if plugins is None:
        from archrun.plugins import default_plugin_manager

        plugins = default_plugin_manager()
    hints = plugins.hook.archrun_describe_family(architecture=arch)
    return GENERIC_HINTS if hints is None else hints


def _build(meta: _Meta, t: _Tensors, hints: FamilyHints, block_style: str | None) -> Descriptor:
    n_embd = _bounded(meta.key("embedding_length"), meta.get("embedding_length", int), 1, MAX_WIDTH)
    n_ctx = _bounded(meta.key("context_length"), meta.get("context_length", int), 1, MAX_CONTEXT)
    n_block = _bounded(meta.key("block_count"), meta.get("block_count", int), 1, MAX_LAYERS)
    n_nextn = _bounded(meta.key("nextn_predict_layers"), meta.get("nextn_predict_layers", int, 0), 0, n_block - 1)
    eps = _norm_eps(meta)
    emb = t.shape("token_embd")
    if len(emb) != 2 or emb[0] != n_embd:
        raise ShapeMismatch(f"token_embd has shape {tuple(emb)}, expected ({n_embd}, n_vocab)")
    n_vocab = emb[1]
    vocab_size = meta.get("vocab_size", int, n_vocab)
    if vocab_size != n_vocab:
        raise ShapeMismatch(f"{meta.key('vocab_size')} = {vocab_size} but token_embd has {n_vocab} rows")
    tied = not t.has("output")
    if not tied:
        t.expect("output", None, (n_embd, n_vocab))
    t.expect("output_norm", None, (n_embd,))
    geo = _Geometry(meta, t, hints, n_embd, n_block)
    layers = tuple(geo.layer(i) for i in range(n_block - n_nextn))
    nextn_layers = tuple(geo.layer(i) for i in range(n_block - n_nextn, n_block))
    return Descriptor(
        architecture=meta.arch,
        n_vocab=n_vocab,
        n_embd=n_embd,
        n_ctx=n_ctx,
        layers=layers,
        rope_tables=geo.rope_tables(),
        norm="rms",
        norm_eps=eps,
        embed_scale=math.sqrt(n_embd) if hints.embed_scale == "sqrt_n_embd" else 1.0,
        tied_output=tied,
        logit_softcap=meta.get("final_logit_softcapping", float, 0.0),
        block_style=block_style or hints.block_style,
        nextn_layers=nextn_layers,
        tensor_names=t.names,
    )


def _norm_eps(meta: _Meta) -> float:
    if not meta.has("attention.layer_norm_rms_epsilon") and meta.has("attention.layer_norm_epsilon"):
        from archrun.errors import UnknownVocabulary

        raise UnknownVocabulary("norm='layer' (LayerNorm with attention.layer_norm_epsilon) is not supported")
    eps = meta.get("attention.layer_norm_rms_epsilon", float)
    if not 0.0 < eps < 1.0:
        raise MetadataError(f"{meta.key('attention.layer_norm_rms_epsilon')!r} = {eps} is not a valid epsilon")
    return eps


class _Geometry:
    """Per-layer geometry from metadata plus tensor presence."""

    def __init__(self, meta: _Meta, t: _Tensors, hints: FamilyHints, n_embd: int, n_block: int):
        self.meta, self.t, self.hints, self.n_embd, self.n_block = meta, t, hints, n_embd, n_block
        self.heads = meta.per_layer("attention.head_count", n_block)
        self.heads_kv = meta.per_layer("attention.head_count_kv", n_block, 0)
        self.n_ff = meta.per_layer("feed_forward_length", n_block, 0)
        for i, (h, kv) in enumerate(zip(self.heads, self.heads_kv, strict=True)):
            _bounded(meta.key("attention.head_count"), h, 1, MAX_HEADS)
            kv = kv or h
            if kv < 1 or h % kv:
                raise MetadataError(f"layer {i}: head_count_kv {kv} does not divide head_count {h}")
        head0 = self.heads[0]
        self.head_dim = meta.get("attention.key_length", int, n_embd // head0)
        self.v_head_dim = meta.get("attention.value_length", int, self.head_dim)
        _bounded(meta.key("attention.key_length"), self.head_dim, 1, MAX_WIDTH)
        _bounded(meta.key("attention.value_length"), self.v_head_dim, 1, MAX_WIDTH)
        self.scale = meta.get("attention.scale", float, default_attention_scale(self.head_dim))
        self.window = meta.get("attention.sliding_window", int, 0)
        self.sliding = self._sliding_layers()
        self.leading_dense = meta.get("leading_dense_block_count", int, 0)

    def _sliding_layers(self) -> tuple[bool, ...]:
        n = self.n_block
        pattern = self.meta.gguf.metadata.get(self.meta.key("attention.sliding_window_pattern"))
        if pattern is not None:
            self.meta.used.add(self.meta.key("attention.sliding_window_pattern"))
            if isinstance(pattern, np.ndarray):
                if len(pattern) != n:
                    raise MetadataError("attention.sliding_window_pattern must have one entry per layer")
                return tuple(bool(x) for x in pattern)
            period = _bounded("attention.sliding_window_pattern", _typed("pattern", pattern, int), 1, MAX_LAYERS)
        else:
            period = self.hints.swa_period
        if not self.window or not period:
            return (False,) * n
        return tuple(i % period < period - 1 for i in range(n))

    def rope_tables(self) -> tuple[RopeSpec, ...]:
        meta = self.meta
        n_rot = meta.get("rope.dimension_count", int, self.head_dim)
        if n_rot > self.head_dim:
            raise MetadataError(f"rope.dimension_count {n_rot} exceeds the head width {self.head_dim}")
        scaling = meta.get("rope.scaling.type", str, "none")
        factor = meta.get("rope.scaling.factor", float, 1.0) if scaling != "none" else 1.0
        pairing = self.hints.rope_pairing
        glob = RopeSpec(
            pairing=pairing,
            n_rot=n_rot,
            freq_base=meta.get("rope.freq_base", float, 10000.0),
            scaling=scaling,
            scaling_factor=factor,
            original_context=meta.get("rope.scaling.original_context_length", int, 0),
            freq_factors="rope_freqs" if self.t.has("rope_freqs") else None,
        )
        if not any(self.sliding):
            return (glob,)
        local = RopeSpec(pairing=pairing, n_rot=n_rot, freq_base=meta.get("rope.freq_base_swa", float, 10000.0))
        return (glob, local)

    def layer(self, i: int) -> LayerSpec:
        t = self.t
        return LayerSpec(
            attention=self._attention(i),
            ffn=self._moe(i) if t.has("ffn_gate_inp", i) else self._dense(i),
            post_attn_norm=self._norm_if_present("post_attn_norm", i),
            post_ffn_norm=self._norm_if_present("post_ffn_norm", i),
        )

    def _attention(self, i: int) -> AttentionSpec:
        t, d = self.t, self.n_embd
        n_head, n_kv = self.heads[i], self.heads_kv[i] or self.heads[i]
        hd, vd = self.head_dim, self.v_head_dim
        t.expect("attn_norm", i, (d,))
        if not t.has("attn_q", i) and t.name("attn_q", i).replace("attn_q", "attn_qkv") in t.gguf.tensors:
            raise MissingTensor(f"layer {i}: fused attn_qkv is not supported (expected separate attn_q/k/v)")
        t.expect("attn_q", i, (d, n_head * hd))
        t.expect("attn_k", i, (d, n_kv * hd))
        t.expect("attn_v", i, (d, n_kv * vd))
        t.expect("attn_output", i, (n_head * vd, d))
        bias = t.has("attn_q.bias", i)
        if bias:
            t.expect("attn_q.bias", i, (n_head * hd,))
            t.expect("attn_k.bias", i, (n_kv * hd,))
            t.expect("attn_v.bias", i, (n_kv * vd,))
        qk_norm = t.has("attn_q_norm", i)
        if qk_norm:
            t.expect("attn_q_norm", i, (hd,))
            t.expect("attn_k_norm", i, (hd,))
        sliding = self.sliding[i]
        return AttentionSpec(
            kind="causal", n_head=n_head, n_head_kv=n_kv, head_dim=hd, v_head_dim=vd, scale=self.scale,
            rope=1 if sliding else 0, window=self.window if sliding else 0, qk_norm=qk_norm,
            qkv_bias=bias, output_bias=t.has("attn_output.bias", i),
        )

    def _dense(self, i: int) -> FfnSpec:
        t, d = self.t, self.n_embd
        n_ff = self.n_ff[i] or t.shape("ffn_up", i)[-1]
        t.expect("ffn_norm", i, (d,))
        for role, shape in (("ffn_gate", (d, n_ff)), ("ffn_up", (d, n_ff)), ("ffn_down", (n_ff, d))):
            t.expect(role, i, shape)
        return FfnSpec(kind=self.hints.ffn_kind, n_ff=n_ff)

    def _moe(self, i: int) -> MoeSpec:
        meta, t, d = self.meta, self.t, self.n_embd
        n_expert = _bounded(meta.key("expert_count"), meta.get("expert_count", int), 1, MAX_EXPERTS)
        n_used = meta.get("expert_used_count", int)
        n_ff = meta.get("expert_feed_forward_length", int, 0) or t.shape("ffn_up_exps", i)[1]
        t.expect("ffn_norm", i, (d,))
        t.expect("ffn_gate_inp", i, (d, n_expert))
        for role, shape in (("ffn_gate_exps", (d, n_ff, n_expert)), ("ffn_up_exps", (d, n_ff, n_expert)),
                            ("ffn_down_exps", (n_ff, d, n_expert))):
            t.expect(role, i, shape)
        bias = t.has("exp_probs_b", i)
        if bias:
            t.expect("exp_probs_b", i, (n_expert,))
        n_shared, n_ff_shared = self._shared(i)
        gating_id = meta.get("expert_gating_func", int, 0)  # 0: the file does not say
        gating = self.hints.gating if gating_id == 0 else GATING.get(gating_id, f"gguf_{gating_id}")
        return MoeSpec(
            kind="topk", expert_kind=self.hints.ffn_kind, n_expert=n_expert, n_expert_used=n_used, n_ff=n_ff,
            gating=gating, weights_norm=meta.get("expert_weights_norm", bool, self.hints.moe_weights_norm),
            weights_scale=meta.get("expert_weights_scale", float, 1.0) or 1.0, router_bias=bias,
            router_input_bias=t.has("ffn_gate_inp.bias", i),
            n_group=meta.get("expert_group_count", int, 1) or 1,
            n_group_used=meta.get("expert_group_used_count", int, 1) or 1,
            n_shared=n_shared, n_ff_shared=n_ff_shared,
        )

    def _shared(self, i: int) -> tuple[int, int]:
        t, d = self.t, self.n_embd
        if not t.has("ffn_up_shexp", i):
            return 0, 0
        n_ff_sh = t.shape("ffn_up_shexp", i)[1]
        for role, shape in (("ffn_gate_shexp", (d, n_ff_sh)), ("ffn_up_shexp", (d, n_ff_sh)),
                            ("ffn_down_shexp", (n_ff_sh, d))):
            t.expect(role, i, shape)
        return max(1, self.meta.get("expert_shared_count", int, 1)), n_ff_sh

    def _norm_if_present(self, role: str, i: int) -> bool:
        if not self.t.has(role, i):
            return False
        self.t.expect(role, i, (self.n_embd,))
        return True


_INFORMATIONAL_PREFIXES = ("general.", "tokenizer.", "quantize.", "split.")


def _unused_keys(gguf: GGUFFile, used: set[str]) -> tuple[str, ...]:
    """Keys nobody consumed: not informational (general.*), not the tokenizer's, not used here."""
    return tuple(
        k for k in gguf.metadata if k not in used and not k.startswith(_INFORMATIONAL_PREFIXES)
    )


def _warn(arch: str, unused: tuple[str, ...], assumptions: tuple[str, ...]) -> None:
    if assumptions:
        warnings.warn(
            f"no family plugin describes architecture {arch!r}; compiled generically assuming: "
            + "; ".join(assumptions),
            ArchrunWarning,
            stacklevel=3,
        )
    if unused:
        warnings.warn(f"{arch}: metadata keys not used by archrun: {', '.join(unused)}", ArchrunWarning,
                      stacklevel=3)

