"""The vocabulary registry: (slot, name) -> Op, filled through the archrun_register_vocabulary hook.

An `Op` carries a numpy float32 reference factory and, optionally, a fast factory. A
factory is called once per model (per layer) with static parameters taken from the
descriptor and returns the bound callable the plan runs; nothing is looked up per token.

Slots and the contract of their factories (shapes: n tokens, d model width, H/KV heads,
hd head width, f FFN width, E experts, k experts used):

  norm        factory(eps: float) -> f(x[..., d], w[d], b[d] | None = None) -> [..., d]
  rope        factory(spec: RopeSpec, freq_factors: ndarray | None)
                -> obj: obj.cos_sin(pos[n]) -> (cos, sin) each [n, n_rot/2];
                        obj(x[n, H, hd], cos, sin) -> [n, H, hd]
  attention   factory(spec: AttentionSpec) -> obj: obj.new_slot(capacity, max_rewind) -> slot;
                        obj(q[n, H, hd], k[n, KV, hd], v[n, KV, vd], slot, start: int, *side) -> [n, H, vd]
                        (side: the row-aligned side inputs its layout's qkv gives, if any);
                        declared `binds`: obj.bind(binder, layer) binds per-layer tensors the op reads
                        (e.g. `attn_sinks` when spec.sinks), called once at load
  mixer       factory(spec: AttentionSpec) -> obj: a whole token mixer (its layout, a MixerLayout, states
                        its geometry): obj.bind(binder, layer) binds its tensors; obj.new_slot(capacity,
                        max_rewind) -> its state; obj.mix(h[n, d], slot, start: int) -> [n, d]
  activation  factory() -> act(x[n, f], up[n, f] | None = None) -> act(x) (* up when given) [n, f]
              (a gated kind may also transform up, e.g. swiglu_oai's clamp(up) + 1)
  residual    factory(scale: float) -> obj: obj.ffn_input(x[n, d], a[n, d]) -> [n, d] (what the FFN reads
                        before its norm); obj.combine(x, a, f) -> [n, d] (the stream after the block)
  gating      factory() -> f(logits[n, E]) -> probs[n, E]
  moe         factory(spec: MoeSpec, gating, act) -> f(x[n, d], weights: archrun.io.weights.MoeWeights) -> [n, d]
  softcap     factory(cap: float) -> f(logits[n, V]) -> [n, V]
  stream      factory(descriptor, **params) -> obj: how the residual stream runs through the blocks when it is
                        more than one [n, d] array (e.g. several parallel streams); obj.bind(binder) binds its
                        tensors at load; obj.enter(x[n, d], ids[n]) -> state (after the embeddings);
                        obj.layer(i, state, block) -> state, where block(x[n, d]) -> [n, d] runs block i;
                        obj.leave(state) -> [n, d] (before the final norm). Unnamed: one stream, block by block
  block_style factory() -> a Decoder class (see archrun.run.interpreter): its `caps` say which entries it carries;
              the op's declared `op_backend` ("reference" or None) which backend the small ops run on

An attention op whose Q/K/V are not the standard attn_q/attn_k/attn_v (or attn_qkv) products
registers its projections as `Op.layout` (an AttentionLayout): the compiler asks it for the
layer's attention geometry, the binder for the bound projections; everything else (norms, rope,
the cache, the residual) stays the interpreter's.

What an op can do beyond its slot's contract it declares at registration (`Op.capabilities`, an
archrun.contracts.OpCapabilities): a fast op joins the fused one-call-per-layer decode path by declaring
kernel parts (archrun.kernels.decode.parts: `fused`, and the residual op's `fused_input`); an FFN op with its own
layer kernel (e.g. moe) declares `fused_layer`: `op.fused_layer(weights, common, group_id=None)`
(group_id, when given, registers its product groups with the decode worker pool: archrun.kernels.decode.fusion),
and so does a token mixer with its layer kernel: `op.fused_layer(common, group_id=None)` with
`op.slot_arrays(slot, start)` (its state arrays for the kernel), and an attention op with its own
projection layout: `op.fused_layer(qkv, o, common, moe, group_id=None)` with `op.slot_arrays(slot)`.
The core reads only what an op declares.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import attrs
import pluggy

from archrun.contracts import OpCapabilities, check_declaration
from archrun.errors import PluginError, UnknownVocabulary

SLOTS = ("norm", "rope", "attention", "mixer", "activation", "residual", "gating", "moe", "softcap", "stream",
         "block_style")
BACKENDS = ("reference", "fast")


class AttentionLayout(Protocol):
    """The projections of an attention op that brings its own (slot "attention", `Op.layout`).

    describe(ctx) runs at compile time for each layer using the op: `ctx` is an
    archrun.describe.compile.LayerContext (the layer's metadata keys, tensor shapes, head counts). It checks
    the layout's tensors and returns AttentionSpec fields: `n_head_kv`, `head_dim`, `v_head_dim`
    (what the attention op and its cache see), `scale`, and `params` (name -> number).

    bind(binder, spec, layer) runs at load: it binds the layer's tensors through the binder
    (`matrix(role, layer)`, `vector(role, layer)`, `table(role, layer)`, `norm`, ...; roles are
    gguf-py's tensor names without `blk.N.`) and returns (qkv, o):
      qkv(h[n, d]) -> (q[n, H*hd], k[n, KV*hd], v[n, KV*vd]), before rope (the model's rope op
      rotates the first n_rot dims of each q/k head), optionally followed by side inputs (arrays [n, ...]
      the op reads besides q, k, v, e.g. a key selector's own projections: the interpreter passes them to
      the op after `start`, untouched, sliced per sequence in a batch);
      o(a[n, H*vd]) -> [n, d], the attention output projected back to the model width.
    """

    def describe(self, ctx: Any) -> dict[str, Any]: ...

    def bind(self, binder: Any, spec: Any, layer: int) -> tuple[Callable[..., Any], Callable[..., Any]]: ...


class ActivationLayout(Protocol):
    """The parameters of an activation op that reads its own from the file (slot "activation",
    `Op.layout`; e.g. learned per-layer constants): describe(ctx) runs at compile time for each layer
    with an FFN (ctx: archrun.describe.compile.LayerContext; `ctx.meta.per_layer_floats(key, n)` reads a float
    key, gguf-py's full name, that holds one value or one per layer) and returns {"params": {name:
    number}}. The descriptor keeps them (FfnSpec/MoeSpec.activation_params) and the binder passes them
    to the op's factories as keywords: factory(**params)."""

    def describe(self, ctx: Any) -> dict[str, Any]: ...


class MoeLayout(Protocol):
    """The per-layer parameters of a mixture op that reads its own from the file (slot "moe", `Op.layout`):
    describe(ctx) runs at compile time for each MoE layer (ctx: archrun.describe.compile.LayerContext) and
    returns {"params": {name: number}}; the descriptor keeps them (MoeSpec.params), which the op reads from
    the spec its factory gets."""

    def describe(self, ctx: Any) -> dict[str, Any]: ...


class MixerLayout(Protocol):
    """The geometry of a token mixer (slot "mixer", `Op.layout`): describe(ctx) runs at compile time for
    each layer using the mixer (ctx: archrun.describe.compile.LayerContext), checks the layer's tensors and returns
    the mixer's spec fields: `params` (name -> number: its conv taps, state sizes, inner widths, ...) and,
    when the mixer has heads, `n_head`, `n_head_kv`, `head_dim`, `v_head_dim`. The mixer op binds its own
    tensors (`bind(binder, layer)`) and keeps its own state (archrun.contracts.MixerOp)."""

    def describe(self, ctx: Any) -> dict[str, Any]: ...


class StreamLayout(Protocol):
    """The parameters of a stream op (slot "stream", `Op.layout`) read from the file: describe(ctx) runs once
    at compile time (ctx: archrun.describe.compile.LayerContext with layer -1: the model's metadata keys and
    tensors) and returns {"params": {name: number}}; the descriptor keeps them (Descriptor.stream_params)
    and the binder passes them to the op's factory as keywords: factory(descriptor, **params). It returns
    None for a file with nothing for the op to carry (Gemma 4 files without per-layer inputs): that model
    runs one stream (Descriptor.stream "")."""

    def describe(self, ctx: Any) -> dict[str, Any] | None: ...


@attrs.frozen
class Lazy:
    """A factory named "module:attribute", imported on its first call.

    A plugin registers its fast factories this way so that importing the plugin (every load
    does) compiles none of its kernels: a model on the reference backend, or one that uses none
    of the plugin's fast ops, never waits for them.
    """

    target: str = attrs.field(validator=attrs.validators.matches_re(r"^[\w.]+:\w+$"))

    def resolve(self) -> Callable[..., Any]:
        """The factory itself (imports its module: the kernels it compiles at import compile now)."""
        module, _, name = self.target.partition(":")
        return getattr(importlib.import_module(module), name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)


@attrs.frozen
class Op:
    """A vocabulary entry: the math of one (slot, name), as a reference and optionally a fast factory.

    layout: an attention op's own projections (AttentionLayout), or None for the standard ones; a
    mixer op's geometry (MixerLayout, required in slot "mixer"); an activation op's parameters read
    from the file (ActivationLayout), or None for an activation without any; a stream op's parameters
    read from the file (StreamLayout); a mixture op's per-layer parameters read from the file (MoeLayout).
    capabilities: what its bound objects can do beyond the slot's Protocol (archrun.contracts), checked
    when the op is registered.
    fast may be a `Lazy("module:factory")`, imported when a model first binds it.
    """

    slot: str = attrs.field(validator=attrs.validators.in_(SLOTS))
    name: str = attrs.field(validator=attrs.validators.instance_of(str))
    reference: Callable[..., Any] = attrs.field(validator=attrs.validators.is_callable())
    fast: Callable[..., Any] | None = attrs.field(default=None)
    doc: str = ""
    layout: AttentionLayout | MixerLayout | ActivationLayout | StreamLayout | MoeLayout | None = attrs.field(
        default=None, kw_only=True)
    capabilities: OpCapabilities = attrs.field(factory=OpCapabilities, kw_only=True)

    def declared(self, backend: str) -> OpCapabilities:
        """What the objects of `backend`'s factory carry (archrun.contracts): a reference object (or the
        reference a fast backend falls back to) carries no kernel member."""
        return self.capabilities.on(backend == "fast" and self.fast is not None)

    def factory(self, backend: str) -> Callable[..., Any]:
        """The factory for `backend` ("fast" falls back to the reference when no fast one exists)."""
        if backend == "fast" and self.fast is not None:
            return self.fast
        return self.reference


@attrs.frozen
class Entry:
    """An op together with the plugin that registered it."""

    op: Op
    plugin: str


class Vocabulary:
    """All registered ops, keyed by (slot, name)."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], Entry] = {}

    def register(self, op: Op, plugin: str) -> None:
        """Add `op`; a second registration of the same (slot, name) is a PluginError."""
        if not isinstance(op, Op):
            raise PluginError(f"plugin {plugin!r} registered {op!r}, which is not an archrun.vocab.Op")
        check_declaration(op.slot, op.name, op.fast, op.capabilities, plugin)
        if op.slot == "mixer" and op.layout is None:
            raise PluginError(f"mixer={op.name!r} (plugin {plugin!r}) has no layout: a token mixer states its "
                              "geometry (archrun.vocab.MixerLayout)")
        key = (op.slot, op.name)
        if key in self._entries:
            other = self._entries[key].plugin
            raise PluginError(f"vocabulary {op.slot}={op.name!r} registered by both {other!r} and {plugin!r}")
        self._entries[key] = Entry(op, plugin)

    def entry(self, slot: str, name: str) -> Entry:
        """The entry for (slot, name); UnknownVocabulary names the installed alternatives."""
        try:
            return self._entries[(slot, name)]
        except KeyError:
            have = sorted(n for s, n in self._entries if s == slot)
            raise UnknownVocabulary(
                f"no installed plugin provides {slot}={name!r} (installed {slot} values: {', '.join(have) or 'none'})"
            ) from None

    def factory(self, slot: str, name: str, backend: str) -> Callable[..., Any]:
        """Resolve (slot, name) to the factory of `backend`."""
        return self.entry(slot, name).op.factory(backend)

    def __iter__(self) -> Iterator[Entry]:
        return iter(sorted(self._entries.values(), key=lambda e: (e.op.slot, e.op.name)))

    def __contains__(self, key: tuple[str, str]) -> bool:
        return key in self._entries


def build_vocabulary(pm: pluggy.PluginManager) -> Vocabulary:
    """Every plugin's vocabulary, remembering which plugin registered what; the hook runs once per
    plugin manager (and again after a plugin was registered or unregistered)."""
    from archrun.plugins.registry import collected

    return collected(pm, "vocabulary", _collect_vocabulary)


def _collect_vocabulary(pm: pluggy.PluginManager) -> Vocabulary:
    vocab = Vocabulary()
    for impl in pm.hook.archrun_register_vocabulary.get_hookimpls():
        def register(op: Op, _plugin: str = impl.plugin_name) -> None:
            vocab.register(op, _plugin)

        impl.function(register=register)
    return vocab
