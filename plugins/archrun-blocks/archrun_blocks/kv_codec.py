"""KV cache row formats of the attention ops: float16 bits and ggml's q8_0 blocks, as numba kernels.

A cache of kv type "f32" holds float32 rows [cap, KV, width]; "f16" holds the IEEE half bits
of every value as uint16 [cap, KV, width]; "q8_0" holds each row as ggml's q8_0 blocks, bytes
uint8 [cap, KV, width / 32 * 34]: per 32 values a float16 scale d (2 bytes, little endian)
then 32 int8 quants, value = q * d. The conversions match numpy's float16 casts
(round to nearest even, subnormals, inf) and gguf-py's q8_0 quantizer bit for bit
(plugins/archrun-blocks/tests/run/test_kv_types.py); the numpy twins the reference backend uses are
in archrun_blocks.reference (encode_rows / decode_rows).

The encoders compile without fastmath (the rounding must be the exact one); the decoders are
integer bit moves plus exact float products, fine under fastmath.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.extending import overload

from archrun.kernels._jit import JIT
from archrun.kernels.matmul import simd

_F32 = np.float32
_EXACT = dict(cache=True, nogil=True)
QK = 32            # values per q8_0 block
Q8_BYTES = 34      # bytes per q8_0 block: float16 scale + 32 int8
KV_DTYPES = {"f32": np.float32, "f16": np.uint16, "q8_0": np.uint8}


def row_width(kv_type: str, width: int) -> int:
    """Elements of one stored row of `width` float values (q8_0: bytes of its blocks)."""
    return width // QK * Q8_BYTES if kv_type == "q8_0" else width


def value_width(kv_type: str, stored: int) -> int:
    """The float values held by a stored row of `stored` elements (row_width's inverse)."""
    return stored // Q8_BYTES * QK if kv_type == "q8_0" else stored


# -- float16 ---------------------------------------------------------------------------------------


@njit(**_EXACT)
def encode_f16(x, out):
    """out[i] = the float16 bits of x[i] (round to nearest even; NaN stays NaN), x float32 [n] C-contiguous."""
    u = x.view(np.uint32)
    for i in range(x.shape[0]):
        f = np.int64(u[i])
        sign = (f >> 16) & 0x8000
        a = f & 0x7FFFFFFF
        # normal range: drop 13 mantissa bits, round half to even (a carry may reach inf: right)
        h = (a - 0x38000000 + 0xFFF + ((a >> 13) & 1)) >> 13
        # below 2^-14: a float16 subnormal m * 2^-24; the implicit bit shifted right by s, rounded to even
        s = min(126 - (a >> 23), 31)
        m = (a & 0x7FFFFF) | 0x800000
        sh = max(s, 1)
        q = m >> sh
        rem = m & ((np.int64(1) << sh) - 1)
        half = np.int64(1) << (sh - 1)
        sub = q + ((rem > half) | ((rem == half) & ((q & 1) == 1)))
        if s > 24:
            sub = 0
        if a < 0x38800000:
            h = sub
        if a >= 0x47800000:
            h = 0x7C00
        if a > 0x7F800000:
            h = 0x7E00
        out[i] = np.uint16(sign | h)


#: whether kernels convert halves with the CPU's F16C instructions (`vcvtph2ps`, through the core's
#: `simd.half_to_float`: exact, 8 or 16 halves an instruction where the bit moves below take ~10 integer ops each)
F16C = simd.F16C


@njit(**JIT)
def _decode_f16_f16c(h, out):
    for i in range(h.shape[0]):
        out[i] = simd.half_to_float(h[i])


@njit(**JIT)
def _decode_f16_bits(h, out):
    ou = out.view(np.uint32)
    for i in range(h.shape[0]):
        b = np.uint32(h[i])
        e = (b >> 10) & 0x1F
        m = b & 0x3FF
        bits = ((b & 0x8000) << 16) | ((e + 112) << 23) | (m << 13)
        if e == 31:
            bits = ((b & 0x8000) << 16) | 0x7F800000 | (m << 13)
        if e == 0:
            bits = (b & 0x8000) << 16
        ou[i] = bits
    for i in range(h.shape[0]):  # subnormals: m * 2^-24 (exact); rare, a second pass keeps the first simple
        b = np.uint32(h[i])
        if (b & 0x7C00) == 0 and (b & 0x3FF) != 0:
            v = _F32(b & 0x3FF) * _F32(5.9604644775390625e-08)
            out[i] = -v if b & 0x8000 else v


#: out[i] = the float32 value of float16 bits h[i] (exact), h uint16 [n], out float32 [n] C-contiguous:
#: the CPU's conversion where it has F16C, else integer bit moves (and without the JIT)
decode_f16 = _decode_f16_f16c if F16C else _decode_f16_bits


@njit(**dict(JIT, inline="always"))
def half_value(lo, hi):
    """The float32 value of the float16 whose little-endian bytes are (lo, hi) (a q8_0 scale)."""
    b = np.int64(lo) | (np.int64(hi) << 8)
    e = (b >> 10) & 0x1F
    m = b & 0x3FF
    if e == 0:
        v = _F32(m) * _F32(5.9604644775390625e-08)
    elif e == 31:
        v = _F32(np.inf) if m == 0 else _F32(np.nan)
    else:
        v = _F32(m + 1024) * _F32(math.ldexp(1.0, int(e) - 25))
    return -v if b & 0x8000 else v


# -- q8_0 ------------------------------------------------------------------------------------------


@njit(**_EXACT)
def _roundf(x):
    """C roundf (half away from zero), as gguf-py's np_roundf computes it."""
    a = abs(x)
    fl = np.floor(a)
    r = fl + np.floor(_F32(2.0) * (a - fl))
    return r if x >= 0 else -r


@njit(**_EXACT)
def encode_q8_0(x, out):
    """ggml's q8_0 blocks of x float32 [n] (n a multiple of 32) into out uint8 [n / 32 * 34]:
    d = max|x| / 127, q = roundf(x * (1 / d)) (0 when d = 0), d stored as float16."""
    dh = np.empty(1, np.uint16)
    dv = np.empty(1, _F32)
    for b in range(x.shape[0] // QK):
        blk = x[b * QK:(b + 1) * QK]
        amax = _F32(0.0)
        for j in range(QK):
            amax = max(amax, abs(blk[j]))
        d = amax / _F32(127.0)
        inv = _F32(1.0) / d if d != 0 else _F32(0.0)
        dv[0] = d
        encode_f16(dv, dh)
        o = out[b * Q8_BYTES:(b + 1) * Q8_BYTES]
        o[0] = np.uint8(dh[0] & 0xFF)
        o[1] = np.uint8(dh[0] >> 8)
        for j in range(QK):
            q = np.int64(_roundf(blk[j] * inv))
            o[2 + j] = np.uint8(q & 0xFF)


@njit(**JIT)
def decode_q8_0(x, out):
    """The float32 values out [n] of q8_0 blocks x uint8 [n / 32 * 34]: q * d."""
    for b in range(out.shape[0] // QK):
        o = out[b * QK:(b + 1) * QK]
        base = b * Q8_BYTES
        d = half_value(x[base], x[base + 1])
        for j in range(QK):
            q = (np.int32(x[base + 2 + j]) ^ 128) - 128  # the byte as int8
            o[j] = _F32(q) * d


# -- rows of a cache -------------------------------------------------------------------------------


def store_row(x, row):
    """One head's values x float32 [width] into a stored row of the cache's kv type (by row's dtype;
    in kernels the choice is made when the caller compiles)."""
    {np.dtype(np.uint16): encode_f16, np.dtype(np.uint8): encode_q8_0}.get(row.dtype, _copy)(x, row)


def load_row(row, out):
    """A stored row of the cache's kv type into float32 out [width] (by row's dtype, as store_row)."""
    {np.dtype(np.uint16): decode_f16, np.dtype(np.uint8): decode_q8_0}.get(row.dtype, _copy)(row, out)


@njit(**dict(JIT, inline="always"))
def _copy(src, dst):
    dst[:] = src


def values_per_row(c) -> int:
    """The float values in each stored row of a cache array c [cap, KV, stored] (by its dtype)."""
    return c.shape[2] // Q8_BYTES * QK if c.dtype == np.uint8 else c.shape[2]


@overload(values_per_row, jit_options=JIT)
def _values_per_row_typed(c):
    if c.dtype == types.uint8:
        return lambda c: c.shape[2] // Q8_BYTES * QK
    return lambda c: c.shape[2]


@overload(store_row, jit_options=JIT)
def _store_row_typed(x, row):
    fn = {types.uint16: encode_f16, types.uint8: encode_q8_0}.get(row.dtype, _copy)
    return lambda x, row: fn(x, row)


@overload(load_row, jit_options=JIT)
def _load_row_typed(row, out):
    fn = {types.uint16: decode_f16, types.uint8: decode_q8_0}.get(row.dtype, _copy)
    return lambda row, out: fn(row, out)


@njit(**JIT)
def encode_rows(src, dst):
    """Rows src float32 [n, KV, width] into a cache's rows dst [n, KV, stored] of dst's kv type."""
    for t in range(src.shape[0]):
        for h in range(src.shape[1]):
            store_row(src[t, h], dst[t, h])


@njit(**JIT)
def load_rows(c, rows, j0, n, out):
    """Cache rows rows[j0:j0 + n] of c [cap, KV, stored] (f16 bits or q8_0 bytes, C-contiguous) into float32
    out[:n] [>= n, KV, width]. A run of consecutive rows (all of a plain slot's, most of a ring's) decodes as
    one flat span: one call per run instead of one per row and head, whose ~20 ns each were 6x the 64
    values' conversion (measured at 4096 rows)."""
    t = 0
    while t < n:
        r = rows[j0 + t]
        u = t + 1
        while u < n and rows[j0 + u] == r + (u - t):
            u += 1
        load_row(c[r:r + u - t].reshape(-1), out[t:u].reshape(-1))
        t = u


@njit(**JIT)
def load_heads(c, rows, j0, n, k0, k1, out):
    """load_rows for kv heads k0..k1-1 only (all of them: load_rows itself). Each value decodes on its
    own (f16 widened, q8_0 scale x byte, a head's row whole q8_0 blocks), so the same bits either way."""
    if k0 == 0 and k1 == c.shape[1]:
        load_rows(c, rows, j0, n, out)
        return
    for t in range(n):
        r = rows[j0 + t]
        for h in range(k0, k1):
            load_row(c[r, h], out[t, h])


@njit(**JIT)
def decode_rows(src, dst):
    """Cache rows src [n, KV, stored] into float32 dst [n, KV, width]."""
    for t in range(src.shape[0]):
        for h in range(src.shape[1]):
            load_row(src[t, h], dst[t, h])
