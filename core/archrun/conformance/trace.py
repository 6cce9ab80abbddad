"""Where two runs part: per-op activations of a model, and the diagnosis of a mismatch with a reference.

``trace(model, ids)`` runs a whole-sequence prefill (the op-by-op path) with every bound op of
the model wrapped, and returns each op's output in execution order as ``Record(layer, op, out)``
(``op`` is ``"slot=name"``, or ``"block"`` for a block's output and ``"output"`` for the head's
product before scaling and softcap; axis 0 of every output is the token position).
``first_divergence(a, b)`` finds the first record where two traces differ and names its layer,
op, position and element.

``changes`` lists the single descriptor changes (one vocabulary entry swapped for another installed
one the slot can take, the rope scaling of one layer kind — sliding or global — turned off or copied
from the other kind, the MoE weight renormalisation flipped, the final softcap removed or added, the
embedding scale) that archrun.conformance.diagnosis's ``diagnose`` tries when logits do not match an
independent reference; a change the model cannot take (an op that needs what the layer does not
carry, e.g. a token mixer's parameters in a transformer's attention slot) is ``Skipped`` and named.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from archrun.descriptor import NO_ROPE, Descriptor, MoeSpec, RopeSpec

#: The outputs of a block's two branches, recorded under these op names: the attention branch after
#: its output projection (before any post-norm), the FFN after its down projection (before any
#: post-norm). Reference tracers record the same points (archrun.conformance.trace_format).
BRANCHES = ("attn_out", "ffn_out")

#: The layer kinds whose rope the diagnosis and the fixtures' sensitivity check flip separately.
LAYER_KINDS = ("sliding", "global")


@attrs.frozen
class Record:
    """One op's output in a traced run: layer index (or "embed"/"head"), "slot=name", the array."""

    layer: int | str
    op: str
    out: np.ndarray = attrs.field(eq=False, repr=False)


@attrs.frozen
class Divergence:
    """The first record where two traces differ."""

    index: int
    layer: int | str
    op: str
    other_op: str
    position: int | None
    element: tuple[int, ...] | None
    got: float | None
    want: float | None

    def describe(self) -> str:
        where = "the output head" if self.layer == "head" else f"layer {self.layer}"
        op = self.op if self.op == self.other_op else f"{self.op} (other run: {self.other_op})"
        if self.element is None:
            at = "" if self.position is None else f"; the logits first differ at position {self.position}"
            return f"op {op} in {where} runs in one model and not the other{at}"
        return (f"op {op} in {where}, position {self.position}, element {list(self.element)}: "
                f"{self.got:.6g} vs {self.want:.6g}")


class _Proxy:
    """Delegates to a bound op object; records what its call (and listed methods) return."""

    def __init__(self, inner: Any, label: str, tracer: _Tracer, methods: Sequence[str] = ()):
        self._inner, self._label, self._tracer = inner, label, tracer
        for m in methods:
            fn = getattr(inner, m)
            setattr(self, m, tracer.wrap(fn, f"{label}.{m}"))

    def __call__(self, *args: Any, **kw: Any) -> Any:
        return self._tracer.record(self._label, self._inner(*args, **kw))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Tracer:
    def __init__(self) -> None:
        self.records: list[Record] = []
        self.layer: int | str = "embed"

    def record(self, op: str, out: Any) -> Any:
        if isinstance(out, np.ndarray):
            self.records.append(Record(self.layer, op, np.array(out, dtype=np.float64)))
        return out

    def wrap(self, fn: Callable[..., Any], op: str) -> Callable[..., Any]:
        def traced(*args: Any, **kw: Any) -> Any:
            return self.record(op, fn(*args, **kw))
        return traced


@contextlib.contextmanager
def _instrumented(model: Any) -> Iterator[_Tracer]:
    """Wrap the bound ops of ``model`` (its plan's attributes) for the duration; restore them after."""
    t = _Tracer()
    plan, d = model.plan, model.descriptor
    saved: list[tuple[Any, str, Any]] = []

    def swap(obj: Any, attr: str, new: Any) -> None:
        saved.append((obj, attr, getattr(obj, attr)))
        setattr(obj, attr, new)

    swap(plan, "norm", t.wrap(plan.norm, f"norm={d.norm}"))
    ropes = list(plan.ropes)
    for i, rope in enumerate(ropes):
        if rope is not None:
            ropes[i] = _Proxy(rope, f"rope={d.rope_tables[i].pairing}", t)
    swap(plan, "ropes", ropes)
    if plan.softcap is not None:
        swap(plan, "softcap", t.wrap(plan.softcap, f"softcap={d.softcap}"))
    index = {}
    for i, lp in enumerate(plan.layers):
        index[id(lp)] = i
        spec = lp.spec
        swap(lp, "attention", _Proxy(lp.attention, f"{spec.attention.slot}={spec.attention.kind}", t))
        swap(lp, "residual", _Proxy(lp.residual, f"residual={spec.residual}", t, ("ffn_input", "combine")))
        ffn = lp.ffn
        if isinstance(spec.ffn, MoeSpec):
            swap(ffn, "moe", t.wrap(ffn.moe, f"moe={spec.ffn.kind}"))
        elif ffn is not None:
            swap(ffn, "act", t.wrap(ffn.act, f"activation={spec.ffn.activation}"))
        if ffn is not None:
            swap(lp, "ffn", _Proxy(ffn, BRANCHES[1], t))
    run_block = model.run_block
    attend = getattr(model, "_attend", None)  # a block style without the attention branch records none
    finish = model.finish_logits

    def traced_block(lp: Any, x: np.ndarray, *args: Any) -> np.ndarray:
        t.layer = index.get(id(lp), "block")
        out = t.record("block", run_block(lp, x, *args))
        t.layer = "head"
        return out

    def traced_finish(logits: np.ndarray) -> np.ndarray:
        t.record("output", logits)
        return finish(logits)

    swap(model, "run_block", traced_block)
    if attend is not None:
        swap(model, "_attend", t.wrap(attend, BRANCHES[0]))
    swap(model, "finish_logits", traced_finish)
    try:
        yield t
    finally:
        for obj, attr, old in reversed(saved):
            if obj is model:
                delattr(model, attr)  # back to the class's method
            else:
                setattr(obj, attr, old)


def trace(model: Any, ids: Sequence[int]) -> tuple[np.ndarray, list[Record]]:
    """(logits [n, vocab], per-op records) of a whole-sequence prefill of ``ids``."""
    with _instrumented(model) as t:
        logits = model.logits(np.asarray(ids, dtype=np.int64))
    return logits, t.records


def first_diff(got: np.ndarray, want: np.ndarray, tolerance: float) -> tuple[int, tuple[int, ...]] | None:
    """(position, element index) of the first row (axis 0) where |got - want| exceeds ``tolerance``
    times max |want| (max 1), and its largest element there; None when they agree."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return (0, ()) if got.shape[:1] != want.shape[:1] else (0, (0,))
    bound = tolerance * max(1.0, float(np.abs(want).max()) if want.size else 1.0)
    bad = ~(np.abs(got - want) <= bound)  # NaN counts as different
    if not bad.any():
        return None
    rows = bad.reshape(len(bad), -1).any(axis=1)
    p = int(np.argmax(rows))
    row_err = np.abs(got[p] - want[p])
    row_err = np.where(np.isnan(row_err), np.inf, row_err)
    element = np.unravel_index(int(np.argmax(row_err)), got[p].shape)
    return p, (p, *map(int, element))


def first_divergence(a: list[Record], b: list[Record], tolerance: float = 1e-4) -> Divergence | None:
    """The first record (in execution order) where traces ``a`` and ``b`` differ."""
    for k, (ra, rb) in enumerate(zip(a, b, strict=False)):
        if ra.layer != rb.layer or ra.op.split("=")[0] != rb.op.split("=")[0]:
            first = ra if len(a) > len(b) else rb
            return Divergence(k, first.layer, first.op, (rb if first is ra else ra).op, None, None, None, None)
        found = first_diff(ra.out, rb.out, tolerance)
        if found is not None:
            p, element = found
            if ra.out.shape != rb.out.shape:
                return Divergence(k, ra.layer, ra.op, rb.op, p, element, math.nan, math.nan)
            return Divergence(k, ra.layer, ra.op, rb.op, p, element, float(ra.out[element]), float(rb.out[element]))
    if len(a) != len(b):
        k = min(len(a), len(b))
        extra = (a if len(a) > len(b) else b)[k]
        return Divergence(k, extra.layer, extra.op, extra.op, None, None, None, None)
    return None


# ------------------------------------------------------------------------------ diagnosis


def build(path: str | Path, descriptor: Descriptor, plugins: Any = None, backend: str = "reference") -> Any:
    """A model of the file at ``path`` run by ``descriptor`` (the block style it names)."""
    from archrun.io.ggufset import open_gguf
    from archrun.plugins import default_plugin_manager
    from archrun.run.bind import build_plan
    from archrun.vocab import build_vocabulary

    vocab = build_vocabulary(plugins or default_plugin_manager())
    gguf = open_gguf(path)
    plan = build_plan(descriptor, gguf, vocab, backend)
    style = vocab.entry("block_style", descriptor.block_style).op.reference()
    return style(plan, gguf, None, None)


# ------------------------------------------------------------------- rope scaling per layer kind


def rope_scaled(table: RopeSpec) -> bool:
    """Whether ``table`` scales its rotation in any way (a scaling kind, frequency factors, a magnitude);
    linear scaling by 1 (BitNet's converter writes it) does not."""
    linear_1 = table.scaling == "linear" and table.scaling_factor == 1.0
    return ((table.scaling != "none" and not linear_1) or table.freq_factors is not None
            or table.attn_scale != 1.0 or table.attn_factor is not None)


def _plain(table: RopeSpec) -> RopeSpec:
    return RopeSpec(pairing=table.pairing, n_rot=table.n_rot, freq_base=table.freq_base)


def _scaling_text(table: RopeSpec) -> str:
    if not rope_scaled(table):
        return "no scaling"
    parts = [table.scaling if table.scaling in ("none", "longrope") else f"{table.scaling} x{table.scaling_factor:g}"]
    if table.scaling == "yarn":
        parts.append(f"original context {table.original_context}")
        if table.attn_factor is not None:
            parts.append(f"attention factor {table.attn_factor:g}")
    if table.freq_factors is not None:
        parts.append(f"frequency factors {table.freq_factors!r}")
    if table.attn_scale != 1.0:
        parts.append(f"magnitude x{table.attn_scale:g}")
    return ", ".join(p for p in parts if p != "none")


def _kind_tables(d: Descriptor, kind: str) -> list[int]:
    """The rotating rope tables the layers of ``kind`` ("sliding": a window; "global") use."""
    out = []
    for layer in d.layers:
        a = layer.attention
        if (a.window > 0) != (kind == "sliding") or a.rope >= len(d.rope_tables):
            continue
        table = d.rope_tables[a.rope]
        if table.pairing != NO_ROPE and table.n_rot and a.rope not in out:
            out.append(a.rope)
    return out


def flip_rope_scaling(d: Descriptor, kind: str) -> tuple[str, Descriptor] | str:
    """The rope of the layers of ``kind`` (LAYER_KINDS) with its scaling flipped: a scaled table
    rotates plain (its base alone), a plain one takes the scaling of the other kind's table (its
    own pairing, width and base). Returns (what changed, descriptor), or why nothing flips."""
    if kind not in LAYER_KINDS:
        raise ValueError(f"layer kind must be one of {LAYER_KINDS}, got {kind!r}")
    mine = _kind_tables(d, kind)
    if not mine:
        has = any((lay.attention.window > 0) == (kind == "sliding") for lay in d.layers)
        return f"its {kind} layers have no rotary embedding" if has else f"the model has no {kind} layers"
    other_kind = LAYER_KINDS[1 - LAYER_KINDS.index(kind)]
    other = next((d.rope_tables[i] for i in _kind_tables(d, other_kind) if rope_scaled(d.rope_tables[i])), None)
    tables, remap, whats = list(d.rope_tables), {}, []
    for i in mine:
        table = d.rope_tables[i]
        if rope_scaled(table):
            new = _plain(table)
            whats.append(f"the rope of the {kind} layers without scaling (stated: {_scaling_text(table)})")
        elif other is not None:
            new = attrs.evolve(other, pairing=table.pairing, n_rot=table.n_rot, freq_base=table.freq_base)
            whats.append(f"the rope of the {kind} layers scaled as the {other_kind} layers' "
                         f"({_scaling_text(other)}; stated: no scaling)")
        else:
            continue
        remap[i] = len(tables)
        tables.append(new)
    if not remap:
        return f"no rope scaling to flip: neither the {kind} layers' rope nor the {other_kind} layers' scales"
    layers = [attrs.evolve(lay, attention=attrs.evolve(lay.attention, rope=remap[lay.attention.rope]))
              if (lay.attention.window > 0) == (kind == "sliding") and lay.attention.rope in remap else lay
              for lay in d.layers]
    return "; ".join(dict.fromkeys(whats)), attrs.evolve(d, rope_tables=tuple(tables), layers=layers)


@attrs.frozen
class Skipped:
    """A change the diagnosis does not try: the slot cannot take it (``why``)."""

    what: str
    why: str


def _layout_name(vocab: Any, slot: str, name: str) -> str | None:
    """The own projection layout (its class name) of an attention op, or None for the standard one."""
    from archrun.errors import UnknownVocabulary

    try:
        layout = vocab.entry(slot, name).op.layout
    except UnknownVocabulary:
        return None
    return None if layout is None else type(layout).__name__


def alternatives(d: Descriptor, vocab: Any, logits: np.ndarray | None = None,
                 want: np.ndarray | None = None) -> Iterator[tuple[str, Descriptor]]:
    """(what changed, descriptor) for every single change the diagnosis tries (``changes`` also
    names the ones it skips)."""
    for what, alt in changes(d, vocab, logits, want):
        if not isinstance(alt, Skipped):
            yield what, alt


def changes(d: Descriptor, vocab: Any, logits: np.ndarray | None = None,
            want: np.ndarray | None = None) -> Iterator[tuple[str, Descriptor | Skipped]]:
    """(what changed, descriptor or ``Skipped``) for every single change of ``d`` the diagnosis
    considers. An attention op swaps in only where the layer's projections are the ones it reads:
    an op with its own projection layout (e.g. MLA, a token mixer) needs parameters and tensors a
    layer described for another op does not carry, so those swaps are ``Skipped``."""
    names = {}
    for entry in vocab:
        names.setdefault(entry.op.slot, []).append(entry.op.name)

    def others(slot: str, value: str) -> list[str]:
        return [n for n in names.get(slot, []) if n != value]

    for alt in others("norm", d.norm):
        yield f"norm={alt} (stated: norm={d.norm})", attrs.evolve(d, norm=alt)
    for i, table in enumerate(d.rope_tables):
        if table.pairing != NO_ROPE and table.n_rot:
            for alt in others("rope", table.pairing):
                tables = list(d.rope_tables)
                tables[i] = attrs.evolve(table, pairing=alt)
                yield f"rope={alt} (stated: rope={table.pairing})", attrs.evolve(d, rope_tables=tables)
    for kind in LAYER_KINDS:
        flipped = flip_rope_scaling(d, kind)
        if not isinstance(flipped, str):
            yield flipped

    def per_layer(slot: str, get: Callable[[Any], str], put: Callable[[Any, str], Any]) -> Iterator[tuple[str, Any]]:
        for value in dict.fromkeys(get(layer) for layer in d.layers if get(layer) is not None):
            for alt in others(slot, value):
                what = f"{slot}={alt} (stated: {slot}={value})"
                if slot in ("attention", "mixer"):
                    have, need = _layout_name(vocab, slot, value), _layout_name(vocab, slot, alt)
                    if have != need:
                        yield what, Skipped(what, f"{slot}={alt} reads its own tensors "
                                                  f"({need or 'the standard projections'}), the layers were "
                                                  f"described for {have or 'the standard projections'}")
                        continue
                layers = [put(layer, alt) if get(layer) == value else layer for layer in d.layers]
                yield what, attrs.evolve(d, layers=layers)

    yield from per_layer("activation", lambda ly: ly.ffn.activation,
                         lambda ly, a: attrs.evolve(ly, ffn=attrs.evolve(ly.ffn, activation=a)))
    yield from per_layer("residual", lambda ly: ly.residual, lambda ly, a: attrs.evolve(ly, residual=a))
    # a layer's op is swapped within its own slot only: an attention op for an attention op, a token mixer
    # for a mixer (a layer described for one kind of op carries none of the other's tensors)
    for slot in ("attention", "mixer"):
        yield from per_layer(slot, lambda ly, s=slot: ly.attention.kind if ly.attention.slot == s else None,
                             lambda ly, a: attrs.evolve(ly, attention=attrs.evolve(ly.attention, kind=a)))
    moe = lambda ly: ly.ffn if isinstance(ly.ffn, MoeSpec) else None  # noqa: E731
    yield from per_layer("gating", lambda ly: moe(ly) and ly.ffn.gating,
                         lambda ly, a: attrs.evolve(ly, ffn=attrs.evolve(ly.ffn, gating=a)))
    if any(moe(ly) for ly in d.layers):
        stated = next(moe(ly) for ly in d.layers if moe(ly)).weights_norm
        layers = [attrs.evolve(ly, ffn=attrs.evolve(ly.ffn, weights_norm=not ly.ffn.weights_norm)) if moe(ly) else ly
                  for ly in d.layers]
        yield (f"MoE weights renormalised={not stated} (stated: {stated}; moe={moe(layers[-1]).kind})",
               attrs.evolve(d, layers=layers))
    if d.logit_softcap:
        yield (f"no final softcap (stated: softcap={d.softcap} at {d.logit_softcap:g})",
               attrs.evolve(d, logit_softcap=0.0))
    elif logits is not None and want is not None:
        cap = _fit_softcap(logits, want)
        if cap is not None:
            yield (f"softcap={d.softcap} at {cap:.4g} (stated: none)",
                   attrs.evolve(d, logit_softcap=cap))
    if d.embed_scale == 1.0:
        yield f"embed_scale=sqrt(n_embd) (stated: {d.embed_scale:g})", attrs.evolve(d, embed_scale=math.sqrt(d.n_embd))
    else:
        yield f"embed_scale=1 (stated: {d.embed_scale:g})", attrs.evolve(d, embed_scale=1.0)


def _fit_softcap(logits: np.ndarray, want: np.ndarray) -> float | None:
    """The cap c for which c * tanh(logits / c) is closest to ``want`` (None if none is close)."""
    z, y = np.asarray(logits, np.float64), np.asarray(want, np.float64)
    scale = max(1.0, float(np.abs(y).max()))
    if float(np.abs(y).max()) >= float(np.abs(z).max()):
        return None  # a softcap only shrinks logits
    caps = np.geomspace(scale * 0.5, scale * 1e3, 400)
    errs = [float(np.abs(c * np.tanh(z / c) - y).max()) for c in caps]
    best = int(np.argmin(errs))
    if errs[best] > 0.05 * scale:
        return None
    lo, hi = caps[max(best - 1, 0)], caps[min(best + 1, len(caps) - 1)]
    for _ in range(60):  # refine (the error is unimodal near the optimum)
        m1, m2 = lo + (hi - lo) / 3, hi - (hi - lo) / 3
        e1 = np.abs(m1 * np.tanh(z / m1) - y).max()
        e2 = np.abs(m2 * np.tanh(z / m2) - y).max()
        lo, hi = (lo, m2) if e1 < e2 else (m1, hi)
    return float((lo + hi) / 2)
