"""Explicit AVX2 block dots for numba kernels (LLVM intrinsics), where numba's loops cannot reach.

llama.cpp's integer dots multiply bytes with `vpmaddubsw` (32 u8 x s8 products summed in
pairs per instruction) and widen with `vpmaddwd`; numba's auto-vectorised loops multiply in
16-bit lanes and spend ~3x the instructions. These intrinsics emit that sequence for one
32-element block of all LANES rows of a group, on the lane layouts of layout.py, and return
exact integer sums: the callers scale them as before, so results are bit-identical to the
portable loops (which stay the implementation where AVX2 is absent, and without the JIT).

`AVX2` says whether they are used: numba compiles for the host CPU, and the host has AVX2
(and no NUMBA_CPU_NAME / NUMBA_CPU_FEATURES override asks for another target).
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import binding, ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from archrun.kernels._jit import LANES, QB


def host_has(feature: str) -> bool:
    """Whether kernels may use the host CPU's `feature` (LLVM's name, e.g. "avx2", "f16c"): numba compiles
    for the host, unless the JIT is off or NUMBA_CPU_NAME / NUMBA_CPU_FEATURES ask for another target."""
    if numba.config.DISABLE_JIT or numba.config.CPU_NAME or numba.config.CPU_FEATURES:
        return False
    try:
        return bool(binding.get_host_cpu_features().get(feature, False))
    except RuntimeError:  # no feature map on this platform
        return False


AVX2 = host_has("avx2")
#: whether kernels may convert float16 with the CPU's F16C instructions (without F16C, LLVM would lower
#: `fpext half` to a helper call numba's linker does not provide)
F16C = host_has("f16c")

_I1, _I8, _I16, _I32 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32)
_V32I8, _V16I16, _V8I32 = ir.VectorType(_I8, 32), ir.VectorType(_I16, 16), ir.VectorType(_I32, 8)


def _data(context, builder, ty, val, elem):
    """Pointer to an array argument's first element, as `elem` *."""
    return builder.bitcast(context.make_array(ty)(context, builder, val).data, elem.as_pointer())


def _declare(builder, name, ret, args):
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, args), name)


def _broadcast32(builder, value):
    """<8 x i32> with `value` in every element."""
    v = builder.insert_element(ir.Constant(_V8I32, ir.Undefined), value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, ir.Constant(_V8I32, ir.Undefined), ir.Constant(_V8I32, [0] * 8))


def _broadcast16(builder, value):
    """<16 x i16> with `value` in every element."""
    v = builder.insert_element(ir.Constant(_V16I16, ir.Undefined), value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, ir.Constant(_V16I16, ir.Undefined), ir.Constant(ir.VectorType(_I32, 16), [0] * 16))


@intrinsic
def _fma32(typingctx, a, b, c):
    if not all(x == types.float32 for x in (a, b, c)):
        return None

    def codegen(context, builder, sig, args):
        f = _declare(builder, "llvm.fma.f32", ir.FloatType(), [ir.FloatType()] * 3)
        return builder.call(f, list(args))

    return types.float32(types.float32, types.float32, types.float32), codegen


def fma32(a, b, c):
    """float32 a * b + c with one rounding (LLVM's llvm.fma: the CPU's fused multiply-add, libm's fmaf where
    it has none), which a loop over lanes vectorises; the float step the VNNI row tiles emit, so the lane
    loops of other hosts compute the same bits. Without the JIT: the float64 product (exact) plus c, rounded
    to float32 (a second rounding, which can differ from one fma in the last bit on rare inputs)."""
    return np.float32(np.float64(a) * np.float64(b) + np.float64(c))


@overload(fma32, inline="always", jit_options={"nogil": True})
def _fma32_jit(a, b, c):
    if all(x == types.float32 for x in (a, b, c)):
        return lambda a, b, c: _fma32(a, b, c)
    return None


@intrinsic
def half_to_float(typingctx, b):
    """float32 of the float16 bits b (uint16): LLVM's `fpext half`, exact (subnormals included), which a
    loop over a block vectorises to `vcvtph2ps` (8 or 16 halves an instruction). Only where F16C."""
    if b != types.uint16:
        return None

    def codegen(context, builder, sig, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(types.uint16), codegen


@intrinsic
def q8_quads_dot(typingctx, w, x, out):
    """out int32 [LANES] = the dot of each lane's 32 int8 weights with x int8 [32].

    w: int8 [32 * LANES] of one block in the quad layout: element e of lane l at
    (e // 4) * 4 * LANES + 4 * l + e % 4, so a 32-byte load holds 4 elements of 8 lanes.
    Per load: |w| (vpabsb), x with w's signs (vpsignb), vpmaddubsw (|sums| <= 2 * 128 * 127,
    no saturation), vpmaddwd by ones -> one int32 per lane.
    """
    if not (isinstance(w, types.Array) and isinstance(x, types.Array) and isinstance(out, types.Array)):
        return None

    def codegen(context, builder, sig, args):
        wp = _data(context, builder, sig.args[0], args[0], _V32I8)
        xp = _data(context, builder, sig.args[1], args[1], _I32)
        op = _data(context, builder, sig.args[2], args[2], _V8I32)
        pabs = _declare(builder, "llvm.abs.v32i8", _V32I8, [_V32I8, _I1])
        psign = _declare(builder, "llvm.x86.avx2.psign.b", _V32I8, [_V32I8, _V32I8])
        pmaddubs = _declare(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16I16, [_V32I8, _V32I8])
        pmaddwd = _declare(builder, "llvm.x86.avx2.pmadd.wd", _V8I32, [_V16I16, _V16I16])
        ones = ir.Constant(_V16I16, [1] * 16)
        regs = LANES // 8
        acc = [ir.Constant(_V8I32, [0] * 8)] * regs
        for q in range(QB // 4):  # 4 elements per pass
            xq = builder.bitcast(_broadcast32(builder, builder.load(builder.gep(xp, [ir.Constant(_I32, q)]),
                                                                    align=1)), _V32I8)
            for r in range(regs):  # lanes 8r .. 8r + 7
                wv = builder.load(builder.gep(wp, [ir.Constant(_I32, q * regs + r)]), align=1)
                prod = builder.call(pmaddubs, [builder.call(pabs, [wv, ir.Constant(_I1, 0)]),
                                               builder.call(psign, [xq, wv])])
                acc[r] = builder.add(acc[r], builder.call(pmaddwd, [prod, ones]))
        for r in range(regs):
            builder.store(acc[r], builder.gep(op, [ir.Constant(_I32, r)]), align=1)
        return context.get_dummy_value()

    return types.void(w, x, out), codegen


def _nibbles_codegen(halves: bool):
    """IR of nibbles_dot (one sum per lane) or nibbles_halves_dot (words 0-3 and 4-7 summed apart)."""

    def codegen(context, builder, sig, args):
        wp = _data(context, builder, sig.args[0], args[0], _V16I16)
        pp = _data(context, builder, sig.args[2], args[2], _I16)
        n_out = 2 if halves else 1
        outs = [_data(context, builder, sig.args[i], args[i], _V16I16) for i in range(len(args) - n_out, len(args))]
        cs = [context.cast(builder, args[i], sig.args[i], types.int16) for i in range(3, 3 + n_out)]
        pmaddubs = _declare(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16I16, [_V32I8, _V32I8])
        mask = ir.Constant(_V16I16, [0x0F0F] * 16)
        four = ir.Constant(_V16I16, [4] * 16)
        pairs = [_broadcast16(builder, builder.load(builder.gep(pp, [ir.Constant(_I32, k)]), align=1))
                 for k in range(QB // 2)]
        lane_halves = LANES // 16
        for h in range(lane_halves):  # lanes 16h .. 16h + 15
            acc = [_broadcast16(builder, builder.neg(c)) for c in cs]
            for j in range(QB // 4):
                s = j // 4 if halves else 0  # words 0-3: elements 0-15
                v = builder.load(builder.gep(wp, [ir.Constant(_I32, j * lane_halves + h)]), align=1)
                lo = builder.bitcast(builder.and_(v, mask), _V32I8)
                hi = builder.bitcast(builder.and_(builder.lshr(v, four), mask), _V32I8)
                acc[s] = builder.add(acc[s], builder.call(pmaddubs, [lo, builder.bitcast(pairs[2 * j], _V32I8)]))
                acc[s] = builder.add(acc[s], builder.call(pmaddubs, [hi, builder.bitcast(pairs[2 * j + 1], _V32I8)]))
            for out, a in zip(outs, acc, strict=True):
                builder.store(a, builder.gep(out, [ir.Constant(_I32, h)]), align=1)
        return context.get_dummy_value()

    return codegen


@intrinsic
def nibbles_dot(typingctx, w, x, xp, c, out):
    """out int16 [LANES] = sum(q * x) - c over one 32-element block of 4-bit fields, wrapped to int16
    (exactly dots._sum4's result).

    w: uint16 [8 * LANES], word j of lane l at j * LANES + l holding elements 4j..4j+3 (4 bits
    each, layout.py); x: the int16 activation block (unused here: the loop version's input);
    xp: int16 [16], the activation's int8 pairs (x[4j], x[4j+2]) at 2j and (x[4j+1], x[4j+3]) at
    2j + 1 (`nibble_pairs`). Per word: the low nibbles of both bytes (v & 0x0F0F) and the high
    ones ((v >> 4) & 0x0F0F) times a broadcast pair in vpmaddubsw (|pair sum| <= 2 * 15 * 127).
    """
    if not all(isinstance(a, types.Array) for a in (w, x, xp, out)):
        return None
    return types.void(w, x, xp, c, out), _nibbles_codegen(False)


@intrinsic
def nibbles_halves_dot(typingctx, w, x, xp, c0, c1, sa, sb):
    """sa, sb int16 [LANES] = sum(q * x) - c of each 16-element half of one block of 4-bit fields,
    wrapped to int16 (exactly dots._sum4_halves' results; Q3_K's fields, 0..7).

    Arguments as nibbles_dot's: words 0-3 hold the first half, 4-7 the second.
    """
    if not all(isinstance(a, types.Array) for a in (w, x, xp, sa, sb)):
        return None
    return types.void(w, x, xp, c0, c1, sa, sb), _nibbles_codegen(True)


@intrinsic
def crumbs_dot(typingctx, w, x, xp, sa, sb):
    """sa, sb int16 [LANES] = sum(q * x) of each 16-element half of one block of 2-bit fields
    (exactly dots._sum2_halves' results: at most 16 * 3 * 127, no wrap).

    w: uint16 [4 * LANES], word j of lane l at j * LANES + l holding elements 8j..8j+7 (2 bits
    each, layout.py); x: the int16 activation block (the loop version's input, unused); xp: int16
    [16], the activation's int8 pairs (x[8j+k], x[8j+4+k]) at 4j + k (`dots.crumb_pairs`). Per
    word and k: (v >> 2k) & 0x0303 puts field k in the low byte and field 4 + k in the high one,
    times the broadcast pair in vpmaddubsw.
    """
    if not all(isinstance(a, types.Array) for a in (w, x, xp, sa, sb)):
        return None

    def codegen(context, builder, sig, args):
        wp = _data(context, builder, sig.args[0], args[0], _V16I16)
        pp = _data(context, builder, sig.args[2], args[2], _I16)
        outs = [_data(context, builder, sig.args[i], args[i], _V16I16) for i in (3, 4)]
        pmaddubs = _declare(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16I16, [_V32I8, _V32I8])
        mask = ir.Constant(_V16I16, [0x0303] * 16)
        pairs = [builder.bitcast(_broadcast16(builder, builder.load(builder.gep(pp, [ir.Constant(_I32, k)]),
                                                                    align=1)), _V32I8)
                 for k in range(QB // 2)]
        lane_halves = LANES // 16
        for h in range(lane_halves):  # lanes 16h .. 16h + 15
            acc = [ir.Constant(_V16I16, [0] * 16)] * 2
            for j in range(QB // 8):
                v = builder.load(builder.gep(wp, [ir.Constant(_I32, j * lane_halves + h)]), align=1)
                for k in range(4):
                    q = builder.and_(builder.lshr(v, ir.Constant(_V16I16, [2 * k] * 16)), mask) if k else \
                        builder.and_(v, mask)
                    acc[j // 2] = builder.add(acc[j // 2], builder.call(pmaddubs, [builder.bitcast(q, _V32I8),
                                                                                  pairs[4 * j + k]]))
            for out, a in zip(outs, acc, strict=True):
                builder.store(a, builder.gep(out, [ir.Constant(_I32, h)]), align=1)
        return context.get_dummy_value()

    return types.void(w, x, xp, sa, sb), codegen


def _shuffle(builder, a, b, mask):
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_I32, len(mask)), mask))


# unpack masks (per 128-bit half, as vpunpck[lh]bw / vpunpck[lh]wd): low or high 8 bytes / 4 words of a and b
_UNPACK_B = {hi: [i for half in (0, 16) for k in range(8) for i in (half + k + 8 * hi, 32 + half + k + 8 * hi)]
             for hi in (0, 1)}
_UNPACK_W = {hi: [i for half in (0, 8) for k in range(4) for i in (half + k + 4 * hi, 16 + half + k + 4 * hi)]
             for hi in (0, 1)}


@intrinsic
def bytes_halves_dot(typingctx, w, x8, sa, sb):
    """sa, sb int32 [LANES] = sum(q * x) of each 16-element half of one block of unsigned byte fields
    (Q6_K's 0..63: exactly dots._bytes_halves_loops' results).

    w: uint8 [32 * LANES] element-major (element e of lane l at e * LANES + l, layout.py), LANES = 32;
    x8: int8 [32], the activation block. Per 4 elements: 4 loads of 32 lanes' bytes, transposed
    to quads in registers (vpunpck[lh]bw, vpunpck[lh]wd: rows in the order 0-3 16-19 | 4-7 20-23 |
    8-11 24-27 | 12-15 28-31), vpmaddubsw with the broadcast activation quad (|pair sum| <= 2 * 63 * 127;
    two quads' pair sums added in int16, <= 32004), vpmaddwd by ones into int32; the row order is
    restored once at the end.
    """
    if not all(isinstance(a, types.Array) for a in (w, x8, sa, sb)):
        return None

    def codegen(context, builder, sig, args):
        wp = _data(context, builder, sig.args[0], args[0], _V32I8)
        xp = _data(context, builder, sig.args[1], args[1], _I32)
        outs = [_data(context, builder, sig.args[i], args[i], _V8I32) for i in (2, 3)]
        pmaddubs = _declare(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16I16, [_V32I8, _V32I8])
        pmaddwd = _declare(builder, "llvm.x86.avx2.pmadd.wd", _V8I32, [_V16I16, _V16I16])
        ones = ir.Constant(_V16I16, [1] * 16)

        def quads(q):  # the 4 transposed registers of elements 4q..4q+3
            a = [builder.load(builder.gep(wp, [ir.Constant(_I32, 4 * q + i)]), align=1) for i in range(4)]
            b01 = [builder.bitcast(_shuffle(builder, a[0], a[1], _UNPACK_B[hi]), _V16I16) for hi in (0, 1)]
            b23 = [builder.bitcast(_shuffle(builder, a[2], a[3], _UNPACK_B[hi]), _V16I16) for hi in (0, 1)]
            return [builder.bitcast(_shuffle(builder, b01[lohi], b23[lohi], _UNPACK_W[hi]), _V32I8)
                    for lohi in (0, 1) for hi in (0, 1)]

        for half in range(2):
            acc = [ir.Constant(_V8I32, [0] * 8)] * 4
            for pair in range(2):  # quads 4 half + 2 pair, + 1: their pair sums added in int16
                p16 = None
                for q in (4 * half + 2 * pair, 4 * half + 2 * pair + 1):
                    xq = builder.bitcast(_broadcast32(builder, builder.load(builder.gep(xp, [ir.Constant(_I32, q)]),
                                                                            align=1)), _V32I8)
                    prods = [builder.call(pmaddubs, [r, xq]) for r in quads(q)]
                    p16 = prods if p16 is None else [builder.add(u, v) for u, v in zip(p16, prods, strict=True)]
                acc = [builder.add(a, builder.call(pmaddwd, [p, ones])) for a, p in zip(acc, p16, strict=True)]
            lo = list(range(4)) + list(range(8, 12))
            hi = list(range(4, 8)) + list(range(12, 16))
            rows = [_shuffle(builder, acc[0], acc[1], lo), _shuffle(builder, acc[2], acc[3], lo),
                    _shuffle(builder, acc[0], acc[1], hi), _shuffle(builder, acc[2], acc[3], hi)]
            for r, v in enumerate(rows):  # rows 8r .. 8r + 7
                builder.store(v, builder.gep(outs[half], [ir.Constant(_I32, r)]), align=1)
        return context.get_dummy_value()

    return types.void(w, x8, sa, sb), codegen



# 5-bit words (layout.py: element 3j + t at bits 5t of word j, 11 words): the byte pairs each
# word yields, as (word, mask/shift recipe, half) in the order of `five_pairs`' activation pairs.
# Recipes: "02" fields 0 and 2 as bytes (elements 3j, 3j + 2); "1" field 1 alone; "0" field 0
# alone; "12" fields 1 and 2; "01" fields 0 and 1. Word 5 straddles the 16-element halves.
FIVE_PAIRS = (
    *((j, r, 0) for j in range(5) for r in ("02", "1")),
    (5, "0", 0), (5, "12", 1),
    *((j, r, 1) for j in range(6, 10) for r in ("02", "1")),
    (10, "01", 1),
)
FIVE_PAIR_SLOTS = 24  # int16 pairs per activation block for fives_dot (21 used)


def _five_bytes(builder, v, recipe):
    """<16 x i16> -> the two fields of `recipe` in the low and high byte of every lane."""
    def k(value):
        return ir.Constant(_V16I16, [value] * 16)

    f0 = builder.and_(v, k(0x001F))
    f1_lo = builder.and_(builder.lshr(v, k(5)), k(0x001F))
    f2_hi = builder.and_(builder.lshr(v, k(2)), k(0x1F00))   # field 2 (bits 10-14) -> bits 8-12
    f1_hi = builder.and_(builder.shl(v, k(3)), k(0x1F00))    # field 1 (bits 5-9) -> bits 8-12
    return {"02": lambda: builder.or_(f0, f2_hi), "1": lambda: f1_lo, "0": lambda: f0,
            "12": lambda: builder.or_(f1_lo, f2_hi), "01": lambda: builder.or_(f0, f1_hi)}[recipe]()


@intrinsic
def fives_dot(typingctx, w, x, xp, c0, c1, sa, sb):
    """sa, sb int16 [LANES] = sum(q * x) - c of each 16-element half of one block of 5-bit fields,
    wrapped to int16 (exactly dots._sum5's results).

    w: uint16 [11 * LANES] (layout.py); x: the int16 activation block (the loop version's
    input, unused); xp: int16 [FIVE_PAIR_SLOTS], the activation's int8 pairs in FIVE_PAIRS order
    (`dots.five_pairs`). Each pair goes through vpmaddubsw (|pair sum| <= 2 * 31 * 127).
    """
    if not all(isinstance(a, types.Array) for a in (w, x, xp, sa, sb)):
        return None

    def codegen(context, builder, sig, args):
        wp = _data(context, builder, sig.args[0], args[0], _V16I16)
        pp = _data(context, builder, sig.args[2], args[2], _I16)
        outs = [_data(context, builder, sig.args[i], args[i], _V16I16) for i in (5, 6)]
        cs = [context.cast(builder, args[i], sig.args[i], types.int16) for i in (3, 4)]
        pmaddubs = _declare(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16I16, [_V32I8, _V32I8])
        pairs = [builder.bitcast(_broadcast16(builder, builder.load(builder.gep(pp, [ir.Constant(_I32, k)]),
                                                                    align=1)), _V32I8)
                 for k in range(len(FIVE_PAIRS))]
        halves = LANES // 16
        for h in range(halves):  # lanes 16h .. 16h + 15
            acc = [_broadcast16(builder, builder.neg(c)) for c in cs]
            words = {}
            for k, (j, recipe, half) in enumerate(FIVE_PAIRS):
                if j not in words:
                    words[j] = builder.load(builder.gep(wp, [ir.Constant(_I32, j * halves + h)]), align=1)
                q = builder.bitcast(_five_bytes(builder, words[j], recipe), _V32I8)
                acc[half] = builder.add(acc[half], builder.call(pmaddubs, [q, pairs[k]]))
            for out, a in zip(outs, acc, strict=True):
                builder.store(a, builder.gep(out, [ir.Constant(_I32, h)]), align=1)
        return context.get_dummy_value()

    return types.void(w, x, xp, c0, c1, sa, sb), codegen


# -- prefill: int8 GEMM tiles (kernels.matmul.gemm) -------------------------------------------------------
# A row group's weights, unpacked once per product into unsigned bytes in quads (U uint32 [nb, 8 * LANES]:
# word q * LANES + l holds elements 4q..4q+3 of lane l, one byte each, fields of at most 7 bits except
# Q8_0's w + 128), are multiplied with GEMM_TOKENS tokens at a time, every block: vpdpbusd (AVX-512 VNNI:
# 4 u8 x s8 products summed into each int32, 16 lanes per instruction) or vpmaddubsw + vpmaddwd (AVX2:
# the same int32 sums, 8 lanes; fields <= 127, so the pair sums never saturate; Q8_0 as |w| times x with
# w's signs, vpsignb, kind SIGNED). The int32 block sums
# start at the block's offset (-c * sum(x), exact) and are scaled into float32 accumulators that stay in
# registers over all blocks: acc += float(isum) * (a * dx) [+ m * (dx * sum(x))].



def _host_vnni() -> bool:
    """AVX-512 VNNI (and BW, for 512-bit byte vectors) where the AVX2 dots are used."""
    if not AVX2:
        return False
    features = binding.get_host_cpu_features()
    return bool(features.get("avx512vnni", False) and features.get("avx512bw", False))


VNNI = _host_vnni()

# tokens per tile: its float accumulators, GEMM_TOKENS x LANES, stay in registers (AVX-512: 4 x 2 of 32
# registers; AVX2 takes 8 lanes at a time: 8 x 1 of 16)
GEMM_TOKENS = 4 if VNNI else 8
ONE, MIN, HALVES = 0, 1, 2  # tile kinds: a * (q - c); a * q + m; per-16 halves a_h * (q - c_h)
# a * w with signed bytes w (Q8_0 on AVX2): U holds |w| quads, then w's (sums of |w| x sign(x, w): no
# vpmaddubsw pair exceeds 2 * 128 * 127, while w + 128 would saturate it)
SIGNED = 3

_F32T, _I64 = ir.FloatType(), ir.IntType(64)
_V16I32, _V16F32, _V8F32 = ir.VectorType(_I32, 16), ir.VectorType(_F32T, 16), ir.VectorType(_F32T, 8)


def _splat(builder, value, vec):
    """`vec` with `value` in every element."""
    v = builder.insert_element(ir.Constant(vec, ir.Undefined), value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, ir.Constant(vec, ir.Undefined), ir.Constant(ir.VectorType(_I32, vec.count),
                                                                                  [0] * vec.count))


def _arrays(context, builder, sig, args):
    return [context.make_array(ty)(context, builder, val) for ty, val in zip(sig.args, args, strict=False)
            if isinstance(ty, types.Array)]


def _ptr(builder, arr, elem):
    return builder.bitcast(arr.data, elem.as_pointer())


def _tile_args(context, builder, sig, args, vi, vf):
    """A tile's arguments as pointers: (t0, nb, n_pad, U as vi, XQ, OFF, DXT, A and M as vf, MS, acc as vf)."""
    U, XQ, OFF, DXT, A, M, MS, acc = _arrays(context, builder, sig, args)
    nb, n_pad = cgutils.unpack_tuple(builder, XQ.shape)[:2]
    return (args[7], nb, n_pad, _ptr(builder, U, vi), _ptr(builder, XQ, _I32), _ptr(builder, OFF, _I32),
            _ptr(builder, DXT, _F32T), _ptr(builder, A, vf), _ptr(builder, M, vf), _ptr(builder, MS, _F32T),
            _ptr(builder, acc, vf))


def _tile_codegen(kind: int):
    """IR of one AVX-512 VNNI tile: U uint32 [nb, 8 * LANES], XQ int32 [nb, n_pad, 8], OFF int32
    [nb, n_pad, 2], DXT f32 [nb, n_pad], A f32 [nb, 2, LANES], M f32 [nb, LANES], MS f32 [nb, n_pad], t0
    -> acc f32 [GEMM_TOKENS, LANES] (gemm._tile_loops states the arithmetic; kinds ONE and MIN read
    only OFF[..., 0] and A[:, 0]). GEMM_TOKENS x 2 int32 and float32 accumulators stay in registers."""
    width = 16  # int32 lanes per register
    vi, vf = _V16I32, _V16F32
    regs = LANES // width
    halves = 2 if kind == HALVES else 1
    tok = GEMM_TOKENS
    assert kind != SIGNED

    def codegen(context, builder, sig, args):
        t0, nb, n_pad, up, xp, op, dp, ap, mp, msp, out = _tile_args(context, builder, sig, args, vi, vf)
        dot = _declare(builder, "llvm.x86.avx512.vpdpbusd.512", _V16I32, [_V16I32] * 3)
        fma = _declare(builder, f"llvm.fma.v{width}f32", vf, [vf] * 3)
        facc = [[cgutils.alloca_once_value(builder, ir.Constant(vf, None)) for _ in range(regs)] for _ in range(tok)]
        k = lambda v: ir.Constant(_I64, v)  # noqa: E731
        with cgutils.for_range(builder, nb) as loop:
            b = loop.index
            row = builder.add(builder.mul(b, n_pad), t0)  # (b, t0) in [nb, n_pad]
            ia = [[[_splat(builder, builder.load(builder.gep(op, [builder.add(builder.mul(row, k(2)), k(2 * t + h))])),
                            vi)
                    for _ in range(regs)] for h in range(halves)] for t in range(tok)]
            ub = builder.mul(b, k(8 * regs))
            xb = builder.mul(row, k(8))
            for q in range(8):
                h = q // 4 if halves == 2 else 0
                u = [builder.load(builder.gep(up, [builder.add(ub, k(q * regs + r))]), align=4) for r in range(regs)]
                for t in range(tok):
                    x = _splat(builder, builder.load(builder.gep(xp, [builder.add(xb, k(8 * t + q))])), vi)
                    for r in range(regs):
                        ia[t][h][r] = builder.call(dot, [ia[t][h][r], u[r], x])
            ab = builder.mul(b, k(2 * regs))
            a = [[builder.load(builder.gep(ap, [builder.add(ab, k(h * regs + r))]), align=4) for r in range(regs)]
                 for h in range(halves)]
            if kind == MIN:
                m = [builder.load(builder.gep(mp, [builder.add(builder.mul(b, k(regs)), k(r))]), align=4)
                     for r in range(regs)]
            for t in range(tok):
                dx = _splat(builder, builder.load(builder.gep(dp, [builder.add(row, k(t))])), vf)
                if kind == MIN:
                    ms = _splat(builder, builder.load(builder.gep(msp, [builder.add(row, k(t))])), vf)
                for r in range(regs):
                    f = builder.load(facc[t][r])
                    for h in range(halves):
                        s = builder.sitofp(ia[t][h][r], vf)
                        f = builder.call(fma, [s, builder.fmul(a[h][r], dx), f])
                    if kind == MIN:
                        f = builder.call(fma, [m[r], ms, f])
                    builder.store(f, facc[t][r])
        for t in range(tok):
            for r in range(regs):
                builder.store(builder.load(facc[t][r]), builder.gep(out, [k(t * regs + r)]), align=4)
        return context.get_dummy_value()

    return codegen


def _tile_lanes8_codegen(kind: int, group: int):
    """The AVX2 tile: the arguments, arithmetic and float steps of _tile_codegen's, ordered for AVX2's
    16 registers: one register of 8 lanes at a time, its GEMM_TOKENS (8) float accumulators held over
    all blocks, the block's quads reloaded from L1 as needed (VNNI's order keeps GEMM_TOKENS x 4 int32
    and float32 accumulators live: on AVX2 it spilled them). vpmaddubsw + vpmaddwd give the int32 sums;
    `group` quads' vpmaddubsw pairs are added as int16 before one vpmaddwd widens them: exact while
    group * 2 * umax * 128 <= 32767 for fields of at most umax (4 quads: 5-bit fields; 2: 6-bit; 1:
    Q8_0's |w| <= 128, SIGNED, whose x bytes take w's signs first, vpsignb). The integer sums are exact
    in any order, so the bits are those of the loop tiles. Measured (AMD Zen 3, one thread, 20-28 blocks
    x 128 tokens, G multiply-adds/s), against VNNI's order with 4 tokens: ONE 68 -> 78, MIN 44 -> 61,
    HALVES 65 -> 64."""
    halves = 2 if kind == HALVES else 1
    tok, regs = GEMM_TOKENS, LANES // 8
    per_half = 8 // halves
    words = 16 if kind == SIGNED else 8  # U's quads a block and lane: SIGNED's |w|, then w
    assert per_half % group == 0

    def codegen(context, builder, sig, args):
        t0, nb, n_pad, up, xp, op, dp, ap, mp, msp, out = _tile_args(context, builder, sig, args, _V8I32, _V8F32)
        pmaddubs = _declare(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16I16, [_V32I8, _V32I8])
        pmaddwd = _declare(builder, "llvm.x86.avx2.pmadd.wd", _V8I32, [_V16I16, _V16I16])
        psign = _declare(builder, "llvm.x86.avx2.psign.b", _V32I8, [_V32I8, _V32I8])
        fma = _declare(builder, "llvm.fma.v8f32", _V8F32, [_V8F32] * 3)
        ones = ir.Constant(_V16I16, [1] * 16)
        k = lambda v: ir.Constant(_I64, v)  # noqa: E731

        def load(ptr, at, ty=None):
            v = builder.load(builder.gep(ptr, [at]), align=4)
            return builder.bitcast(v, ty) if ty is not None else v

        for r in range(regs):
            facc = [cgutils.alloca_once_value(builder, ir.Constant(_V8F32, None)) for _ in range(tok)]
            with cgutils.for_range(builder, nb) as loop:
                b = loop.index
                row = builder.add(builder.mul(b, n_pad), t0)  # (b, t0) in [nb, n_pad]
                ub = builder.mul(b, k(words * regs))
                u = [load(up, builder.add(ub, k(q * regs + r)), _V32I8) for q in range(8)]
                if kind == SIGNED:
                    w = [load(up, builder.add(ub, k((8 + q) * regs + r)), _V32I8) for q in range(8)]
                ab = builder.mul(b, k(2 * regs))
                a = [load(ap, builder.add(ab, k(h * regs + r))) for h in range(halves)]
                if kind == MIN:
                    m = load(mp, builder.add(builder.mul(b, k(regs)), k(r)))
                xb = builder.mul(row, k(8))
                for t in range(tok):
                    x = [builder.bitcast(_splat(builder, load(xp, builder.add(xb, k(8 * t + q))), _V8I32), _V32I8)
                         for q in range(8)]
                    if kind == SIGNED:
                        x = [builder.call(psign, [x[q], w[q]]) for q in range(8)]
                    dx = _splat(builder, load(dp, builder.add(row, k(t))), _V8F32)
                    f = builder.load(facc[t])
                    for h in range(halves):
                        off = load(op, builder.add(builder.mul(builder.add(row, k(t)), k(2)), k(h)))
                        i = _splat(builder, off, _V8I32)
                        for g0 in range(h * per_half, (h + 1) * per_half, group):
                            p = builder.call(pmaddubs, [u[g0], x[g0]])
                            for q in range(g0 + 1, g0 + group):
                                p = builder.add(p, builder.call(pmaddubs, [u[q], x[q]]))
                            i = builder.add(i, builder.call(pmaddwd, [p, ones]))
                        f = builder.call(fma, [builder.sitofp(i, _V8F32), builder.fmul(a[h], dx), f])
                    if kind == MIN:
                        ms = _splat(builder, load(msp, builder.add(row, k(t))), _V8F32)
                        f = builder.call(fma, [m, ms, f])
                    builder.store(f, facc[t])
            for t in range(tok):
                builder.store(builder.load(facc[t]), builder.gep(out, [k(t * regs + r)]), align=4)
        return context.get_dummy_value()

    return codegen


def _tile_intrinsic(kind: int, vnni: bool, group: int = 1):
    """The tile of `kind`: AVX-512 VNNI's, or AVX2's whose int16 sums take `group` quads."""
    @intrinsic
    def tile(typingctx, U, XQ, OFF, DXT, A, M, MS, t0, acc):
        if not all(isinstance(a, types.Array) for a in (U, XQ, OFF, DXT, A, M, MS, acc)):
            return None
        if not isinstance(t0, types.Integer):
            return None
        sig = types.void(U, XQ, OFF, DXT, A, M, MS, types.int64, acc)
        return sig, _tile_codegen(kind) if vnni else _tile_lanes8_codegen(kind, group)

    return tile


# tile_<kind>_<isa>(U, XQ, OFF, DXT, A, M, MS, t0, acc): see _tile_codegen; gemm.py holds the loop versions
tile_one_vnni, tile_min_vnni, tile_halves_vnni = (_tile_intrinsic(k, True) for k in (ONE, MIN, HALVES))
# AVX2: ONE's and MIN's fields have at most 5 bits (Q4_0 .. Q5_K), HALVES' 6 (Q6_K), SIGNED's |w| <= 128
tile_one_avx2, tile_min_avx2 = _tile_intrinsic(ONE, False, 4), _tile_intrinsic(MIN, False, 4)
tile_halves_avx2, tile_signed_avx2 = _tile_intrinsic(HALVES, False, 2), _tile_intrinsic(SIGNED, False, 1)


# -- 16-bit float weights: rows of activations in registers (kernels.matmul.floatmm) ----------------------------
# A row group's float16 / bfloat16 lanes (W uint16 [nb, QB * LANES], element e of block b of lane l at
# (b * QB + e) * LANES + l) times `rows` activation rows, on `width` of the group's lanes from lane l0:
# each element vector is converted in registers (vcvtph2ps for float16; bfloat16 is the high half of a
# float32) and multiplied into every row's accumulators (`llvm.fma`, one rounding each), which stay in
# registers over all blocks. Every (row, lane) accumulator takes the same fma chain in the same order
# (b, then e) whatever `rows`, `width` and l0 are, so a row's result is the same bits alone and in a tile
# of any shape.

AVX512 = AVX2 and host_has("avx512f")
# (rows, width) of the tiles floatmm takes, largest first. AVX-512: 4 rows x 2 zmm (whole groups). AVX2 has
# 16 ymm registers: one or two rows take the whole group (4 ymm accumulators a row: 4 independent chains
# for a lone row); from 3 rows on, half a group's lanes (2 ymm a row) in two passes, up to 6 rows: 12
# accumulators, 2 converted weight vectors and a broadcast. Each converted vector then feeds 6 rows, not 2
# (the conversions and the weights' L2 reads per multiply-add shrink 3x).
HALF_TILES = ((4, LANES), (2, LANES), (1, LANES)) if AVX512 else \
    ((6, LANES // 2), (5, LANES // 2), (4, LANES // 2), (3, LANES // 2), (2, LANES), (1, LANES))
HALF_TILE = HALF_TILES[0][0]  # most rows a tile


def _half_rows(builder, W, X, t0, acc, rows: int, bf16: bool, width: int, l0: int) -> None:
    """Emit acc f32 [rows, LANES] lanes l0 .. l0 + width - 1 = the products of those lanes of row group W
    uint16 [nb, QB * LANES] with rows t0 .. t0 + rows - 1 of X f32 [n, >= nb * QB]."""
    vf, vh, vi = ir.VectorType(_F32T, width), ir.VectorType(ir.HalfType(), width), ir.VectorType(_I16, width)
    v32 = ir.VectorType(_I32, width)
    nb = cgutils.unpack_tuple(builder, W.shape)[0]
    x_stride = builder.sdiv(cgutils.unpack_tuple(builder, X.strides)[0], ir.Constant(_I64, 4))
    wp, xp = _ptr(builder, W, _I16), _ptr(builder, X, _F32T)
    fma = _declare(builder, f"llvm.fma.v{width}f32", vf, [vf] * 3)
    k = lambda v: ir.Constant(_I64, v)  # noqa: E731
    xrow = [builder.mul(builder.add(t0, k(r)), x_stride) for r in range(rows)]
    facc = [cgutils.alloca_once_value(builder, ir.Constant(vf, None)) for _ in range(rows)]
    with cgutils.for_range(builder, nb) as loop:
        e0 = builder.mul(loop.index, k(QB))
        f = [builder.load(a) for a in facc]
        for e in range(QB):
            col = builder.add(e0, k(e))
            at = builder.gep(wp, [builder.add(builder.mul(col, k(LANES)), k(l0))])
            v = builder.load(builder.bitcast(at, vi.as_pointer()), align=2)
            if bf16:
                w = builder.bitcast(builder.shl(builder.zext(v, v32), ir.Constant(v32, [16] * width)), vf)
            else:
                w = builder.fpext(builder.bitcast(v, vh), vf)
            for r in range(rows):
                x = builder.load(builder.gep(xp, [builder.add(xrow[r], col)]), align=4)
                f[r] = builder.call(fma, [w, _splat(builder, x, vf), f[r]])
        for a, val in zip(facc, f, strict=True):
            builder.store(val, a)
    out = _ptr(builder, acc, _F32T)
    for r in range(rows):
        at = builder.gep(out, [k(r * LANES + l0)])
        builder.store(builder.load(facc[r]), builder.bitcast(at, vf.as_pointer()), align=4)


def _half_tile_codegen(bf16: bool):
    """IR of half_tile[_bf16](W, X, t0, left, acc) -> rows: the largest of HALF_TILES with at most `left`
    rows (all its lane passes) on rows t0 .. of X; acc f32 [>= rows, LANES]."""

    def codegen(context, builder, sig, args):
        W, X, acc = _arrays(context, builder, sig, args)
        t0, left = args[2], args[3]
        taken = cgutils.alloca_once(builder, _I64)

        def run(rows: int, width: int) -> None:
            for l0 in range(0, LANES, width):
                _half_rows(builder, W, X, t0, acc, rows, bf16, width, l0)
            builder.store(ir.Constant(_I64, rows), taken)

        def choose(i: int) -> None:
            rows, width = HALF_TILES[i]
            if i + 1 == len(HALF_TILES):
                run(rows, width)
                return
            with builder.if_else(builder.icmp_signed(">=", left, ir.Constant(_I64, rows))) as (then, other):
                with then:
                    run(rows, width)
                with other:
                    choose(i + 1)

        choose(0)
        return builder.load(taken)

    return codegen


def _half_tile_intrinsic(bf16: bool):
    @intrinsic
    def half_tile(typingctx, W, X, t0, left, acc):
        if not all(isinstance(a, types.Array) for a in (W, X, acc)) or not all(
                isinstance(i, types.Integer) for i in (t0, left)):
            return None
        return types.int64(W, X, types.int64, types.int64, acc), _half_tile_codegen(bf16)

    half_tile.__doc__ = (f"rows = the largest of HALF_TILES with at most `left` rows: acc f32 [rows, LANES] = "
                         f"{'bfloat16' if bf16 else 'float16'} row group W times rows t0 .. t0 + rows - 1 of X")
    return half_tile


# half_tile[_bf16](W, X, t0, left, acc) -> rows: see _half_tile_codegen (float16 needs F16C; floatmm calls them)
half_tile, half_tile_bf16 = _half_tile_intrinsic(False), _half_tile_intrinsic(True)


# Whether a type's decode tile asks for the next row group's lines itself (_prefetch_next). On AVX2-only hosts
# (Zen 3) every type does: one-token decode of SmolLM2 +10-20 %, whose weights otherwise arrived as the loads
# missed. On AVX-512 VNNI hosts (Zen 4) the hardware prefetcher streams these sequential reads alone and the
# extra requests only take miss slots: 1 thread, 64 distinct 3-5 MB matrices read from memory, without the
# requests Q5_0 15.0 -> 19.6 GB/s, Q6_K 11.9 -> 17.8, Q8_0 17.9 -> 22.9; Q4_K loses (14.5 -> 12.5) and Q4_1
# stays even, so those two keep them. A hint either way: no bit depends on it.
PREFETCH_NEXT_GROUP = {"q4_1": True, "q4_k": True, "q5_0": not VNNI, "q6_k": not VNNI, "q8_0": not VNNI}


def _prefetch_next(builder, p, at, stride, count):
    """Prefetch the `count` 64-byte vectors of p from element at + stride: a row tile asks for the next
    row group's lines of the block it is at (stride: a group's vectors), so memory streams the next group
    while this one computes (PREFETCH_NEXT_GROUP says for which types). A prefetch never faults, so the
    last group may point past its matrix."""
    fn = _declare(builder, "llvm.prefetch.p0", ir.VoidType(), [p.type, _I32, _I32, _I32])
    base = builder.add(at, stride)
    for i in range(count):
        q = builder.gep(p, [builder.add(base, ir.Constant(_I64, i))])
        builder.call(fn, [q, ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])  # read, all levels


# numba's fastmath pass gives every float multiply without flags LLVM's `fast` flags, which let LLVM
# reassociate it with its neighbours differently in each function the kernel is inlined into (a one-token
# step, a multi-row step): a row's bits would then depend on its caller. A multiply flagged only `nnan`
# (no reassociation, no contraction) is left as written.
_EXACT = ("nnan",)


# -- decode rows of Q4_1 on AVX-512 VNNI: the block unpacked once for a tile of rows (kernels.matmul.dots) --------
# A row group's Q4_1 words (W uint16 [nb, 8 * LANES]: word j of lane l at j * LANES + l holds elements
# 4j..4j+3, 4 bits each) become one int32 per lane and word in registers, one element a byte
# (s = (v | v << 8) & 0x00FF00FF; (s | s << 4) & 0x0F0F0F0F), and go into `vpdpbusd` with each row's four
# int8 activations of those elements (the block's int16 activations narrowed in registers): exact int32
# block sums sum(q x), scaled per block and row as acc = fma(m, dx * sx, fma(d, dx * float(isum), acc))
# in float32 accumulators that stay in registers over all blocks (sx: the block's integer sum of x). Each
# row takes the same IEEE operations in the same order whatever the tile's size, so a row gives the same
# bits alone and beside others.


def _q4_1_rows_codegen(rows: int):
    """IR of q4_1_rows_<rows>(W, D, M, X, DX, QH, t0, acc): acc f32 [rows, LANES] for rows t0.. of the
    int16 activations X [n, nb, 32] (values in [-127, 127]), their scales DX f32 [n, nb] and half sums QH
    int16 [n, nb, 2], against group W uint16 [nb, 8 * LANES] with scales D and minima M f32 [nb, LANES]."""
    half = LANES // 2
    v16i, v32i = ir.VectorType(_I16, LANES), ir.VectorType(_I32, LANES)
    lo, hi = ir.Constant(ir.VectorType(_I32, half), list(range(half))), \
        ir.Constant(ir.VectorType(_I32, half), list(range(half, LANES)))
    spread = [ir.Constant(ir.VectorType(_I32, half), [j] * half) for j in range(QB // 4)]

    def codegen(context, builder, sig, args):
        W, D, M, X, DX, QH, acc = _arrays(context, builder, sig, args)
        t0 = args[6]
        nb = cgutils.unpack_tuple(builder, W.shape)[0]
        wp, dp, mp = _ptr(builder, W, v16i), _ptr(builder, D, _V16F32), _ptr(builder, M, _V16F32)
        xp, dxp, hp = _ptr(builder, X, ir.VectorType(_I16, QB)), _ptr(builder, DX, _F32T), _ptr(builder, QH, _I16)
        dot = _declare(builder, "llvm.x86.avx512.vpdpbusd.512", _V16I32, [_V16I32] * 3)
        fma = _declare(builder, "llvm.fma.v16f32", _V16F32, [_V16F32] * 3)
        k = lambda v: ir.Constant(_I64, v)  # noqa: E731
        m8, m4, c8, c4 = (ir.Constant(v32i, [c] * LANES) for c in (0x00FF00FF, 0x0F0F0F0F, 8, 4))
        facc = [[cgutils.alloca_once_value(builder, ir.Constant(_V16F32, None)) for _ in range(2)]
                for _ in range(rows)]
        with cgutils.for_range(builder, nb) as loop:
            b = loop.index
            tb = [builder.add(builder.mul(builder.add(t0, k(r)), nb), b) for r in range(rows)]  # (t, b) in [n, nb]
            xq = [builder.bitcast(builder.trunc(builder.load(builder.gep(xp, [tb[r]]), align=2),
                                                ir.VectorType(_I8, QB)), _V8I32) for r in range(rows)]
            ia = [[ir.Constant(_V16I32, None)] * 2 for _ in range(rows)]
            if PREFETCH_NEXT_GROUP["q4_1"]:
                _prefetch_next(builder, wp, builder.mul(b, k(8)), builder.mul(nb, k(8)), 8)  # 8 words of 64 bytes
            for j in range(QB // 4):
                v = builder.zext(builder.load(builder.gep(wp, [builder.add(builder.mul(b, k(8)), k(j))]), align=2),
                                 v32i)
                t = builder.and_(builder.or_(v, builder.shl(v, c8)), m8)
                u = builder.and_(builder.or_(t, builder.shl(t, c4)), m4)
                uh = [builder.shuffle_vector(u, u, m) for m in (lo, hi)]
                for r in range(rows):
                    x = builder.shuffle_vector(xq[r], xq[r], spread[j])
                    ia[r] = [builder.call(dot, [ia[r][h], uh[h], x]) for h in range(2)]
            d = [builder.load(builder.gep(dp, [builder.add(builder.mul(b, k(2)), k(h))]), align=4) for h in range(2)]
            m = [builder.load(builder.gep(mp, [builder.add(builder.mul(b, k(2)), k(h))]), align=4) for h in range(2)]
            for r in range(rows):
                dx = builder.load(builder.gep(dxp, [tb[r]]))
                h0 = builder.sext(builder.load(builder.gep(hp, [builder.mul(tb[r], k(2))])), _I32)
                h1 = builder.sext(builder.load(builder.gep(hp, [builder.add(builder.mul(tb[r], k(2)), k(1))])), _I32)
                sx = builder.sitofp(builder.add(h0, h1), _F32T)
                dsx = _splat(builder, builder.fmul(dx, sx, flags=_EXACT), _V16F32)
                dxv = _splat(builder, dx, _V16F32)
                for h in range(2):
                    f = builder.fmul(builder.sitofp(ia[r][h], _V16F32), dxv, flags=_EXACT)
                    a = builder.call(fma, [d[h], f, builder.load(facc[r][h])])
                    builder.store(builder.call(fma, [m[h], dsx, a]), facc[r][h])
        out = _ptr(builder, acc, _V16F32)
        for r in range(rows):
            for h in range(2):
                builder.store(builder.load(facc[r][h]), builder.gep(out, [k(2 * r + h)]), align=4)
        return context.get_dummy_value()

    return codegen


def _q4_1_rows_intrinsic(rows: int):
    @intrinsic
    def q4_1_rows(typingctx, W, D, M, X, DX, QH, t0, acc):
        if not all(isinstance(a, types.Array) for a in (W, D, M, X, DX, QH, acc)):
            return None
        if not isinstance(t0, types.Integer):
            return None
        return types.void(W, D, M, X, DX, QH, types.int64, acc), _q4_1_rows_codegen(rows)

    q4_1_rows.__doc__ = f"acc f32 [{rows}, LANES] = Q4_1 row group times {rows} activation rows (VNNI)"
    return q4_1_rows


# q4_1_rows_<rows>(W, D, M, X, DX, QH, t0, acc): see _q4_1_rows_codegen (AVX-512 VNNI hosts; dots picks it)
q4_1_rows_1, q4_1_rows_2, q4_1_rows_4 = (_q4_1_rows_intrinsic(r) for r in (1, 2, 4))


# -- decode rows on AVX2: a row's float accumulators in registers over all its blocks (kernels.matmul.dots) ------
# The lane loops (dots._q4_1_loops, ...) store each block's integer sums and reload their float accumulators
# per block: ~15 G multiply-adds/s a thread, the same with the weights in L2 as from memory (compute-bound).
# These tiles keep one row's 32 float accumulators in 4 ymm registers over the group's blocks, take each
# block's exact integer sums as the loops' simd dots do (the same unpacking and vpmaddubsw, kept in
# registers), and then apply the loops' own float steps per lane in the loops' order, with no fused or
# reassociated operation the loops do not have: each type's bits are the loops' (and the VNNI tiles' where
# those exist). Types: Q4_1 and Q4_K (4-bit words), Q8_0 (quads), Q6_K (bytes, element-major).

_ROW_REGS = LANES // 8  # ymm registers of 8 lanes a row group


def _row_avx2_loop(context, builder, nb, acc, lines, wline, block, prefetch):
    """The row tile's frame: float accumulators (4 x <8 x float>) over blocks b < nb, `block(b, facc)` adding
    block b; where `prefetch` (PREFETCH_NEXT_GROUP), the next group's `lines` 64-byte lines of block b
    prefetched first; acc f32 [1, LANES] = the sums at the end."""
    k = lambda v: ir.Constant(_I64, v)  # noqa: E731
    facc = [cgutils.alloca_once_value(builder, ir.Constant(_V8F32, None)) for _ in range(_ROW_REGS)]
    with cgutils.for_range(builder, nb) as loop:
        b = loop.index
        if prefetch:
            _prefetch_next(builder, wline, builder.mul(b, k(lines)), builder.mul(nb, k(lines)), lines)
        block(b, facc)
    out = _ptr(builder, acc, _V8F32)
    for r in range(_ROW_REGS):
        builder.store(builder.load(facc[r]), builder.gep(out, [k(r)]), align=4)


def _row_scalars(builder, dxp, hp, tb):
    """Row t's block scalars: dx (float) and Sx (int32: its integer sum, the two half sums added)."""
    k = lambda v: ir.Constant(_I64, v)  # noqa: E731
    h0 = builder.sext(builder.load(builder.gep(hp, [builder.mul(tb, k(2))])), _I32)
    h1 = builder.sext(builder.load(builder.gep(hp, [builder.add(builder.mul(tb, k(2)), k(1))])), _I32)
    return builder.load(builder.gep(dxp, [tb])), h0, h1


def _lane_vec(builder, ptr, index, elem, to_float):
    """8 lanes of a scale array at vector `index` (elem: <8 x float>, <8 x i8> unsigned or signed) as floats."""
    v = builder.load(builder.gep(ptr, [index]), align=1)
    if elem == _V8F32:
        return v
    return builder.uitofp(v, _V8F32) if to_float == "u" else builder.sitofp(v, _V8F32)


def _nibble_sums(builder, wp, pp, b, tb, sxi):
    """Exact int32 sum(q x) of one block of 4-bit words (as nibbles_dot: the int16 sum from -8 Sx, wrapped,
    then 8 Sx given back in int32), 4 registers of 8 lanes."""
    k = lambda v: ir.Constant(_I64, v)  # noqa: E731
    pmaddubs = _declare(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16I16, [_V32I8, _V32I8])
    mask, four = ir.Constant(_V16I16, [0x0F0F] * 16), ir.Constant(_V16I16, [4] * 16)
    halves = [ir.Constant(ir.VectorType(_I32, 8), list(range(8 * q, 8 * q + 8))) for q in range(2)]
    pairs = [_broadcast16(builder, builder.load(builder.gep(pp, [builder.add(builder.mul(tb, k(QB // 2)), k(i))]),
                                                align=2)) for i in range(QB // 2)]
    c8 = builder.mul(sxi, ir.Constant(_I32, 8))
    back = _splat(builder, c8, _V8I32)
    sums = []
    for h in range(LANES // 16):  # lanes 16h .. 16h + 15
        s = _broadcast16(builder, builder.neg(builder.trunc(c8, _I16)))
        for j in range(QB // 4):
            v = builder.load(builder.gep(wp, [builder.add(builder.mul(b, k(QB // 2)), k(2 * j + h))]), align=2)
            lo = builder.bitcast(builder.and_(v, mask), _V32I8)
            hi = builder.bitcast(builder.and_(builder.lshr(v, four), mask), _V32I8)
            s = builder.add(s, builder.call(pmaddubs, [lo, builder.bitcast(pairs[2 * j], _V32I8)]))
            s = builder.add(s, builder.call(pmaddubs, [hi, builder.bitcast(pairs[2 * j + 1], _V32I8)]))
        sums += [builder.add(builder.sext(builder.shuffle_vector(s, s, halves[q]), _V8I32), back) for q in range(2)]
    return sums


def _q4_1_row_codegen(context, builder, sig, args):
    """q4_1_row_avx2(W, D, M, XP, DX, QH, t, acc): Q4_1 group W uint16 [nb, 8 * LANES], scales D and minima
    M f32 [nb, LANES], activation pairs XP int16 [n, nb, 16] (dots.nibble_pairs), DX f32 [n, nb], QH int16
    [n, nb, 2]; per lane acc = fma(m, dx * Sx, fma(d, float(sum) * dx, acc)) (dots._q4_1_loops)."""
    W, D, M, XP, DX, QH, acc = _arrays(context, builder, sig, args)
    t, nb = args[6], cgutils.unpack_tuple(builder, W.shape)[0]
    wp, dp, mp = _ptr(builder, W, _V16I16), _ptr(builder, D, _V8F32), _ptr(builder, M, _V8F32)
    pp, dxp, hp = _ptr(builder, XP, _I16), _ptr(builder, DX, _F32T), _ptr(builder, QH, _I16)
    fma = _declare(builder, "llvm.fma.v8f32", _V8F32, [_V8F32] * 3)
    k = lambda v: ir.Constant(_I64, v)  # noqa: E731

    def block(b, facc):
        tb = builder.add(builder.mul(t, nb), b)
        dx, h0, h1 = _row_scalars(builder, dxp, hp, tb)
        sxi = builder.add(h0, h1)
        dxv = _splat(builder, dx, _V8F32)
        dsx = _splat(builder, builder.fmul(dx, builder.sitofp(sxi, _F32T), flags=_EXACT), _V8F32)
        for r, isum in enumerate(_nibble_sums(builder, wp, pp, b, tb, sxi)):
            at = builder.add(builder.mul(b, k(_ROW_REGS)), k(r))
            f = builder.fmul(builder.sitofp(isum, _V8F32), dxv, flags=_EXACT)
            a = builder.call(fma, [_lane_vec(builder, dp, at, _V8F32, ""), f, builder.load(facc[r])])
            builder.store(builder.call(fma, [_lane_vec(builder, mp, at, _V8F32, ""), dsx, a]), facc[r])

    _row_avx2_loop(context, builder, nb, acc, 8, _ptr(builder, W, ir.VectorType(_I16, 32)), block,
                   PREFETCH_NEXT_GROUP["q4_1"])
    return context.get_dummy_value()


def _q4_k_row_codegen(context, builder, sig, args):
    """q4_k_row_avx2(W, D, DM, SC, MN, XP, DX, QH, t, acc): Q4_K group W uint16 [nb, 8 * LANES], super-block
    scales D and DM f32 [nb / 8, LANES], block scales SC and minima MN uint8 [nb, LANES]; per lane
    acc = acc + dx * ((d * sc) * sum - (dm * mn) * Sx), unfused (dots.q4_k)."""
    W, D, DM, SC, MN, XP, DX, QH, acc = _arrays(context, builder, sig, args)
    t, nb = args[8], cgutils.unpack_tuple(builder, W.shape)[0]
    wp, dp, dmp = _ptr(builder, W, _V16I16), _ptr(builder, D, _V8F32), _ptr(builder, DM, _V8F32)
    v8i8 = ir.VectorType(_I8, 8)
    scp, mnp = _ptr(builder, SC, v8i8), _ptr(builder, MN, v8i8)
    pp, dxp, hp = _ptr(builder, XP, _I16), _ptr(builder, DX, _F32T), _ptr(builder, QH, _I16)
    k = lambda v: ir.Constant(_I64, v)  # noqa: E731

    def block(b, facc):
        tb = builder.add(builder.mul(t, nb), b)
        dx, h0, h1 = _row_scalars(builder, dxp, hp, tb)
        sxi = builder.add(h0, h1)
        dxv = _splat(builder, dx, _V8F32)
        sxv = _splat(builder, builder.sitofp(sxi, _F32T), _V8F32)
        sup = builder.lshr(b, k(3))
        for r, isum in enumerate(_nibble_sums(builder, wp, pp, b, tb, sxi)):
            at = builder.add(builder.mul(b, k(_ROW_REGS)), k(r))
            st = builder.add(builder.mul(sup, k(_ROW_REGS)), k(r))
            dsc = builder.fmul(_lane_vec(builder, dp, st, _V8F32, ""), _lane_vec(builder, scp, at, v8i8, "u"),
                               flags=_EXACT)
            dmn = builder.fmul(_lane_vec(builder, dmp, st, _V8F32, ""), _lane_vec(builder, mnp, at, v8i8, "u"),
                               flags=_EXACT)
            u = builder.fsub(builder.fmul(dsc, builder.sitofp(isum, _V8F32), flags=_EXACT),
                             builder.fmul(dmn, sxv, flags=_EXACT), flags=_EXACT)
            builder.store(builder.fadd(builder.load(facc[r]), builder.fmul(dxv, u, flags=_EXACT), flags=_EXACT),
                          facc[r])

    _row_avx2_loop(context, builder, nb, acc, 8, _ptr(builder, W, ir.VectorType(_I16, 32)), block,
                   PREFETCH_NEXT_GROUP["q4_k"])
    return context.get_dummy_value()


def _q8_0_row_codegen(context, builder, sig, args):
    """q8_0_row_avx2(W, D, X8, DX, t, acc): Q8_0 group W int8 [nb, 32 * LANES] (quads), scales D f32
    [nb, LANES], activation bytes X8 int8 [n, nb, 32]; per lane acc = acc + d * (dx * float(sum)), unfused
    (dots._q8_0_loops); the sums as simd.q8_quads_dot's."""
    W, D, X8, DX, acc = _arrays(context, builder, sig, args)
    t, nb = args[4], cgutils.unpack_tuple(builder, W.shape)[0]
    wp, dp, xp, dxp = _ptr(builder, W, _V32I8), _ptr(builder, D, _V8F32), _ptr(builder, X8, _I32), \
        _ptr(builder, DX, _F32T)
    pabs = _declare(builder, "llvm.abs.v32i8", _V32I8, [_V32I8, _I1])
    psign = _declare(builder, "llvm.x86.avx2.psign.b", _V32I8, [_V32I8, _V32I8])
    pmaddubs = _declare(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16I16, [_V32I8, _V32I8])
    pmaddwd = _declare(builder, "llvm.x86.avx2.pmadd.wd", _V8I32, [_V16I16, _V16I16])
    ones = ir.Constant(_V16I16, [1] * 16)
    k = lambda v: ir.Constant(_I64, v)  # noqa: E731

    def block(b, facc):
        tb = builder.add(builder.mul(t, nb), b)
        isum = [ir.Constant(_V8I32, [0] * 8)] * _ROW_REGS
        for q in range(QB // 4):
            xq = builder.bitcast(_broadcast32(builder, builder.load(
                builder.gep(xp, [builder.add(builder.mul(tb, k(QB // 4)), k(q))]), align=1)), _V32I8)
            for r in range(_ROW_REGS):
                wv = builder.load(builder.gep(wp, [builder.add(builder.mul(b, k(QB)), k(q * _ROW_REGS + r))]),
                                  align=1)
                prod = builder.call(pmaddubs, [builder.call(pabs, [wv, ir.Constant(_I1, 0)]),
                                               builder.call(psign, [xq, wv])])
                isum[r] = builder.add(isum[r], builder.call(pmaddwd, [prod, ones]))
        dxv = _splat(builder, builder.load(builder.gep(dxp, [tb])), _V8F32)
        for r in range(_ROW_REGS):
            d = _lane_vec(builder, dp, builder.add(builder.mul(b, k(_ROW_REGS)), k(r)), _V8F32, "")
            y = builder.fmul(d, builder.fmul(dxv, builder.sitofp(isum[r], _V8F32), flags=_EXACT), flags=_EXACT)
            builder.store(builder.fadd(builder.load(facc[r]), y, flags=_EXACT), facc[r])

    _row_avx2_loop(context, builder, nb, acc, 16, _ptr(builder, W, ir.VectorType(_I8, 64)), block,
                   PREFETCH_NEXT_GROUP["q8_0"])
    return context.get_dummy_value()


def _q5_0_row_codegen(context, builder, sig, args):
    """q5_0_row_avx2(W, D, XP, DX, QH, t, acc): Q5_0 group W uint16 [nb, 11 * LANES] (5-bit words), scales
    D f32 [nb, LANES], activation pairs XP int16 [n, nb, FIVE_PAIR_SLOTS] (dots.five_pairs); per lane
    acc = acc + d * (dx * float(sa + sb)), unfused (dots.q5_0), with sa, sb the halves' sums from -16 Sa and
    -16 Sb as fives_dot's (wrapped int16, exact)."""
    W, D, XP, DX, QH, acc = _arrays(context, builder, sig, args)
    t, nb = args[5], cgutils.unpack_tuple(builder, W.shape)[0]
    wp, dp, pp = _ptr(builder, W, _V16I16), _ptr(builder, D, _V8F32), _ptr(builder, XP, _I16)
    dxp, hp = _ptr(builder, DX, _F32T), _ptr(builder, QH, _I16)
    pmaddubs = _declare(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16I16, [_V32I8, _V32I8])
    k = lambda v: ir.Constant(_I64, v)  # noqa: E731
    halves8 = [ir.Constant(ir.VectorType(_I32, 8), list(range(8 * q, 8 * q + 8))) for q in range(2)]
    words = 11

    def block(b, facc):
        tb = builder.add(builder.mul(t, nb), b)
        pairs = [builder.bitcast(_broadcast16(builder, builder.load(builder.gep(
            pp, [builder.add(builder.mul(tb, k(FIVE_PAIR_SLOTS)), k(i))]), align=2)), _V32I8)
            for i in range(len(FIVE_PAIRS))]
        cs = [builder.trunc(builder.mul(builder.sext(builder.load(builder.gep(
            hp, [builder.add(builder.mul(tb, k(2)), k(h))])), _I32), ir.Constant(_I32, 16)), _I16) for h in range(2)]
        dxv = _splat(builder, builder.load(builder.gep(dxp, [tb])), _V8F32)
        isums = []
        for h in range(LANES // 16):  # lanes 16h .. 16h + 15
            s = [_broadcast16(builder, builder.neg(c)) for c in cs]
            loaded = {}
            for i, (j, recipe, half) in enumerate(FIVE_PAIRS):
                if j not in loaded:
                    loaded[j] = builder.load(builder.gep(wp, [builder.add(builder.mul(b, k(2 * words)), k(2 * j + h))]),
                                             align=2)
                q = builder.bitcast(_five_bytes(builder, loaded[j], recipe), _V32I8)
                s[half] = builder.add(s[half], builder.call(pmaddubs, [q, pairs[i]]))
            for q in range(2):
                isums.append(builder.add(builder.sext(builder.shuffle_vector(s[0], s[0], halves8[q]), _V8I32),
                                         builder.sext(builder.shuffle_vector(s[1], s[1], halves8[q]), _V8I32)))
        for r, isum in enumerate(isums):
            d = _lane_vec(builder, dp, builder.add(builder.mul(b, k(_ROW_REGS)), k(r)), _V8F32, "")
            y = builder.fmul(d, builder.fmul(dxv, builder.sitofp(isum, _V8F32), flags=_EXACT), flags=_EXACT)
            builder.store(builder.fadd(builder.load(facc[r]), y, flags=_EXACT), facc[r])

    _row_avx2_loop(context, builder, nb, acc, words, _ptr(builder, W, ir.VectorType(_I16, 32)), block,
                   PREFETCH_NEXT_GROUP["q5_0"])
    return context.get_dummy_value()

def _byte_quads(builder, wp, base, q):
    """The 4 registers of elements 4q..4q+3 of a block of byte fields (element-major, 32 lanes a 32-byte
    vector at base + element) transposed to lane quads (bytes_halves_dot's order)."""
    a = [builder.load(builder.gep(wp, [builder.add(base, ir.Constant(_I64, 4 * q + i))]), align=1) for i in range(4)]
    b01 = [builder.bitcast(_shuffle(builder, a[0], a[1], _UNPACK_B[hi]), _V16I16) for hi in (0, 1)]
    b23 = [builder.bitcast(_shuffle(builder, a[2], a[3], _UNPACK_B[hi]), _V16I16) for hi in (0, 1)]
    return [builder.bitcast(_shuffle(builder, b01[lohi], b23[lohi], _UNPACK_W[hi]), _V32I8)
            for lohi in (0, 1) for hi in (0, 1)]


def _q6_k_row_codegen(context, builder, sig, args):
    """q6_k_row_avx2(W, D, SC, X8, DX, QH, t, acc): Q6_K group W uint8 [nb, 32 * LANES] (element-major),
    super-block scales D f32 [nb / 8, LANES], half-block scales SC int8 [2 nb, LANES]; per lane
    acc = acc + d * (dx * (ca * (ia - 32 Sa) + cb * (ib - 32 Sb))), unfused (dots.q6_k); the sums as
    simd.bytes_halves_dot's."""
    W, D, SC, X8, DX, QH, acc = _arrays(context, builder, sig, args)
    t, nb = args[6], cgutils.unpack_tuple(builder, W.shape)[0]
    wp, dp, xp, dxp, hp = _ptr(builder, W, _V32I8), _ptr(builder, D, _V8F32), _ptr(builder, X8, _I32), \
        _ptr(builder, DX, _F32T), _ptr(builder, QH, _I16)
    v8i8 = ir.VectorType(_I8, 8)
    scp = _ptr(builder, SC, v8i8)
    pmaddubs = _declare(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16I16, [_V32I8, _V32I8])
    pmaddwd = _declare(builder, "llvm.x86.avx2.pmadd.wd", _V8I32, [_V16I16, _V16I16])
    ones = ir.Constant(_V16I16, [1] * 16)
    k = lambda v: ir.Constant(_I64, v)  # noqa: E731
    lo = list(range(4)) + list(range(8, 12))
    hi = list(range(4, 8)) + list(range(12, 16))
    c32 = ir.Constant(_F32T, 32.0)

    def block(b, facc):
        tb = builder.add(builder.mul(t, nb), b)
        base = builder.mul(b, k(QB))
        halves = []
        for half in range(2):
            sums = [ir.Constant(_V8I32, [0] * 8)] * 4
            for pair in range(2):
                p16 = None
                for q in (4 * half + 2 * pair, 4 * half + 2 * pair + 1):
                    xq = builder.bitcast(_broadcast32(builder, builder.load(
                        builder.gep(xp, [builder.add(builder.mul(tb, k(QB // 4)), k(q))]), align=1)), _V32I8)
                    prods = [builder.call(pmaddubs, [v, xq]) for v in _byte_quads(builder, wp, base, q)]
                    p16 = prods if p16 is None else [builder.add(u, v) for u, v in zip(p16, prods, strict=True)]
                sums = [builder.add(s, builder.call(pmaddwd, [p, ones])) for s, p in zip(sums, p16, strict=True)]
            halves.append([_shuffle(builder, sums[0], sums[1], lo), _shuffle(builder, sums[2], sums[3], lo),
                           _shuffle(builder, sums[0], sums[1], hi), _shuffle(builder, sums[2], sums[3], hi)])
        dx = builder.load(builder.gep(dxp, [tb]))
        offs = [_splat(builder, builder.fmul(c32, builder.sitofp(builder.load(builder.gep(
            hp, [builder.add(builder.mul(tb, k(2)), k(h))])), _F32T), flags=_EXACT), _V8F32) for h in range(2)]
        dxv = _splat(builder, dx, _V8F32)
        sup = builder.lshr(b, k(3))
        for r in range(_ROW_REGS):
            sa = builder.fsub(builder.sitofp(halves[0][r], _V8F32), offs[0], flags=_EXACT)
            sb = builder.fsub(builder.sitofp(halves[1][r], _V8F32), offs[1], flags=_EXACT)
            ca = _lane_vec(builder, scp, builder.add(builder.mul(builder.mul(b, k(2)), k(_ROW_REGS)), k(r)), v8i8, "s")
            cb = _lane_vec(builder, scp, builder.add(builder.mul(builder.add(builder.mul(b, k(2)), k(1)),
                                                                 k(_ROW_REGS)), k(r)), v8i8, "s")
            s = builder.fadd(builder.fmul(ca, sa, flags=_EXACT), builder.fmul(cb, sb, flags=_EXACT), flags=_EXACT)
            d = _lane_vec(builder, dp, builder.add(builder.mul(sup, k(_ROW_REGS)), k(r)), _V8F32, "")
            y = builder.fmul(d, builder.fmul(dxv, s, flags=_EXACT), flags=_EXACT)
            builder.store(builder.fadd(builder.load(facc[r]), y, flags=_EXACT), facc[r])

    _row_avx2_loop(context, builder, nb, acc, 16, _ptr(builder, W, ir.VectorType(_I8, 64)), block,
                   PREFETCH_NEXT_GROUP["q6_k"])
    return context.get_dummy_value()


def _row_avx2_typed(args, t, codegen):
    """A row tile's typing: every argument but the row t an array (acc last), t an integer."""
    if not all(isinstance(a, types.Array) for a in args) or not isinstance(t, types.Integer):
        return None
    return types.void(*args[:-1], types.int64, args[-1]), codegen


# <type>_row_avx2(..., t, acc): acc f32 [1, LANES] = the row group times activation row t (AVX2 hosts)
@intrinsic
def q4_1_row_avx2(typingctx, W, D, M, XP, DX, QH, t, acc):
    """Q4_1 row tile (AVX2): see _q4_1_row_codegen."""
    return _row_avx2_typed((W, D, M, XP, DX, QH, acc), t, _q4_1_row_codegen)


@intrinsic
def q4_k_row_avx2(typingctx, W, D, DM, SC, MN, XP, DX, QH, t, acc):
    """Q4_K row tile (AVX2): see _q4_k_row_codegen."""
    return _row_avx2_typed((W, D, DM, SC, MN, XP, DX, QH, acc), t, _q4_k_row_codegen)


@intrinsic
def q5_0_row_avx2(typingctx, W, D, XP, DX, QH, t, acc):
    """Q5_0 row tile (AVX2): see _q5_0_row_codegen."""
    return _row_avx2_typed((W, D, XP, DX, QH, acc), t, _q5_0_row_codegen)


@intrinsic
def q8_0_row_avx2(typingctx, W, D, X8, DX, t, acc):
    """Q8_0 row tile (AVX2): see _q8_0_row_codegen."""
    return _row_avx2_typed((W, D, X8, DX, acc), t, _q8_0_row_codegen)


@intrinsic
def q6_k_row_avx2(typingctx, W, D, SC, X8, DX, QH, t, acc):
    """Q6_K row tile (AVX2): see _q6_k_row_codegen."""
    return _row_avx2_typed((W, D, SC, X8, DX, QH, acc), t, _q6_k_row_codegen)


# -- decode rows of Q8_0 on AVX-512 VNNI: the block read once for a tile of rows (kernels.matmul.dots) ----------
# A row group's Q8_0 bytes in quads (W int8 [nb, QB * LANES]: element e of lane l at (e // 4) * 4 * LANES
# + 4 * l + e % 4, so 64 bytes hold 4 elements of 16 lanes, one int32 each) go into `vpdpbusd` as
# unsigned bytes w + 128 (w ^ 0x80, once per tile) with each row's four int8 activations of those elements:
# exact int32 sums sum((w + 128) x), less 128 * sum(x) (the block's half sums), give sum(w x) exactly.
# Each row's float steps, acc = fma(d, dx * float(isum), acc), are the same whatever the tile's size.


def _q8_0_rows_codegen(rows: int):
    """IR of q8_0_rows_<rows>(W, D, X, DX, QH, t0, acc): acc f32 [rows, LANES] for rows t0.. of the int16
    activations X [n, nb, 32], scales DX f32 [n, nb] and half sums QH int16 [n, nb, 2], against group W
    int8 [nb, QB * LANES] (quads) with scales D f32 [nb, LANES]."""
    half = LANES // 16  # int32 registers a quad of elements: 16 lanes each
    spread = [ir.Constant(ir.VectorType(_I32, 16), [j] * 16) for j in range(QB // 4)]

    def codegen(context, builder, sig, args):
        W, D, X, DX, QH, acc = _arrays(context, builder, sig, args)
        t0 = args[5]
        nb = cgutils.unpack_tuple(builder, W.shape)[0]
        wp, dp = _ptr(builder, W, _V16I32), _ptr(builder, D, _V16F32)
        xp, dxp, hp = _ptr(builder, X, ir.VectorType(_I16, QB)), _ptr(builder, DX, _F32T), _ptr(builder, QH, _I16)
        dot = _declare(builder, "llvm.x86.avx512.vpdpbusd.512", _V16I32, [_V16I32] * 3)
        fma = _declare(builder, "llvm.fma.v16f32", _V16F32, [_V16F32] * 3)
        k = lambda v: ir.Constant(_I64, v)  # noqa: E731
        flip = ir.Constant(_V16I32, [-0x7F7F7F80] * 16)  # 0x80808080: w + 128 as unsigned bytes
        facc = [[cgutils.alloca_once_value(builder, ir.Constant(_V16F32, None)) for _ in range(half)]
                for _ in range(rows)]
        with cgutils.for_range(builder, nb) as loop:
            b = loop.index
            tb = [builder.add(builder.mul(builder.add(t0, k(r)), nb), b) for r in range(rows)]  # (t, b) in [n, nb]
            xq = [builder.bitcast(builder.trunc(builder.load(builder.gep(xp, [tb[r]]), align=2),
                                                ir.VectorType(_I8, QB)), _V8I32) for r in range(rows)]
            # int32 sums start at -128 * sum(x): the offset of w + 128, exact
            off = []
            for r in range(rows):
                h0 = builder.sext(builder.load(builder.gep(hp, [builder.mul(tb[r], k(2))])), _I32)
                h1 = builder.sext(builder.load(builder.gep(hp, [builder.add(builder.mul(tb[r], k(2)), k(1))])), _I32)
                off.append(_splat(builder, builder.mul(builder.add(h0, h1), ir.Constant(_I32, -128)), _V16I32))
            ia = [[off[r]] * half for r in range(rows)]
            wb = builder.mul(b, k(QB // 4 * half))
            if PREFETCH_NEXT_GROUP["q8_0"]:
                _prefetch_next(builder, wp, wb, builder.mul(nb, k(QB // 4 * half)), QB // 4 * half)
            for j in range(QB // 4):
                u = [builder.xor(builder.load(builder.gep(wp, [builder.add(wb, k(j * half + h))]), align=1), flip)
                     for h in range(half)]
                for r in range(rows):
                    x = builder.shuffle_vector(xq[r], xq[r], spread[j])
                    ia[r] = [builder.call(dot, [ia[r][h], u[h], x]) for h in range(half)]
            d = [builder.load(builder.gep(dp, [builder.add(builder.mul(b, k(half)), k(h))]), align=4)
                 for h in range(half)]
            for r in range(rows):
                dxv = _splat(builder, builder.load(builder.gep(dxp, [tb[r]])), _V16F32)
                for h in range(half):
                    f = builder.fmul(dxv, builder.sitofp(ia[r][h], _V16F32), flags=_EXACT)
                    builder.store(builder.call(fma, [d[h], f, builder.load(facc[r][h])]), facc[r][h])
        out = _ptr(builder, acc, _V16F32)
        for r in range(rows):
            for h in range(half):
                builder.store(builder.load(facc[r][h]), builder.gep(out, [k(half * r + h)]), align=4)
        return context.get_dummy_value()

    return codegen


def _q8_0_rows_intrinsic(rows: int):
    @intrinsic
    def q8_0_rows(typingctx, W, D, X, DX, QH, t0, acc):
        if not all(isinstance(a, types.Array) for a in (W, D, X, DX, QH, acc)):
            return None
        if not isinstance(t0, types.Integer):
            return None
        return types.void(W, D, X, DX, QH, types.int64, acc), _q8_0_rows_codegen(rows)

    q8_0_rows.__doc__ = f"acc f32 [{rows}, LANES] = Q8_0 row group times {rows} activation rows (VNNI)"
    return q8_0_rows


# q8_0_rows_<rows>(W, D, X, DX, QH, t0, acc): see _q8_0_rows_codegen (AVX-512 VNNI hosts; dots picks it)
q8_0_rows_1, q8_0_rows_2, q8_0_rows_4 = (_q8_0_rows_intrinsic(r) for r in (1, 2, 4))
