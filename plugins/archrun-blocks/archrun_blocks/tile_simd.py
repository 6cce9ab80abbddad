"""A float32 register tile for the attention kernels: C[4, 16] (+)= A[4, K] @ B[K, 16] in LLVM vector IR.

The prompt attention's two products are small matrix products over one block of keys: the scores
S = Q K^T (A: four score rows of queries, B: the block's keys transposed, K = hd) and the value mix
acc += P V (A: four rows of probabilities, B: the block's value rows, K = the keys of the block). numba's
loops over them keep the output rows in memory (a load and a store per multiply-add vector, ~5
multiply-adds a cycle measured); this tile keeps all 4 x 16 outputs in eight 8-wide registers for the whole
K loop: per step two loads of B, four broadcasts of A and eight fused multiply-adds, the shape of a BLAS
micro-kernel (12 of the 16 vector registers of AVX2, so no spills on the oldest hosts; any x86-64 host
runs the same IR, LLVM lowering the 8-wide vectors to what it has).

Order of the sums: each output is sum over k of a[r, k] * b[k, c] in k order with one rounding per fused
multiply-add (llvm.fma, whatever the fastmath flags of the caller): the same bits on every host. Without
the JIT (NUMBA_DISABLE_JIT) `mm4x16` is the plain loop `_mm4x16_loops` (float32 rounding, other order).
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from archrun.kernels._jit import JIT

ROWS, COLS = 4, 16          # the tile: rows of A / C, columns of B / C
_F = ir.FloatType()
_V8 = ir.VectorType(_F, 8)
_I64 = ir.IntType(64)


def _view(context, builder, ty, val):
    """(float* data, row stride in elements) of a 2-D float32 array argument (unit column stride assumed)."""
    a = context.make_array(ty)(context, builder, val)
    data = builder.bitcast(a.data, _F.as_pointer())
    stride = builder.udiv(builder.extract_value(a.strides, 0), ir.Constant(_I64, 4))
    return data, stride


def _at(builder, base, row, stride, col):
    """&base[row * stride + col] (float*)."""
    return builder.gep(base, [builder.add(builder.mul(row, stride), col)])


def _vec(builder, ptr):
    return builder.bitcast(ptr, _V8.as_pointer())


def _splat(builder, x):
    v = builder.insert_element(ir.Constant(_V8, ir.Undefined), x, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(v, ir.Constant(_V8, ir.Undefined), ir.Constant(ir.VectorType(ir.IntType(32), 8),
                                                                               [0] * 8))


def _mm_codegen(accumulate: bool, rows: int = ROWS):
    def codegen(context, builder, sig, args):
        (a, sa), (b, sb), (c, sc) = (_view(context, builder, t, v) for t, v in zip(sig.args, args, strict=True))
        k_len = builder.extract_value(context.make_array(sig.args[0])(context, builder, args[0]).shape, 1)
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V8, [_V8, _V8, _V8]), "llvm.fma.v8f32")
        acc = []
        for r in range(rows):
            for h in range(COLS // 8):
                init = (builder.load(_vec(builder, _at(builder, c, ir.Constant(_I64, r), sc, ir.Constant(_I64, 8 * h))),
                                     align=4) if accumulate else ir.Constant(_V8, [0.0] * 8))
                acc.append(cgutils.alloca_once_value(builder, init))  # promoted to registers by LLVM
        with cgutils.for_range(builder, k_len) as loop:
            k = loop.index
            bv = [builder.load(_vec(builder, _at(builder, b, k, sb, ir.Constant(_I64, 8 * h))), align=4)
                  for h in range(COLS // 8)]
            for r in range(rows):
                x = _splat(builder, builder.load(_at(builder, a, ir.Constant(_I64, r), sa, k)))
                for h in range(COLS // 8):
                    slot = acc[r * (COLS // 8) + h]
                    builder.store(builder.call(fma, [x, bv[h], builder.load(slot)]), slot)
        for r in range(rows):
            for h in range(COLS // 8):
                ptr = _vec(builder, _at(builder, c, ir.Constant(_I64, r), sc, ir.Constant(_I64, 8 * h)))
                builder.store(builder.load(acc[r * (COLS // 8) + h]), ptr, align=4)
        return context.get_dummy_value()

    return codegen


def _typed(a, b, c):
    arrays = (a, b, c)
    return all(isinstance(x, types.Array) and x.ndim == 2 and x.dtype == types.float32 for x in arrays)


@intrinsic
def _mm4x16_ir(typingctx, a, b, c):
    """c[:4, :16] = a[:4, :K] @ b[:K, :16] (see the module docstring)."""
    if not _typed(a, b, c):
        return None
    return types.void(a, b, c), _mm_codegen(False)


@intrinsic
def _mm4x16_acc_ir(typingctx, a, b, c):
    """c[:4, :16] += a[:4, :K] @ b[:K, :16]."""
    if not _typed(a, b, c):
        return None
    return types.void(a, b, c), _mm_codegen(True)


@intrinsic
def _mm3x16_acc_ir(typingctx, a, b, c):
    """c[:3, :16] += a[:3, :K] @ b[:K, :16]: the tile with three rows (a GQA group of 3 without a padding row),
    each output's bits those of mm4x16_acc."""
    if not _typed(a, b, c):
        return None
    return types.void(a, b, c), _mm_codegen(True, 3)


@njit(**JIT)
def _mm4x16_loops(a, b, c, accumulate):
    """The tile's arithmetic as plain loops (no JIT: the intrinsic needs it); a's rows (4, or 3)."""
    for r in range(a.shape[0]):
        for j in range(COLS):
            s = c[r, j] if accumulate else np.float32(0.0)
            for k in range(a.shape[1]):
                s += a[r, k] * b[k, j]
            c[r, j] = s


if numba.config.DISABLE_JIT:
    def mm4x16(a, b, c):
        """c[:4, :16] = a[:4, :K] @ b[:K, :16]: float32 2-D views, unit column stride, b and c 16 columns."""
        _mm4x16_loops(a, b, c, False)

    def mm4x16_acc(a, b, c):
        """c[:4, :16] += a[:4, :K] @ b[:K, :16] (as mm4x16)."""
        _mm4x16_loops(a, b, c, True)

    def mm3x16_acc(a, b, c):
        """c[:3, :16] += a[:3, :K] @ b[:K, :16] (as mm4x16)."""
        _mm4x16_loops(a, b, c, True)
else:
    mm4x16, mm4x16_acc, mm3x16_acc = _mm4x16_ir, _mm4x16_acc_ir, _mm3x16_acc_ir


# -- decode scores: four key rows x two query heads ------------------------------------------------------
_H = ir.HalfType()
_I32 = ir.IntType(32)


def _lanes(builder, ptr, off, half: bool):
    """8 float32 values at ptr + off (float32 elements, or float16 bits widened exactly)."""
    if not half:
        return builder.load(_vec(builder, builder.gep(ptr, [off])), align=4)
    v = builder.load(builder.bitcast(builder.gep(ptr, [off]), ir.VectorType(_H, 8).as_pointer()), align=2)
    return builder.fpext(v, _V8)


def _pair_sums(builder, a, b, lo, hi):
    mask = ir.VectorType(_I32, 8)
    return builder.fadd(builder.shuffle_vector(a, b, ir.Constant(mask, lo)),
                        builder.shuffle_vector(a, b, ir.Constant(mask, hi)))


def _sums8(builder, a):
    """<8 x float> of the element sums of the 8 vectors a[0..7], in a fixed tree (no fastmath reordering)."""
    t = [_pair_sums(builder, a[i], a[i + 1], [0, 8, 2, 10, 4, 12, 6, 14], [1, 9, 3, 11, 5, 13, 7, 15])
         for i in (0, 2, 4, 6)]
    u = [_pair_sums(builder, t[i], t[i + 1], [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]) for i in (0, 2)]
    return _pair_sums(builder, u[0], u[1], [0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15])


def _dots_codegen(half: bool, heads: int):
    """Codegen of `heads` query rows x 4 key rows: one 8-lane accumulator a dot (multiply-adds in element
    order, lane e % 8), each reduced by _sums8's tree; eight outputs a store, the last store's first
    4 * heads % 8 lanes only."""
    def codegen(context, builder, sig, args):
        ptrs = []
        for i, (t, v) in enumerate(zip(sig.args, args, strict=True)):
            data = context.make_array(t)(context, builder, v).data
            ptrs.append(builder.bitcast(data, (_H if half and heads <= i < heads + 4 else _F).as_pointer()))
        hd = builder.extract_value(context.make_array(sig.args[0])(context, builder, args[0]).shape, 0)
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V8, [_V8, _V8, _V8]), "llvm.fma.v8f32")
        acc = [cgutils.alloca_once_value(builder, ir.Constant(_V8, [0.0] * 8)) for _ in range(4 * heads)]
        with cgutils.for_range(builder, builder.lshr(hd, ir.Constant(_I64, 3))) as loop:
            off = builder.shl(loop.index, ir.Constant(_I64, 3))
            q = [_lanes(builder, ptrs[i], off, False) for i in range(heads)]
            k = [_lanes(builder, ptrs[heads + r], off, half) for r in range(4)]
            for g in range(heads):
                for r in range(4):
                    slot = acc[4 * g + r]
                    builder.store(builder.call(fma, [q[g], k[r], builder.load(slot)]), slot)
        out = ptrs[heads + 4]
        for o in range(0, 4 * heads, 8):
            part = [builder.load(a) for a in acc[o:o + 8]]
            sums = _sums8(builder, part if len(part) == 8 else part + part)
            if len(part) == 8:
                builder.store(sums, _vec(builder, builder.gep(out, [ir.Constant(_I64, o)])), align=4)
                continue
            half4 = builder.shuffle_vector(sums, sums, ir.Constant(ir.VectorType(_I32, 4), [0, 1, 2, 3]))
            builder.store(half4, builder.bitcast(builder.gep(out, [ir.Constant(_I64, o)]),
                                                 ir.VectorType(_F, 4).as_pointer()), align=4)
        return context.get_dummy_value()

    return codegen


def _dots_typed(qs, ks, out) -> bool:
    """Whether the score intrinsics take these arguments: 1-D arrays, key rows all float32 or all uint16."""
    if not all(isinstance(x, types.Array) and x.ndim == 1 for x in (*qs, *ks, out)):
        return False
    return ks[0].dtype in (types.float32, types.uint16) and all(k.dtype == ks[0].dtype for k in ks)


@intrinsic
def _dots4x2_ir(typingctx, q0, q1, k0, k1, k2, k3, out):
    """out f32 [8] = (q0.k0, q0.k1, q0.k2, q0.k3, q1.k0, .., q1.k3): q0, q1 float32 [hd], k rows float32 or
    float16 bits (uint16) [hd], hd a multiple of 8 (the caller's check)."""
    ks = (k0, k1, k2, k3)
    if not _dots_typed((q0, q1), ks, out):
        return None
    return types.void(q0, q1, k0, k1, k2, k3, out), _dots_codegen(k0.dtype == types.uint16, 2)


@intrinsic
def _dots4x3_ir(typingctx, q0, q1, q2, k0, k1, k2, k3, out):
    """out f32 [12] = (q0.k0, .., q0.k3, q1.k0, .., q2.k3): dots4x2 with three query heads (a GQA group of 3
    without a repeated head), each dot's bits those of dots4x2."""
    ks = (k0, k1, k2, k3)
    if not _dots_typed((q0, q1, q2), ks, out):
        return None
    return types.void(q0, q1, q2, k0, k1, k2, k3, out), _dots_codegen(k0.dtype == types.uint16, 3)


@njit(**JIT)
def _dots4x2_loops(q0, q1, k0, k1, k2, k3, out):
    """dots4x2 as plain loops (no JIT); float16 bits widened by numpy."""
    ks = (k0, k1, k2, k3)
    for g in range(2):
        q = q0 if g == 0 else q1
        for r in range(4):
            k = ks[r]
            kf = k.view(np.float16).astype(np.float32) if k.dtype == np.uint16 else k
            s = np.float32(0.0)
            for e in range(q.shape[0]):
                s += q[e] * kf[e]
            out[4 * g + r] = s


@njit(**JIT)
def _dots4x3_loops(q0, q1, q2, k0, k1, k2, k3, out):
    """dots4x3 as plain loops (no JIT)."""
    last = np.empty(8, np.float32)
    _dots4x2_loops(q0, q1, k0, k1, k2, k3, out[:8])
    _dots4x2_loops(q2, q2, k0, k1, k2, k3, last)
    out[8:12] = last[:4]


dots4x2 = _dots4x2_loops if numba.config.DISABLE_JIT else _dots4x2_ir
dots4x3 = _dots4x3_loops if numba.config.DISABLE_JIT else _dots4x3_ir
