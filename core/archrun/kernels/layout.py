"""Repacking GGUF blocks into the lane-interleaved layout the kernels read.

Every quantized type is unpacked (numpy, at load) into integer fields in natural element
order plus its scales, then packed again:

- fields go into uint16 words, several per word, in natural order inside each 32-element
  block (4-bit: 4 per word; 5-bit: 3 per word, 11 words per block; 2-bit: 8 per word); 8-bit
  fields (Q8_0, Q6_K) stay bytes;
- rows are interleaved in groups of LANES: words[group, block, word * LANES + lane], so the kernels'
  inner loops run over contiguous lanes (one output row each) with no horizontal sums;
- f16 scales become float32; K-quant sub-scales become one byte each.

The repacked matrix is at most ~1.35x the GGUF bytes (Q3_K; Q4_K 1.06x, Q4_1 1.2x,
Q5_0 1.18x, Q6_K 1.31x) and is built a few thousand rows at a time, so load-time temporaries
stay small. Rows are padded with zero rows to a multiple of LANES.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from archrun.kernels._jit import LANES, QB

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
                 word_dtype):
        self.block = block            # elements per GGUF block
        self.type_size = type_size    # bytes per GGUF block
        self.unpack = unpack
        self.pack = pack
        self.words = words            # words per 32-element block per row
        self.word_dtype = np.dtype(word_dtype)


LAYOUTS: dict[int, TypeLayout] = {
    2: TypeLayout(32, 18, _unpack_q4_0, _pack4, 8, np.uint16),     # Q4_0
    3: TypeLayout(32, 20, _unpack_q4_1, _pack4, 8, np.uint16),     # Q4_1
    6: TypeLayout(32, 22, _unpack_q5_0, _pack5, 11, np.uint16),    # Q5_0
    7: TypeLayout(32, 24, _unpack_q5_1, _pack5, 11, np.uint16),    # Q5_1
    8: TypeLayout(32, 34, _unpack_q8_0, _pack8, 32, np.int8),      # Q8_0
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


def repack(raw_rows: np.ndarray, ggml_type: int, n_in: int) -> tuple[np.ndarray, ...]:
    """GGUF rows uint8 [n_out, row_bytes] -> (words, *scales) in the lane layout.

    words [ng, n_in // 32, words * LANES] (word-major, lane-minor within a block); scales
    [ng, n_blocks_or_sub, LANES] in the order the type's unpacker returns them.
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
        packed = _lanes(lay.pack(fields.reshape(blocks.shape[0], n_in)), part)
        words[g0:g0 + part] = packed.reshape(part, n_in // QB, -1)
        if scales is None:
            scales = [np.zeros((ng,) + s.reshape(s.shape[0], -1).shape[1:] + (LANES,), s.dtype) for s in sc]
        for dst, s in zip(scales, sc, strict=True):
            dst[g0:g0 + part] = _lanes(s.reshape(s.shape[0], -1), part)
    return (words, *scales)


def unpack_rows(raw_rows: np.ndarray, ggml_type: int, n_in: int) -> tuple[np.ndarray, tuple]:
    """(fields [n, n_in], scales) of GGUF rows, natural order; for tests and tools."""
    lay = LAYOUTS[ggml_type]
    blocks = np.asarray(raw_rows).reshape(raw_rows.shape[0], n_in // lay.block, lay.type_size)
    fields, sc = lay.unpack(blocks)
    return fields.reshape(raw_rows.shape[0], n_in), sc
