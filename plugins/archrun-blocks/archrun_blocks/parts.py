"""Kernel parts of archrun-blocks' ops: the math of one token, for the fused decode path.

Each function is compiled with its slot's signature (archrun.kernels.decode.parts.SIGNATURES), so
the core's layer kernel calls it as a first-class function value; the fast ops' op-by-op
paths (archrun_blocks.elementwise) run the same functions over rows, so the numba math of an
op exists once. Parameters arrive as the float64 array `p` (see each function).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from archrun.kernels._jit import JIT
from archrun.kernels.decode.parts import SIGNATURES
from archrun_blocks.decode_attention import attend_split, split_sinks, visible_rows
from archrun_blocks.kv_codec import store_row, values_per_row
from archrun_blocks.rotate import rotate_pairs

_F32 = np.float32
_GELU_C = _F32(math.sqrt(2.0 / math.pi))
_SQRT1_2 = 1.0 / math.sqrt(2.0)
_LOG2E = _F32(1.4426950408889634)
_LN2_HI = _F32(0.693359375)        # ln 2 split so that n * _LN2_HI is exact for |n| < 2^9
_LN2_LO = _F32(-2.12194440e-4)
# Routing compares scores exactly (no fastmath: ties and infinities behave as in numpy).
_EXACT = dict(cache=True, nogil=True)
_NO_SLOPES, _NO_DIST = np.empty(0, np.float64), np.empty(0, _F32)  # attention without ALiBi biases


# -- norms: p = (eps, weight offset) ---------------------------------------------------------------------------


@njit(**dict(JIT, inline="always"))
def _sum64(x, mean, square):
    """sum of (x[i] - mean) (squared when `square`) in float64, in a stated order: element i goes to lane
    i % 8, the 8 lanes are summed as ((0+1)+(2+3))+((4+5)+(6+7)), then the tail in element order. Eight
    independent chains (which LLVM vectorises without reassociating) instead of one ~8x slower chain."""
    n = x.shape[0]
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0
    end = n - n % 8
    for i in range(0, end, 8):
        v0, v1, v2, v3 = np.float64(x[i]) - mean, np.float64(x[i + 1]) - mean, np.float64(x[i + 2]) - mean, \
            np.float64(x[i + 3]) - mean
        v4, v5, v6, v7 = np.float64(x[i + 4]) - mean, np.float64(x[i + 5]) - mean, np.float64(x[i + 6]) - mean, \
            np.float64(x[i + 7]) - mean
        if square:
            v0, v1, v2, v3, v4, v5, v6, v7 = v0 * v0, v1 * v1, v2 * v2, v3 * v3, v4 * v4, v5 * v5, v6 * v6, v7 * v7
        a0 += v0
        a1 += v1
        a2 += v2
        a3 += v3
        a4 += v4
        a5 += v5
        a6 += v6
        a7 += v7
    s = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))
    for i in range(end, n):
        v = np.float64(x[i]) - mean
        s += v * v if square else v
    return s


@njit(SIGNATURES["norm"], **JIT)
def rms_norm(p, x, w, b, out):
    """out = x / sqrt(mean(x^2) + eps) * (w + offset) (+ b); the sum of squares in float64 (`_sum64`)."""
    ss = _sum64(x, 0.0, True)
    r = _F32(1.0 / math.sqrt(ss / x.shape[0] + p[0]))
    off = _F32(p[1])
    for i in range(x.shape[0]):
        out[i] = x[i] * r * (w[i] + off)
    for i in range(b.shape[0]):
        out[i] += b[i]


@njit(SIGNATURES["norm"], **JIT)
def layer_norm(p, x, w, b, out):
    """out = (x - mean(x)) / sqrt(var(x) + eps) * (w + offset) (+ b); mean and variance in float64."""
    n = x.shape[0]
    mean = _sum64(x, 0.0, False) / n  # float64 in pure Python too (a float32 scalar would win there)
    ss = _sum64(x, mean, True)
    r = 1.0 / math.sqrt(ss / n + p[0])
    off = _F32(p[1])
    for i in range(n):
        out[i] = _F32((x[i] - mean) * r) * (w[i] + off)
    for i in range(b.shape[0]):
        out[i] += b[i]


# -- rotary embedding: p = (n_rot, neox) -----------------------------------------------------------


@njit(SIGNATURES["rope"], **JIT)
def rope(p, v, n_head, hd, cos, sin):
    """Rotate the first n_rot dims of every head of v [n_head * hd] in place (NEOX or NORM pairs)."""
    n_rot, neox = int(p[0]), p[1] != 0.0
    for h in range(n_head):
        xi = v[h * hd:(h + 1) * hd]
        rotate_pairs(xi, xi, n_rot, neox, cos, sin)


# -- attention: p = (scale, window, softcap[, sink_0 .. sink_{H-1}]) -----------------------------------------


@njit(**dict(JIT, inline="always"))
def _store_and_select(k, v, kc, vc, kpos, ring, row, pos, window):
    """Store k [KV * hd] / v [KV * vd] at cache row `row` in the cache's kv type (a ring slot records
    its position), then (rows, count): the cache rows visible from `pos` (window 0: global)."""
    n_kv = kc.shape[1]
    hd, vd = k.shape[0] // n_kv, v.shape[0] // n_kv
    for h in range(n_kv):
        store_row(k[h * hd:(h + 1) * hd], kc[row, h])
        store_row(v[h * vd:(h + 1) * vd], vc[row, h])
    if ring:
        kpos[row] = pos
    rows = np.empty(kc.shape[0], np.int64)
    return rows, visible_rows(kpos, ring, pos, window, rows)


@njit(**dict(JIT, inline="always"))
def causal(p, q, k, v, kc, vc, kpos, ring, row, pos, out, ctrl, task):
    """causal_attention over a cache of any kv type (archrun_blocks.kv_codec; compiled per cache dtype)."""
    rows, count = _store_and_select(k, v, kc, vc, kpos, ring, row, pos, int(p[1]))
    n_head = q.shape[0] // values_per_row(kc)
    # shared with the decode pool when one runs (by kv head; past SPLIT_MIN_ROWS rows also by chunks of keys)
    if p.shape[0] > 3:  # learned sink logits (gpt-oss): p[3:3 + n_head]
        split_sinks(q, kc, vc, rows, count, n_head, p[0], p[2], _NO_SLOPES, _NO_DIST, p[3:3 + n_head], out, ctrl,
                    task)
    else:
        attend_split(q, kc, vc, rows, count, n_head, p[0], p[2], np.empty(0, np.float64),
                     np.empty(0, _F32), out, ctrl, task)


@njit(**dict(JIT, inline="always"))
def alibi(p, q, k, v, kc, vc, kpos, ring, row, pos, out, ctrl, task):
    """alibi_attention over a cache of any kv type (compiled per cache dtype)."""
    rows, count = _store_and_select(k, v, kc, vc, kpos, ring, row, pos, int(p[1]))
    dist = np.empty(count, _F32)
    for j in range(count):  # a ring row holds position kpos[row]; a plain row r holds position r
        dist[j] = _F32((kpos[rows[j]] if ring else rows[j]) - pos)
    n_head = q.shape[0] // values_per_row(kc)
    attend_split(q, kc, vc, rows, count, n_head, p[0], p[2], p[5:5 + n_head], dist, out, ctrl, task)


@njit(SIGNATURES["attention"], **JIT)
def causal_attention(p, q, k, v, kc, vc, kpos, ring, row, pos, out, ctrl, task):
    """Store k/v at cache row `row` (ring slots record its position), then causal GQA of q over the
    rows visible from `pos` (window p[1], 0: global), scores scaled by p[0] and capped by p[2] (0: none);
    with p[3:] (one per query head) each head's softmax also counts that sink logit
    (decode_attention.attend_sinks).
    Shared with the decode pool ctrl as its task `task` by kv head, and over more than SPLIT_MIN_ROWS rows the
    keys go in chunks (archrun_blocks.decode_attention.attend_split). The parts of other kv types are in
    archrun_blocks.kv_parts."""
    causal(p, q, k, v, kc, vc, kpos, ring, row, pos, out, ctrl, task)


# -- ALiBi attention: p = (scale, window, softcap, max_bias, n_head, slope_0 .. slope_{n_head-1}) ----------


@njit(SIGNATURES["attention"], **JIT)
def alibi_attention(p, q, k, v, kc, vc, kpos, ring, row, pos, out, ctrl, task):
    """causal_attention with ALiBi: query head h adds slope_h * (key position - pos) to its scores (after
    the scale p[0] and the cap p[2]); the slopes follow the fixed fields (reference.alibi_slopes of
    max_bias p[3] and n_head p[4])."""
    alibi(p, q, k, v, kc, vc, kpos, ring, row, pos, out, ctrl, task)


# -- activations: p unused (but by swiglu_oai) -----------------------------------------------------------


@njit(**dict(JIT, inline="always"))
def _exp_pieces(y):
    """exp(y) = e * 2^n for y clamped to [-87, 87] (normal float32 either way): (e, 2^n's float32 bits).

    n = round(y / ln 2), r = y - n ln 2 (|r| <= ln 2 / 2, Cody-Waite split), e = e^r by its degree-6
    Taylor polynomial: relative error < 5e-7. Unlike libm's expf (a call per element), loops over this
    vectorise; 2^n is built in the exponent bits (the caller views the returned int32 as float32).
    """
    y = min(max(y, _F32(-87.0)), _F32(87.0))
    n = np.floor(y * _LOG2E + _F32(0.5))
    r = (y - n * _LN2_HI) - n * _LN2_LO
    e = _F32(1.0) + r * (_F32(1.0) + r * (_F32(0.5) + r * (_F32(1.0 / 6) + r * (
        _F32(1.0 / 24) + r * (_F32(1.0 / 120) + r * _F32(1.0 / 720))))))
    return e, (np.int32(n) + np.int32(127)) << np.int32(23)


@njit(**dict(JIT, inline="always"))
def _x_sigmoid(x, out, c1, c3):
    """out = x / (1 + exp(-(c1 x + c3 x^3))) = x sigmoid(c1 x + c3 x^3); out may be x.

    Two vectorised loops: the exponentials' pieces into scratch, then the quotient (reading x[i]
    before writing out[i]). Below the clamp (c1 x + c3 x^3 < -87) the result is x / (1 + e^87), as
    negligible as the exact one (< 1e-37 |x|); fastmath never meets an infinity.
    """
    n = x.shape[0]
    e = np.empty(n, _F32)
    bits = np.empty(n, np.int32)
    for i in range(n):
        g = x[i]
        e[i], bits[i] = _exp_pieces(-(c1 * g + c3 * g * g * g))
    two_n = bits.view(np.float32)
    for i in range(n):
        out[i] = x[i] / (_F32(1.0) + e[i] * two_n[i])


@njit(SIGNATURES["activation"], **JIT)
def silu(p, x, out):
    """out = x / (1 + exp(-x)) (exp by a vectorised polynomial: see _exp_pieces)."""
    _x_sigmoid(x, out, _F32(1.0), _F32(0.0))


@njit(SIGNATURES["activation"], **JIT)
def gelu_tanh(p, x, out):
    """out = 0.5 x (1 + tanh(t)), t = sqrt(2/pi) (x + 0.044715 x^3), computed as x sigmoid(2t) (the same
    function: 0.5 (1 + tanh t) = sigmoid(2t)), whose exp vectorises where tanhf is a call per element."""
    _x_sigmoid(x, out, _F32(2.0) * _GELU_C, _F32(2.0) * _GELU_C * _F32(0.044715))


@njit(SIGNATURES["activation"], **JIT)
def gelu(p, x, out):
    """out = 0.5 x (1 + erf(x / sqrt 2)) (exact GELU)."""
    for i in range(x.shape[0]):
        g = x[i]
        out[i] = _F32(0.5 * g * (1.0 + math.erf(g * _SQRT1_2)))


@njit(SIGNATURES["activation"], **JIT)
def relu2(p, x, out):
    """out = max(x, 0)^2."""
    for i in range(x.shape[0]):
        g = max(x[i], _F32(0.0))
        out[i] = g * g


@njit(SIGNATURES["gated"], **JIT)
def swiglu_oai(p, gate, up, out):
    """gpt-oss's clamped SwiGLU, p = (alpha, limit): g = min(gate, limit), u = clip(up, -limit, limit),
    out = g / (1 + exp(-alpha g)) * (u + 1) (exp by the vectorised polynomial, _exp_pieces); out may be gate.
    Gates below -120 count as -120: g sigmoid(alpha g) is below 1e-35 in magnitude there (0 in float32 from
    about -60 on), where exp's clamp at 87 would otherwise leave g / (1 + e^87), up to 5 for g = -3e38."""
    alpha, limit = _F32(p[0]), _F32(p[1])
    n = gate.shape[0]
    g = np.empty(n, _F32)
    e = np.empty(n, _F32)
    bits = np.empty(n, np.int32)
    for i in range(n):
        g[i] = limit if gate[i] > limit else max(gate[i], _F32(-120.0))
        e[i], bits[i] = _exp_pieces(-(alpha * g[i]))
    two_n = bits.view(np.float32)
    for i in range(n):
        u = -limit if up[i] < -limit else (limit if up[i] > limit else up[i])
        out[i] = g[i] / (_F32(1.0) + e[i] * two_n[i]) * (u + _F32(1.0))


# -- residual topologies: p = (residual scale,) --------------------------------------------------------


@njit(SIGNATURES["residual"], **JIT)
def sequential_input(p, x, a, out):
    """The FFN reads the stream after the attention's residual: x + s a."""
    s = _F32(p[0])
    for i in range(x.shape[0]):
        out[i] = x[i] + a[i] * s


@njit(SIGNATURES["residual"], **JIT)
def sequential_combine(p, x, a, f):
    """x <- (x + s a) + s f."""
    s = _F32(p[0])
    for i in range(x.shape[0]):
        x[i] = (x[i] + a[i] * s) + f[i] * s


@njit(SIGNATURES["residual"], **JIT)
def parallel_input(p, x, a, out):
    """Attention and FFN both read the block's input x."""
    out[:] = x


@njit(SIGNATURES["residual"], **JIT)
def parallel_combine(p, x, a, f):
    """x <- x + s (a + f)."""
    s = _F32(p[0])
    for i in range(x.shape[0]):
        x[i] = x[i] + (a[i] + f[i]) * s


# -- MoE gating: p unused -----------------------------------------------------------------------------


@njit(SIGNATURES["gating"], **_EXACT)
def gating_softmax(p, logits, probs):
    """probs = softmax(logits) in float32 after max subtraction."""
    m = logits[0]
    for e in range(logits.shape[0]):
        m = max(m, logits[e])
    s = _F32(0.0)
    for e in range(logits.shape[0]):
        probs[e] = np.exp(logits[e] - m)
        s += probs[e]
    for e in range(logits.shape[0]):
        probs[e] = probs[e] / s


@njit(SIGNATURES["gating"], **_EXACT)
def gating_sigmoid(p, logits, probs):
    """probs = 1 / (1 + exp(-logits)), per expert."""
    for e in range(logits.shape[0]):
        probs[e] = _F32(1.0) / (_F32(1.0) + np.exp(-logits[e]))


@njit(**_EXACT)
def _sparsemixer_weight(logits, excluded, best, gap):
    """softmax at `best` over the experts (other than `excluded`) within the relative gap of logits[best]."""
    top = logits[best]
    s = _F32(0.0)
    for e in range(logits.shape[0]):
        factor = max(abs(logits[e]), top)  # 0 only where logits[e] = top = 0: kept (HF's 0/0 is nan)
        if e != excluded and (factor == 0 or not ((top - logits[e]) / factor > gap)):
            s += np.exp(logits[e] - top)
    return _F32(1.0) / s


@njit(SIGNATURES["gating"], **_EXACT)
def gating_sparsemixer(p, logits, probs):
    """PhiMoE's sparsemixer (reference.gating_sparsemixer): the best and second-best experts get their
    masked-softmax weights, every other expert 0; p[0] = jitter eps."""
    gap = _F32(2.0 * p[0])
    first = 0
    for e in range(logits.shape[0]):
        probs[e] = _F32(0.0)
        if logits[e] > logits[first]:
            first = e
    probs[first] = _sparsemixer_weight(logits, -1, first, gap)
    if logits.shape[0] > 1:
        second = 1 if first == 0 else 0
        for e in range(logits.shape[0]):
            if e != first and logits[e] > logits[second]:
                second = e
        probs[second] = _sparsemixer_weight(logits, first, second, gap)
