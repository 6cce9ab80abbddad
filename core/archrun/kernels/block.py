"""One decoder block for one token in one jitted call: the decode fast path.

`decode_block` runs the interpreter's generic block (archrun.model.Interpreter.run_block) for a
single token, with every step inside one numba function: RMSNorm, the q/k/v products from
8-bit-quantized activations, per-head q/k norms, rotary embedding, the K/V cache write,
causal (optionally windowed) grouped-query attention over the cached rows, the output
product, optional post-norms, the residuals, and the gated FFN. The per-token Python work is
one call per layer, with no allocation outside the kernel.

What the block computes is data, given by the ops bound to the layer (their `kernel`
descriptions: NormKernel, RopeKernel, AttentionKernel, ActKernel) and by the weights:

- every matrix is passed as a *uniform matrix* (`uniform(qmatrix, bias)`): one tuple type for
  every quantization, so one compiled kernel serves every model; the kind field selects the
  product kernel at run time (dots.py for quantized types, floatmm.py for 16-bit floats, a
  float32 dot for dense float32);
- absent optional vectors (q/k norms, post-norms, biases) are empty arrays.

The numerics are those of the op-by-op fast path: activations are quantized once per product
exactly as kernels.matmul does for one token, norms sum squares in float64, softmax runs in
float32 after max subtraction.

Validation happens when the block is built (FusedBlock in archrun.fusion) and per call on
the few per-token values (cache row, position); the kernels do not bounds-check.
"""

from __future__ import annotations

import math

import attrs
import numpy as np
from numba import njit, prange

from archrun.kernels import atomics, dots, floatmm, pool
from archrun.kernels._jit import JIT, JIT_PAR, LANES, QB
from archrun.kernels.decode_attention import attend_one, visible_rows
from archrun.kernels.elementwise import rotate_pairs
from archrun.kernels.qmatrix import BF16, F16, QMatrix

_F32 = np.float32
# Small steps are inlined into their callers at numba IR level: every separately compiled
# function that calls the product kernels re-optimizes all of them when it is linked
# (measured: ~5-20 s of cold compile per level).
_STEP = dict(JIT, inline="always")

# Activation kinds of the gated FFN (ActKernel.kind).
ACT_SWIGLU, ACT_GEGLU_TANH = 0, 1
_GELU_C = _F32(math.sqrt(2.0 / math.pi))


# -- what a bound op tells the fused block (the op's `kernel` attribute) -------------------------


@attrs.frozen
class NormKernel:
    """An RMSNorm op: x / sqrt(mean(x^2) + eps) * w."""

    eps: float


@attrs.frozen
class RopeKernel:
    """A rotary op on the first n_rot dims of each head; neox pairs (i, i + n_rot/2), else (2i, 2i+1)."""

    n_rot: int
    neox: bool


@attrs.frozen
class AttentionKernel:
    """Causal grouped-query attention with softmax scale and optional window (0: global).

    slot_arrays(slot) -> (k [cap, KV, hd], v [cap, KV, vd], pos int64 [cap], ring: bool):
    the cache arrays of one of the op's slots; a ring slot keeps each row's position in pos
    (-1: empty) and stores position p at row p % cap; a plain slot stores p at row p.
    """

    scale: float
    window: int
    slot_arrays: object = attrs.field(eq=False, repr=False)


@attrs.frozen
class ActKernel:
    """A gated FFN activation: ACT_SWIGLU or ACT_GEGLU_TANH."""

    kind: int

# Uniform matrix fields: (kind, wu16, wi8, wu8, wh, wf, d, m, scu, sci, mn, bias, n_out)
# kind: the ggml type, or 0 for a dense float32 matrix wf [n_out, n_in].
_KIND, _WU16, _WI8, _WU8, _WH, _WF, _D, _M, _SCU, _SCI, _MN, _BIAS, _NOUT = range(13)


def _ro(a: np.ndarray) -> np.ndarray:
    """A read-only view (one array type per field, whatever the source's flags)."""
    v = a.view()
    v.flags.writeable = False
    return v


def _empty(dtype, ndim: int) -> np.ndarray:
    return _ro(np.empty((0,) * ndim, dtype))


def _rw_empty(dtype, ndim: int) -> np.ndarray:
    return np.empty((0,) * ndim, dtype)


def uniform(w: QMatrix, bias: np.ndarray | None = None) -> tuple:
    """The kernel-side tuple of a prepared matrix (and optional float32 bias [n_out])."""
    f = [_empty(np.uint16, 3), _empty(np.int8, 3), _empty(np.uint8, 3), _rw_empty(np.uint16, 3),
         _empty(np.float32, 2), _empty(np.float32, 3), _empty(np.float32, 3), _empty(np.uint8, 3),
         _empty(np.int8, 3), _empty(np.uint8, 3)]
    kind = w.ggml_type
    a = w.arrays
    if w.dense:
        kind, f[4] = 0, _ro(a[0])
    elif kind in (F16, BF16):
        f[3] = a[0]  # writable: read-only 16-bit lanes compile to a slower kernel
    elif kind == 8:  # Q8_0: int8 fields
        f[1], f[5] = _ro(a[0]), _ro(a[1])
    elif kind == 14:  # Q6_K: byte fields, int8 sub-scales
        f[2], f[5], f[8] = _ro(a[0]), _ro(a[1]), _ro(a[2])
    elif kind == 11:  # Q3_K: int8 sub-scales
        f[0], f[5], f[8] = _ro(a[0]), _ro(a[1]), _ro(a[2])
    elif kind in (10, 12, 13):  # Q2_K, Q4_K, Q5_K: d, dmin, scales, mins
        f[0], f[5], f[6], f[7], f[9] = (_ro(x) for x in a)
    elif kind in (3, 7):  # Q4_1, Q5_1: d, m
        f[0], f[5], f[6] = (_ro(x) for x in a)
    else:  # Q4_0, Q5_0: d
        f[0], f[5] = (_ro(x) for x in a)
    b = _ro(np.ascontiguousarray(bias, dtype=np.float32)) if bias is not None else _empty(np.float32, 1)
    return (np.int64(kind), *f, b, np.int64(w.n_out))


def absent_matrix() -> tuple:
    """A uniform matrix with no rows (an unused slot of a product group)."""
    f = [_empty(np.uint16, 3), _empty(np.int8, 3), _empty(np.uint8, 3), _rw_empty(np.uint16, 3),
         _empty(np.float32, 2), _empty(np.float32, 3), _empty(np.float32, 3), _empty(np.uint8, 3),
         _empty(np.int8, 3), _empty(np.uint8, 3)]
    return (np.int64(-1), *f, _empty(np.float32, 1), np.int64(0))


# -- products -----------------------------------------------------------------------------------


@njit(**_STEP)
def _groups(m):
    """Row groups of LANES rows of a uniform matrix."""
    return (m[_NOUT] + LANES - 1) // LANES


@njit(**_STEP)
def _dense_rows(W, xf, g0, g1, out):
    """out[t, r] = W[r] . xf[t] for every token t and the rows of groups [g0, g1)."""
    r1 = min(g1 * LANES, W.shape[0])
    for t in range(xf.shape[0]):
        x = xf[t]
        for r in range(g0 * LANES, r1):
            w = W[r]
            s = _F32(0.0)
            for e in range(w.shape[0]):
                s += w[e] * x[e]
            out[t, r] = s


@njit(**JIT)
def _mv(m, xf, X, DX, QH, g0, g1, out):
    """Rows of groups [g0, g1) of out [n, n_out] = x @ m.T (x as float xf [n, n_in] and quantized X/DX/QH)."""
    k = m[_KIND]
    if k == 0:
        _dense_rows(m[_WF], xf, g0, g1, out)
    elif k == F16 or k == BF16:  # noqa: SIM109 (a tuple test compiles to a slower branch chain in numba)
        floatmm.half(m[_WH], k == BF16, xf, g0, g1, out)
    elif k == 2:
        dots.q4_0(m[_WU16], m[_D], X, DX, QH, g0, g1, out)
    elif k == 3:
        dots.q4_1(m[_WU16], m[_D], m[_M], X, DX, QH, g0, g1, out)
    elif k == 6:
        dots.q5_0(m[_WU16], m[_D], X, DX, QH, g0, g1, out)
    elif k == 7:
        dots.q5_1(m[_WU16], m[_D], m[_M], X, DX, QH, g0, g1, out)
    elif k == 8:
        dots.q8_0(m[_WI8], m[_D], X, DX, QH, g0, g1, out)
    elif k == 10:
        dots.q2_k(m[_WU16], m[_D], m[_M], m[_SCU], m[_MN], X, DX, QH, g0, g1, out)
    elif k == 11:
        dots.q3_k(m[_WU16], m[_D], m[_SCI], X, DX, QH, g0, g1, out)
    elif k == 12:
        dots.q4_k(m[_WU16], m[_D], m[_M], m[_SCU], m[_MN], X, DX, QH, g0, g1, out)
    elif k == 13:
        dots.q5_k(m[_WU16], m[_D], m[_M], m[_SCU], m[_MN], X, DX, QH, g0, g1, out)
    elif k == 14:
        dots.q6_k(m[_WU8], m[_D], m[_SCI], X, DX, QH, g0, g1, out)


@njit(**_STEP)
def _chunk(m, c, chunks, xf, X, DX, QH, out):
    """Chunk c of `chunks` of m's row groups."""
    ng = _groups(m)
    if ng:
        _mv(m, xf, X, DX, QH, c * ng // chunks, (c + 1) * ng // chunks, out)


@njit(**_STEP)
def _add_bias(m, o):
    b = m[_BIAS]
    for t in range(o.shape[0]):
        for i in range(b.shape[0]):
            o[t, i] += b[i]


@njit(**_STEP)
def _product_range(c, chunks, xf, X, DX, QH, out, kind, wu16, wi8, wu8, wh, wf, d, m, scu, sci, mn, bias, n_out):
    """Chunk c of one matrix given field by field (parallel regions cannot capture tuples of arrays)."""
    _chunk((kind, wu16, wi8, wu8, wh, wf, d, m, scu, sci, mn, bias, n_out), c, chunks, xf, X, DX, QH, out)


@njit(**_STEP)
def _outputs(ms, y):
    """The column blocks of y [n, sum of n_out] that the 3 matrices of ms write."""
    n0, n1, n2 = ms[0][_NOUT], ms[1][_NOUT], ms[2][_NOUT]
    return y[:, :n0], y[:, n0:n0 + n1], y[:, n0 + n1:n0 + n1 + n2]


@njit(**_STEP)
def _group_chunk(ms, c, chunks, xf, X, DX, QH, y):
    """Chunk c of `chunks` of every matrix of the group ms, into y [n, sum of n_out]."""
    o0, o1, o2 = _outputs(ms, y)
    _chunk(ms[0], c, chunks, xf, X, DX, QH, o0)
    _chunk(ms[1], c, chunks, xf, X, DX, QH, o1)
    _chunk(ms[2], c, chunks, xf, X, DX, QH, o2)


@njit(**_STEP)
def _add_biases(ms, y):
    o0, o1, o2 = _outputs(ms, y)
    _add_bias(ms[0], o0)
    _add_bias(ms[1], o1)
    _add_bias(ms[2], o2)


@njit(**JIT_PAR)
def _products(m0, m1, m2, xf, X, DX, QH, y, chunks):
    """y[t] = [m0 @ x[t] | m1 @ x[t] | m2 @ x[t]] (+ biases) for every token t; row groups of all three
    split over `chunks` threads."""
    if chunks == 1:  # no parallel region: no thread wake-up
        _group_chunk((m0, m1, m2), 0, 1, xf, X, DX, QH, y)
    else:
        o0, o1, o2 = _outputs((m0, m1, m2), y)
        a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12 = m0
        b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12 = m1
        c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12 = m2
        for c in prange(chunks):
            _product_range(c, chunks, xf, X, DX, QH, o0, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12)
            _product_range(c, chunks, xf, X, DX, QH, o1, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12)
            _product_range(c, chunks, xf, X, DX, QH, o2, c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12)
    _add_biases((m0, m1, m2), y)


# Weight bytes of a product group below which one thread does it: a parallel region costs
# tens of microseconds of wake-up and join (TBB layer), more than splitting a small group saves.
PARALLEL_MIN_GROUP_BYTES = 2 << 20


@njit(**_STEP)
def _weight_bytes(m):
    """Bytes of m's packed fields (scales left out)."""
    return m[_WU16].size * 2 + m[_WI8].size + m[_WU8].size + m[_WH].size * 2 + m[_WF].size * 4


@njit(**_STEP)
def _group_chunks(ms, chunks):
    """`chunks`, or 1 when the group is too small to pay for a parallel region."""
    if _weight_bytes(ms[0]) + _weight_bytes(ms[1]) + _weight_bytes(ms[2]) < PARALLEL_MIN_GROUP_BYTES:
        return 1
    return chunks


@njit(**_STEP)
def product_rows(ms, xf, y, chunks):
    """y[t] = [m @ xf[t] for m in ms] (3 uniform matrices, absent ones empty) for xf f32 [n, n_in]
    (C-contiguous), y f32 [n, sum of n_out]; xf is quantized once (8-bit blocks) when n_in allows."""
    n, n_in = xf.shape
    if n_in % QB == 0:
        X, DX, QH = dots._quantized(xf)
    else:  # only float kernels take such widths (checked when the block is built)
        X = np.empty((n, 0, QB), np.int16)
        DX = np.empty((n, 0), np.float32)
        QH = np.empty((n, 0, 2), np.int16)
    _products(ms[0], ms[1], ms[2], xf, X, DX, QH, y, _group_chunks(ms, chunks))


# -- products shared with the decode worker pool (kernels.pool) ---------------------------------
# Weight bytes from which a one-token product goes to the pool, and per chunk of it: a hand-off
# costs ~0.1 us, a chunk of 16 KiB ~1-2 us of one thread's streaming.
POOL_MIN_GROUP_BYTES = 48 << 10
POOL_CHUNK_BYTES = 16 << 10


@njit(**_STEP)
def _group_bytes(ms):
    return _weight_bytes(ms[0]) + _weight_bytes(ms[1]) + _weight_bytes(ms[2])


@njit(**_STEP)
def _pool_chunks(ms, threads):
    """Chunks of a pooled product: ~POOL_CHUNK_BYTES each, 1-4 per thread."""
    return max(threads, min(4 * threads, _group_bytes(ms) // POOL_CHUNK_BYTES, pool.MAX_CHUNKS))


@njit(**_STEP)
def _pool_views(par, n, n_in, n_total):
    """The pool's shared buffers as this job's activation xf [n, n_in], its quantized blocks and
    output y [n, n_total]."""
    ctrl, pxf, xq, dq, hq, py = par
    X, DX, QH = pool.quantized_views(xq, dq, hq, n, n_in)
    return pxf[:n * n_in].reshape((n, n_in)), X, DX, QH, py[:n * n_total].reshape((n, n_total))


@njit(**_STEP)
def _pool_fits(par, gid, ms, xf, y):
    """Whether this product goes to the running pool `par`: a known group, big enough, buffers large enough."""
    ctrl, pxf, py = par[0], par[1], par[5]
    return (gid >= 0 and pool.active(ctrl) and _group_bytes(ms) >= POOL_MIN_GROUP_BYTES
            and xf.size <= pxf.shape[0] and y.size <= py.shape[0])


@njit(**_STEP)
def _pooled_rows(par, gid, ms, xf, y):
    """product_rows of group `gid` (= ms) with its chunks shared with the pool's workers."""
    ctrl = par[0]
    n, n_in = xf.shape
    nch = _pool_chunks(ms, ctrl[pool.THREADS])
    xs, X, DX, QH, ys = _pool_views(par, n, n_in, y.shape[1])
    xs[:] = xf
    if X.shape[1]:
        dots.quantize_act(xs, X, DX, QH)
    pool.publish(ctrl, gid, nch, n, n_in)
    while True:
        c, w = pool.claim(ctrl)
        if c == -1:
            break
        if c >= 0:
            _group_chunk(ms, c, nch, xs, X, DX, QH, ys)
            pool.done(ctrl)
    pool.wait_done(ctrl, nch)
    y[:] = ys
    _add_biases(ms, y)


@njit(**JIT)
def serve(ctrl, groups, pxf, xq, dq, hq, py, idle_ticks, idle_spins):
    """A pool worker: compute claimed chunks of published jobs (groups[gid]: 3 uniform matrices)
    until the pool says sleep, or no job came for idle_ticks time-stamp ticks (or idle_spins spins)."""
    par = (ctrl, pxf, xq, dq, hq, py)
    idle = 0
    last = atomics.ticks()
    while idle < idle_spins and atomics.ticks() - last <= idle_ticks:
        c, w = pool.claim(ctrl)
        if c >= 0:
            ms = groups[pool.job_group(w)]
            n_total = ms[0][_NOUT] + ms[1][_NOUT] + ms[2][_NOUT]
            xs, X, DX, QH, ys = _pool_views(par, atomics.load(ctrl, pool.N), atomics.load(ctrl, pool.N_IN), n_total)
            _group_chunk(ms, c, pool.job_chunks(w), xs, X, DX, QH, ys)
            pool.worker_done(ctrl)
            idle = 0
            last = atomics.ticks()
        elif c == -1:
            if pool.should_sleep(ctrl):
                return
            atomics.pause()
            idle += 1


@njit(**_STEP)
def _product_group(par, gid, ms, x, y, chunks):
    """y[:] = [m @ x for m in ms] for one token x f32 [n_in] (see product_rows); group `gid` of the
    running pool `par` shares the work with its workers."""
    xf, yf = x.reshape(1, x.shape[0]), y.reshape(1, y.shape[0])
    if _pool_fits(par, gid, ms, xf, yf):
        _pooled_rows(par, gid, ms, xf, yf)
    else:
        product_rows(ms, xf, yf, chunks)


@njit(**JIT)
def pooled_product(par, gid, ms, xf, y, chunks):
    """y f32 [n, sum of n_out] = product_rows(ms, xf, ...), through the running pool `par` when it fits
    (the entry for products outside the fused blocks, e.g. the output head)."""
    if _pool_fits(par, gid, ms, xf, y):
        _pooled_rows(par, gid, ms, xf, y)
    else:
        product_rows(ms, xf, y, chunks)


# -- elementwise steps ------------------------------------------------------------------------


@njit(**_STEP)
def _rms(x, w, eps, out):
    """out = x / sqrt(mean(x^2) + eps) * w (sum of squares in float64, as kernels.rms_norm)."""
    ss = 0.0
    for i in range(x.shape[0]):
        ss += np.float64(x[i]) * x[i]
    r = _F32(1.0 / math.sqrt(ss / x.shape[0] + eps))
    for i in range(x.shape[0]):
        out[i] = x[i] * r * w[i]


@njit(**_STEP)
def _rms_heads(v, n_head, hd, w, eps):
    """Per-head RMSNorm of v [n_head * hd] in place."""
    for h in range(n_head):
        seg = v[h * hd:(h + 1) * hd]
        _rms(seg, w, eps, seg)


@njit(**_STEP)
def _rope_heads(v, n_head, hd, n_rot, neox, cos, sin):
    """Rotate the first n_rot dims of every head of v [n_head * hd] in place."""
    for h in range(n_head):
        xi = v[h * hd:(h + 1) * hd]
        rotate_pairs(xi, xi, n_rot, neox, cos, sin)


@njit(**_STEP)
def add_residual(x, y, post_norm, eps):
    """x += y, y first RMS-normed in place by post_norm when the block has one (non-empty)."""
    if post_norm.shape[0]:
        _rms(y, post_norm, eps, y)
    for i in range(x.shape[0]):
        x[i] += y[i]


@njit(**_STEP)
def _act(gu, f, kind, out):
    """out[i] = act(gate[i]) * up[i], gate = gu[:f], up = gu[f:2f]."""
    for i in range(f):
        g = gu[i]
        if kind == ACT_SWIGLU:
            a = g / (_F32(1.0) + np.exp(-g))
        else:
            a = _F32(0.5) * g * (_F32(1.0) + np.tanh(_GELU_C * (g + _F32(0.044715) * g * g * g)))
        out[i] = a * gu[f + i]


# -- the block ----------------------------------------------------------------------------------


@njit(**_STEP)
def _attention_part(x, qkv, o_mat, vecs, geo, eps, scale, kc, vc, kpos, ring, row, pos, cos, sin, chunks, par):
    """x += attention sub-block (pre-norm, q/k/v, q/k norms, rope, cache write, attention, o, post-norm)."""
    n_head, n_kv, hd, vd, n_rot, neox, window = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6]
    attn_norm, q_norm, k_norm, post_attn_norm = vecs[0], vecs[1], vecs[2], vecs[3]
    h = np.empty(x.shape[0], np.float32)
    _rms(x, attn_norm, eps, h)
    nq, nk = n_head * hd, n_kv * hd
    y = np.empty(nq + nk + n_kv * vd, np.float32)
    _product_group(par, geo[9], qkv, h, y, chunks)
    q, k, v = y[:nq], y[nq:nq + nk], y[nq + nk:]
    if q_norm.shape[0]:
        _rms_heads(q, n_head, hd, q_norm, eps)
        _rms_heads(k, n_kv, hd, k_norm, eps)
    if n_rot:
        _rope_heads(q, n_head, hd, n_rot, neox, cos, sin)
        _rope_heads(k, n_kv, hd, n_rot, neox, cos, sin)
    kc[row] = k.reshape(n_kv, hd)
    vc[row] = v.reshape(n_kv, vd)
    if ring:
        kpos[row] = pos
    rows = np.empty(kc.shape[0], np.int64)
    count = visible_rows(kpos, ring, pos, window, rows)
    att = np.empty(n_head * vd, np.float32)
    attend_one(q, kc, vc, rows, count, n_head, scale, att)
    o = np.empty(x.shape[0], np.float32)
    _product_group(par, geo[10], o_mat, att, o, chunks)
    add_residual(x, o, post_attn_norm, eps)


@njit(**_STEP)
def _dense_ffn_part(x, gate_up, down, vecs, geo, eps, chunks, par):
    """x += gated FFN sub-block (pre-norm, gate/up, activation, down, post-norm)."""
    act, n_ff = geo[7], geo[8]
    ffn_norm, post_ffn_norm = vecs[4], vecs[5]
    h = np.empty(x.shape[0], np.float32)
    _rms(x, ffn_norm, eps, h)
    gu = np.empty(2 * n_ff, np.float32)
    _product_group(par, geo[11], gate_up, h, gu, chunks)
    a = np.empty(n_ff, np.float32)
    _act(gu, n_ff, act, a)
    f = np.empty(x.shape[0], np.float32)
    _product_group(par, geo[12], down, a, f, chunks)
    add_residual(x, f, post_ffn_norm, eps)


@njit(**JIT)
def decode_block(x, qkv, o_mat, gate_up, down, vecs, geo, eps, scale, kc, vc, kpos, ring, row, pos, cos, sin,
                 chunks, par):
    """One decoder block with a dense gated FFN on one token; x f32 [d] is updated in place.

    Each product group is 3 uniform matrices whose outputs are concatenated, absent ones
    padding: qkv (q, k, v) or (stacked q|k|v, -, -); o_mat (o, -, -); gate_up (gate, up, -) or
    (stacked gate|up, -, -); down (down, -, -).
    vecs: (attn_norm, q_norm, k_norm, post_attn_norm, ffn_norm, post_ffn_norm) float32, empty
    when absent. geo: (n_head, n_kv, head_dim, v_head_dim, n_rot, neox, window, act, n_ff, and the
    pool group ids of qkv, o_mat, gate_up, down: -1 for none).
    The token's K/V go to cache row `row` of kc [cap, KV, hd] / vc [cap, KV, vd] (ring slots
    also record kpos[row] = pos); cos/sin [n_rot / 2] are the rotary angles at `pos`.
    """
    _attention_part(x, qkv, o_mat, vecs, geo, eps, scale, kc, vc, kpos, ring, row, pos, cos, sin, chunks, par)
    _dense_ffn_part(x, gate_up, down, vecs, geo, eps, chunks, par)


@njit(**JIT)
def decode_layer(x, layers, i, kc, vc, kpos, ring, row, pos, cos, sin, chunks, par):
    """decode_block of layer i, whose (qkv, o_mat, gate_up, down, vecs, geo, eps, scale) is
    layers[i] (a numba typed list of them): one list argument instead of ~150 arrays makes the
    call from Python ~15 us cheaper (numba unboxes every array of a call's arguments)."""
    qkv, o_mat, gate_up, down, vecs, geo, eps, scale = layers[i]
    _attention_part(x, qkv, o_mat, vecs, geo, eps, scale, kc, vc, kpos, ring, row, pos, cos, sin, chunks, par)
    _dense_ffn_part(x, gate_up, down, vecs, geo, eps, chunks, par)
