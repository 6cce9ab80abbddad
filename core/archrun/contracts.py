"""The contract of each vocabulary slot: what a bound op must be (a Protocol per slot) and what it may
declare it can do beyond that (`OpCapabilities`).

An `archrun.vocab.Op` declares its optional capabilities once, at registration
(``Op(..., capabilities=OpCapabilities(fused=True, ...))``); the vocabulary refuses a declaration its
slot cannot take (PluginError). The binder checks each bound object against its op's declaration
(`check_bound`: every declared member is there) and remembers it; the core then reads only what an op
declares, and never asks an object what it happens to carry.

Two kinds of capability:

- kernel members, which only the fast factory's objects carry (the reference factory's never do):
  `fused` (an archrun.kernels.decode.parts.Part, or None for an instance without one), `fused_input` (the
  residual's FFN-input Part), `fused_for` (attention: ``fused_for(kv_type) -> Part | None``),
  `pool_task` (attention: a numba function compiled for SIGNATURES["task"], or None), `slot_arrays`
  (attention: ``slot_arrays(slot) -> (k, v, pos, ring)``; mixer: ``slot_arrays(slot, start) -> state``, the
  tuple of state arrays its layer kernel updates for the token at start), `act_part` (moe: its activation's
  Part, or None), `fused_layer` (moe: ``fused_layer(weights, common, group_id=None) -> (kernel, args, big) |
  None``; mixer: ``fused_layer(common, group_id=None) -> (kernel, args, big) | None``, the whole layer's
  kernel: archrun.kernels.decode.fusion.MixerBlock; attention with its own projection layout:
  ``fused_layer(qkv, o, common, moe, group_id=None) -> (kernel, args, big) | None``, the whole layer's kernel
  from its layout's bound projections and the layer's MoeFfn or None: fusion.fuse_attention_layer),
  `fused_beside` (mixer: ``fused_beside(layer, group_id=None) -> (kernel, args, big) | None``, the kernel of
  a layer where the mixer runs beside the attention on the same normed input, its output added to the
  attention's: `layer` is the dense layer kernel's one-item argument list (kernels.decode.layer), the
  kernel is called as kernel(x, *args, kc, vc, kpos, ring, row, pos, cos, sin, state, chunks, par):
  fusion.BesideBlock);
- members and values of both factories: `kv_types` (attention: the bound object's ``kv_types`` tuple;
  undeclared: float32 only), `binds` (``bind(binder, layer)`` binds per-layer tensors of its own at
  load), and the values `causal` (attention: False for an op whose queries see every position),
  `ffn_reads_input` (residual: the FFN reads the block's input, so the block may share one norm),
  `empty` (mixer: the op adds nothing to the stream, so the block's FFN may read its normed input under
  any residual topology: the layers without a token mixer),
  `token_ids` (moe: the op is called ``moe(x, weights, token_ids)`` with each row's token id, int64 [n],
  e.g. to route by token; such a layer has no layer kernel, since a fused step knows no token ids),
  `own_ffn_norm` (moe: the op is called on the FFN branch's input before the block's FFN norm and applies
  that norm itself, binding it with `binds`, e.g. a router and experts that read the unnormed stream beside
  a normed dense MLP: Gemma 4's mixture blocks; such a layer has no layer kernel),
  `branches` (stream: the op calls each block's attention and FFN branches apart, ``block.attention`` /
  ``block.ffn``, and carries the residual itself, so the blocks' residual topology is never used) and
  `op_backend` (block_style: the backend the small ops bind on, "reference" or None for the model's).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import attrs
import numpy as np

from archrun.errors import PluginError

#: capabilities only a fast factory's bound objects carry
KERNEL_MEMBERS = ("fused", "fused_input", "fused_for", "pool_task", "slot_arrays", "act_part", "fused_layer",
                  "fused_beside")
#: members both factories' objects carry when declared
SHARED_MEMBERS = ("kv_types", "binds")
#: declared values (read from the declaration itself, not from bound objects)
VALUES = ("causal", "ffn_reads_input", "empty", "token_ids", "own_ffn_norm", "branches", "op_backend")

#: slot -> the capabilities an op of that slot may declare (members and values)
SLOT_CAPABILITIES: dict[str, frozenset[str]] = {
    "norm": frozenset({"fused"}),
    "rope": frozenset({"fused"}),
    "attention": frozenset({"fused", "fused_for", "pool_task", "slot_arrays", "kv_types", "binds", "causal",
                            "fused_layer"}),
    "mixer": frozenset({"empty", "fused_layer", "fused_beside", "slot_arrays"}),
    "activation": frozenset({"fused"}),
    "residual": frozenset({"fused", "fused_input", "binds", "ffn_reads_input"}),
    "gating": frozenset({"fused"}),
    "moe": frozenset({"act_part", "fused_layer", "binds", "token_ids", "own_ffn_norm"}),
    "softcap": frozenset(),
    "stream": frozenset({"branches"}),
    "block_style": frozenset({"op_backend"}),
}


@attrs.frozen
class OpCapabilities:
    """What a vocabulary op declares it can do beyond its slot's Protocol (see the module docstring).

    Each member flag says the bound objects carry that attribute (its value may be None for an instance
    that has none, e.g. an attention kind's spec the kernel cannot run); the values are the op's own.
    """

    fused: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool), kw_only=True)
    fused_input: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool), kw_only=True)
    fused_for: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool), kw_only=True)
    pool_task: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool), kw_only=True)
    slot_arrays: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool), kw_only=True)
    act_part: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool), kw_only=True)
    fused_layer: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool), kw_only=True)
    fused_beside: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool), kw_only=True)
    kv_types: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool), kw_only=True)
    binds: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool), kw_only=True)
    causal: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool), kw_only=True)
    ffn_reads_input: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool), kw_only=True)
    empty: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool), kw_only=True)
    token_ids: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool), kw_only=True)
    own_ffn_norm: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool), kw_only=True)
    branches: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool), kw_only=True)
    op_backend: str | None = attrs.field(default=None, kw_only=True,
                                         validator=attrs.validators.in_((None, "reference")))

    def declared(self) -> frozenset[str]:
        """The capabilities that differ from the undeclared default."""
        blank = OpCapabilities()
        return frozenset(a.name for a in attrs.fields(OpCapabilities)
                         if getattr(self, a.name) != getattr(blank, a.name))

    def members(self) -> tuple[str, ...]:
        """The attribute names the bound objects carry (`binds` is the `bind` method)."""
        return tuple("bind" if n == "binds" else n for n in (*KERNEL_MEMBERS, *SHARED_MEMBERS)
                     if getattr(self, n))

    def on(self, fast: bool) -> OpCapabilities:
        """The declaration for objects of the fast factory (fast=True) or of the reference one: a reference
        object carries no kernel member."""
        return self if fast else attrs.evolve(self, **{n: False for n in KERNEL_MEMBERS})


NONE = OpCapabilities()


def check_declaration(slot: str, name: str, fast: object, caps: object, plugin: str) -> None:
    """PluginError unless `caps` is an OpCapabilities whose declarations slot `slot` can take (kernel
    members only with a fast factory)."""
    label = f"{slot}={name!r} (plugin {plugin!r})"
    if not isinstance(caps, OpCapabilities):
        raise PluginError(f"{label} declares capabilities {caps!r}, which is not an archrun.contracts.OpCapabilities")
    wrong = sorted(caps.declared() - SLOT_CAPABILITIES.get(slot, frozenset()))
    if wrong:
        allowed = ", ".join(sorted(SLOT_CAPABILITIES.get(slot, ()))) or "none"
        raise PluginError(f"{label} declares {', '.join(wrong)}, which slot {slot!r} does not take "
                          f"(it takes: {allowed})")
    if caps.token_ids and caps.fused_layer:
        raise PluginError(f"{label} declares token_ids and fused_layer: a layer kernel is given no token ids")
    if caps.own_ffn_norm and not caps.binds:
        raise PluginError(f"{label} declares own_ffn_norm without binds: it must bind the FFN norm it applies")
    if caps.own_ffn_norm and caps.fused_layer:
        raise PluginError(f"{label} declares own_ffn_norm and fused_layer: a layer kernel applies the FFN norm itself")
    kernel = sorted(n for n in KERNEL_MEMBERS if getattr(caps, n))
    if kernel and fast is None:
        raise PluginError(f"{label} declares the kernel members {', '.join(kernel)} but has no fast factory "
                          "(only a fast factory's objects carry them)")


def check_bound(obj: Any, caps: OpCapabilities, slot: str, name: str) -> None:
    """PluginError unless the bound object `obj` carries every member its op declares, each of its kind
    (a Part or None; a callable or None; a tuple of kv type names)."""
    from archrun.kernels.decode.parts import Part

    for member in caps.members():
        try:
            value = getattr(obj, member)
        except AttributeError:
            raise PluginError(f"{slot}={name!r} declares {member!r} but its bound {type(obj).__name__} has no "
                              f"such attribute") from None
        if member in ("fused", "fused_input", "act_part"):
            ok = value is None or isinstance(value, Part)
        elif member == "kv_types":
            ok = isinstance(value, tuple) and all(isinstance(t, str) for t in value) and "f32" in value
        else:
            ok = value is None or callable(value)
        if not ok:
            raise PluginError(f"{slot}={name!r}: its bound {type(obj).__name__}.{member} is {value!r}, which is "
                              "not what the contract says (archrun.contracts)")
    if slot == "mixer" and not isinstance(obj, MixerOp):
        raise PluginError(f"mixer={name!r}: its bound {type(obj).__name__} lacks bind, new_slot or mix "
                          "(archrun.contracts.MixerOp)")


# -- the Protocol of each slot's bound objects ---------------------------------------------------------


class NormOp(Protocol):
    """slot "norm": factory(eps) -> f(x[..., d], w[d], b[d] | None = None) -> [..., d]."""

    def __call__(self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray: ...


class RopeOp(Protocol):
    """slot "rope": factory(spec, freq_factors, *tables) -> obj."""

    def cos_sin(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...

    def __call__(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray: ...


class AttentionOp(Protocol):
    """slot "attention": factory(spec: AttentionSpec) -> obj; obj(q, k, v, slot, start) -> [n, H, vd]."""

    def new_slot(self, capacity: int, max_rewind: int = ..., **kv: Any) -> Any: ...

    def __call__(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, slot: Any, start: int) -> np.ndarray: ...


@runtime_checkable
class MixerOp(Protocol):
    """slot "mixer": factory(spec: AttentionSpec) -> obj, a whole token mixer that binds its own tensors
    (bind), keeps its own state (new_slot) and mixes the block's normed input: mix(h[n, d], slot, start)."""

    def bind(self, binder: Any, layer: int) -> None: ...

    def new_slot(self, capacity: int, max_rewind: int = ...) -> Any: ...

    def mix(self, h: np.ndarray, slot: Any, start: int) -> np.ndarray: ...


class ActivationOp(Protocol):
    """slot "activation": factory() -> act(x[n, f], up[n, f] | None = None) -> [n, f]."""

    def __call__(self, x: np.ndarray, up: np.ndarray | None = None) -> np.ndarray: ...


class ResidualOp(Protocol):
    """slot "residual": factory(scale) -> obj."""

    def ffn_input(self, x: np.ndarray, a: np.ndarray) -> np.ndarray: ...

    def combine(self, x: np.ndarray, a: np.ndarray, f: np.ndarray) -> np.ndarray: ...


class StreamOp(Protocol):
    """slot "stream": factory(descriptor, **params) -> obj carrying the residual stream through the blocks:
    bind(binder) at load; enter(x[n, d], ids[n]) -> state; layer(i, state, block) -> state, where
    block(x[n, d]) -> [n, d] is block i; leave(state) -> [n, d]."""

    def bind(self, binder: Any) -> None: ...

    def enter(self, x: np.ndarray, ids: np.ndarray) -> Any: ...

    def layer(self, i: int, state: Any, block: Any) -> Any: ...

    def leave(self, state: Any) -> np.ndarray: ...


class GatingOp(Protocol):
    """slot "gating": factory() -> f(logits[n, E]) -> probs[n, E]."""

    def __call__(self, logits: np.ndarray) -> np.ndarray: ...


class MoeOp(Protocol):
    """slot "moe": factory(spec: MoeSpec, gating, act) -> f(x[n, d], weights) -> [n, d]."""

    def __call__(self, x: np.ndarray, weights: Any) -> np.ndarray: ...


class SoftcapOp(Protocol):
    """slot "softcap": factory(cap) -> f(logits[n, V]) -> [n, V]."""

    def __call__(self, logits: np.ndarray) -> np.ndarray: ...


#: slot -> the Protocol of its bound objects (block_style's factory returns a Decoder class: archrun.run.interpreter)
PROTOCOLS: dict[str, type | Callable[..., Any]] = {
    "norm": NormOp, "rope": RopeOp, "attention": AttentionOp, "mixer": MixerOp, "activation": ActivationOp,
    "residual": ResidualOp, "gating": GatingOp, "moe": MoeOp, "softcap": SoftcapOp, "stream": StreamOp,
}
