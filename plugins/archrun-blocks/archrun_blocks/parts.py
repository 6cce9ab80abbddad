"""Kernel parts of archrun-blocks' ops: the math of one token, for the fused decode path.

Each function is compiled with its slot's signature (archrun.kernels.parts.SIGNATURES), so
the core's layer kernel calls it as a first-class function value; the fast ops' op-by-op
paths (archrun_blocks.elementwise) run the same functions over rows, so the numba math of an
op exists once. Parameters arrive as the float64 array `p` (see each function).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from archrun.kernels._jit import JIT
from archrun.kernels.parts import SIGNATURES
from archrun_blocks.decode_attention import attend_biased, attend_one, visible_rows
from archrun_blocks.rotate import rotate_pairs

_F32 = np.float32
_GELU_C = _F32(math.sqrt(2.0 / math.pi))
_SQRT1_2 = 1.0 / math.sqrt(2.0)
# Routing compares scores exactly (no fastmath: ties and infinities behave as in numpy).
_EXACT = dict(cache=True, nogil=True)


# -- norms: p = (eps, weight offset) ---------------------------------------------------------------------------


@njit(SIGNATURES["norm"], **JIT)
def rms_norm(p, x, w, b, out):
    """out = x / sqrt(mean(x^2) + eps) * (w + offset) (+ b); the sum of squares in float64."""
    ss = 0.0
    for i in range(x.shape[0]):
        ss += np.float64(x[i]) * x[i]
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
    s = 0.0
    for i in range(n):
        s += np.float64(x[i])  # float64 in pure Python too (a float32 scalar would win there)
    mean = s / n
    ss = 0.0
    for i in range(n):
        dx = np.float64(x[i]) - mean
        ss += dx * dx
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


# -- attention: p = (scale, window, softcap) ----------------------------------------------------------


@njit(**dict(JIT, inline="always"))
def _store_and_select(k, v, kc, vc, kpos, ring, row, pos, window):
    """Store k [KV * hd] / v [KV * vd] at cache row `row` (a ring slot records its position), then
    (rows, count): the cache rows visible from `pos` (window 0: global)."""
    kc[row] = k.reshape(kc.shape[1], kc.shape[2])
    vc[row] = v.reshape(vc.shape[1], vc.shape[2])
    if ring:
        kpos[row] = pos
    rows = np.empty(kc.shape[0], np.int64)
    return rows, visible_rows(kpos, ring, pos, window, rows)


@njit(SIGNATURES["attention"], **JIT)
def causal_attention(p, q, k, v, kc, vc, kpos, ring, row, pos, out):
    """Store k/v at cache row `row` (ring slots record its position), then causal GQA of q over the
    rows visible from `pos` (window p[1], 0: global), scores scaled by p[0] and capped by p[2] (0: none)."""
    rows, count = _store_and_select(k, v, kc, vc, kpos, ring, row, pos, int(p[1]))
    attend_one(q, kc, vc, rows, count, q.shape[0] // kc.shape[2], p[0], p[2], out)


# -- ALiBi attention: p = (scale, window, softcap, max_bias, n_head, slope_0 .. slope_{n_head-1}) ----------


@njit(SIGNATURES["attention"], **JIT)
def alibi_attention(p, q, k, v, kc, vc, kpos, ring, row, pos, out):
    """causal_attention with ALiBi: query head h adds slope_h * (key position - pos) to its scores (after
    the scale p[0] and the cap p[2]); the slopes follow the fixed fields (reference.alibi_slopes of
    max_bias p[3] and n_head p[4])."""
    hd = kc.shape[2]
    rows, count = _store_and_select(k, v, kc, vc, kpos, ring, row, pos, int(p[1]))
    dist = np.empty(count, _F32)
    for j in range(count):  # a ring row holds position kpos[row]; a plain row r holds position r
        dist[j] = _F32((kpos[rows[j]] if ring else rows[j]) - pos)
    n_head = q.shape[0] // hd
    attend_biased(q, kc, vc, rows, count, n_head, p[0], p[2], p[5:5 + n_head], dist, out)


# -- activations: p unused -------------------------------------------------------------------------


@njit(SIGNATURES["activation"], **JIT)
def silu(p, x, out):
    """out = x / (1 + exp(-x)); -0 below x = -88 (exp(-x) would overflow float32, and fastmath assumes no
    infinities: x / (1 + inf) came out NaN; x e^x is below 1e-36 there)."""
    for i in range(x.shape[0]):
        g = x[i]
        e = np.exp(min(-g, _F32(88.0)))  # the same value for every x above -88
        out[i] = g / (_F32(1.0) + e) if g > _F32(-88.0) else _F32(-0.0)


@njit(SIGNATURES["activation"], **JIT)
def gelu_tanh(p, x, out):
    """out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    for i in range(x.shape[0]):
        g = x[i]
        out[i] = _F32(0.5) * g * (_F32(1.0) + np.tanh(_GELU_C * (g + _F32(0.044715) * g * g * g)))


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
