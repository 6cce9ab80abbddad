"""The family plugin API: what an architecture's files do not say, as data.

A family package describes one or more `general.architecture` strings with `FamilyHints` and
registers them with `FamilyPlugin` (entry point group "archrun"):

    from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

    plugin = FamilyPlugin({"llama": FamilyHints(name="llama", rope_pairing="norm", activation="silu",
                                                 embed_scale=1.0, **TRANSFORMER)})

Every structural choice the compiler cannot read from a file is a *convention* (see
CONVENTIONS): a family states it, or a caller does (`archrun.load(path, hints={...})`), or the
model does not load. Values of vocabulary conventions are names in the registry's slots
(archrun.vocab.SLOTS); the compiler copies them into the descriptor without knowing any.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import attrs
from attrs import field, frozen
from attrs import validators as v

from archrun.errors import InvalidRequest, shown
from archrun.hookspecs import hookimpl

# Conventions a file does not state: hint field -> (what it means, the registry slot its value names or None).
CONVENTIONS: Mapping[str, tuple[str, str | None]] = MappingProxyType({
    "rope_pairing": ("which dims the rotary embedding pairs", "rope"),
    "attention": ("the attention op", "attention"),
    "activation": ("the FFN activation", "activation"),
    "residual": ("the residual topology of a block", "residual"),
    "embed_scale": ("the token-embedding multiplier (a number or 'sqrt_n_embd')", None),
    "norm": ("the norm op (files name it only through their epsilon key)", "norm"),
    "moe": ("the mixture-of-experts op", "moe"),
    "gating": ("the expert gating function (files may say it in expert_gating_func)", "gating"),
    "softcap": ("the final-logit softcap op", "softcap"),
    "logit_scale_key": ("how the file's logit_scale key applies to the logits: 'multiply' or 'divide'", None),
    "recurrent": ("the block op of the layers a file marks recurrent (a hybrid model's non-attention layers)",
                  "mixer"),
    "parallel": ("a token mixer every block runs beside its attention, on the same input, adding its output",
                 "mixer"),
    "mixerless": ("the op in the token mixer's place of the layers a file marks as having none (an FFN-only "
                  "block)", "mixer"),
    "final_norm": ("the norm op of the trunk's final norm, when it is not the model's norm op", "norm"),
    "stream": ("how the residual stream runs through the blocks when it is more than one array (several "
               "parallel streams; none: one stream, block by block)", "stream"),
})
LOGIT_SCALE_USES = ("multiply", "divide")
# How the rope of sliding-window layers relates to the global layers' (FamilyHints.swa_rope).
SWA_ROPES = ("global", "plain")

# What files say by key (GGUF's own numbering and key names) -> the vocabulary it means.
NORM_BY_EPSILON_KEY: Mapping[str, str] = MappingProxyType({
    "attention.layer_norm_rms_epsilon": "rms",
    "attention.layer_norm_epsilon": "layer",
})
# expert_gating_func (llama.cpp's llama_expert_gating_func_type; 4 is newer than the gguf-py archrun pins)
GATING_BY_ID: Mapping[int, str] = MappingProxyType({1: "softmax", 2: "sigmoid", 4: "sqrtsoftplus"})
# pooling_type (llama.cpp's llama_pooling_type numbering) -> Descriptor.pooling
POOLING_BY_ID: Mapping[int, str] = MappingProxyType({0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"})
RESIDUAL_BY_PARALLEL_KEY: Mapping[bool, str] = MappingProxyType({True: "parallel", False: "sequential"})

# The choices every decoder-only transformer family so far shares; a family spreads them into its
# hints (`**TRANSFORMER`) and overrides what differs. Nothing applies them to an unknown architecture.
TRANSFORMER: Mapping[str, Any] = MappingProxyType({
    "attention": "causal", "residual": "sequential", "moe": "topk", "softcap": "tanh",
})
DEFAULT_BLOCK_STYLE = "fused"


def _embed_scale(value: Any) -> str | float | None:
    if value is None or value == "sqrt_n_embd":
        return value
    try:
        scale = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"embed_scale must be a positive number or 'sqrt_n_embd', got {value!r}") from None
    if not scale > 0:
        raise ValueError(f"embed_scale must be a positive number or 'sqrt_n_embd', got {value!r}")
    return scale


def _opt_str(_inst, attr, value) -> None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{attr.name} must be a vocabulary name (str), got {value!r}")


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


@frozen
class FamilyHints:
    """What a family plugin (or a caller) says about an architecture that its GGUF files do not.

    Data only, never math. Convention fields (CONVENTIONS) are None when not stated. Also:
    `defaults` maps key suffixes (without the `<arch>.` prefix) to values used when the file
    omits them; `tensor_names` remaps tensor roles (archrun.descriptor.DEFAULT_TENSOR_NAMES;
    None: the architecture has no such tensor; a tuple of names: the first the file has, as
    Falcon-40B's attention norm `attn_norm_2` where 7B files have only `attn_norm`);
    `swa_period` P > 0 makes layer i sliding iff
    i % P < P - 1 unless the file has attention.sliding_window_pattern; `nope_period` P > 0 makes
    every P-th layer (i % P == P - 1) use no rotary embedding (the layer patterns archrun-blocks
    registers read these and `nope_global`, archrun.describe.layers); `block_style` the default style.
    `qk_norm_after_rope`: per-head Q/K norms apply to the rotated Q/K (HunYuan), not before rope.
    `nope_global`: when a model has sliding-window layers, its full-attention layers use no
    rotary embedding (cohere2, exaone4). `pre_norms` False: blocks have no attn/ffn pre-norms
    (post-norms only); `swa_rope`: the rope of the sliding-window layers: "global" (the default,
    llama.cpp's rule for every architecture that states nothing else) rotates them as the global
    layers (the file's scaling, factor, YaRN attention factor and frequency factors) with the base
    `rope.freq_base_swa` when the file has one; "plain" rotates them with that base alone, no
    scaling of any kind (Gemma 3's local layers, OLMo 3's sliding layers). `yarn_truncate` False:
    YaRN's correction dims are not rounded to whole dims (HF's `truncate: false`, gpt-oss; llama.cpp
    always rounds them). `norm_weights` False: norms have no learned weights (no norm weight
    tensors); `ignored_tensors`: globs of tensors the architecture's files carry and no plan uses
    (loading warns; any other unused tensor fails the load). `rope_attn_scale`: the cos/sin
    magnitude of a scaled rope (any scaling but "none") where the architecture's reference fixes it
    instead of deriving it as the converter does (replaces the file's `rope.scaling.attn_factor`).
    `residual_scale_depth` D: the residual scale D / sqrt(block_count) where neither the file nor
    `residual_scale` states one; `logit_scale_base` B: the logit scale B / n_embd where neither the
    file nor `logit_scale` states one (MiniCPM's scale_depth and dim_model_base).
    `gating_biased`: the gating of MoE layers that carry a selection bias (`exp_probs_b`) in a file
    that states no `expert_gating_func` (else `gating`). `logit_scale_key`: how a file's
    `logit_scale` key applies ("multiply", or "divide" as granite's does). `recurrent`: the op
    (slot "mixer", a token mixer such as a short convolution or a state-space scan) of the
    layers a file marks recurrent — those whose per-layer `attention.head_count_kv` is 0, or, with
    `full_attention_interval` P, every layer but each P-th; a file with no attention heads at all
    (`attention.head_count` 0) is recurrent throughout. `parallel`: the token mixer (slot
    "mixer") every layer runs beside its attention on the same normed input, the two outputs
    summed (Falcon-H1's Mamba2 beside attention). `mixerless`: the op (slot "mixer") in the token
    mixer's place of the layers a file marks as having no mixer at all (archrun.describe.layers' `mixerless`
    property; an op that adds nothing, such as archrun-blocks' "none"): Nemotron-H's MLP layers.
    `final_norm`: the norm op of the trunk's final norm where it differs from every other norm's
    (BitNet: the blocks' norms quantize what they feed, the final norm feeds a float head).
    `stream`: the op (slot "stream") that carries the residual stream through the blocks when it is more
    than one [n, d] array (parallel streams of which each block reads one, inputs added per layer); None: one
    stream.
    `metadata_keys`: the metadata key names the architecture's files carry that the installed gguf-py does
    not spell (gguf.constants.Keys), written as gguf-py writes its own: `"{arch}.hyper_connection.count"`
    (a name without `{arch}.` is a key of no architecture). The compiler, layer patterns and op layouts
    read these as they read gguf-py's keys; any other name is refused, and keys a file carries that nobody
    reads still only warn. `tensor_roles`: tensor roles gguf-py does not name, role -> name template
    (`{"hc_attn_fn": "blk.{i}.hc_attn_fn.weight"}`), which ops bind by role as gguf-py's own
    (`tensor_names` only remaps roles gguf-py or archrun already know).
    """

    name: str = field(validator=v.instance_of(str))
    rope_pairing: str | None = field(default=None, validator=_opt_str)
    attention: str | None = field(default=None, validator=_opt_str)
    activation: str | None = field(default=None, validator=_opt_str)
    residual: str | None = field(default=None, validator=_opt_str)
    embed_scale: str | float | None = field(default=None, converter=_embed_scale)
    norm: str | None = field(default=None, validator=_opt_str)
    moe: str | None = field(default=None, validator=_opt_str)
    gating: str | None = field(default=None, validator=_opt_str)
    softcap: str | None = field(default=None, validator=_opt_str)
    recurrent: str | None = field(default=None, validator=_opt_str)
    parallel: str | None = field(default=None, validator=_opt_str)
    mixerless: str | None = field(default=None, validator=_opt_str)
    final_norm: str | None = field(default=None, validator=_opt_str)
    stream: str | None = field(default=None, validator=_opt_str)
    moe_weights_norm: bool = False
    logit_scale_key: str | None = field(default=None, validator=v.optional(v.in_(LOGIT_SCALE_USES)))
    pre_norms: bool = True
    norm_weights: bool = True
    residual_scale: float | None = field(default=None, converter=_opt_float)
    logit_scale: float | None = field(default=None, converter=_opt_float)
    rope_attn_scale: float | None = field(default=None, converter=_opt_float)
    gating_biased: str | None = field(default=None, validator=_opt_str)
    residual_scale_depth: float | None = field(default=None, converter=_opt_float)
    logit_scale_base: float | None = field(default=None, converter=_opt_float)
    defaults: Mapping[str, Any] = field(factory=dict, converter=lambda d: MappingProxyType(dict(d)))
    tensor_names: Mapping[str, str | tuple[str, ...] | None] = field(
        factory=dict, converter=lambda d: MappingProxyType(dict(d)))
    metadata_keys: tuple[str, ...] = field(default=(), converter=tuple, validator=lambda i, a, v: _key_names(v))
    tensor_roles: Mapping[str, str] = field(factory=dict, converter=lambda d: MappingProxyType(dict(d)),
                                            validator=lambda i, a, v: _role_templates(v))
    swa_period: int = 0
    nope_period: int = 0
    nope_global: bool = False
    swa_rope: str = field(default="global", validator=v.in_(SWA_ROPES))
    yarn_truncate: bool = True
    qk_norm_after_rope: bool = False
    ignored_tensors: tuple[str, ...] = field(default=(), converter=tuple)  # more IGNORED_TENSORS globs
    block_style: str = DEFAULT_BLOCK_STYLE
    chat_template: str | None = None
    generic: bool = False  # no family plugin knows the architecture: everything came from the caller
    caller: frozenset[str] = frozenset()  # the fields a caller's hints set (they override what files say)

    def updated(self, hints: Mapping[str, Any] | None) -> FamilyHints:
        """These hints with a caller's `hints` (field -> value; strings from a command line are fine) on top."""
        if hints is None:
            return self
        if not isinstance(hints, Mapping) or not all(isinstance(k, str) for k in hints):
            raise InvalidRequest(f"hints must be a mapping of convention name -> value, got {shown(hints)}")
        if not hints:
            return self
        names = {a.name for a in attrs.fields(FamilyHints)} - {"name", "generic", "caller"}
        unknown = sorted(set(hints) - names)
        if unknown:
            raise InvalidRequest(f"unknown hint(s) {', '.join(unknown)} (known: {', '.join(sorted(names))})")
        try:
            return attrs.evolve(self, **{k: _hint_value(k, v) for k, v in hints.items()},
                                caller=self.caller | frozenset(hints))
        except (TypeError, ValueError) as e:
            raise InvalidRequest(f"bad hint: {e}") from None


def _key_names(names: tuple[Any, ...]) -> None:
    for name in names:
        if not isinstance(name, str) or not name.strip(".") or "{" in name.removeprefix("{arch}."):
            raise ValueError(f"metadata_keys holds key names such as '{{arch}}.hyper_connection.count', got {name!r}")


def _role_templates(roles: Mapping[Any, Any]) -> None:
    for role, template in roles.items():
        if not (isinstance(role, str) and role and isinstance(template, str) and template
                and "{" not in template.replace("{i}", "")):
            raise ValueError(f"tensor_roles maps a role to a tensor name template ('blk.{{i}}.NAME.weight'), got "
                             f"{role!r}: {template!r}")


def _hint_value(name: str, value: Any) -> Any:
    """A hint from a command line arrives as a string: convert the non-string fields."""
    if name == "tensor_names" and isinstance(value, Mapping):  # JSON gives lists where a tuple means "the first found"
        return {k: tuple(t) if isinstance(t, list) else t for k, t in value.items()}
    if not isinstance(value, str):
        return value
    if name in ("defaults", "tensor_names"):  # a JSON object: {"attention.max_alibi_bias": 8.0}
        try:
            parsed = json.loads(value)
        except ValueError:
            raise ValueError(f"{name} must be a JSON object, got {value!r}") from None
        if not isinstance(parsed, dict):
            raise ValueError(f"{name} must be a JSON object, got {value!r}")
        return _hint_value(name, parsed)
    if name in ("moe_weights_norm", "pre_norms", "norm_weights", "nope_global", "qk_norm_after_rope",
                "yarn_truncate"):
        return value.lower() in ("1", "true", "yes")
    if name == "ignored_tensors":  # comma-separated globs
        return tuple(p.strip() for p in value.split(",") if p.strip())
    if name in ("swa_period", "nope_period"):
        return int(value)
    return value


def parse_hints(items: list[str] | tuple[str, ...]) -> dict[str, str]:
    """`["rope_pairing=norm", ...]` (the CLI's --hint values) -> {"rope_pairing": "norm", ...}."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InvalidRequest(f"a hint is NAME=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out


class FamilyPlugin:
    """A family plugin made from architecture -> FamilyHints: implements the family hooks (and, given
    `tool_calls`, archrun_tool_call_format for its architectures; given `reasoning`, an
    archrun.text.reasoning.ReasoningFormat, archrun_reasoning_format for its architectures when the chat
    template uses that format).

    A family package needs only `plugin = FamilyPlugin({...})` and the entry point
    `[project.entry-points.archrun] name = "package:plugin"`.
    """

    def __init__(self, hints: Mapping[str, FamilyHints], tool_calls: Any = None, reasoning: Any = None):
        self.hints = MappingProxyType(dict(hints))
        self.tool_calls = tool_calls  # an archrun.generation.tools.ToolCallFormat for these architectures, or None
        self.reasoning = reasoning    # an archrun.text.reasoning.ReasoningFormat, or None

    @hookimpl
    def archrun_describe_family(self, architecture: str) -> FamilyHints | None:
        return self.hints.get(architecture)

    @hookimpl
    def archrun_families(self) -> list[str]:
        return sorted(self.hints)

    @hookimpl
    def archrun_tool_call_format(self, architecture: str, chat_template: str | None) -> Any:
        return self.tool_calls if architecture in self.hints else None

    @hookimpl
    def archrun_reasoning_format(self, architecture: str, chat_template: str | None) -> Any:
        if self.reasoning is None or architecture not in self.hints:
            return None
        return self.reasoning if self.reasoning.applies(chat_template) else None
