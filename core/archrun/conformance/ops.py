"""Every fast op equals its reference: random shapes (ragged sizes, extreme values), op by op and through
its kernel part (what the fused decode path calls for one token), for any registered vocabulary entry.

``check_fast_op(entry)`` drives one ``archrun.vocab.Entry`` through its slot's contract
(archrun.vocab) and raises AssertionError naming the op, the input case and the first element
where fast and reference differ.
"""

from __future__ import annotations

from collections.abc import Callable
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


def _close(label: str, case: str, got: Any, want: Any, tolerance: float = TOLERANCE) -> None:
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


def check_fast_op(entry: Any) -> None:
    """Assert the fast factory of ``entry`` agrees with its reference (see the module docstring)."""
    op = entry.op
    label = f"{op.slot}={op.name} ({entry.plugin})"
    if op.fast is None:
        return
    harness = _HARNESSES.get(op.slot)
    if harness is None:
        raise Unsupported(f"no kit harness for slot {op.slot!r}")
    harness(label, op.reference, op.fast)


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
            part = getattr(fast, "fused", None)
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
        part = getattr(fast, "fused", None)
        if part is not None:
            v = x[-1].reshape(-1).copy()
            part.fn(part.params, v, heads, hd, cos[-1], sin[-1])
            _close(label, case + " kernel part", v.reshape(heads, hd), want[-1])


def _attention(label: str, ref_f: Callable, fast_f: Callable) -> None:
    rng = _rng(label)
    name = label.split("=")[1].split(" ")[0]
    for window, softcap in ((0, 0.0), (5, 3.0)):
        for n, t0, heads, kv, hd, vd in [(1, 20, 4, 2, 64, 64), (8, 0, 6, 3, 32, 32), (3, 7, 5, 5, 12, 20)]:
            spec = AttentionSpec(kind=name, n_head=heads, n_head_kv=kv, head_dim=hd, v_head_dim=vd,
                                 scale=hd ** -0.5, window=window, softcap=softcap, alibi_max_bias=8.0)
            ref, fast = ref_f(spec), fast_f(spec)
            rs, fs = ref.new_slot(64, 8), fast.new_slot(64, 8)

            def r(*shape: int, scale: float = 1.0) -> np.ndarray:
                return (rng.standard_normal(shape) * scale).astype(F32)

            case = f"n={n} after {t0} heads={heads}/{kv} hd={hd} vd={vd} window={window} softcap={softcap}"
            if t0:
                prefix = (r(t0, heads, hd), r(t0, kv, hd), r(t0, kv, vd))
                ref(*prefix, rs, 0)
                fast(*prefix, fs, 0)
            q, k, v = r(n, heads, hd, scale=2.0), r(n, kv, hd), r(n, kv, vd)
            _close(label, case, fast(q, k, v, fs, t0), ref(q, k, v, rs, t0))


def _activation(label: str, ref_f: Callable, fast_f: Callable) -> None:
    ref, fast = ref_f(), fast_f()
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
    part = getattr(fast, "fused", None)
    if part is not None:
        for name, row in (("random row", (rng.standard_normal(97) * 6).astype(F32)), ("extreme values", EXTREMES)):
            out = np.empty_like(row)
            part.fn(part.params, np.ascontiguousarray(row), out)
            _close(label, f"kernel part, {name}", out, ref(row))


def _residual(label: str, ref_f: Callable, fast_f: Callable) -> None:
    rng = _rng(label)
    for scale in (1.0, 0.37):
        ref, fast = ref_f(scale), fast_f(scale)
        for d in (1, 31, 576):
            x, a, f = (rng.standard_normal((3, d)).astype(F32) for _ in range(3))
            case = f"d={d} scale={scale}"
            _close(label, case + " ffn_input", fast.ffn_input(x, a), ref.ffn_input(x, a))
            _close(label, case + " combine", fast.combine(x, a, f), ref.combine(x, a, f))
            fin, comb = getattr(fast, "fused_input", None), getattr(fast, "fused", None)
            if fin is not None:
                g = np.empty(d, F32)
                fin.fn(fin.params, x[0].copy(), a[0].copy(), g)
                _close(label, case + " kernel part ffn_input", g, ref.ffn_input(x, a)[0])
            if comb is not None:
                row = x[0].copy()
                comb.fn(comb.params, row, a[0].copy(), f[0].copy())
                _close(label, case + " kernel part combine", row, ref.combine(x, a, f)[0])


def _gating(label: str, ref_f: Callable, fast_f: Callable) -> None:
    ref, fast = ref_f(), fast_f()
    rng = _rng(label)
    for shape in [(1, 1), (1, 8), (5, 64), (3, 7)]:
        logits = (rng.standard_normal(shape) * 3).astype(F32)
        _close(label, f"logits{list(shape)}", fast(logits), ref(logits))
    extreme = np.array([[80.0, -80.0, 0.0, 30.0], [-1e4, 1e4, 0.0, 1.0]], F32)
    _close(label, "extreme logits", fast(extreme), ref(extreme))
    part = getattr(fast, "fused", None)
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


_HARNESSES: dict[str, Callable[[str, Callable, Callable], None]] = {
    "norm": _norm, "rope": _rope, "attention": _attention, "activation": _activation, "residual": _residual,
    "gating": _gating, "softcap": _softcap,
}
SLOTS_COVERED = tuple(_HARNESSES)
