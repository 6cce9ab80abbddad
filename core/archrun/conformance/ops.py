"""Every fast op equals its reference: random shapes (ragged sizes, extreme values), op by op and through
its kernel part (what the fused decode path calls for one token), for any registered vocabulary entry.

``check_fast_op(entry)`` drives one ``archrun.vocab.Entry`` through its slot's contract
(archrun.vocab) and raises AssertionError naming the op, the input case and the first element
where fast and reference differ. A package may excuse a known deviation of some input cases
(``deviations``: case-label pattern -> why); they must then still differ, so a fix is noticed.
Attention ops whose layout states its own heads and parameters (``Op.layout``) are driven on
the ``AttentionSpec``s the package declares for them (``specs``); activation ops whose layout reads
their parameters from the file, on the parameter dicts declared (each passed to both factories as
keywords).
"""

from __future__ import annotations

import contextlib
import fnmatch
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from archrun.descriptor import AttentionSpec, RopeSpec

F32 = np.float32
NONE = np.empty(0, F32)
TOLERANCE = 2e-5  # relative to max(1, max |reference|)

#: values every elementwise op must handle: signed zeros, denormals, saturation points, huge values
EXTREMES = np.array([0.0, -0.0, 1e-38, -1e-38, 1e-45, 0.5, -0.5, 10.0, -10.0, 50.0, -50.0, 88.0, -88.0,
                     1e4, -1e4, 3e38, -3e38], F32)


class Unsupported(Exception):
    """The kit has no harness for this slot."""


def _rng(key: str) -> np.random.Generator:
    import zlib

    return np.random.default_rng(zlib.crc32(key.encode()))


class _Run:
    """The cases of one op's check: mismatches are collected, not raised, so every case runs."""

    def __init__(self, specs: Sequence[Any], caps: Any = None) -> None:
        self.specs = tuple(specs)
        self.caps = caps  # what the fast op declares (archrun.contracts.OpCapabilities)
        self.failed: dict[str, str] = {}
        self.passed: set[str] = set()


_RUN: list[_Run] = []


@contextlib.contextmanager
def _collecting(specs: Sequence[Any], caps: Any = None) -> Iterator[_Run]:
    run = _Run(specs, caps)
    _RUN.append(run)
    try:
        yield run
    finally:
        _RUN.pop()


def _member(fast: Any, name: str) -> Any:
    """The fast object's kernel member `name` when its op declares it (archrun.contracts), else None."""
    from archrun.contracts import NONE

    caps = _RUN[-1].caps if _RUN and _RUN[-1].caps is not None else NONE
    return getattr(fast, name) if getattr(caps, name) else None


def _close(label: str, case: str, got: Any, want: Any, tolerance: float = TOLERANCE) -> None:
    try:
        _assert_close(label, case, got, want, tolerance)
    except AssertionError as e:
        if not _RUN:
            raise
        _RUN[-1].failed.setdefault(case, str(e))
        return
    if _RUN:
        _RUN[-1].passed.add(case)


def close(label: str, case: str, got: Any, want: Any, tolerance: float = TOLERANCE) -> None:
    """Compare one case of an op driver's (Conformance.op_drivers): the fast op's output `got` with the
    reference's `want`, within `tolerance` of the reference's largest magnitude (at least 1); NaN equals
    NaN. A mismatch is collected with the check's other cases (or raised outside a check)."""
    _close(label, case, got, want, tolerance)


def _assert_close(label: str, case: str, got: Any, want: Any, tolerance: float) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{label} [{case}]: fast returns shape {got.shape}, reference {want.shape}"
    g, w = got.astype(np.float64), want.astype(np.float64)
    finite = np.isfinite(w)
    bound = tolerance * max(1.0, float(np.abs(w[finite]).max()) if finite.any() else 1.0)
    bad = ~((np.abs(g - w) <= bound) | (np.isnan(g) & np.isnan(w)) | (g == w))
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise AssertionError(f"{label} [{case}]: fast differs from reference first at element {list(idx)} of "
                             f"shape {list(got.shape)}: fast {g[idx]:.8g}, reference {w[idx]:.8g} "
                             f"(bound {bound:.2e}); {int(bad.sum())} elements differ")


def check_fast_op(entry: Any, deviations: Mapping[str, str] | None = None, specs: Sequence[Any] = (),
                  driver: Callable[[str, Callable, Callable], None] | None = None) -> None:
    """Assert the fast factory of ``entry`` agrees with its reference (see the module docstring).

    ``deviations``: input-case label pattern (fnmatch) -> why the fast op may differ on the cases it
    matches (each pattern must still match a differing case).
    ``specs``: the factory specs to drive an op on (attention: ``AttentionSpec``s), instead of the
    harness's own grid; required for an attention op with its own layout.
    ``driver``: ``driver(label, reference_factory, fast_factory)`` in place of the slot's harness, for an
    op whose calls take inputs the harness does not build (an attention op's side inputs, a table it
    binds at load); it builds its cases and compares each through ``close`` (Conformance.op_drivers).
    """
    op = entry.op
    label = f"{op.slot}={op.name} ({entry.plugin})"
    if op.fast is None:
        return
    harness = driver or _HARNESSES.get(op.slot)
    if harness is None:
        raise Unsupported(f"no kit harness for slot {op.slot!r}")
    if op.layout is not None and not specs and driver is None:
        raise Unsupported(f"{label} has its own layout: declare the specs to drive it on (attention: AttentionSpecs; "
                          "activation: parameter dicts) (Conformance(op_specs={...}), docs/conformance.md)")
    # extreme inputs overflow on purpose
    with _collecting(specs, op.declared("fast")) as run, np.errstate(all="ignore"):
        harness(label, op.reference, op.fast)
    _verdict(label, run, dict(deviations or {}))


def _verdict(label: str, run: _Run, deviations: dict[str, str]) -> None:
    def excused(case: str) -> bool:
        return any(fnmatch.fnmatchcase(case, pattern) for pattern in deviations)

    unexcused = [msg for case, msg in run.failed.items() if not excused(case)]
    if unexcused:
        more = f"\n(and {len(unexcused) - 1} more failing cases)" if len(unexcused) > 1 else ""
        raise AssertionError(unexcused[0] + more)
    fixed = [p for p in deviations if not any(fnmatch.fnmatchcase(case, p) for case in run.failed)]
    assert not fixed, (f"{label}: declared deviations match no differing case (fixed, or no such case: remove "
                       "them from the declaration): " + "; ".join(f"{p!r} ({deviations[p]})" for p in fixed))


def _norm(label: str, ref_f: Callable, fast_f: Callable) -> None:
    ref, fast = ref_f(1e-5), fast_f(1e-5)
    rng = _rng(label)
    for shape in [(1, 1), (1, 64), (7, 577), (3, 4, 128), (2, 3, 33)]:
        for bias in (False, True):
            x = (rng.standard_normal(shape) * 3 + 0.5).astype(F32)
            w = rng.standard_normal(shape[-1]).astype(F32)
            b = rng.standard_normal(shape[-1]).astype(F32) if bias else None
            want = ref(x, w, b)
            case = f"x{list(shape)}{' +bias' if bias else ''}"
            _close(label, case, fast(x, w, b), want)
            part = _member(fast, "fused")
            if part is not None:
                row = np.ascontiguousarray(x.reshape(-1, shape[-1])[-1]).copy()
                part.fn(part.params, row, w, NONE if b is None else b, row)
                _close(label, case + " kernel part", row, want.reshape(-1, shape[-1])[-1])
    big = np.array([[1e4, -1e4, 3e3, 0.0, 1e-30, -2.5e3]], F32)  # large and tiny magnitudes
    _close(label, "extreme x", fast(big, np.ones(6, F32), None), ref(big, np.ones(6, F32), None))


def _rope(label: str, ref_f: Callable, fast_f: Callable) -> None:
    rng = _rng(label)
    name = label.split("=")[1].split(" ")[0]
    for n, heads, hd, n_rot in [(1, 4, 64, 64), (9, 2, 128, 64), (5, 3, 32, 16), (3, 5, 24, 8), (2, 1, 6, 2)]:
        spec = RopeSpec(pairing=name, n_rot=n_rot, freq_base=1e4)
        ref, fast = ref_f(spec, None), fast_f(spec, None)
        pos = np.arange(100, 100 + n)
        case = f"n={n} heads={heads} hd={hd} n_rot={n_rot}"
        cos, sin = ref.cos_sin(pos)
        fcos, fsin = fast.cos_sin(pos)
        _close(label, case + " cos", fcos, cos)
        _close(label, case + " sin", fsin, sin)
        x = rng.standard_normal((n, heads, hd)).astype(F32)
        want = ref(x, cos, sin)
        _close(label, case, fast(x, cos, sin), want)
        part = _member(fast, "fused")
        if part is not None:
            v = x[-1].reshape(-1).copy()
            part.fn(part.params, v, heads, hd, cos[-1], sin[-1])
            _close(label, case + " kernel part", v.reshape(heads, hd), want[-1])
    spec = RopeSpec(pairing=name, n_rot=64, freq_base=1e4)  # far positions, huge values
    ref, fast = ref_f(spec, None), fast_f(spec, None)
    cos, sin = ref.cos_sin(np.arange(65000, 65009))
    x = (rng.standard_normal((9, 2, 128)) * 1e4).astype(F32)
    _close(label, "positions 65000-65008, values ~1e4", fast(x, cos, sin), ref(x, cos, sin))


def _attention_specs(name: str) -> list[Any]:
    """The harness's grid: ragged head counts and widths, GQA/MHA/MQA-like, windows, softcaps, ALiBi."""
    specs = []
    for window, softcap, alibi in ((0, 0.0, 0.0), (5, 3.0, 0.0), (0, 0.0, 8.0), (4, 0.0, 8.0)):
        for heads, kv, hd, vd in ((4, 2, 64, 64), (6, 3, 32, 32), (5, 5, 12, 20), (3, 1, 8, 8)):
            specs.append(AttentionSpec(kind=name, n_head=heads, n_head_kv=kv, head_dim=hd, v_head_dim=vd,
                                       scale=hd ** -0.5, window=window, softcap=softcap, alibi_max_bias=alibi))
    return specs


def _attention(label: str, ref_f: Callable, fast_f: Callable) -> None:
    from archrun.errors import MetadataError

    rng = _rng(label)
    name = label.split("=")[1].split(" ")[0]
    specs = _RUN[-1].specs if _RUN and _RUN[-1].specs else _attention_specs(name)
    ran = 0
    for i, spec in enumerate(specs):
        try:
            ref, fast = ref_f(spec), fast_f(spec)
        except MetadataError:  # the op refuses this configuration (e.g. ALiBi on a rope attention)
            continue
        ran += 1
        n, t0 = ((1, 20), (8, 0), (3, 7), (5, 2))[i % 4]
        _attend_case(label, rng, spec, ref, fast, n, t0, q_scale=2.0)
        _attention_part_cases(label, rng, spec, ref_f, fast_f)
        if i % 4 == 0:  # scores far beyond exp's range: the softmax must subtract its maximum
            _attend_case(label, rng, spec, ref_f(spec), fast_f(spec), 4, 3, q_scale=300.0)
    if not ran:
        raise AssertionError(f"{label}: the op refuses every attention spec of the harness; declare the "
                             "AttentionSpecs it runs on (Conformance(op_specs=...))")


def _attend_case(label: str, rng: np.random.Generator, spec: Any, ref: Any, fast: Any, n: int, t0: int,
                 q_scale: float) -> None:
    heads, kv, hd, vd = spec.n_head, spec.n_head_kv, spec.head_dim, spec.v_head_dim
    rs, fs = ref.new_slot(64, 8), fast.new_slot(64, 8)

    def r(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(F32)

    case = (f"n={n} after {t0} heads={heads}/{kv} hd={hd} vd={vd} window={spec.window} softcap={spec.softcap} "
            f"alibi={spec.alibi_max_bias}{'' if q_scale < 100 else ' huge scores'}")
    if t0:
        prefix = (r(t0, heads, hd), r(t0, kv, hd), r(t0, kv, vd))
        ref(*prefix, rs, 0)
        fast(*prefix, fs, 0)
    q, k, v = r(n, heads, hd, scale=q_scale), r(n, kv, hd), r(n, kv, vd)
    # float32 scores of magnitude s carry ~s * 6e-8 absolute error into exp: a looser bound there
    tolerance = TOLERANCE if q_scale < 100 else 1e-3
    _close(label, case, fast(q, k, v, fs, t0), ref(q, k, v, rs, t0), tolerance)


def _kv_parts(fast: Any) -> list[tuple[str, Any]]:
    """(kv type, Part) of each kernel part of an attention op: ``op.fused`` for float32 caches, and
    ``op.fused_for(kv_type)`` for each other kv type the op stores (``op.kv_types``) that has one
    compiled for ``SIGNATURES["attention:<kv type>"]`` (archrun.kernels.decode.parts); each as the op declares."""
    from archrun.kernels.decode.parts import usable

    out = []
    for kv in _member(fast, "kv_types") or ("f32",):
        if kv == "f32":
            p = usable(_member(fast, "fused"), "attention")
        else:
            make = _member(fast, "fused_for")
            p = usable(make(kv), f"attention:{kv}") if make is not None else None
        if p is not None:
            out.append((kv, p))
    return out


def _attention_part_cases(label: str, rng: np.random.Generator, spec: Any, ref_f: Callable, fast_f: Callable) -> None:
    """The op's kernel part (what the fused decode calls for one token: store the token's K/V at its cache
    row, attend over the visible rows) against the reference op on the same kind of slot: a plain slot,
    and a ring of window + 4 rows for a windowed spec; 21 cached tokens, then 3 decode steps, then a
    rewind of 2 and 2 steps more (a ring then holds rows of positions past the current one)."""
    fast = fast_f(spec)
    if _member(fast, "slot_arrays") is None:
        return
    layouts = [("plain", 64)] + ([("ring", 4)] if spec.window else [])
    for kv, p in _kv_parts(fast):
        for layout, max_rewind in layouts:
            ref, fast = ref_f(spec), fast_f(spec)
            extra = {} if kv == "f32" else {"kv_type": kv}
            rs, fs = ref.new_slot(48, max_rewind, **extra), fast.new_slot(48, max_rewind, **extra)
            _attention_part_run(label, rng, spec, ref, fast, p, rs, fs, f"kernel part, {kv} {layout} slot")


def _attention_part_run(label: str, rng: np.random.Generator, spec: Any, ref: Any, fast: Any, p: Any, rs: Any,
                        fs: Any, what: str) -> None:
    from archrun.kernels.decode.parts import NO_TASK

    heads, kv, hd, vd = spec.n_head, spec.n_head_kv, spec.head_dim, spec.v_head_dim

    def r(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(F32)

    t0 = 21
    prefix = (r(t0, heads, hd) * 2, r(t0, kv, hd), r(t0, kv, vd))
    ref(*prefix, rs, 0)
    fast(*prefix, fs, 0)
    for step, pos in enumerate((t0, t0 + 1, t0 + 2, t0 + 1, t0 + 2)):  # the last two after a rewind of 2
        q, k, v = r(1, heads, hd) * 2, r(1, kv, hd), r(1, kv, vd)
        want = ref(q, k, v, rs, pos)[0]  # [heads, vd]
        kc, vc, kpos, ring = fast.slot_arrays(fs)
        row = pos % kc.shape[0] if ring else pos
        att = np.full(heads * vd, np.nan, F32)
        p.fn(p.params, q.reshape(-1).copy(), k.reshape(-1).copy(), v.reshape(-1).copy(), kc, vc, kpos, bool(ring),
             row, pos, att, *NO_TASK)
        case = (f"{what} heads={heads}/{kv} hd={hd} vd={vd} window={spec.window} softcap={spec.softcap} "
                f"alibi={spec.alibi_max_bias} position {pos}{' after a rewind' if step >= 3 else ''}")
        # the first diverging element is named as [query head, value element]
        _close(label, case, att.reshape(heads, vd), want)


def _activation(label: str, ref_f: Callable, fast_f: Callable) -> None:
    for params in (_RUN[-1].specs if _RUN and _RUN[-1].specs else ({},)):
        named = f"{label} {params}" if params else label
        _activation_cases(named, ref_f(**params), fast_f(**params))


def _activation_cases(label: str, ref: Callable, fast: Callable) -> None:
    from archrun.kernels.decode.parts import is_gated

    part = _member(fast, "fused")
    if part is not None and is_gated(part):
        _gated_activation_cases(label, ref, fast, part)
        return
    rng = _rng(label)
    for shape in [(0, 5), (1, 1), (3, 17), (6, 96), (2, 1001), (2, 3, 5)]:
        g = (rng.standard_normal(shape) * 4).astype(F32)
        u = rng.standard_normal(shape).astype(F32)
        _close(label, f"x{list(shape)}", fast(g), ref(g))
        _close(label, f"x{list(shape)} gated", fast(g, u), ref(g, u))
    _close(label, "extreme values", fast(EXTREMES), ref(EXTREMES))
    wide = (rng.standard_normal((6, 40)) * 8).astype(F32)
    strided = wide[::2, 1::3]
    _close(label, "strided (not contiguous)", fast(strided, strided), ref(strided, strided))
    if part is not None:
        for name, row in (("random row", (rng.standard_normal(97) * 6).astype(F32)), ("extreme values", EXTREMES)):
            out = np.empty_like(row)
            part.fn(part.params, np.ascontiguousarray(row), out)
            _close(label, f"kernel part, {name}", out, ref(row))


def _gated_activation_cases(label: str, ref: Callable, fast: Callable, part: Any) -> None:
    """An activation whose kernel part reads up itself (SIGNATURES["gated"], e.g. a clamped SwiGLU): it runs
    only as act(gate, up), so every case gives up, including gates and ups beyond any clamp and exp's range."""
    rng = _rng(label)
    for shape in [(0, 5), (1, 1), (3, 17), (6, 96), (2, 1001), (2, 3, 5)]:
        g, u = (rng.standard_normal(shape) * 6).astype(F32), (rng.standard_normal(shape) * 6).astype(F32)
        _close(label, f"x{list(shape)} gated", fast(g, u), ref(g, u))
    wide = (rng.standard_normal((6, 40)) * 8).astype(F32)
    g, u = wide[::2, 1::3], wide[1::2, 2::3]
    _close(label, "strided (not contiguous)", fast(g, u), ref(g, u))
    for name, up in (("up in range", np.full_like(EXTREMES, 0.5)), ("up extreme", EXTREMES[::-1].copy())):
        _close(label, f"extreme gates, {name}", fast(EXTREMES, up), ref(EXTREMES, up))
        out = np.full_like(EXTREMES, np.nan)
        part.fn(part.params, EXTREMES.copy(), up, out)
        _close(label, f"kernel part, extreme gates, {name}", out, ref(EXTREMES, up))
    g, u = (rng.standard_normal(97) * 6).astype(F32), (rng.standard_normal(97) * 6).astype(F32)
    out = np.full_like(g, np.nan)
    part.fn(part.params, g, u, out)
    _close(label, "kernel part, random row", out, ref(g, u))


def _residual(label: str, ref_f: Callable, fast_f: Callable) -> None:
    rng = _rng(label)
    for scale in (1.0, 0.37):
        ref, fast = ref_f(scale), fast_f(scale)
        for d in (1, 31, 576):
            x, a, f = (rng.standard_normal((3, d)).astype(F32) for _ in range(3))
            case = f"d={d} scale={scale}"
            _close(label, case + " ffn_input", fast.ffn_input(x, a), ref.ffn_input(x, a))
            _close(label, case + " combine", fast.combine(x, a, f), ref.combine(x, a, f))
            fin, comb = _member(fast, "fused_input"), _member(fast, "fused")
            if fin is not None:
                g = np.empty(d, F32)
                fin.fn(fin.params, x[0].copy(), a[0].copy(), g)
                _close(label, case + " kernel part ffn_input", g, ref.ffn_input(x, a)[0])
            if comb is not None:
                row = x[0].copy()
                comb.fn(comb.params, row, a[0].copy(), f[0].copy())
                _close(label, case + " kernel part combine", row, ref.combine(x, a, f)[0])
        x, a = np.stack([EXTREMES, EXTREMES[::-1], -EXTREMES]), np.stack([EXTREMES[::-1], -EXTREMES, EXTREMES])
        _close(label, f"extreme values scale={scale} ffn_input", fast.ffn_input(x, a), ref.ffn_input(x, a))
        _close(label, f"extreme values scale={scale} combine", fast.combine(x, a, -x), ref.combine(x, a, -x))


def _gating(label: str, ref_f: Callable, fast_f: Callable) -> None:
    ref, fast = ref_f(), fast_f()
    rng = _rng(label)
    for shape in [(1, 1), (1, 8), (5, 64), (3, 7)]:
        logits = (rng.standard_normal(shape) * 3).astype(F32)
        _close(label, f"logits{list(shape)}", fast(logits), ref(logits))
    extreme = np.array([[80.0, -80.0, 0.0, 30.0], [-1e4, 1e4, 0.0, 1.0]], F32)
    _close(label, "extreme logits", fast(extreme), ref(extreme))
    part = _member(fast, "fused")
    if part is not None:
        row = (rng.standard_normal(16) * 3).astype(F32)
        probs = np.empty_like(row)
        part.fn(part.params, row, probs)
        _close(label, "kernel part", probs, ref(row[None])[0])


def _softcap(label: str, ref_f: Callable, fast_f: Callable) -> None:
    rng = _rng(label)
    for cap in (3.0, 30.0):
        ref, fast = ref_f(cap), fast_f(cap)
        for shape in [(1, 1), (4, 96), (2, 1001)]:
            x = (rng.standard_normal(shape) * 20).astype(F32)
            _close(label, f"cap={cap} x{list(shape)}", fast(x.copy()), ref(x.copy()))
        _close(label, f"cap={cap} extreme values", fast(EXTREMES[None].copy()), ref(EXTREMES[None].copy()))


def _installed(slot: str) -> list[Any]:
    from archrun.plugins import default_plugin_manager
    from archrun.vocab import build_vocabulary

    return sorted((e.op for e in build_vocabulary(default_plugin_manager()) if e.op.slot == slot), key=lambda o: o.name)


def _moe_weights(seed: int, spec: Any, d: int, backend: str) -> Any:
    """Random float32 MoeWeights of ``spec`` (router, experts, shared experts) for ``backend``."""
    from archrun.io.weights import Matrix, MoeWeights

    rng = np.random.default_rng(seed)

    def m(n_out: int, n_in: int, scale: float = 0.3) -> Matrix:
        w = (rng.standard_normal((n_out, n_in)) * scale).astype(F32)
        return Matrix(np.ascontiguousarray(w).view(np.uint8), 0, n_in, backend)  # ggml type 0: F32

    e, f, fs = spec.n_expert, spec.n_ff, spec.n_ff_shared
    return MoeWeights(
        gate_inp=m(e, d, 0.5), probs_bias=(rng.standard_normal(e) * 0.1).astype(F32) if spec.router_bias else None,
        gate=[m(f, d) for _ in range(e)], up=[m(f, d) for _ in range(e)], down=[m(d, f) for _ in range(e)],
        shared=(m(fs, d), m(fs, d), m(d, fs)) if spec.n_shared else None)


def _moe(label: str, ref_f: Callable, fast_f: Callable) -> None:
    from archrun.descriptor import MoeSpec

    name = label.split("=")[1].split(" ")[0]
    gatings, acts = _installed("gating"), _installed("activation")
    rng = _rng(label)
    configs = [  # (what, d, spec fields)
        ("top2 of 8, renormalised", 64, dict(n_expert=8, n_expert_used=2, n_ff=32, weights_norm=True)),
        ("top3 of 8 in 2 of 4 groups, scaled, selection bias, shared expert", 128,
         dict(n_expert=8, n_expert_used=3, n_ff=48, weights_norm=True, weights_scale=2.5, n_group=4,
              n_group_used=2, router_bias=True, n_shared=1, n_ff_shared=32)),
        ("top1 of 6, widths off the kernels' lanes", 40,
         dict(n_expert=6, n_expert_used=1, n_ff=24, weights_norm=False)),
    ]
    for i, (what, d, fields) in enumerate(configs):
        for j, gating in enumerate(gatings):
            act = acts[(i + j) % len(acts)]
            spec = MoeSpec(kind=name, activation=act.name, gating=gating.name, **fields)
            ref = ref_f(spec, gating.reference(), act.reference())
            fast = fast_f(spec, gating.factory("fast")(), act.factory("fast")())
            w_ref, w_fast = _moe_weights(i, spec, d, "reference"), _moe_weights(i, spec, d, "fast")
            for n, scale in ((1, 1.0), (5, 1.0), (37, 1.0), (3, 1e3)):
                x = (rng.standard_normal((n, d)) * scale).astype(F32)
                case = f"{what}, d={d}, gating={gating.name}, activation={act.name}, n={n}" + \
                    (", huge x" if scale > 1 else "")
                _close(label, case, fast(x, w_fast), ref(x, w_ref))


_HARNESSES: dict[str, Callable[[str, Callable, Callable], None]] = {
    "norm": _norm, "rope": _rope, "attention": _attention, "activation": _activation, "residual": _residual,
    "gating": _gating, "softcap": _softcap, "moe": _moe,
}
SLOTS_COVERED = tuple(_HARNESSES)
