"""Repacking GGUF blocks into the lane-interleaved layout the kernels read.

Every quantized type is unpacked into integer fields in natural element order plus its
scales, then packed again (numpy in `repack_reference`, the definition; one jitted kernel per
type in `repack`, which load uses: ~1 G weights/s per thread, bit-identical):

- fields go into uint16 words, several per word, in natural order inside each 32-element
  block (4-bit: 4 per word; 5-bit: 3 per word, 11 words per block; 2-bit: 8 per word); 8-bit
  fields (Q8_0, Q6_K) stay bytes;
- rows are interleaved in groups of LANES: words[group, block, word * LANES + lane], so the kernels'
  inner loops run over contiguous lanes (one output row each) with no horizontal sums;
  Q8_0 interleaves quads instead: element e of lane l at (e // 4) * 4 * LANES + 4 * l + e % 4,
  the layout of the byte-pair multiply (simd.q8_quads_dot: 4 elements of 8 lanes per load);
- f16 scales become float32; K-quant sub-scales become one byte each.

The repacked matrix is at most ~1.35x the GGUF bytes (Q3_K; Q4_K 1.06x, Q4_1 1.2x,
Q5_0 1.18x, Q6_K 1.31x) and is built a few MB of GGUF rows at a time, whose file pages are
released as soon as they are repacked, so load-time temporaries stay small. Rows are padded
with zero rows to a multiple of LANES.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
from numba import njit

from archrun.kernels._jit import JIT, LANES, QB

# rows unpacked per chunk while repacking: bounds the float/uint8 temporaries (~8 MB)
_CHUNK_ROWS = 2048

_U8 = np.uint8


def _f16(blocks: np.ndarray, off: int) -> np.ndarray:
    """float32 [..., n_blocks] from the little-endian f16 at byte `off` of every block."""
    return np.ascontiguousarray(blocks[..., off:off + 2]).view("<f2")[..., 0].astype(np.float32)


def _nibbles_lohi(qs: np.ndarray) -> np.ndarray:
    """[..., 16] bytes -> [..., 32] fields: low nibbles are elements 0..15, high 16..31."""
    qs = np.ascontiguousarray(qs)
    out = np.empty(qs.shape[:-1] + (32,), _U8)
    np.bitwise_and(qs, _U8(15), out=out[..., :16])
    np.right_shift(qs, _U8(4), out=out[..., 16:])
    return out


def _bits32(qh: np.ndarray) -> np.ndarray:
    """[..., 4] bytes (a little-endian uint32) -> [..., 32] bits, bit j = element j."""
    return np.unpackbits(np.ascontiguousarray(qh), axis=-1, bitorder="little")


def _crumbs_k(qs: np.ndarray) -> np.ndarray:
    """K-quant 2-bit fields: [..., 64] bytes -> [..., 256]; element h*128 + s*32 + l is
    bits 2s..2s+1 of byte 32h + l."""
    lead = qs.shape[:-1]
    q = qs.reshape(*lead, 2, 1, 32) >> np.array([0, 2, 4, 6], _U8).reshape(4, 1)
    return (q & _U8(3)).reshape(*lead, 256)


def _hbits_k(hm: np.ndarray) -> np.ndarray:
    """K-quant high bits: [..., 32] bytes -> [..., 256]; element i*32 + l is bit i of byte l."""
    lead = hm.shape[:-1]
    q = hm.reshape(*lead, 1, 32) >> np.arange(8, dtype=_U8).reshape(8, 1)
    return (q & _U8(1)).reshape(*lead, 256)


def _scale_min_k4(sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K 12 packed bytes -> (scales [..., 8], mins [..., 8]), 6 bits each."""
    d, m, md = sc[..., 0:4], sc[..., 4:8], sc[..., 8:12]
    scales = np.concatenate([d & _U8(63), (md & _U8(15)) | ((d >> _U8(2)) & _U8(48))], axis=-1)
    mins = np.concatenate([m & _U8(63), (md >> _U8(4)) | ((m >> _U8(2)) & _U8(48))], axis=-1)
    return scales, mins


def _scales_q3k(sc: np.ndarray) -> np.ndarray:
    """Q3_K 12 packed bytes -> 16 signed 6-bit scales (value - 32) as int8."""
    lead = sc.shape[:-1]
    lo = (sc[..., 0:8].reshape(*lead, 1, 8) >> np.array([0, 4], _U8).reshape(2, 1)).reshape(*lead, 16)
    hi = (sc[..., 8:12].reshape(*lead, 1, 4) >> np.array([0, 2, 4, 6], _U8).reshape(4, 1))
    hi = hi.reshape(*lead, 16)
    return (((lo & _U8(15)) | ((hi & _U8(3)) << _U8(4))).astype(np.int8) - np.int8(32)).astype(np.int8)


# -- per-type unpackers: blocks uint8 [rows, n_blocks, type_size] -> (fields [rows, n_in], scales)
# fields hold the stored (offset) integers; the comment of each gives the element's value.


def _unpack_q4_0(b):  # d * (q - 8)
    return _nibbles_lohi(b[..., 2:18]), (_f16(b, 0),)


def _unpack_q4_1(b):  # d * q + m
    return _nibbles_lohi(b[..., 4:20]), (_f16(b, 0), _f16(b, 2))


def _unpack_q5_0(b):  # d * (q - 16)
    return _nibbles_lohi(b[..., 6:22]) | (_bits32(b[..., 2:6]) << _U8(4)), (_f16(b, 0),)


def _unpack_q5_1(b):  # d * q + m
    q = _nibbles_lohi(b[..., 8:24]) | (_bits32(b[..., 4:8]) << _U8(4))
    return q, (_f16(b, 0), _f16(b, 2))


def _unpack_q8_0(b):  # d * q, q int8
    return np.ascontiguousarray(b[..., 2:34]).view(np.int8), (_f16(b, 0),)


def _unpack_q2_k(b):  # d * sc * q - dmin * mn, per 16; sc, mn are the nibbles of one byte
    sc = b[..., 0:16]
    return _crumbs_k(b[..., 16:80]), (_f16(b, 80), _f16(b, 82), sc & _U8(15), sc >> _U8(4))


def _unpack_q3_k(b):  # d * sc * (q - 4), sc signed, per 16
    q = _crumbs_k(b[..., 32:96]) + (_hbits_k(b[..., 0:32]) << _U8(2))
    return q, (_f16(b, 108), _scales_q3k(b[..., 96:108]))


def _unpack_q4_k(b):  # d * sc * q - dmin * mn, per 32
    lead = b.shape[:-1]
    q = b[..., 16:144].reshape(*lead, 4, 1, 32) >> np.array([0, 4], _U8).reshape(2, 1)
    sc, mn = _scale_min_k4(b[..., 4:16])
    return (q & _U8(15)).reshape(*lead, 256), (_f16(b, 0), _f16(b, 2), sc, mn)


def _unpack_q5_k(b):  # d * sc * q - dmin * mn, per 32
    lead = b.shape[:-1]
    lo = b[..., 48:176].reshape(*lead, 4, 1, 32) >> np.array([0, 4], _U8).reshape(2, 1)
    q = (lo & _U8(15)).reshape(*lead, 256) | (_hbits_k(b[..., 16:48]) << _U8(4))
    sc, mn = _scale_min_k4(b[..., 4:16])
    return q, (_f16(b, 0), _f16(b, 2), sc, mn)


def _unpack_q6_k(b):  # d * sc * (q - 32), sc int8, per 16
    lead = b.shape[:-1]
    ql = b[..., 0:128].reshape(*lead, 2, 1, 64) >> np.array([0, 4], _U8).reshape(2, 1)
    ql = (ql & _U8(15)).reshape(*lead, 2, 128)
    qh = b[..., 128:192].reshape(*lead, 2, 1, 32) >> np.array([0, 2, 4, 6], _U8).reshape(4, 1)
    qh = (qh & _U8(3)).reshape(*lead, 2, 128)
    q = (ql | (qh << _U8(4))).reshape(*lead, 256)
    return q, (_f16(b, 208), np.ascontiguousarray(b[..., 192:208]).view(np.int8))


def _unpack_half(b):  # F16 / BF16: the 16-bit pattern itself, no scales
    return np.ascontiguousarray(b).view("<u2")[..., 0], ()


# -- field packers: fields [rows, n_in] -> words [rows, n_in // 32, words per block]


def _pack4(q: np.ndarray) -> np.ndarray:
    """4 fields per uint16 word, element 4j + t at bits 4t."""
    f = q.reshape(q.shape[0], -1, QB // 4, 4).astype(np.uint16)
    return f[..., 0] | (f[..., 1] << 4) | (f[..., 2] << 8) | (f[..., 3] << 12)


def _pack5(q: np.ndarray) -> np.ndarray:
    """3 fields per uint16 word (element 3j + t at bits 5t), 11 words per block."""
    f = q.reshape(q.shape[0], -1, QB).astype(np.uint16)
    words = np.empty(f.shape[:-1] + (11,), np.uint16)
    t = f[..., :30].reshape(f.shape[0], f.shape[1], 10, 3)
    np.bitwise_or(t[..., 0] | (t[..., 1] << 5), t[..., 2] << 10, out=words[..., :10])
    words[..., 10] = f[..., 30] | (f[..., 31] << 5)
    return words


def _pack2(q: np.ndarray) -> np.ndarray:
    """8 fields per uint16 word, element 8j + t at bits 2t."""
    f = q.reshape(q.shape[0], -1, QB // 8, 8).astype(np.uint16)
    return np.bitwise_or.reduce(f << (2 * np.arange(8, dtype=np.uint16)), axis=-1)


def _pack8(q: np.ndarray) -> np.ndarray:
    """One field per byte."""
    return q.reshape(q.shape[0], -1, QB)


class TypeLayout:
    """How one ggml type is unpacked, packed and how many scale arrays it keeps."""

    def __init__(self, block: int, type_size: int, unpack: Callable, pack: Callable, words: int,
                 word_dtype, quads: bool = False):
        self.block = block            # elements per GGUF block
        self.type_size = type_size    # bytes per GGUF block
        self.unpack = unpack
        self.pack = pack
        self.words = words            # words per 32-element block per row
        self.word_dtype = np.dtype(word_dtype)
        self.quads = quads            # lanes interleaved by 4 consecutive words (Q8_0), else by word


LAYOUTS: dict[int, TypeLayout] = {
    2: TypeLayout(32, 18, _unpack_q4_0, _pack4, 8, np.uint16),     # Q4_0
    3: TypeLayout(32, 20, _unpack_q4_1, _pack4, 8, np.uint16),     # Q4_1
    6: TypeLayout(32, 22, _unpack_q5_0, _pack5, 11, np.uint16),    # Q5_0
    7: TypeLayout(32, 24, _unpack_q5_1, _pack5, 11, np.uint16),    # Q5_1
    8: TypeLayout(32, 34, _unpack_q8_0, _pack8, 32, np.int8, quads=True),  # Q8_0
    10: TypeLayout(256, 84, _unpack_q2_k, _pack2, 4, np.uint16),   # Q2_K
    11: TypeLayout(256, 110, _unpack_q3_k, _pack4, 8, np.uint16),  # Q3_K
    12: TypeLayout(256, 144, _unpack_q4_k, _pack4, 8, np.uint16),  # Q4_K
    13: TypeLayout(256, 176, _unpack_q5_k, _pack5, 11, np.uint16),  # Q5_K
    14: TypeLayout(256, 210, _unpack_q6_k, _pack8, 32, np.uint8),  # Q6_K
    1: TypeLayout(1, 2, _unpack_half, _pack8, 32, np.uint16),      # F16
    30: TypeLayout(1, 2, _unpack_half, _pack8, 32, np.uint16),     # BF16
}


def n_groups(n_out: int) -> int:
    """Row groups of LANES rows covering n_out rows (the last one zero-padded)."""
    return -(-n_out // LANES)


def _lanes(a: np.ndarray, ng: int) -> np.ndarray:
    """[n_out, *rest] -> [ng, *rest, LANES] with rows zero-padded to ng * LANES."""
    pad = ng * LANES - a.shape[0]
    if pad:
        a = np.concatenate([a, np.zeros((pad,) + a.shape[1:], a.dtype)])
    a = a.reshape(ng, LANES, *a.shape[1:])
    return np.ascontiguousarray(np.moveaxis(a, 1, -1))


def repack_reference(raw_rows: np.ndarray, ggml_type: int, n_in: int) -> tuple[np.ndarray, ...]:
    """GGUF rows uint8 [n_out, row_bytes] -> (words, *scales) in the lane layout, with numpy.

    words [ng, n_in // 32, words * LANES] (word-major, lane-minor within a block); scales
    [ng, n_blocks_or_sub, LANES] in the order the type's unpacker returns them. The readable
    definition of the layout: `repack` (jitted, used at load) must match it bit for bit.
    """
    lay = LAYOUTS[ggml_type]
    n_out = raw_rows.shape[0]
    ng = n_groups(n_out)
    nblk = n_in // lay.block
    words = np.zeros((ng, n_in // QB, lay.words * LANES), lay.word_dtype)
    scales = None
    step = _CHUNK_ROWS  # a multiple of LANES, so chunks map to whole groups
    for r0 in range(0, n_out, step):
        blocks = np.asarray(raw_rows[r0:r0 + step]).reshape(-1, nblk, lay.type_size)
        fields, sc = lay.unpack(blocks)
        g0, part = r0 // LANES, n_groups(blocks.shape[0])
        packed = _lanes(lay.pack(fields.reshape(blocks.shape[0], n_in)), part)  # [part, nb, words, LANES]
        if lay.quads:  # -> [part, nb, words // 4, LANES, 4]
            packed = packed.reshape(part, n_in // QB, lay.words // 4, 4, LANES).swapaxes(-1, -2)
        words[g0:g0 + part] = packed.reshape(part, n_in // QB, -1)
        if scales is None:
            scales = [np.zeros((ng,) + s.reshape(s.shape[0], -1).shape[1:] + (LANES,), s.dtype) for s in sc]
        for dst, s in zip(scales, sc, strict=True):
            dst[g0:g0 + part] = _lanes(s.reshape(s.shape[0], -1), part)
    return (words, *scales)


# -- jitted repack (used at load) ---------------------------------------------------------------
# One kernel per type writes row groups [g0, g1) of the lane layout straight from the GGUF
# rows, reading the same bytes as the numpy unpackers above; `repack` must equal
# `repack_reference` bit for bit (tests/kernels/test_kernels.py checks every type on random blocks).
# Kernel arguments: raw read-only uint8 [n_out, row_bytes], g0, g1, words, *scales, where f16
# scales are written as float32 bit patterns (uint32 views of the float32 scale arrays).
# Fields go through a small int32 scratch f (one GGUF block) in natural element order.

_INL = dict(JIT, inline="always")


@njit(**_INL)
def _h2f(lo, hi):
    """float32 bits of the little-endian f16 bytes (lo, hi), exactly as numpy converts them."""
    h = np.int64(lo) | (np.int64(hi) << 8)
    sign = (h & 0x8000) << 16
    e = h & 0x7C00
    m = h & 0x03FF
    if e == 0x7C00:  # inf / nan (payload kept)
        return sign | 0x7F800000 | (m << 13)
    if e != 0:  # normal: rebias the exponent by 127 - 15
        return sign | (((h & 0x7FFF) + 0x1C000) << 13)
    if m == 0:
        return sign
    shift = 0  # subnormal m * 2^-24: normalise
    m <<= 1
    while (m & 0x0400) == 0:
        m <<= 1
        shift += 1
    return sign | ((127 - 15 - shift) << 23) | ((m & 0x03FF) << 13)


@njit(**_INL)
def _nibbles(row, o, f, f0):
    """16 bytes at row[o:] -> f[f0:f0 + 32]: low nibbles are elements 0..15, high 16..31."""
    for i in range(16):
        q = np.int32(row[o + i])
        f[f0 + i] = q & 15
        f[f0 + 16 + i] = q >> 4


@njit(**_INL)
def _high_bits(row, o, f, shift):
    """f[j] |= bit j of the little-endian uint32 at row[o:], shifted left by `shift` (j < 32)."""
    qh = (np.int64(row[o]) | (np.int64(row[o + 1]) << 8) | (np.int64(row[o + 2]) << 16)
          | (np.int64(row[o + 3]) << 24))
    for j in range(32):
        f[j] |= np.int32((qh >> j) & 1) << shift


@njit(**_INL)
def _put4(words, g, blk, lane, f, f0):
    """Fields f[f0:f0 + 32] -> the 8 words of 32-block blk: element 4j + t at bits 4t of word j."""
    for j in range(8):
        o = f0 + 4 * j
        words[g, blk, j * LANES + lane] = f[o] | (f[o + 1] << 4) | (f[o + 2] << 8) | (f[o + 3] << 12)


@njit(**_INL)
def _put5(words, g, blk, lane, f, f0):
    """Fields f[f0:f0 + 32] -> 11 words: element 3j + t at bits 5t of word j."""
    for j in range(10):
        o = f0 + 3 * j
        words[g, blk, j * LANES + lane] = f[o] | (f[o + 1] << 5) | (f[o + 2] << 10)
    words[g, blk, 10 * LANES + lane] = f[f0 + 30] | (f[f0 + 31] << 5)


@njit(**_INL)
def _put2(words, g, blk, lane, f, f0):
    """Fields f[f0:f0 + 32] -> 4 words: element 8j + t at bits 2t of word j."""
    for j in range(4):
        o = f0 + 8 * j
        w = 0
        for t in range(8):
            w |= f[o + t] << (2 * t)
        words[g, blk, j * LANES + lane] = w


@njit(**_INL)
def _put8(words, g, blk, lane, f, f0):
    """Fields f[f0:f0 + 32] -> 32 one-field words (bytes or 16-bit patterns)."""
    for t in range(QB):
        words[g, blk, t * LANES + lane] = f[f0 + t]


@njit(**_INL)
def _lanes_of(raw, g):
    """Real (non-padding) rows in group g."""
    return min(LANES, raw.shape[0] - g * LANES)


@njit(**JIT)
def _rp_q4_0(raw, g0, g1, words, d):
    f = np.empty(QB, np.int32)
    for g in range(g0, g1):
        for lane in range(_lanes_of(raw, g)):
            row = raw[g * LANES + lane]
            for b in range(words.shape[1]):
                o = 18 * b
                d[g, b, lane] = _h2f(row[o], row[o + 1])
                _nibbles(row, o + 2, f, 0)
                _put4(words, g, b, lane, f, 0)


@njit(**JIT)
def _rp_q4_1(raw, g0, g1, words, d, m):
    f = np.empty(QB, np.int32)
    for g in range(g0, g1):
        for lane in range(_lanes_of(raw, g)):
            row = raw[g * LANES + lane]
            for b in range(words.shape[1]):
                o = 20 * b
                d[g, b, lane] = _h2f(row[o], row[o + 1])
                m[g, b, lane] = _h2f(row[o + 2], row[o + 3])
                _nibbles(row, o + 4, f, 0)
                _put4(words, g, b, lane, f, 0)


@njit(**JIT)
def _rp_q5_0(raw, g0, g1, words, d):
    f = np.empty(QB, np.int32)
    for g in range(g0, g1):
        for lane in range(_lanes_of(raw, g)):
            row = raw[g * LANES + lane]
            for b in range(words.shape[1]):
                o = 22 * b
                d[g, b, lane] = _h2f(row[o], row[o + 1])
                _nibbles(row, o + 6, f, 0)
                _high_bits(row, o + 2, f, 4)
                _put5(words, g, b, lane, f, 0)


@njit(**JIT)
def _rp_q5_1(raw, g0, g1, words, d, m):
    f = np.empty(QB, np.int32)
    for g in range(g0, g1):
        for lane in range(_lanes_of(raw, g)):
            row = raw[g * LANES + lane]
            for b in range(words.shape[1]):
                o = 24 * b
                d[g, b, lane] = _h2f(row[o], row[o + 1])
                m[g, b, lane] = _h2f(row[o + 2], row[o + 3])
                _nibbles(row, o + 8, f, 0)
                _high_bits(row, o + 4, f, 4)
                _put5(words, g, b, lane, f, 0)


@njit(**JIT)
def _rp_q8_0(raw, g0, g1, words, d):
    for g in range(g0, g1):
        for lane in range(_lanes_of(raw, g)):
            row = raw[g * LANES + lane]
            for b in range(words.shape[1]):
                o = 34 * b
                d[g, b, lane] = _h2f(row[o], row[o + 1])
                for t in range(QB):  # the int8 quants, bit for bit, in quads
                    words[g, b, (t >> 2) * 4 * LANES + 4 * lane + (t & 3)] = np.int8(row[o + 2 + t])


@njit(**JIT)
def _rp_q2_k(raw, g0, g1, words, d, dmin, sc, mn):
    f = np.empty(256, np.int32)
    for g in range(g0, g1):
        for lane in range(_lanes_of(raw, g)):
            row = raw[g * LANES + lane]
            for b in range(words.shape[1] // 8):
                o = 84 * b
                d[g, b, lane] = _h2f(row[o + 80], row[o + 81])
                dmin[g, b, lane] = _h2f(row[o + 82], row[o + 83])
                for k in range(16):  # 4-bit scale and min of each 16 elements
                    sc[g, 16 * b + k, lane] = row[o + k] & 15
                    mn[g, 16 * b + k, lane] = row[o + k] >> 4
                for e in range(256):  # element h*128 + s*32 + l: bits 2s of byte 32h + l
                    h, s, l = e >> 7, (e >> 5) & 3, e & 31
                    f[e] = (np.int32(row[o + 16 + 32 * h + l]) >> (2 * s)) & 3
                for sub in range(8):
                    _put2(words, g, 8 * b + sub, lane, f, 32 * sub)


@njit(**JIT)
def _rp_q3_k(raw, g0, g1, words, d, sc):
    f = np.empty(256, np.int32)
    for g in range(g0, g1):
        for lane in range(_lanes_of(raw, g)):
            row = raw[g * LANES + lane]
            for b in range(words.shape[1] // 8):
                o = 110 * b
                d[g, b, lane] = _h2f(row[o + 108], row[o + 109])
                for k in range(16):  # 6-bit scales: low nibble from bytes 0..7, high crumb from 8..11
                    lo = (np.int32(row[o + 96 + (k & 7)]) >> (4 * (k >> 3))) & 15
                    hi = (np.int32(row[o + 104 + (k & 3)]) >> (2 * (k >> 2))) & 3
                    sc[g, 16 * b + k, lane] = (lo | (hi << 4)) - 32
                for e in range(256):  # crumbs of qs plus the high bit i of hmask byte l (e = 32i + l)
                    h, s, l = e >> 7, (e >> 5) & 3, e & 31
                    q = (np.int32(row[o + 32 + 32 * h + l]) >> (2 * s)) & 3
                    f[e] = q | (((np.int32(row[o + l]) >> (e >> 5)) & 1) << 2)
                for sub in range(8):
                    _put4(words, g, 8 * b + sub, lane, f, 32 * sub)


@njit(**_INL)
def _scale_min_k4_jit(row, o, sc, mn, g, k0, lane):
    """Q4_K/Q5_K 12 packed bytes at row[o:] -> 8 scales and 8 mins (6 bits each)."""
    for j in range(4):
        a, c, md = np.int32(row[o + j]), np.int32(row[o + 4 + j]), np.int32(row[o + 8 + j])
        sc[g, k0 + j, lane] = a & 63
        mn[g, k0 + j, lane] = c & 63
        sc[g, k0 + 4 + j, lane] = (md & 15) | ((a >> 2) & 48)
        mn[g, k0 + 4 + j, lane] = (md >> 4) | ((c >> 2) & 48)


@njit(**JIT)
def _rp_q4_k(raw, g0, g1, words, d, dmin, sc, mn):
    f = np.empty(256, np.int32)
    for g in range(g0, g1):
        for lane in range(_lanes_of(raw, g)):
            row = raw[g * LANES + lane]
            for b in range(words.shape[1] // 8):
                o = 144 * b
                d[g, b, lane] = _h2f(row[o], row[o + 1])
                dmin[g, b, lane] = _h2f(row[o + 2], row[o + 3])
                _scale_min_k4_jit(row, o + 4, sc, mn, g, 8 * b, lane)
                for c in range(4):  # 32 bytes -> elements 64c + l (low nibble), 64c + 32 + l (high)
                    for i in range(32):
                        q = np.int32(row[o + 16 + 32 * c + i])
                        f[64 * c + i] = q & 15
                        f[64 * c + 32 + i] = q >> 4
                for sub in range(8):
                    _put4(words, g, 8 * b + sub, lane, f, 32 * sub)


@njit(**JIT)
def _rp_q5_k(raw, g0, g1, words, d, dmin, sc, mn):
    f = np.empty(256, np.int32)
    for g in range(g0, g1):
        for lane in range(_lanes_of(raw, g)):
            row = raw[g * LANES + lane]
            for b in range(words.shape[1] // 8):
                o = 176 * b
                d[g, b, lane] = _h2f(row[o], row[o + 1])
                dmin[g, b, lane] = _h2f(row[o + 2], row[o + 3])
                _scale_min_k4_jit(row, o + 4, sc, mn, g, 8 * b, lane)
                for c in range(4):
                    for i in range(32):
                        q = np.int32(row[o + 48 + 32 * c + i])
                        hb = np.int32(row[o + 16 + i])  # bit k of byte i: element 32k + i
                        f[64 * c + i] = (q & 15) | (((hb >> (2 * c)) & 1) << 4)
                        f[64 * c + 32 + i] = (q >> 4) | (((hb >> (2 * c + 1)) & 1) << 4)
                for sub in range(8):
                    _put5(words, g, 8 * b + sub, lane, f, 32 * sub)


@njit(**JIT)
def _rp_q6_k(raw, g0, g1, words, d, sc):
    for g in range(g0, g1):
        for lane in range(_lanes_of(raw, g)):
            row = raw[g * LANES + lane]
            for b in range(words.shape[1] // 8):
                o = 210 * b
                d[g, b, lane] = _h2f(row[o + 208], row[o + 209])
                for k in range(16):
                    sc[g, 16 * b + k, lane] = np.int8(row[o + 192 + k])
                for h in range(2):  # element 128h + 32k + l: nibble of ql, crumb k of qh[32h + l]
                    blk = 8 * b + 4 * h
                    for l in range(QB):
                        a = np.int32(row[o + 64 * h + l])
                        c = np.int32(row[o + 64 * h + 32 + l])
                        q = np.int32(row[o + 128 + 32 * h + l])
                        k = l * LANES + lane
                        words[g, blk, k] = (a & 15) | ((q & 3) << 4)
                        words[g, blk + 1, k] = (c & 15) | (((q >> 2) & 3) << 4)
                        words[g, blk + 2, k] = (a >> 4) | (((q >> 4) & 3) << 4)
                        words[g, blk + 3, k] = (c >> 4) | (((q >> 6) & 3) << 4)


@njit(**JIT)
def _rp_half(raw, g0, g1, words):
    f = np.empty(QB, np.int32)
    for g in range(g0, g1):
        for lane in range(_lanes_of(raw, g)):
            row = raw[g * LANES + lane]
            for b in range(words.shape[1]):
                for t in range(QB):
                    f[t] = np.int32(row[64 * b + 2 * t]) | (np.int32(row[64 * b + 2 * t + 1]) << 8)
                _put8(words, g, b, lane, f, 0)


# type -> (kernel, scale arrays as (dtype, entries per GGUF block)), in the unpackers' order
_F4 = np.float32
_KERNELS: dict[int, tuple[Callable, tuple]] = {
    2: (_rp_q4_0, ((_F4, 1),)),
    3: (_rp_q4_1, ((_F4, 1), (_F4, 1))),
    6: (_rp_q5_0, ((_F4, 1),)),
    7: (_rp_q5_1, ((_F4, 1), (_F4, 1))),
    8: (_rp_q8_0, ((_F4, 1),)),
    10: (_rp_q2_k, ((_F4, 1), (_F4, 1), (_U8, 16), (_U8, 16))),
    11: (_rp_q3_k, ((_F4, 1), (np.int8, 16))),
    12: (_rp_q4_k, ((_F4, 1), (_F4, 1), (_U8, 8), (_U8, 8))),
    13: (_rp_q5_k, ((_F4, 1), (_F4, 1), (_U8, 8), (_U8, 8))),
    14: (_rp_q6_k, ((_F4, 1), (np.int8, 16))),
    1: (_rp_half, ()),
    30: (_rp_half, ()),
}

# raw bytes per repack task: big matrices are split over threads, and the file pages of each
# finished task are released at once (the repacked copy replaces them in memory)
_TASK_BYTES = 4 << 20
_pool: list[ThreadPoolExecutor] = []


def _threads() -> int:
    return max(1, min(8, numba.config.NUMBA_NUM_THREADS))


def repack(raw_rows: np.ndarray, ggml_type: int, n_in: int) -> tuple[np.ndarray, ...]:
    """GGUF rows uint8 [n_out, row_bytes] -> (words, *scales) in the lane layout (see
    `repack_reference` for the shapes), with the jitted kernels.

    Matrices above _TASK_BYTES are split into row-group ranges run on a small thread pool
    (the kernels release the GIL); when raw_rows is a view of a GGUF file mapping, the pages
    of each finished range are handed back to the OS (archrun.io.ggufio.release_view).
    """
    from archrun.io.ggufio import release_view

    lay = LAYOUTS[ggml_type]
    kernel, scale_specs = _KERNELS[ggml_type]
    raw = np.ascontiguousarray(raw_rows).view()
    raw.flags.writeable = False  # one compiled variant per type: file views are read-only
    n_out, row_bytes = raw.shape
    ng = n_groups(n_out)
    nblk = n_in // lay.block
    words = np.zeros((ng, n_in // QB, lay.words * LANES), lay.word_dtype)
    scales = [np.zeros((ng, nblk * per, LANES), dt) for dt, per in scale_specs]
    outs = [words, *(s.view(np.uint32) if s.dtype == np.float32 else s for s in scales)]
    step = max(1, _TASK_BYTES // (row_bytes * LANES))  # groups per task

    def task(g0: int) -> None:
        g1 = min(ng, g0 + step)
        kernel(raw, g0, g1, *outs)
        release_view(raw_rows[g0 * LANES:g1 * LANES])

    starts = range(0, ng, step)
    if len(starts) > 1 and _threads() > 1:
        if not _pool:
            _pool.append(ThreadPoolExecutor(_threads(), thread_name_prefix="archrun-repack"))
        list(_pool[0].map(task, starts))
    else:
        for g0 in starts:
            task(g0)
    return (words, *scales)
