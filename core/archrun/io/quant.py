"""Reference numpy dequantization of ggml tensor data to float32.

Every routine reproduces ``gguf.quants.dequantize`` bit for bit: the same float32 operations in
the same order (scale products rounded to float32 first, then ``scale * q`` and the min term),
so this module is the reference the numba kernels are tested against.

Data is processed in chunks of whole blocks written into one preallocated output, which keeps
the temporaries cache-sized: a 150k x 896 Q8_0 matrix dequantizes in well under a second.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, QK_K, GGMLQuantizationType

from archrun.errors import UnsupportedQuantType

__all__ = ["SCALE_FIELDS", "SUPPORTED_TYPES", "block_info", "dequantize", "first_non_finite", "row_bytes",
           "type_name"]

_T = GGMLQuantizationType
_F16 = np.dtype("<f2")
_F32 = np.dtype("<f4")

# about 256 KiB of float32 output per chunk: big enough to amortise Python overhead,
# small enough that the uint8/float32 temporaries stay in cache
_CHUNK_ELEMENTS = 1 << 16


def type_name(ggml_type: int) -> str:
    """Name of a ggml type number ("Q4_K"), or "type <n>" for numbers gguf does not know."""
    try:
        return GGMLQuantizationType(ggml_type).name
    except ValueError:
        return f"type {ggml_type}"


def block_info(ggml_type: int) -> tuple[int, int]:
    """(elements per block, bytes per block) of any type gguf knows, supported or not.

    Layout is known for more types than archrun can dequantize, so this only raises
    UnsupportedQuantType for type numbers absent from gguf's GGML_QUANT_SIZES.
    """
    try:
        return GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        raise UnsupportedQuantType(f"unknown ggml tensor type {type_name(ggml_type)}") from None


def row_bytes(ggml_type: int, n_cols: int) -> int:
    """Bytes of one row of ``n_cols`` elements; n_cols must be a positive multiple of the block size."""
    block_size, type_size = block_info(ggml_type)
    if n_cols <= 0 or n_cols % block_size:
        raise ValueError(
            f"row of {n_cols} elements is not a positive multiple of the {type_name(ggml_type)} block size {block_size}"
        )
    return n_cols // block_size * type_size


def _f16(col: np.ndarray) -> np.ndarray:
    """(n, 2) uint8 columns of a block array -> (n, 1) float32 from little-endian float16."""
    return np.ascontiguousarray(col).view(_F16).astype(np.float32)


def _fields(packed: np.ndarray, lanes: int, bits: int) -> np.ndarray:
    """(n, g*lanes) packed bytes -> (n, g, 8 // bits, lanes) uint8 fields, lowest bits first.

    Field k of byte j is ``(byte >> (k * bits)) & mask``. Each shift runs on one contiguous
    array (numpy is slow on short broadcast rows), then one concatenate interleaves them.
    """
    n = packed.shape[0]
    x = np.ascontiguousarray(packed).reshape(n, -1, 1, lanes)
    mask = np.uint8((1 << bits) - 1)
    parts = [x & mask] + [(x >> np.uint8(k)) & mask for k in range(bits, 8 - bits, bits)] + [x >> np.uint8(8 - bits)]
    return np.concatenate(parts, axis=2)


def _nibbles(qs: np.ndarray, lanes: int) -> np.ndarray:
    """(n, g*lanes) packed bytes -> (n, g, 2, lanes) uint8: low nibbles first, then high ones."""
    return _fields(qs, lanes, 4)


def _times16(x: np.ndarray) -> np.ndarray:
    """x << 4 for uint8 (a multiply: numpy's uint8 shift left is not vectorised)."""
    return np.multiply(x, np.uint8(16), out=x)


# ---- legacy 32-element blocks -------------------------------------------------------------------


def _q4_0(b: np.ndarray, out: np.ndarray) -> None:
    # block: d f16 | qs[16]; x = d * (q - 8), low nibbles are elements 0..15
    q = _nibbles(b[:, 2:], 16).reshape(len(b), 32).view(np.int8)
    np.multiply(_f16(b[:, 0:2]), np.subtract(q, np.int8(8), out=q), out=out)


def _q4_1(b: np.ndarray, out: np.ndarray) -> None:
    # block: d f16 | m f16 | qs[16]; x = d * q + m
    q = _nibbles(b[:, 4:], 16).reshape(len(b), 32)
    np.multiply(_f16(b[:, 0:2]), q, out=out)
    np.add(out, _f16(b[:, 2:4]), out=out)


def _q5_high(qh: np.ndarray) -> np.ndarray:
    """(n, 4) bytes of the little-endian uint32 of fifth bits -> (n, 32) uint8 values 0/16."""
    return _times16(np.unpackbits(np.ascontiguousarray(qh), axis=1, bitorder="little"))


def _q5_0(b: np.ndarray, out: np.ndarray) -> None:
    # block: d f16 | qh u32 | qs[16]; x = d * (q - 16)
    q = np.bitwise_or(_nibbles(b[:, 6:], 16).reshape(len(b), 32), _q5_high(b[:, 2:6])).view(np.int8)
    np.multiply(_f16(b[:, 0:2]), np.subtract(q, np.int8(16), out=q), out=out)


def _q5_1(b: np.ndarray, out: np.ndarray) -> None:
    # block: d f16 | m f16 | qh u32 | qs[16]; x = d * q + m
    q = _nibbles(b[:, 8:], 16).reshape(len(b), 32) | _q5_high(b[:, 4:8])
    np.multiply(_f16(b[:, 0:2]), q, out=out)
    np.add(out, _f16(b[:, 2:4]), out=out)


def _q8_0(b: np.ndarray, out: np.ndarray) -> None:
    # block: d f16 | qs int8[32]; x = q * d
    np.multiply(b[:, 2:].view(np.int8), _f16(b[:, 0:2]), out=out)


MXFP4, Q8_0, BF16 = int(_T.MXFP4), int(_T.Q8_0), int(_T.BF16)

# MXFP4 (OCP microscaling FP4, gpt-oss): block e uint8 (E8M0 scale) | qs[16]; element j is
# E2M1_X2[low nibble of qs[j]] * 2^(e - 128) for j < 16, the high nibble's for j + 16 (ggml's
# kvalues_mxfp4 are twice the E2M1 values, so they are integers; the scale is halved to match)
E2M1_X2 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)


def _mxfp4_codes(b: np.ndarray) -> np.ndarray:
    """int8 [n, 32]: each element's doubled E2M1 value."""
    return E2M1_X2[_nibbles(b[:, 1:], 16).reshape(len(b), 32)]


def _mxfp4_scales(b: np.ndarray) -> np.ndarray:
    """float32 [n, 1]: 2^(e - 128), exact (ggml_e8m0_to_fp32_half: e = 0 and 1 are subnormal,
    e = 255 is 2^127, not NaN)."""
    return np.ldexp(np.float32(1.0), b[:, 0].astype(np.int32) - 128).astype(np.float32)[:, None]


def _mxfp4(b: np.ndarray, out: np.ndarray) -> None:
    np.multiply(_mxfp4_codes(b), _mxfp4_scales(b), out=out)


def mxfp4_as_bf16(raw: np.ndarray) -> np.ndarray:
    """MXFP4 rows uint8 [n, row_bytes] -> the same values as BF16 rows uint8 [n, 2 * elements].

    Exact for every block: a value is a doubled E2M1 code (at most two significant bits) times
    2^(e - 128), and bfloat16 has float32's exponent range, subnormals included. The fast engine
    multiplies MXFP4 weights as BF16 this way, on float32 activations: the products are those of
    the dequantized float32 weights, as the checkpoints' own reference computes them (an int8
    quantization of the activations, llama.cpp's route for MXFP4, lands ~1e-2 of max |logit| away)."""
    blocks = np.ascontiguousarray(raw).reshape(-1, 17)
    values = np.empty((len(blocks), 32), np.float32)
    _mxfp4(blocks, values)
    bf16 = (values.view(np.uint32) >> 16).astype("<u2")
    return bf16.view(np.uint8).reshape(raw.shape[0], -1)


# ---- k-quants: 256-element super-blocks ---------------------------------------------------------


def _q2_k(b: np.ndarray, out: np.ndarray) -> None:
    # block: scales[16] (lo nibble scale, hi nibble min) | qs[64] | d f16 | dmin f16
    n = len(b)
    scales = b[:, :16]
    dl = (_f16(b[:, 80:82]) * (scales & np.uint8(0x0F))).reshape(n, 16, 1)
    ml = (_f16(b[:, 82:84]) * (scales >> np.uint8(4))).reshape(n, 16, 1)
    q = _fields(b[:, 16:80], 32, 2).reshape(n, 16, 16)
    o = out.reshape(n, 16, 16)
    np.multiply(dl, q, out=o)
    np.subtract(o, ml, out=o)


def _q3_k_scales(sc: np.ndarray) -> np.ndarray:
    """(n, 12) packed 6-bit scales -> (n, 16) float32 values in -32..31."""
    n = sc.shape[0]
    lo = _fields(sc[:, :8], 8, 4).reshape(n, 16)
    hi = _fields(sc[:, 8:12], 4, 2).reshape(n, 16)
    s = (lo | _times16(hi)).view(np.int8)
    return np.subtract(s, np.int8(32), out=s).astype(np.float32)


def _q3_k(b: np.ndarray, out: np.ndarray) -> None:
    # block: hmask[32] | qs[64] | scales[12] | d f16; q = low2 - 4 * (1 - hbit)
    n = len(b)
    dl = (_f16(b[:, 108:110]) * _q3_k_scales(b[:, 96:108])).reshape(n, 16, 1)
    ql = _fields(b[:, 32:96], 32, 2).reshape(n, 16, 16).view(np.int8)
    hbit = _fields(b[:, :32], 32, 1).reshape(n, 16, 16)
    # ql - 4 * (1 - hbit) == ql - 4 + 4 * hbit
    q = np.subtract(ql, np.int8(4), out=ql)
    q += np.multiply(hbit, np.uint8(4), out=hbit).view(np.int8)
    np.multiply(dl, q, out=out.reshape(n, 16, 16))


def _k_scale_min(sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n, 12) packed 6-bit scales and mins of Q4_K/Q5_K -> two (n, 8) uint8 arrays."""
    s = sc.reshape(-1, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    scale = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mins = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return scale, mins


def _k_affine(b: np.ndarray, q: np.ndarray, out: np.ndarray) -> None:
    """x = (d * scale) * q - dmin * min over 8 sub-blocks of 32; q is (n, 8, 32) uint8."""
    n = len(b)
    scale, mins = _k_scale_min(b[:, 4:16])
    dl = (_f16(b[:, 0:2]) * scale).reshape(n, 8, 1)
    ml = (_f16(b[:, 2:4]) * mins).reshape(n, 8, 1)
    o = out.reshape(n, 8, 32)
    np.multiply(dl, q, out=o)
    np.subtract(o, ml, out=o)


def _q4_k(b: np.ndarray, out: np.ndarray) -> None:
    # block: d f16 | dmin f16 | scales[12] | qs[128]
    _k_affine(b, _nibbles(b[:, 16:], 32).reshape(len(b), 8, 32), out)


def _q5_k(b: np.ndarray, out: np.ndarray) -> None:
    # block: d f16 | dmin f16 | scales[12] | qh[32] | qs[128]
    n = len(b)
    ql = _nibbles(b[:, 48:], 32).reshape(n, 8, 32)
    qh = _fields(b[:, 16:48], 32, 1).reshape(n, 8, 32)
    _k_affine(b, np.bitwise_or(ql, _times16(qh), out=ql), out)


def _q6_k(b: np.ndarray, out: np.ndarray) -> None:
    # block: ql[128] | qh[64] | scales int8[16] | d f16; x = (d * scale) * (q - 32)
    n = len(b)
    dl = (_f16(b[:, 208:210]) * b[:, 192:208].view(np.int8)).reshape(n, 16, 1)
    ql = _nibbles(b[:, :128], 64).reshape(n, 8, 32)
    qh = _fields(b[:, 128:192], 32, 2).reshape(n, 8, 32)
    q = np.bitwise_or(ql, _times16(qh), out=ql).view(np.int8)
    q = np.subtract(q, np.int8(32), out=q)
    np.multiply(dl, q.reshape(n, 16, 16), out=out.reshape(n, 16, 16))


# ---- ternary types (BitNet b1.58) ---------------------------------------------------------------


def _gguf_reference(qtype: GGMLQuantizationType) -> Callable[[np.ndarray, np.ndarray], None]:
    """gguf-py's numpy dequantizer of `qtype` (the ternary types TQ1_0 and TQ2_0, whose matrices have no
    kernel yet: the fast backend multiplies their dequantized float32 copy)."""
    from gguf import quants

    def fn(b: np.ndarray, out: np.ndarray) -> None:
        out[:] = quants.dequantize(b, qtype).reshape(out.shape)

    return fn


# ---- plain float types --------------------------------------------------------------------------


def _f16_elems(b: np.ndarray, out: np.ndarray) -> None:
    out[:] = b.view(_F16)


def _bf16(b: np.ndarray, out: np.ndarray) -> None:
    # bfloat16 is the high half of a float32
    out.view(np.uint32)[:] = b.view("<u2").astype(np.uint32) << np.uint32(16)


def _f32(b: np.ndarray, out: np.ndarray) -> None:
    out[:] = b.view(_F32)


_BlockFn = Callable[[np.ndarray, np.ndarray], None]

# ggml type -> routine writing (n_blocks, block_size) float32 from (n_blocks, type_size) uint8
_DEQUANT: dict[int, _BlockFn] = {
    _T.F32: _f32,
    _T.F16: _f16_elems,
    _T.BF16: _bf16,
    _T.Q4_0: _q4_0,
    _T.Q4_1: _q4_1,
    _T.Q5_0: _q5_0,
    _T.Q5_1: _q5_1,
    _T.Q8_0: _q8_0,
    _T.MXFP4: _mxfp4,
    _T.Q2_K: _q2_k,
    _T.Q3_K: _q3_k,
    _T.Q4_K: _q4_k,
    _T.Q5_K: _q5_k,
    _T.Q6_K: _q6_k,
    _T.TQ1_0: _gguf_reference(_T.TQ1_0),
    _T.TQ2_0: _gguf_reference(_T.TQ2_0),
}
assert QK_K == 256, "k-quant layouts above assume 256-element super-blocks"

SUPPORTED_TYPES: frozenset[int] = frozenset(int(t) for t in _DEQUANT)


def _blocks_of(raw: np.ndarray, ggml_type: int, np_shape: tuple[int, ...]) -> np.ndarray:
    """Validate sizes and view ``raw`` as (n_blocks, type_size) uint8 (no copy when contiguous)."""
    block_size, type_size = block_info(ggml_type)
    n_elems = int(np.prod(np_shape, dtype=object)) if np_shape else 1
    if not np_shape or np_shape[-1] % block_size:
        raise ValueError(
            f"{type_name(ggml_type)} tensor of shape {np_shape}: last dimension is not a multiple "
            f"of the block size {block_size}"
        )
    n_blocks = n_elems // block_size
    if raw.dtype != np.uint8 or raw.size != n_blocks * type_size:
        raise ValueError(
            f"{type_name(ggml_type)} tensor of shape {np_shape} needs {n_blocks * type_size} bytes, "
            f"got {raw.size} of dtype {raw.dtype}"
        )
    return np.ascontiguousarray(raw).reshape(n_blocks, type_size)


def dequantize(raw: np.ndarray, ggml_type: int, np_shape: tuple[int, ...]) -> np.ndarray:
    """Dequantize ggml tensor bytes to a new float32 array of ``np_shape`` (numpy order).

    ``raw`` is uint8 of any shape holding exactly the tensor's bytes. Types outside
    SUPPORTED_TYPES raise UnsupportedQuantType naming the type (e.g. "IQ4_XS").
    """
    fn = _DEQUANT.get(ggml_type)
    if fn is None:
        raise UnsupportedQuantType(f"archrun cannot dequantize ggml type {type_name(ggml_type)}")
    np_shape = tuple(int(d) for d in np_shape)
    blocks = _blocks_of(raw, ggml_type, np_shape)
    block_size = block_info(ggml_type)[0]
    out = np.empty((len(blocks), block_size), dtype=np.float32)
    step = max(1, _CHUNK_ELEMENTS // block_size)
    # random or hostile scales may be inf/NaN; they propagate like in ggml, without warnings
    with np.errstate(all="ignore"):
        for start in range(0, len(blocks), step):
            fn(blocks[start : start + step], out[start : start + step])
    return out.reshape(np_shape)


# ---- non-finite values --------------------------------------------------------------------------

# byte ranges of each block type's float16 scale fields (d, and dmin / m where the type has one)
SCALE_FIELDS: dict[int, tuple[tuple[int, int], ...]] = {
    _T.Q4_0: ((0, 2),),
    _T.Q4_1: ((0, 2), (2, 4)),
    _T.Q5_0: ((0, 2),),
    _T.Q5_1: ((0, 2), (2, 4)),
    _T.Q8_0: ((0, 2),),
    _T.Q2_K: ((80, 82), (82, 84)),
    _T.Q3_K: ((108, 110),),
    _T.Q4_K: ((0, 2), (2, 4)),
    _T.Q5_K: ((0, 2), (2, 4)),
    _T.Q6_K: ((208, 210),),
}
# float element types: (unsigned view, mask of the exponent bits; all set = Inf or NaN)
_FLOAT_BITS = {_T.F32: ("<u4", 0x7F800000), _T.F16: ("<u2", 0x7C00), _T.BF16: ("<u2", 0x7F80)}
_F16_EXP = np.uint16(0x7C00)
_SCAN_ELEMENTS = 1 << 20  # elements per pass over float data: bounds the temporaries


def first_non_finite(raw: np.ndarray, ggml_type: int) -> tuple[str, int] | None:
    """Where the first Inf or NaN of a tensor's bytes is, else None: ("element", i) for float
    types, ("scale of block", i) for block types (their integer quants are always finite).

    Reads the bit patterns only (no float conversion, no warnings); memory stays bounded by one
    pass's temporaries whatever the tensor size. Types without a table entry report None.
    """
    if ggml_type in _FLOAT_BITS:
        dtype, mask = _FLOAT_BITS[ggml_type]
        bits = np.ascontiguousarray(raw).reshape(-1).view(dtype)
        m = bits.dtype.type(mask)
        for start in range(0, len(bits), _SCAN_ELEMENTS):
            bad = np.flatnonzero((bits[start:start + _SCAN_ELEMENTS] & m) == m)
            if len(bad):
                return "element", start + int(bad[0])
        return None
    if ggml_type == _T.MXFP4:  # scales are finite powers of two; a big one times a big code is Inf
        blocks = np.ascontiguousarray(raw).reshape(-1, 17)
        big = np.abs(_mxfp4_codes(blocks)).max(axis=1).astype(np.float64)
        bad = np.flatnonzero(np.ldexp(big, blocks[:, 0].astype(np.int32) - 128) >= 2.0 ** 128)
        return ("scale of block", int(bad[0])) if len(bad) else None
    fields = SCALE_FIELDS.get(ggml_type)
    if not fields:
        return None
    type_size = block_info(ggml_type)[1]
    # every block size and scale offset is even: the scales are columns of a uint16 view
    blocks = np.ascontiguousarray(raw).reshape(-1).view("<u2").reshape(-1, type_size // 2)
    first = None
    for lo, _hi in fields:
        bad = np.flatnonzero((blocks[:, lo // 2] & _F16_EXP) == _F16_EXP)
        if len(bad) and (first is None or bad[0] < first):
            first = int(bad[0])
    return None if first is None else ("scale of block", first)
