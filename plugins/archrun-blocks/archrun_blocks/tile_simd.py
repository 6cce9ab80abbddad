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


def _mm_codegen(accumulate: bool):
    def codegen(context, builder, sig, args):
        (a, sa), (b, sb), (c, sc) = (_view(context, builder, t, v) for t, v in zip(sig.args, args, strict=True))
        k_len = builder.extract_value(context.make_array(sig.args[0])(context, builder, args[0]).shape, 1)
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V8, [_V8, _V8, _V8]), "llvm.fma.v8f32")
        acc = []
        for r in range(ROWS):
            for h in range(COLS // 8):
                init = (builder.load(_vec(builder, _at(builder, c, ir.Constant(_I64, r), sc, ir.Constant(_I64, 8 * h))),
                                     align=4) if accumulate else ir.Constant(_V8, [0.0] * 8))
                acc.append(cgutils.alloca_once_value(builder, init))  # promoted to registers by LLVM
        with cgutils.for_range(builder, k_len) as loop:
            k = loop.index
            bv = [builder.load(_vec(builder, _at(builder, b, k, sb, ir.Constant(_I64, 8 * h))), align=4)
                  for h in range(COLS // 8)]
            for r in range(ROWS):
                x = _splat(builder, builder.load(_at(builder, a, ir.Constant(_I64, r), sa, k)))
                for h in range(COLS // 8):
                    slot = acc[r * (COLS // 8) + h]
                    builder.store(builder.call(fma, [x, bv[h], builder.load(slot)]), slot)
        for r in range(ROWS):
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


@njit(**JIT)
def _mm4x16_loops(a, b, c, accumulate):
    """The tile's arithmetic as plain loops (no JIT: the intrinsic needs it)."""
    for r in range(ROWS):
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
else:
    mm4x16, mm4x16_acc = _mm4x16_ir, _mm4x16_acc_ir
