"""Eight float32 rows' dot products with one vector x, the rows in the lanes of one 8-wide register.

`dots8(W, r, x, out)` sets out[r + i] = W[r + i] . x for i in 0..7, each sum in element order with a
multiply and an add each rounded (s = 0; s = s + w[e] * x[e] for e = 0, 1, ...): the bits of the plain
scalar loop, row by row. The decode kernel's float32 products (kernels.decode.block) read their weights
row-major, so a lane's elements lie along a row: each block of 8 x 8 weights is loaded as eight row
vectors and transposed in registers (three rounds of shuffles), and then every column goes into the
eight lanes' sums at once with one multiply and one add of 8-wide vectors, where the scalar loop needed
eight of each. Each step of 16 elements reads a whole cache line of every row and prefetches the same
share of the next eight rows into the second-level cache, in address order (Zen 4, a Granite-style
hybrid's float32 Mamba2 layer, 12.8 MB from memory: 1.1 -> 0.66 ms; prefetched into the first level:
0.99 ms). Sixteen rows at once, two chains of adds, measured slower from memory: their lines overfill an
L1 set when rows lie 4 KiB apart. The multiplies and adds carry only the `nnan` flag (no reassociation,
no contraction, so numba's fastmath pass leaves them as written): the same bits in every caller, on
every x86-64 host. Without the JIT (NUMBA_DISABLE_JIT) `dots8` is the plain loop.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from archrun.kernels._jit import JIT

_F = ir.FloatType()
_V8 = ir.VectorType(_F, 8)
_I8, _I32, _I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
_EXACT = ("nnan",)  # see the module docstring


def _mask(*ix: int) -> ir.Constant:
    return ir.Constant(ir.VectorType(_I32, 8), list(ix))


def _transpose8(builder, rows: list) -> list:
    """Columns [c0..c7] of the 8 x 8 block whose rows are the vectors `rows` (c_j[i] = rows[i][j])."""
    t = []
    for i in range(0, 8, 2):  # interleave row pairs: [a0 b0 a1 b1 | a4 b4 a5 b5], [a2 b2 a3 b3 | a6 b6 a7 b7]
        t += [builder.shuffle_vector(rows[i], rows[i + 1], _mask(0, 8, 1, 9, 4, 12, 5, 13)),
              builder.shuffle_vector(rows[i], rows[i + 1], _mask(2, 10, 3, 11, 6, 14, 7, 15))]
    u = []
    for i in (0, 4):  # pairs of pairs: four rows' element j (and j + 4) side by side
        for a, b in ((t[i], t[i + 2]), (t[i + 1], t[i + 3])):
            u += [builder.shuffle_vector(a, b, _mask(0, 1, 8, 9, 4, 5, 12, 13)),
                  builder.shuffle_vector(a, b, _mask(2, 3, 10, 11, 6, 7, 14, 15))]
    # u[0..3]: rows 0-3's elements (0|4), (1|5), (2|6), (3|7); u[4..7]: rows 4-7's
    lo, hi = _mask(0, 1, 2, 3, 8, 9, 10, 11), _mask(4, 5, 6, 7, 12, 13, 14, 15)
    cols = [builder.shuffle_vector(u[j], u[4 + j], lo) for j in range(4)]
    return cols + [builder.shuffle_vector(u[j], u[4 + j], hi) for j in range(4)]


def _splat(builder, x):
    v = builder.insert_element(ir.Constant(_V8, ir.Undefined), x, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, ir.Constant(_V8, ir.Undefined), _mask(*[0] * 8))


def _codegen(context, builder, sig, args):
    from numba.core import cgutils

    w_ty, _, x_ty, o_ty = sig.args
    wa = context.make_array(w_ty)(context, builder, args[0])
    w = builder.bitcast(wa.data, _F.as_pointer())
    x = builder.bitcast(context.make_array(x_ty)(context, builder, args[2]).data, _F.as_pointer())
    o = builder.bitcast(context.make_array(o_ty)(context, builder, args[3]).data, _F.as_pointer())
    stride = builder.udiv(builder.extract_value(wa.strides, 0), ir.Constant(_I64, 4))
    n = builder.extract_value(wa.shape, 1)
    r = args[1]
    bases = [builder.mul(builder.add(r, ir.Constant(_I64, i)), stride) for i in range(8)]
    acc = cgutils.alloca_once_value(builder, ir.Constant(_V8, [0.0] * 8))  # promoted to a register
    prefetch = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [_I8.as_pointer(), _I32, _I32, _I32]), "llvm.prefetch.p0")
    ahead = builder.gep(builder.bitcast(w, _I8.as_pointer()),
                        [builder.mul(builder.add(bases[0], builder.mul(stride, ir.Constant(_I64, 8))),
                                     ir.Constant(_I64, 4))])  # the next eight rows (a hint: may lie past W)

    def add_column(col, e):
        xe = _splat(builder, builder.load(builder.gep(x, [e])))
        builder.store(builder.fadd(builder.load(acc), builder.fmul(col, xe, flags=_EXACT), flags=_EXACT), acc)

    def block(e0):
        rows = [builder.load(builder.bitcast(builder.gep(w, [builder.add(b, e0)]), _V8.as_pointer()), align=4)
                for b in bases]
        for j, col in enumerate(_transpose8(builder, rows)):
            add_column(col, builder.add(e0, ir.Constant(_I64, j)))

    pairs = builder.udiv(n, ir.Constant(_I64, 16))
    with cgutils.for_range(builder, pairs) as loop:  # 16 elements: a whole cache line of each row at once
        e0 = builder.mul(loop.index, ir.Constant(_I64, 16))
        line0 = builder.mul(loop.index, ir.Constant(_I64, 64 * 8))
        for q in range(0, 64 * 8, 64):  # this step's share of the next rows, in address order, to L2
            builder.call(prefetch, [builder.gep(ahead, [builder.add(line0, ir.Constant(_I64, q))]),
                                    ir.Constant(_I32, 0), ir.Constant(_I32, 2), ir.Constant(_I32, 1)])
        block(e0)
        block(builder.add(e0, ir.Constant(_I64, 8)))
    blocks = builder.udiv(n, ir.Constant(_I64, 8))
    done = builder.mul(pairs, ir.Constant(_I64, 2))
    with cgutils.for_range(builder, builder.sub(blocks, done)) as loop:  # an odd block of 8
        block(builder.mul(builder.add(done, loop.index), ir.Constant(_I64, 8)))
    tail0 = builder.mul(blocks, ir.Constant(_I64, 8))
    with cgutils.for_range(builder, builder.sub(n, tail0)) as loop:  # the last n % 8 elements: a column each
        e = builder.add(tail0, loop.index)
        col = ir.Constant(_V8, ir.Undefined)
        for i, b in enumerate(bases):
            col = builder.insert_element(col, builder.load(builder.gep(w, [builder.add(b, e)])), ir.Constant(_I32, i))
        add_column(col, e)
    builder.store(builder.load(acc), builder.bitcast(builder.gep(o, [r]), _V8.as_pointer()), align=4)
    return context.get_dummy_value()


def _typed(W, r, x, out) -> bool:
    return (isinstance(W, types.Array) and W.ndim == 2 and W.dtype == types.float32 and isinstance(r, types.Integer)
            and all(isinstance(a, types.Array) and a.ndim == 1 and a.dtype == types.float32 for a in (x, out)))


@intrinsic
def _dots8_ir(typingctx, W, r, x, out):
    """out[r:r + 8] = W[r:r + 8] @ x (see the module docstring): W float32 [n_out, n_in], x and out float32
    vectors, each with unit element stride (rows of C-contiguous arrays: not checked)."""
    return (types.void(W, types.int64, x, out), _codegen) if _typed(W, r, x, out) else None


@njit(**JIT)
def _dots8_loops(W, r, x, out):
    """The same sums as plain loops (no JIT: the intrinsic needs it)."""
    for i in range(8):
        w = W[r + i]
        s = np.float32(0.0)
        for e in range(w.shape[0]):
            s += w[e] * x[e]
        out[r + i] = s


if numba.config.DISABLE_JIT:
    def dots8(W, r, x, out):
        """out[r:r + 8] = W[r:r + 8] @ x, each row's sum in element order."""
        _dots8_loops(W, r, x, out)
else:
    dots8 = _dots8_ir
