"""Arrays passed through an int64 block: addresses and float bits, for the decode pool's tasks.

A pool task (kernels.decode.pool) receives its arguments as one int64 array, written by the thread that
publishes it: an array travels as its address (`address(a)`, a.ctypes.data) and is rebuilt on the
other side with `array_at(addr, shape, dtype)` (a C-contiguous view of the same memory, no copy);
a float travels as its bits (`put_float` / `get_float`). The arrays must outlive the task: the
publisher keeps them until every chunk is done (kernels.decode.pool.wait_done).

`array_at` is an LLVM inttoptr under the JIT and a ctypes view in pure Python (NUMBA_DISABLE_JIT),
so a kernel using it runs both ways. Nothing is checked: the caller writes the addresses and
shapes of arrays it allocated.
"""

from __future__ import annotations

import ctypes

import numpy as np
from numba import carray, types
from numba.extending import intrinsic, overload

from archrun.kernels._jit import JIT


def address(a: np.ndarray) -> int:
    """The address of a's first element (a C-contiguous array)."""
    return a.ctypes.data


@overload(address, jit_options=JIT)
def _address_jit(a):
    return lambda a: a.ctypes.data


@intrinsic
def _pointer(typingctx, addr, dtype):
    """addr (int64) as a pointer to dtype's elements."""
    ptr = types.CPointer(dtype.dtype)

    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], context.get_value_type(ptr))

    return ptr(types.int64, dtype), codegen


def array_at(addr: int, shape: tuple, dtype: type) -> np.ndarray:
    """The C-contiguous array of `shape` and `dtype` at address addr (a view: no copy)."""
    n = int(np.prod(shape))
    if n == 0:
        return np.empty(shape, dtype)
    buf = (ctypes.c_char * (n * np.dtype(dtype).itemsize)).from_address(int(addr))
    return np.frombuffer(buf, dtype).reshape(shape)


@overload(array_at, jit_options=JIT)
def _array_at_jit(addr, shape, dtype):
    return lambda addr, shape, dtype: carray(_pointer(addr, dtype), shape)


def put_float(args: np.ndarray, i: int, x: float) -> None:
    """args[i] = the float64 bits of x."""
    args.view(np.float64)[i] = x


@overload(put_float, jit_options=JIT)
def _put_float_jit(args, i, x):
    def impl(args, i, x):
        args.view(np.float64)[i] = x
    return impl


def get_float(args: np.ndarray, i: int) -> float:
    """The float64 whose bits are args[i]."""
    return args.view(np.float64)[i]


@overload(get_float, jit_options=JIT)
def _get_float_jit(args, i):
    return lambda args, i: args.view(np.float64)[i]
