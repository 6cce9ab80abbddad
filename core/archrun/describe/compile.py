"""The metadata compiler: GGUF metadata + tensor presence + conventions -> Descriptor.

`compile_gguf` reads the standard `<arch>.*` key layout for whatever architecture a file
names and infers structure from which tensors exist (q/k norms, biases, fused QKV, packed
gate|up, gated or plain FFN, expert stacks, router bias, shared experts, sandwich norms, a
learned position table). Which layers are recurrent, without a token mixer, sliding-window or
without rope, the layer patterns plugins register say (archrun.describe.layers).
What a file cannot say — its conventions (archrun.family.CONVENTIONS) — comes from the family
plugin answering `archrun_describe_family`, with a caller's hints on top. The compiler names
no op: every op name in a descriptor comes from those hints or from what a file says by key
(archrun.family's tables). It reads the installed vocabulary only for what an attention op
declares about its own tensors (its projection layout), and to refuse an op nobody installed.
A model whose conventions are not all stated does not compile (UnsupportedArchitecture lists
what is missing). Every metadata key that is not used is reported; a required key that is
missing fails loudly, naming it.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np
from attrs import frozen
from gguf.constants import Keys

from archrun.describe.layers import LayerFacts, decide, layer_patterns
from archrun.descriptor import (
    DEFAULT_TENSOR_NAMES,
    GGUF_TENSOR_ROLES,
    IGNORED_TENSORS,
    NO_ROPE,
    AttentionSpec,
    Descriptor,
    FfnSpec,
    LayerSpec,
    MoeSpec,
    RopeSpec,
    default_attention_scale,
)
from archrun.errors import (
    ArchrunWarning,
    MetadataError,
    MissingTensor,
    ShapeMismatch,
    UnknownVocabulary,
    UnsupportedArchitecture,
)
from archrun.family import (
    CONVENTIONS,
    GATING_BY_ID,
    NORM_BY_EPSILON_KEY,
    POOLING_BY_ID,
    RESIDUAL_BY_PARALLEL_KEY,
    FamilyHints,
)
from archrun.io.ggufio import GGUFFile
from archrun.io.ggufset import GGUFSet, open_gguf
from archrun.io.lora import AdaptedFile

# Sanity bounds: larger values are hostile or corrupt, not models.
MAX_LAYERS = 1024
MAX_CONTEXT = 1 << 24
MAX_WIDTH = 1 << 18
MAX_HEADS = 4096
MAX_EXPERTS = 4096


def _key_names(group: type) -> list[str]:
    """The key names gguf-py spells in a Keys group and its nested groups (e.g. Keys.Attention.Indexer)."""
    out = []
    for value in vars(group).values():
        if isinstance(value, str):
            out.append(value)
        elif isinstance(value, type):
            out.extend(_key_names(value))
    return out


# Every `<arch>.*` metadata key the compiler reads is one gguf-py spells (gguf.constants.Keys), without
# its "{arch}." prefix: no hand copies of key names (_Meta refuses any other name).
ARCH_KEYS = frozenset(value.removeprefix("{arch}.") for value in _key_names(Keys) if value.startswith("{arch}."))
# gguf-py's keys that carry no `{arch}.` prefix (e.g. `xielu.alpha_n`)
GLOBAL_KEYS = frozenset(value for group in vars(Keys).values() if isinstance(group, type)
                        for value in _key_names(group) if "{" not in value)
# Rope scalings a RopeSpec can state (the rope ops implement them); others are refused at compile time.
ROPE_SCALINGS = ("none", "linear", "yarn", "longrope")


@frozen
class CompileResult:
    """A descriptor plus what the compiler noticed on the way."""

    descriptor: Descriptor
    family: str  # name of the FamilyHints used (the architecture string when only a caller's hints described it)
    unused_keys: tuple[str, ...]
    hints: FamilyHints  # the conventions used (family + caller)
    chat_template: str | None = None  # a family default, for files that carry none


class _Meta:
    """Typed, use-tracking access to `<arch>.*` metadata keys: gguf-py's (gguf.constants.Keys) and those the
    family declares (FamilyHints.metadata_keys), no others."""

    def __init__(self, gguf: GGUFFile, arch: str, defaults: Mapping[str, Any], declared: tuple[str, ...] = ()):
        self.gguf, self.arch, self.defaults = gguf, arch, defaults
        self.used: set[str] = set()
        self.arch_keys = ARCH_KEYS | {k.removeprefix("{arch}.") for k in declared if k.startswith("{arch}.")}
        self.global_keys = GLOBAL_KEYS | {k for k in declared if not k.startswith("{arch}.")}

    def key(self, name: str) -> str:
        if name not in self.arch_keys:
            raise KeyError(f"{name!r} is not a gguf-py metadata key (gguf.constants.Keys) nor one the family "
                           "declares (FamilyHints.metadata_keys)")
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

    def per_layer_floats(self, key: str, n: int, infinite: bool = False) -> tuple[float, ...]:
        """A float key gguf-py names in full (with its `{arch}.` prefix or without one, e.g.
        `xielu.alpha_n`) holding one value or one per layer: n finite floats (with `infinite`, ±inf are
        values too: e.g. the normal quantile of 0 or 1); MetadataError when the file lacks it or holds
        something else (NaN always)."""
        if not (key.startswith("{arch}.") and key.removeprefix("{arch}.") in self.arch_keys) \
                and key not in self.global_keys:
            raise KeyError(f"{key!r} is not a gguf-py metadata key (gguf.constants.Keys) nor one the family "
                           "declares (FamilyHints.metadata_keys)")
        full = key.replace("{arch}", self.arch)
        if full not in self.gguf.metadata:
            raise MetadataError(f"missing required metadata key {full!r}")
        self.used.add(full)
        value = self.gguf.metadata[full]
        if isinstance(value, np.ndarray):
            if value.ndim != 1 or len(value) != n or value.dtype.kind not in "iuf":
                raise MetadataError(f"{full!r} must be a number or {n} numbers, got {value.dtype}[{len(value)}]")
            values = tuple(float(x) for x in value)
        else:
            values = (_typed(full, value, float),) * n
        if not all(math.isfinite(x) or (infinite and not math.isnan(x)) for x in values):
            raise MetadataError(f"metadata key {full!r} holds a value that is not a finite number")
        return values

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
        if not math.isfinite(value):  # an Inf scale or NaN epsilon would reach the kernels
            raise MetadataError(f"metadata key {key!r} = {value} is not a finite number")
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

    def __init__(self, gguf: GGUFFile, names: Mapping[str, str | tuple[str, ...] | None]):
        self.gguf = gguf
        self.names = {role: self._pick(t) if isinstance(t, tuple) else t for role, t in names.items()}

    def _pick(self, candidates: tuple[str, ...]) -> str:
        """The first candidate name template the file has (checked at block 0), else the first."""
        for t in candidates:
            if t.format(i=0) in self.gguf.tensors:
                return t
        return candidates[0]

    def name(self, role: str, layer: int | None = None) -> str | None:
        t = self.names[role] if role in self.names else GGUF_TENSOR_ROLES[role]
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

    def dim(self, role: str, layer: int | None, k: int) -> int:
        """Dimension k (ggml order) of the tensor; ShapeMismatch when it has fewer dimensions."""
        shape = self.shape(role, layer)
        if len(shape) <= k:
            raise ShapeMismatch(f"tensor {self.name(role, layer)!r} has shape {tuple(shape)}, expected at least "
                                f"{k + 1} dimensions")
        return shape[k]

    def expect(self, role: str, layer: int | None, shape: tuple[int, ...]) -> None:
        """The tensor exists with this shape; trailing 1s are no dimension (ggml's ne[k] = 1, as llama.cpp reads)."""
        got = tuple(self.shape(role, layer))
        while len(got) > len(shape) and got[-1] == 1:
            got = got[:-1]
        if got != tuple(shape):
            raise ShapeMismatch(
                f"tensor {self.name(role, layer)!r} has shape {tuple(got)}, metadata implies {tuple(shape)}"
            )


def compile_gguf(source: Any, plugins: Any = None, block_style: str | None = None,
                 hints: Mapping[str, Any] | None = None) -> CompileResult:
    """Compile a GGUF file (path or open GGUFFile) into a Descriptor; see the module docstring.

    plugins: a pluggy PluginManager (default: archrun.plugins.default_plugin_manager()).
    block_style: override the family's block style (a name in slot "block_style").
    hints: conventions (archrun.family.FamilyHints fields) given by the caller, on top of the
    family's; for an architecture no plugin describes they are the only source.
    """
    if not isinstance(source, GGUFFile | GGUFSet | AdaptedFile):  # a path (open_gguf refuses anything else)
        with open_gguf(source) as gguf:
            return compile_gguf(gguf, plugins, block_style, hints)
    from archrun.plugins import checked_plugin_manager

    plugins = checked_plugin_manager(plugins)  # before the file is read: a wrong type is the caller's error
    gguf: GGUFFile = source
    arch = _typed("general.architecture", _require(gguf, "general.architecture"), str)
    fam = _family_hints(arch, plugins, hints)
    meta = _Meta(gguf, arch, fam.defaults, fam.metadata_keys)
    tensors = _Tensors(gguf, {**DEFAULT_TENSOR_NAMES, **fam.tensor_roles, **fam.tensor_names})
    try:
        attention_ops, mixer_ops, param_layouts = _layouts(plugins)
        descriptor = _build(meta, tensors, fam, block_style, layer_patterns(plugins), attention_ops, mixer_ops,
                            param_layouts)
    except (ValueError, TypeError) as e:  # a descriptor validator refused a value from the file
        raise MetadataError(f"{arch}: metadata describes an impossible model: {e.args[0]}") from None
    unused = _unused_keys(gguf, meta.used)
    _warn(arch, unused)
    return CompileResult(descriptor, fam.name, unused, fam, fam.chat_template)


def describe(source: Any, plugins: Any = None, hints: Mapping[str, Any] | None = None) -> Descriptor:
    """The Descriptor of a GGUF file (path or open GGUFFile): `compile_gguf(...).descriptor`."""
    return compile_gguf(source, plugins, hints=hints).descriptor


def _require(gguf: GGUFFile, key: str) -> Any:
    if key not in gguf.metadata:
        raise MetadataError(f"missing required metadata key {key!r}")
    return gguf.metadata[key]


def _family_hints(arch: str, plugins: Any, hints: Mapping[str, Any] | None) -> FamilyHints:
    """The family's hints for `arch` with the caller's on top (a caller's alone when no family knows it)."""
    fam = plugins.hook.archrun_describe_family(architecture=arch)
    if fam is None:
        fam = FamilyHints(name=arch, generic=True)
    return fam.updated(hints)


class _Conventions:
    """The conventions a model needs, each from the hints (or the file where it says so); collects
    what is missing instead of guessing, so one error can name all of it."""

    def __init__(self, meta: _Meta, fam: FamilyHints):
        self.meta, self.fam = meta, fam
        self.missing: list[str] = []

    def need(self, name: str) -> Any:
        value = getattr(self.fam, name)
        if value is None and name not in self.missing:
            self.missing.append(name)
        return value

    def norm(self) -> tuple[str | None, float]:
        """(norm op, epsilon): the hint, or what the file's epsilon key says.

        A file may carry both epsilon keys; a stated norm reads its own kind's ("layer_1p" the
        LayerNorm one), else the first key in NORM_BY_EPSILON_KEY order names the norm.
        """
        present = [(key, kind) for key, kind in NORM_BY_EPSILON_KEY.items() if self.meta.has(key)]
        stated = self.fam.norm
        own = [(key, kind) for key, kind in present if stated and (stated == kind or stated.startswith(kind + "_"))]
        for key, kind in own or present:
            eps = self.meta.get(key, float)
            if not 0.0 < eps < 1.0:
                raise MetadataError(f"{self.meta.key(key)!r} = {eps} is not a valid epsilon")
            return stated or kind, eps
        raise MetadataError(f"missing required metadata key {self.meta.key(next(iter(NORM_BY_EPSILON_KEY)))!r}")

    def residual(self) -> str | None:
        """The residual topology: what the file's use_parallel_residual key says (gptneox, stablelm),
        unless the caller states one; else the convention."""
        if self.meta.has("use_parallel_residual") and "residual" not in self.fam.caller:
            return RESIDUAL_BY_PARALLEL_KEY[self.meta.get("use_parallel_residual", bool)]
        return self.need("residual")

    def gating(self, router_bias: bool = False) -> str | None:
        """The file's expert_gating_func; else the family's gating of layers with a selection bias
        (FamilyHints.gating_biased) where the layer has one; else the convention."""
        gating_id = self.meta.get("expert_gating_func", int, 0)  # 0: the file does not say
        if gating_id:
            return GATING_BY_ID.get(gating_id, f"gguf_{gating_id}")
        if router_bias and self.fam.gating_biased and "gating" not in self.fam.caller:
            return self.fam.gating_biased
        return self.need("gating")

    def check(self) -> None:
        """UnsupportedArchitecture naming every convention nobody stated."""
        if not self.missing:
            return
        arch, fam = self.meta.arch, self.fam
        what = "; ".join(f"{name} ({CONVENTIONS[name][0]})" for name in self.missing)
        who = (f"no installed family plugin describes architecture {arch!r}" if fam.generic
               else f"family {fam.name!r} does not state every convention of this {arch!r} file")
        example = " ".join(f"--hint {name}=..." for name in self.missing)
        raise UnsupportedArchitecture(f"{who}; missing: {what}. State them with archrun.load(path, hints={{...}}) "
                                      f"or `{example}`")


def _layouts(plugins: Any) -> tuple[dict[str, Any], dict[str, Any], dict[tuple[str, str], Any]]:
    """(installed attention ops by name -> their projection layout (None: the standard projections),
    installed token mixers (slot "mixer") by name -> their layout, installed activations, stream ops and
    mixtures that read parameters from the file by (slot, name) -> their layout)."""
    from archrun.vocab import build_vocabulary

    vocab = list(build_vocabulary(plugins))
    return ({e.op.name: e.op.layout for e in vocab if e.op.slot == "attention"},
            {e.op.name: e.op.layout for e in vocab if e.op.slot == "mixer"},
            {(e.op.slot, e.op.name): e.op.layout for e in vocab
             if e.op.slot in ("activation", "stream", "moe") and e.op.layout is not None})


@frozen
class LayerContext:
    """What a layout (archrun.vocab.AttentionLayout, MixerLayout, ActivationLayout) reads at compile
    time for one layer.

    meta: the architecture's metadata keys (`get(name, kind, default)`, `has(name)`, `key(name)`;
    names as gguf-py spells them without `{arch}.`, e.g. "attention.kv_lora_rank"; and
    `per_layer_floats(key, n)`, a float key by its full gguf-py name, one value or one per layer); tensors: the
    file's tensors by role (`has(role, layer)`, `shape(role, layer)`, `expect(role, layer, shape)`,
    shapes in ggml order); n_head / n_head_kv: the layer's head counts as the file states them.
    """

    meta: Any
    tensors: Any
    layer: int
    n_embd: int
    n_head: int
    n_head_kv: int


def _build(meta: _Meta, t: _Tensors, fam: FamilyHints, block_style: str | None, patterns: Mapping[str, Any],
           attention_ops: Mapping[str, Any], mixer_ops: Mapping[str, Any],
           param_layouts: Mapping[tuple[str, str], Any] | None = None) -> Descriptor:
    conv = _Conventions(meta, fam)
    n_embd = _bounded(meta.key("embedding_length"), meta.get("embedding_length", int), 1, MAX_WIDTH)
    n_ctx = _bounded(meta.key("context_length"), meta.get("context_length", int), 1, MAX_CONTEXT)
    n_block = _bounded(meta.key("block_count"), meta.get("block_count", int), 1, MAX_LAYERS)
    n_nextn = _bounded(meta.key("nextn_predict_layers"), meta.get("nextn_predict_layers", int, 0), 0, n_block - 1)
    norm, eps = conv.norm()
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
    final_norm = t.name("output_norm") is not None  # a family maps it to None: its trunk ends unnormed
    if fam.norm_weights and final_norm:
        t.expect("output_norm", None, (n_embd,))
    positions = t.has("position_embd")
    if positions:
        pos = t.shape("position_embd")
        if len(pos) != 2 or pos[0] != n_embd or pos[1] < 1:
            raise ShapeMismatch(f"position_embd has shape {tuple(pos)}, expected ({n_embd}, n_positions)")
    geo = _Geometry(meta, t, conv, n_embd, n_block, patterns, attention_ops, mixer_ops, param_layouts or {})
    layers = tuple(geo.layer(i) for i in range(n_block - n_nextn))
    nextn_layers = tuple(geo.layer(i) for i in range(n_block - n_nextn, n_block) if _has_block(t, i))
    if len(nextn_layers) < n_nextn:  # e.g. converted from a transformers-saved checkpoint, which drops them
        warnings.warn(f"{meta.arch}: {meta.key('nextn_predict_layers')} = {n_nextn} but the file carries no "
                      "tensors for those blocks: multi-token prediction is unavailable", ArchrunWarning,
                      stacklevel=3)
        nextn_layers = ()
    rope_tables = geo.rope_tables()
    softcap_value = meta.get("final_logit_softcapping", float, 0.0)
    softcap = conv.need("softcap") if softcap_value else fam.softcap
    # files may state the embedding multiplier (granite's embedding_scale); else it is a convention
    embed_scale = meta.get("embedding_scale", float, 0.0) or conv.need("embed_scale")
    stream = fam.stream or ""
    stream_layout = (param_layouts or {}).get(("stream", stream))
    described = {} if stream_layout is None else stream_layout.describe(LayerContext(meta, t, -1, n_embd, 0, 0))
    if described is None:  # the layout declines: this file has nothing for the op to carry, one stream
        stream, described = "", {}
    stream_params = tuple(sorted((str(k), float(v)) for k, v in described.get("params", {}).items()))
    conv.check()
    return Descriptor(
        architecture=meta.arch,
        n_vocab=n_vocab,
        n_embd=n_embd,
        n_ctx=n_ctx,
        layers=layers,
        rope_tables=rope_tables,
        norm=norm,
        norm_eps=eps,
        embed_scale=math.sqrt(n_embd) if embed_scale == "sqrt_n_embd" else embed_scale,
        tied_output=tied,
        logit_scale=_logit_scale(meta, conv, fam, n_embd),
        logit_softcap=softcap_value,
        output_norm_bias=_vector_if_present(t, "output_norm.bias", None, n_embd),
        output_bias=not tied and _vector_if_present(t, "output.bias", None, n_vocab),
        position_embedding=positions,
        embed_norm=_vector_if_present(t, "token_embd_norm", None, n_embd),
        embed_norm_bias=_vector_if_present(t, "token_embd_norm.bias", None, n_embd),
        norm_weights=fam.norm_weights,
        token_types=_token_types(t, n_embd),
        output_norm=final_norm,
        final_norm=fam.final_norm or "",
        causal=meta.get("attention.causal", bool, True),
        pooling=_pooling(meta),
        block_style=block_style or fam.block_style,
        stream=stream,
        stream_params=stream_params,
        nextn_layers=nextn_layers,
        tensor_names=t.names,
        ignored_tensors=IGNORED_TENSORS + fam.ignored_tensors,
        **({"softcap": softcap} if softcap else {}),
    )


def _token_types(t: _Tensors, n_embd: int) -> bool:
    """Whether the file has a token-type (segment) table {n_embd, n_types} (BERT's)."""
    if not t.has("token_types"):
        return False
    shape = tuple(t.shape("token_types"))
    if len(shape) not in (1, 2) or shape[0] != n_embd:
        raise ShapeMismatch(f"token_types has shape {shape}, expected ({n_embd}, n_types)")
    return True


def _pooling(meta: _Meta) -> str:
    """The pooling the file states (`pooling_type`, llama.cpp's numbering); "none" when it states none."""
    pooling_id = meta.get("pooling_type", int, 0)
    if pooling_id not in POOLING_BY_ID:
        raise MetadataError(f"{meta.key('pooling_type')!r} = {pooling_id} is not a pooling type "
                            f"({', '.join(f'{k} {v}' for k, v in POOLING_BY_ID.items())})")
    return POOLING_BY_ID[pooling_id]


def _has_block(t: _Tensors, i: int) -> bool:
    """Whether the file has any tensor of block i."""
    return any(name.startswith(f"blk.{i}.") for name in t.gguf.tensors)


def _logit_scale(meta: _Meta, conv: _Conventions, fam: FamilyHints, n_embd: int) -> float:
    """The logits' multiplier: the file's `logit_scale` key as the family says it applies, else the hint
    (`logit_scale`, or `logit_scale_base` / n_embd)."""
    if not meta.has("logit_scale"):
        return fam.logit_scale or (fam.logit_scale_base or 0.0) / n_embd or 1.0
    value = meta.get("logit_scale", float)
    if not 0.0 < value < 1e6:
        raise MetadataError(f"{meta.key('logit_scale')!r} = {value} is not a valid logit scale")
    use = conv.need("logit_scale_key")
    return 1.0 / value if use == "divide" else value


def _vector_if_present(t: _Tensors, role: str, i: int | None, n: int) -> bool:
    if not t.has(role, i):
        return False
    t.expect(role, i, (n,))
    return True


class _Geometry:
    """Per-layer geometry from metadata plus tensor presence; vocabulary from the conventions."""

    def __init__(self, meta: _Meta, t: _Tensors, conv: _Conventions, n_embd: int, n_block: int,
                 patterns: Mapping[str, Any], attention_ops: Mapping[str, Any], mixer_ops: Mapping[str, Any],
                 param_layouts: Mapping[tuple[str, str], Any]):
        self.meta, self.t, self.conv, self.fam = meta, t, conv, conv.fam
        self.attention_ops, self.mixer_ops, self.param_layouts = attention_ops, mixer_ops, param_layouts
        self.n_embd, self.n_block = n_embd, n_block
        self.heads = meta.per_layer("attention.head_count", n_block)
        self.heads_kv = meta.per_layer("attention.head_count_kv", n_block, 0)
        self.n_ff = meta.per_layer("feed_forward_length", n_block, 0)
        # which layers are recurrent, sliding, without rope: the registered layer patterns say
        flags = decide(LayerFacts(meta, self.fam, n_block, self.heads, self.heads_kv, MAX_LAYERS), patterns)
        self.recurrent, self.mixerless = flags["recurrent"], flags["mixerless"]
        for i, (h, kv) in enumerate(zip(self.heads, self.heads_kv, strict=True)):
            if self.recurrent[i] and self.mixerless[i]:
                raise MetadataError(f"layer {i} is marked both recurrent and without a token mixer")
            if self.recurrent[i] or self.mixerless[i]:
                continue  # the mixer's layout states its own geometry
            _bounded(meta.key("attention.head_count"), h, 1, MAX_HEADS)
            kv = kv or h
            if kv < 1 or h % kv:
                raise MetadataError(f"layer {i}: head_count_kv {kv} does not divide head_count {h}")
        head0 = max(self.heads) or 1
        self.head_dim = meta.get("attention.key_length", int, n_embd // head0)
        self.v_head_dim = meta.get("attention.value_length", int, self.head_dim)
        _bounded(meta.key("attention.key_length"), self.head_dim, 1, MAX_WIDTH)
        _bounded(meta.key("attention.value_length"), self.v_head_dim, 1, MAX_WIDTH)
        self.scale = meta.get("attention.scale", float, default_attention_scale(self.head_dim))
        self.softcap = meta.get("attn_logit_softcapping", float, 0.0)
        self.clamp_kqv = meta.get("attention.clamp_kqv", float, 0.0)
        if not 0.0 <= self.clamp_kqv < 1e30:
            raise MetadataError(f"{meta.key('attention.clamp_kqv')!r} = {self.clamp_kqv} is not a valid clamp")
        self.alibi_max_bias = meta.get("attention.max_alibi_bias", float, 0.0)
        if not 0.0 <= self.alibi_max_bias < 1e4:
            raise MetadataError(f"{meta.key('attention.max_alibi_bias')!r} = {self.alibi_max_bias} is not a valid bias")
        self.window = meta.get("attention.sliding_window", int, 0)
        self.sliding, self.nope = flags["sliding"], flags["nope"]
        self.attention_kind = conv.need("attention")
        self.layout = self._layout()
        self.recurrent_kind = self._mixer_kind("recurrent", self.recurrent, "recurrent layers")
        self.mixerless_kind = self._mixer_kind("mixerless", self.mixerless, "layers without a token mixer")
        self.n_rot = meta.get("rope.dimension_count", int, self.head_dim)
        if self.n_rot > self.head_dim:
            raise MetadataError(f"rope.dimension_count {self.n_rot} exceeds the head width {self.head_dim}")
        rotary = self.n_rot and not all(n or r or m for n, r, m in zip(self.nope, self.recurrent, self.mixerless,
                                                                       strict=True))
        self.pairing = (conv.need("rope_pairing") or "") if rotary else NO_ROPE
        self.leading_dense = _bounded(meta.key("leading_dense_block_count"),
                                      meta.get("leading_dense_block_count", int, 0), 0, n_block)
        self.residual = conv.residual()

    def _mixer_kind(self, convention: str, flags: tuple[bool, ...], what: str) -> str | None:
        """The token mixer (slot "mixer") the convention names for the flagged layers, if any is flagged."""
        if not any(flags):
            return None
        kind = self.conv.need(convention)
        if kind is None:
            self.conv.check()  # the flagged layers' op is a convention nobody stated
        if kind not in self.mixer_ops:
            raise UnknownVocabulary(f"no installed plugin provides mixer={kind!r}, which the {what} of "
                                    f"{self.meta.arch!r} files need (install the vocabulary package that registers it)")
        return kind

    def _layout(self) -> Any:
        """The attention op's own projection layout, if it has one. A file without the standard
        attention tensors needs one: if its op is not installed, that is what the model lacks."""
        kind = self.attention_kind
        if kind is None or kind in self.attention_ops:
            return self.attention_ops.get(kind)
        if not any(self.t.has(role, 0) for role in ("attn_k", "attn_qkv")):
            raise UnknownVocabulary(f"no installed plugin provides attention={kind!r}, which {self.meta.arch!r} "
                                    "files need (install the vocabulary package that registers it)")
        return None

    def rope_tables(self) -> tuple[RopeSpec, ...]:
        """Table 0: global layers; 1: sliding layers (when any); last: NO_ROPE (when any NoPE layer).

        The sliding layers' table is the global one with the base `rope.freq_base_swa` (llama.cpp:
        the global base by default), scaling included, unless the family states that its sliding
        layers rotate plain (`FamilyHints.swa_rope`): then the base alone."""
        meta, pairing = self.meta, self.pairing
        glob = RopeSpec(pairing=pairing, n_rot=self.n_rot if pairing != NO_ROPE else 0,
                        freq_base=meta.get("rope.freq_base", float, 10000.0), **self._scaling())
        tables = [glob]
        if any(self.sliding):
            base = meta.get("rope.freq_base_swa", float, glob.freq_base)
            # sliding layers whose heads have their own width rotate their own dims
            n_rot = meta.get("rope.dimension_count_swa", int, glob.n_rot) if glob.n_rot else 0
            plain = self.fam.swa_rope == "plain"
            tables.append(RopeSpec(pairing=pairing, n_rot=n_rot, freq_base=base) if plain
                          else attrs.evolve(glob, freq_base=base, n_rot=n_rot))
        if any(self.nope) and pairing != NO_ROPE:
            tables.append(RopeSpec(pairing=NO_ROPE, n_rot=0, freq_base=glob.freq_base))
        return tuple(tables)

    def _scaling(self) -> dict[str, Any]:
        """RopeSpec scaling fields from rope.scaling.* keys and the rope factor tensors."""
        meta, t = self.meta, self.t
        longrope = t.has("rope_factors_long") and t.has("rope_factors_short")
        scaling = meta.get("rope.scaling.type", str, "longrope" if longrope else "none")
        if scaling not in ROPE_SCALINGS:
            raise MetadataError(f"{meta.key('rope.scaling.type')!r} = {scaling!r}: rope scaling must be one of "
                                f"{', '.join(ROPE_SCALINGS)}")
        if scaling == "longrope" and not longrope:
            raise MissingTensor("longrope scaling needs the rope_factors_long and rope_factors_short tensors")
        n_ctx = meta.get("context_length", int)
        original = meta.get("rope.scaling.original_context_length", int, 0)
        if scaling in ("yarn", "longrope") and not original:
            original = n_ctx
        yarn_attn = meta.get("rope.scaling.yarn_attn_factor", float, 0.0) if scaling == "yarn" else 0.0
        return dict(
            scaling=scaling,
            scaling_factor=meta.get("rope.scaling.factor", float, 1.0) if scaling in ("linear", "yarn") else 1.0,
            original_context=original,
            freq_factors="rope_freqs" if t.has("rope_freqs") else None,
            context=n_ctx,
            beta_fast=meta.get("rope.scaling.yarn_beta_fast", float, 32.0),
            beta_slow=meta.get("rope.scaling.yarn_beta_slow", float, 1.0),
            ext_factor=meta.get("rope.scaling.yarn_ext_factor", float, 1.0),
            attn_factor=yarn_attn or None,
            attn_scale=self._attn_scale(scaling),
            long_factors="rope_factors_long" if longrope else None,
            short_factors="rope_factors_short" if longrope else None,
            truncate=self.fam.yarn_truncate or scaling != "yarn",
        )

    def _attn_scale(self, scaling: str) -> float:
        """The rope's cos/sin magnitude: the file's `rope.scaling.attn_factor`, unless the family fixes
        the magnitude of a scaled rope (FamilyHints.rope_attn_scale)."""
        stated = self.meta.get("rope.scaling.attn_factor", float, 1.0) or 1.0
        return self.fam.rope_attn_scale if self.fam.rope_attn_scale and scaling != "none" else stated

    def _rope_table(self, i: int) -> int:
        if self.nope[i] and self.pairing != NO_ROPE:
            return 2 if any(self.sliding) else 1
        return 1 if self.sliding[i] else 0

    def layer(self, i: int) -> LayerSpec:
        t, d = self.t, self.n_embd
        pre, weights = self.fam.pre_norms, self.fam.norm_weights
        if pre and weights:
            t.expect("attn_norm", i, (d,))
        if i < self.leading_dense and t.has("ffn_gate_inp", i):
            raise MetadataError(f"layer {i} has a router but leading_dense_block_count says the first "
                                f"{self.leading_dense} layers are dense")
        ffn = self._ffn(i)
        ffn_norm = ffn is not None and pre and (_vector_if_present(t, "ffn_norm", i, d) if weights else True)
        attention = self._attention(i)
        return LayerSpec(
            attention=attention,
            ffn=ffn,
            post_attn_norm=_vector_if_present(t, "post_attn_norm", i, d),
            post_ffn_norm=_vector_if_present(t, "post_ffn_norm", i, d),
            residual=self.residual or "",
            residual_scale=self.meta.get("residual_scale", float, 0.0) or self.fam.residual_scale
            or (self.fam.residual_scale_depth or 0.0) / math.sqrt(self.n_block) or 1.0,
            parallel=self._parallel(i),
            ffn_norm=ffn_norm,
            attn_norm=pre,
            norm_bias=pre and weights and self._norm_bias(i, ffn_norm),
            **self._sub_norms(i, attention, ffn),
        )

    def _sub_norms(self, i: int, a: AttentionSpec, ffn: FfnSpec | MoeSpec | None) -> dict[str, bool]:
        """Norms inside the branches, by presence: on the attention output before its projection
        (`attn_sub_norm`), on a dense FFN's hidden before its down projection (`ffn_sub_norm`)."""
        t = self.t
        if (t.has("attn_sub_norm", i) and a.mixer) or (t.has("ffn_sub_norm", i) and not isinstance(ffn, FfnSpec)):
            raise MetadataError(f"layer {i}: a sub-layer norm needs standard attention and a dense FFN")
        return {"attn_sub_norm": _vector_if_present(t, "attn_sub_norm", i, a.n_head * a.v_head_dim),
                "ffn_sub_norm": ffn is not None and _vector_if_present(t, "ffn_sub_norm", i, ffn.n_ff)}

    def _parallel(self, i: int) -> AttentionSpec | None:
        """The token mixer the family runs beside every layer's attention, if it states one."""
        kind = self.fam.parallel
        if kind is None or self.recurrent[i] or self.mixerless[i]:
            return None
        if kind not in self.mixer_ops:
            raise UnknownVocabulary(f"no installed plugin provides the token mixer mixer={kind!r}, which "
                                    f"{self.meta.arch!r} files run beside their attention")
        return self._layout_attention(i, kind, self.mixer_ops[kind], mixer=True)

    def _ffn(self, i: int) -> FfnSpec | MoeSpec | None:
        """The block's FFN: MoE by its router, dense by its up projection, none without either
        (a block whose only branch is its token mixer, e.g. Mamba2; it then has no ffn_norm)."""
        t = self.t
        if t.has("ffn_gate_inp", i):
            return self._moe(i)
        if t.has("ffn_up", i) or t.has("ffn_norm", i):
            return self._dense(i)
        return None

    def _norm_bias(self, i: int, ffn_norm: bool) -> bool:
        bias = _vector_if_present(self.t, "attn_norm.bias", i, self.n_embd)
        if ffn_norm and _vector_if_present(self.t, "ffn_norm.bias", i, self.n_embd) != bias:
            raise MissingTensor(f"layer {i}: attn_norm and ffn_norm must both have biases or neither")
        return bias

    def _attention(self, i: int) -> AttentionSpec:
        if self.recurrent[i] or self.mixerless[i]:
            kind = self.recurrent_kind if self.recurrent[i] else self.mixerless_kind
            return self._layout_attention(i, kind, self.mixer_ops[kind], mixer=True)
        if self.layout is not None:
            return self._layout_attention(i, self.attention_kind, self.layout)
        t, d = self.t, self.n_embd
        n_head, n_kv = self.heads[i], self.heads_kv[i] or self.heads[i]
        hd, vd = self.head_dim, self.v_head_dim
        packed = t.has("attn_qkv", i)
        if packed:
            t.expect("attn_qkv", i, (d, n_head * hd + n_kv * (hd + vd)))
            bias = _vector_if_present(t, "attn_qkv.bias", i, n_head * hd + n_kv * (hd + vd))
        else:
            t.expect("attn_q", i, (d, n_head * hd))
            t.expect("attn_k", i, (d, n_kv * hd))
            t.expect("attn_v", i, (d, n_kv * vd))
            bias = t.has("attn_q.bias", i)
            if bias:
                t.expect("attn_q.bias", i, (n_head * hd,))
                t.expect("attn_k.bias", i, (n_kv * hd,))
                t.expect("attn_v.bias", i, (n_kv * vd,))
        t.expect("attn_output", i, (n_head * vd, d))
        qk_norm = t.has("attn_q_norm", i)
        full = qk_norm and t.shape("attn_q_norm", i)[0] != hd  # one norm over all heads (OLMo 2)
        per_head = qk_norm and not full and len(t.shape("attn_q_norm", i)) == 2 and t.shape("attn_q_norm", i)[1] > 1
        if per_head:  # each head its own weights (Command R+: {hd, H})
            t.expect("attn_q_norm", i, (hd, n_head))
            t.expect("attn_k_norm", i, (hd, n_kv))
        elif qk_norm:
            t.expect("attn_q_norm", i, (n_head * hd if full else hd,))
            t.expect("attn_k_norm", i, (n_kv * hd if full else hd,))
        sliding = self.sliding[i]
        sinks = _vector_if_present(t, "attn_sinks", i, n_head)
        return AttentionSpec(
            kind=self.attention_kind or "", n_head=n_head, n_head_kv=n_kv, head_dim=hd, v_head_dim=vd,
            scale=self.scale, rope=self._rope_table(i), window=self.window if sliding else 0, qk_norm=qk_norm,
            qk_norm_full=full, qk_norm_per_head=per_head, qk_norm_after_rope=qk_norm and self.fam.qk_norm_after_rope,
            clamp_kqv=self.clamp_kqv,
            qkv_bias=bias, output_bias=t.has("attn_output.bias", i), softcap=self.softcap, qkv_packed=packed,
            alibi_max_bias=self.alibi_max_bias, sinks=sinks,
        )

    def _layout_attention(self, i: int, kind: str, layout: Any, mixer: bool = False) -> AttentionSpec:
        """A layer whose op brings its own projections (or is the whole token mixer, slot "mixer"): the
        layout states the geometry (a mixer without heads states none: one head of width one)."""
        n_head = self.heads[i]
        ctx = LayerContext(self.meta, self.t, i, self.n_embd, n_head, self.heads_kv[i] or n_head)
        heads = {"n_head": 1, "n_head_kv": 1, "head_dim": 1, "v_head_dim": 1} if mixer else {"n_head": n_head}
        fields = {**heads, **layout.describe(ctx)}
        fields.setdefault("scale", self.scale)
        if mixer:
            fields["mixer"] = True
        return AttentionSpec(kind=kind, rope=self._rope_table(i),
                             window=self.window if self.sliding[i] else 0, softcap=self.softcap, **fields)

    def _dense(self, i: int) -> FfnSpec:
        t, d = self.t, self.n_embd
        up = t.shape("ffn_up", i)
        gated = t.has("ffn_gate", i)
        n_ff = self.n_ff[i] or up[-1]
        packed = not gated and len(up) == 2 and up[-1] == 2 * n_ff  # gate|up stacked in one tensor
        if gated:
            t.expect("ffn_gate", i, (d, n_ff))
        t.expect("ffn_up", i, (d, 2 * n_ff if packed else n_ff))
        t.expect("ffn_down", i, (n_ff, d))
        act = self.conv.need("activation") or ""
        return FfnSpec(activation=act, activation_params=self._activation_params(i, act), n_ff=n_ff,
                       gated=gated or packed,
                       packed=packed, gate_bias=gated and _vector_if_present(t, "ffn_gate.bias", i, n_ff),
                       up_bias=_vector_if_present(t, "ffn_up.bias", i, 2 * n_ff if packed else n_ff),
                       down_bias=_vector_if_present(t, "ffn_down.bias", i, d))

    def _activation_params(self, i: int, kind: str, slot: str = "activation") -> tuple[tuple[str, float], ...]:
        """Layer i's parameters of an activation (or mixture, `slot` "moe") op that reads its own from the file
        (its `Op.layout`, archrun.vocab.ActivationLayout / MoeLayout), as sorted (name, value) pairs; none for
        the others."""
        layout = self.param_layouts.get((slot, kind))
        if layout is None:
            return ()
        ctx = LayerContext(self.meta, self.t, i, self.n_embd, self.heads[i], self.heads_kv[i] or self.heads[i])
        return tuple(sorted((str(k), float(v)) for k, v in layout.describe(ctx).get("params", {}).items()))

    def _moe(self, i: int) -> MoeSpec:
        meta, t, d = self.meta, self.t, self.n_embd
        n_expert = _bounded(meta.key("expert_count"), meta.get("expert_count", int), 1, MAX_EXPERTS)
        n_used = meta.get("expert_used_count", int)
        packed = t.has("ffn_gate_up_exps", i)  # gate and up in one tensor (gate rows first), by presence
        n_ff = meta.get("expert_feed_forward_length", int, 0) or (
            t.dim("ffn_gate_up_exps", i, 1) // 2 if packed else t.dim("ffn_up_exps", i, 1))
        t.expect("ffn_gate_inp", i, (d, n_expert))
        shapes = ((("ffn_gate_up_exps", (d, 2 * n_ff, n_expert)),) if packed else
                  (("ffn_gate_exps", (d, n_ff, n_expert)), ("ffn_up_exps", (d, n_ff, n_expert))))
        for role, shape in (*shapes, ("ffn_down_exps", (n_ff, d, n_expert))):
            t.expect(role, i, shape)
        bias = t.has("exp_probs_b", i)
        if bias:
            t.expect("exp_probs_b", i, (n_expert,))
        n_shared, n_ff_shared = self._shared(i)
        act, kind = self.conv.need("activation") or "", self.conv.need("moe") or ""
        return MoeSpec(
            kind=kind, activation=act, activation_params=self._activation_params(i, act),
            params=self._activation_params(i, kind, "moe"),
            n_expert=n_expert,
            n_expert_used=n_used, n_ff=n_ff, gating=self.conv.gating(bias) or "",
            weights_norm=meta.get("expert_weights_norm", bool, self.fam.moe_weights_norm),
            weights_scale=meta.get("expert_weights_scale", float, 1.0) or 1.0, router_bias=bias,
            router_input_bias=t.has("ffn_gate_inp.bias", i),
            n_group=meta.get("expert_group_count", int, 1) or 1,
            n_group_used=meta.get("expert_group_used_count", int, 1) or 1,
            n_shared=n_shared, n_ff_shared=n_ff_shared,
            shared_gate=bool(n_shared) and _vector_if_present(t, "ffn_gate_inp_shexp", i, d),
            shared_bias=bool(n_shared) and self._shared_bias(i, n_ff_shared),
            packed=packed,
            **self._expert_biases(i, n_ff, n_expert),
        )

    def _shared_bias(self, i: int, n_ff_shared: int) -> bool:
        """Whether the shared experts' projections carry biases (all three, or none)."""
        roles = {"ffn_gate_shexp.bias": n_ff_shared, "ffn_up_shexp.bias": n_ff_shared,
                 "ffn_down_shexp.bias": self.n_embd}
        present = [_vector_if_present(self.t, role, i, n) for role, n in roles.items()]
        if any(present) and not all(present):
            raise MissingTensor(f"layer {i}: the shared experts' gate, up and down projections must all have "
                                "biases or none")
        return all(present)

    def _expert_biases(self, i: int, n_ff: int, n_expert: int) -> dict[str, bool]:
        """Which expert projections carry biases ({n_out, E} tensors, by presence)."""
        found = {}
        for role, n_out in (("gate", n_ff), ("up", n_ff), ("down", self.n_embd)):
            found[f"{role}_bias"] = self.t.has(f"ffn_{role}_exps.bias", i)
            if found[f"{role}_bias"]:
                self.t.expect(f"ffn_{role}_exps.bias", i, (n_out, n_expert))
        return found

    def _shared(self, i: int) -> tuple[int, int]:
        t, d = self.t, self.n_embd
        if not t.has("ffn_up_shexp", i):
            return 0, 0
        n_ff_sh = self.meta.get("expert_shared_feed_forward_length", int, 0) or t.dim("ffn_up_shexp", i, 1)
        for role, shape in (("ffn_gate_shexp", (d, n_ff_sh)), ("ffn_up_shexp", (d, n_ff_sh)),
                            ("ffn_down_shexp", (n_ff_sh, d))):
            t.expect(role, i, shape)
        return max(1, self.meta.get("expert_shared_count", int, 1)), n_ff_sh


_INFORMATIONAL_PREFIXES = ("general.", "tokenizer.", "quantize.", "split.")


def _unused_keys(gguf: GGUFFile, used: set[str]) -> tuple[str, ...]:
    """Keys nobody consumed: not informational (general.*), not the tokenizer's, not used here."""
    return tuple(
        k for k in gguf.metadata if k not in used and not k.startswith(_INFORMATIONAL_PREFIXES)
    )


def _warn(arch: str, unused: tuple[str, ...]) -> None:
    if unused:
        warnings.warn(f"{arch}: metadata keys not used by archrun: {', '.join(unused)}", ArchrunWarning,
                      stacklevel=3)

