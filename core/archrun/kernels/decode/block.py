"""The product engine of the fused decode path: uniform matrices, product groups, the worker pool.

Every matrix reaches the jitted layer kernels (kernels.decode.layer, and ops' own layer kernels) as a
*uniform matrix* (`uniform(qmatrix, bias)`): one tuple type for every quantization, so one
compiled kernel serves every model; its kind field selects the product kernel at run time
(dots.py for quantized types, floatmm.py for 16-bit floats, a float32 dot for dense float32).
Products come in groups of 3 matrices sharing one input (absent ones padding), computed from
8-bit-quantized activations exactly as kernels.matmul does for one token; on more than one
thread a group can be shared with the decode worker pool (kernels.decode.pool).

Validation happens when the matrices are prepared and the blocks built (archrun.kernels.decode.fusion); the
kernels do not bounds-check.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from archrun.kernels import atomics
from archrun.kernels._jit import JIT, JIT_PAR, LANES, QB
from archrun.kernels.decode import pool
from archrun.kernels.decode.addresses import address, array_at
from archrun.kernels.matmul import dots, f32_rows, floatmm
from archrun.kernels.matmul.qmatrix import BF16, F16, QMatrix

_F32 = np.float32
# Small steps are inlined into their callers at numba IR level: every separately compiled
# function that calls the product kernels re-optimizes all of them when it is linked
# (measured: ~5-20 s of cold compile per level).
_STEP = dict(JIT, inline="always")

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
    """out[t, r] = W[r] . xf[t] for every token t and the rows of groups [g0, g1): each row's sum in element
    order (a multiply, then an add, each rounded). Eight rows go side by side in the lanes of one vector
    (f32_rows.dots8: 8 x 8 blocks transposed in registers), each row keeping its own order, so its bits."""
    r0, r1 = g0 * LANES, min(g1 * LANES, W.shape[0])
    for t in range(xf.shape[0]):
        x, o = xf[t], out[t]
        r = r0
        while r + 8 <= r1:
            f32_rows.dots8(W, r, x, o)
            r += 8
        for rr in range(r, r1):
            w = W[rr]
            s = _F32(0.0)
            for e in range(w.shape[0]):
                s += w[e] * x[e]
            o[rr] = s


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
def _span(m, off, a, b, xf, X, DX, QH, out):
    """The part of m's row groups that lies in [a, b) of the group's row groups, m's own starting at off."""
    g0, g1 = max(a - off, 0), min(b - off, _groups(m))
    if g0 < g1:
        _mv(m, xf, X, DX, QH, g0, g1, out)


@njit(**_STEP)
def _group_chunk(ms, c, chunks, xf, X, DX, QH, y):
    """Chunk c of `chunks` of the group ms, into y [n, sum of n_out]: the row groups of its 3 matrices taken
    as one sequence (m0's, then m1's, then m2's), cut into `chunks` contiguous ranges, so a chunk streams
    one contiguous run of weights (a matrix boundary at most adds one); a row's bits do not depend on the
    range it falls in."""
    o0, o1, o2 = _outputs(ms, y)
    n0, n1 = _groups(ms[0]), _groups(ms[1])
    total = n0 + n1 + _groups(ms[2])
    a, b = c * total // chunks, (c + 1) * total // chunks
    _span(ms[0], 0, a, b, xf, X, DX, QH, o0)
    _span(ms[1], n0, a, b, xf, X, DX, QH, o1)
    _span(ms[2], n0 + n1, a, b, xf, X, DX, QH, o2)


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


# -- products shared with the decode worker pool (kernels.decode.pool) ---------------------------------
# A product group's job carries the addresses of its activation and output in the pool's args block.
_A_X, _A_Y = 0, 1
# Weight bytes from which a one-token product goes to the pool, and the most weight bytes of one chunk.
# Every chunk starts its streams cold (~1.5 us from memory, a 16 KiB chunk's streaming is ~1-2 us), so a
# product takes one contiguous chunk per thread; only groups over POOL_CHUNK_BYTES a thread (an output
# head) are cut finer, so a worker descheduled while it holds a chunk delays the step by one such chunk.
# Zen 4, 2 threads, in one process: SmolLM2 Q4_1 ~149 -> ~170 tok/s, Gemma 3 ~102 -> ~110, Qwen2.5 ~57 ->
# ~60 against 4 chunks a thread of ~16 KiB.
POOL_MIN_GROUP_BYTES = 48 << 10
POOL_CHUNK_BYTES = 4 << 20


@njit(**_STEP)
def _group_bytes(ms):
    return _weight_bytes(ms[0]) + _weight_bytes(ms[1]) + _weight_bytes(ms[2])


@njit(**_STEP)
def _pool_chunks(ms, threads):
    """Chunks of a pooled product: one per thread, more only where a thread's would pass POOL_CHUNK_BYTES."""
    return max(threads, min(_group_bytes(ms) // POOL_CHUNK_BYTES, pool.MAX_CHUNKS))


@njit(**_STEP)
def _pool_views(par, n, n_in, n_total):
    """This job's activation xf [n, n_in] and output y [n, n_total] (at the addresses its publisher put in
    the pool's args block: the caller's own arrays, or the pool's staging buffers) and its quantized blocks
    (the pool's buffers)."""
    ctrl, pxf, xq, dq, hq, py = par
    X, DX, QH = pool.quantized_views(xq, dq, hq, n, n_in)
    xf = array_at(atomics.load(ctrl, pool.ARGS + _A_X), (n, n_in), _F32)
    return xf, X, DX, QH, array_at(atomics.load(ctrl, pool.ARGS + _A_Y), (n, n_total), _F32)


# -- the idle worker's read-ahead -----------------------------------------------------------------------
# While the step's thread does work of its own (attention, norms, activation quantization, the Python between
# layers and between tokens), a pool worker that has no chunk to compute asks memory for the weights of the
# product groups that come next (group ids are given in step order), so memory streams all the time and the
# next products find their weights in the caches. A prefetch is a hint: no result depends on it.
_LINE = 64


@njit(**_STEP)
def _prefetch_array(a, base, lo, hi):
    """Prefetch the lines of a (C-contiguous) that lie in [lo, hi) of a sequence in which a's lines start at
    `base`; returns the line after a's last."""
    n = (a.size * a.itemsize + _LINE - 1) // _LINE
    step = _LINE // a.itemsize
    for line in range(max(lo, base) - base, min(hi, base + n) - base):
        atomics.prefetch(a, line * step)
    return base + n


@njit(**_STEP)
def _prefetch_matrix(m, base, lo, hi):
    base = _prefetch_array(m[_WU16], base, lo, hi)
    base = _prefetch_array(m[_WI8], base, lo, hi)
    base = _prefetch_array(m[_WU8], base, lo, hi)
    base = _prefetch_array(m[_WH], base, lo, hi)
    base = _prefetch_array(m[_WF], base, lo, hi)
    base = _prefetch_array(m[_D], base, lo, hi)
    base = _prefetch_array(m[_M], base, lo, hi)
    base = _prefetch_array(m[_SCU], base, lo, hi)
    base = _prefetch_array(m[_SCI], base, lo, hi)
    return _prefetch_array(m[_MN], base, lo, hi)


@njit(**_STEP)
def prefetch_group(ms, lo, hi):
    """Prefetch lines [lo, hi) of group ms's weights (its matrices' arrays in a fixed order, each from a line
    boundary); returns how many lines the group has (hi = lo: count only)."""
    return _prefetch_matrix(ms[2], _prefetch_matrix(ms[1], _prefetch_matrix(ms[0], 0, lo, hi), lo, hi), lo, hi)


@njit(**_STEP)
def _rows_contiguous(a):
    """Whether 2-d a is C-contiguous (its rows back to back), so workers can read or write it by address."""
    return a.strides[1] == a.itemsize and (a.shape[0] <= 1 or a.strides[0] == a.shape[1] * a.itemsize)


@njit(**_STEP)
def _pool_fits(par, gid, ms, xf, y):
    """Whether this product goes to the running pool `par`: a known group, big enough, buffers large enough."""
    ctrl, pxf, py = par[0], par[1], par[5]
    return (gid >= 0 and pool.active(ctrl) and _group_bytes(ms) >= POOL_MIN_GROUP_BYTES
            and xf.size <= pxf.shape[0] and y.size <= py.shape[0])


@njit(**_STEP)
def publish_product(ctrl, gid, n_chunks, xf, y):
    """Make product group gid of activation xf [n, n_in] (quantized into the pool's buffers already) into
    y [n, n_total] (both C-contiguous, read and written by address) the pool's job of n_chunks chunks."""
    ctrl[pool.ARGS + _A_X], ctrl[pool.ARGS + _A_Y] = address(xf), address(y)
    pool.publish(ctrl, gid, n_chunks, xf.shape[0], xf.shape[1])  # atomic: the addresses are seen before it


@njit(**_STEP)
def _pooled_rows(par, gid, ms, xf, y):
    """product_rows of group `gid` (= ms) with its chunks shared with the pool's workers."""
    ctrl, pxf, xq, dq, hq, py = par
    n, n_in = xf.shape
    nch = _pool_chunks(ms, ctrl[pool.THREADS])
    X, DX, QH = pool.quantized_views(xq, dq, hq, n, n_in)
    # the chunks read xf and write y in place where they are C-contiguous (no copies on this thread while the
    # workers wait), else through the pool's staging buffers
    x_in = _rows_contiguous(xf)
    xs = xf if x_in else pxf[:n * n_in].reshape((n, n_in))
    if not x_in:
        xs[:] = xf
    y_in = _rows_contiguous(y)
    ys = y if y_in else py[:y.size].reshape(y.shape)
    if X.shape[1]:
        dots.quantize_act(xs, X, DX, QH)
    publish_product(ctrl, gid, nch, xs, ys)
    while True:
        c, w = pool.claim(ctrl)
        if c == -1:
            break
        if c >= 0:
            _group_chunk(ms, c, nch, xs, X, DX, QH, ys)
            pool.done(ctrl)
    pool.wait_done(ctrl, nch)
    if not y_in:
        y[:] = ys
    # never true: a use of xs and ys after the wait (numba frees an array after its last use; the workers
    # read and write them by address)
    if xs.shape[0] < 0 or ys.shape[0] < 0:
        y[0, 0] = 0.0
    _add_biases(ms, y)


@njit(**_STEP)
def product_group_rows(par, gid, ms, xf, y, chunks):
    """y[t] = [m @ xf[t] for m in ms] for rows xf f32 [n, n_in] (see product_rows); group `gid` of the
    running pool `par` shares the work with its workers. Each weight block is read once for all n
    rows, and row t's result is the same bits as the product of xf[t] alone (per-row 8-bit blocks,
    the same accumulation order: kernels.matmul.dots)."""
    if _pool_fits(par, gid, ms, xf, y):
        _pooled_rows(par, gid, ms, xf, y)
    else:
        product_rows(ms, xf, y, chunks)


@njit(**_STEP)
def product_group(par, gid, ms, x, y, chunks):
    """y[:] = [m @ x for m in ms] for one token x f32 [n_in] (product_group_rows of one row)."""
    product_group_rows(par, gid, ms, x.reshape(1, x.shape[0]), y.reshape(1, y.shape[0]), chunks)


@njit(**JIT)
def pooled_product(par, gid, ms, xf, y, chunks):
    """y f32 [n, sum of n_out] = product_rows(ms, xf, ...), through the running pool `par` when it fits
    (the entry for products outside the fused blocks, e.g. the output head)."""
    if _pool_fits(par, gid, ms, xf, y):
        _pooled_rows(par, gid, ms, xf, y)
    else:
        product_rows(ms, xf, y, chunks)
