"""Atomic operations on int64 array elements, a spin-wait hint and prefetch hints, for numba kernels.

numba has no CPU atomics; these intrinsics emit LLVM's sequentially consistent atomic
load/store/add/compare-and-swap on `a[i]` (a: a C-contiguous int64 array; i is not bounds-
checked, callers pass constant field indices of arrays they allocated). Being seq_cst, each is
also a compiler barrier: ordinary loads and stores are not moved across it, so data written
before an atomic store is visible to a thread that sees the store.

The atomics compile only under the JIT (NUMBA_DISABLE_JIT leaves them uncallable); archrun uses them
only in the decode worker pool (pool.py), which is off without the JIT. `prefetch` and `prefetch_l2` are no-ops there.
"""

from __future__ import annotations

import platform

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload

_X86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")


def _elem_ptr(context, builder, arr_ty, arr, idx):
    a = context.make_array(arr_ty)(context, builder, arr)
    return cgutils.get_item_pointer(context, builder, arr_ty, a, [idx])


def _check(arr):
    if not (isinstance(arr, types.Array) and arr.dtype == types.int64 and arr.ndim == 1):
        raise TypeError("atomics take a 1-d int64 array")


@intrinsic
def load(typingctx, arr, idx):
    """a[i], read atomically."""
    _check(arr)

    def codegen(context, builder, sig, args):
        return builder.load_atomic(_elem_ptr(context, builder, sig.args[0], args[0], args[1]), "seq_cst", 8)

    return types.int64(arr, types.intp), codegen


@intrinsic
def store(typingctx, arr, idx, val):
    """a[i] = v, written atomically."""
    _check(arr)

    def codegen(context, builder, sig, args):
        v = context.cast(builder, args[2], sig.args[2], types.int64)
        builder.store_atomic(v, _elem_ptr(context, builder, sig.args[0], args[0], args[1]), "seq_cst", 8)
        return context.get_dummy_value()

    return types.void(arr, types.intp, types.int64), codegen


@intrinsic
def add(typingctx, arr, idx, val):
    """a[i] += v atomically; returns the old value."""
    _check(arr)

    def codegen(context, builder, sig, args):
        v = context.cast(builder, args[2], sig.args[2], types.int64)
        ptr = _elem_ptr(context, builder, sig.args[0], args[0], args[1])
        return builder.atomic_rmw("add", ptr, v, "seq_cst")

    return types.int64(arr, types.intp, types.int64), codegen


@intrinsic
def cas(typingctx, arr, idx, expected, new):
    """If a[i] == expected, a[i] = new (atomically); returns whether it swapped."""
    _check(arr)

    def codegen(context, builder, sig, args):
        ptr = _elem_ptr(context, builder, sig.args[0], args[0], args[1])
        e = context.cast(builder, args[2], sig.args[2], types.int64)
        n = context.cast(builder, args[3], sig.args[3], types.int64)
        res = builder.cmpxchg(ptr, e, n, "seq_cst", "seq_cst")
        return builder.extract_value(res, 1)

    return types.boolean(arr, types.intp, types.int64, types.int64), codegen


@intrinsic
def pause(typingctx):
    """A spin-wait hint to the CPU (x86 `pause`; nothing elsewhere)."""

    def codegen(context, builder, sig, args):
        if _X86:
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                "llvm.x86.sse2.pause")
            builder.call(fn, [])
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def ticks(typingctx):
    """The CPU's time-stamp counter on x86 (constant rate, ~1-4 GHz); 0 elsewhere."""

    def codegen(context, builder, sig, args):
        if not _X86:
            return context.get_constant(types.int64, 0)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(64), []),
                                            "llvm.readcyclecounter")
        return builder.call(fn, [])

    return types.int64(), codegen


def _prefetch_codegen(locality: int):
    def codegen(context, builder, sig, args):
        a = context.make_array(sig.args[0])(context, builder, args[0])
        ptr = builder.gep(a.data, [args[1]])
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [ptr.type, ir.IntType(32), ir.IntType(32), ir.IntType(32)]),
            "llvm.prefetch.p0")
        i32 = lambda v: ir.Constant(ir.IntType(32), v)  # noqa: E731
        builder.call(fn, [ptr, i32(0), i32(locality), i32(1)])  # read, data
        return context.get_dummy_value()

    return codegen


@intrinsic
def _prefetch(typingctx, arr, i):
    if not isinstance(arr, types.Array):
        return None
    return types.void(arr, types.intp), _prefetch_codegen(3)  # all cache levels (x86: prefetcht0)


@intrinsic
def _prefetch_l2(typingctx, arr, i):
    if not isinstance(arr, types.Array):
        return None
    return types.void(arr, types.intp), _prefetch_codegen(2)  # the outer levels, not L1 (x86: prefetcht1)


def prefetch(arr, i):
    """Ask the CPU to bring the cache line holding element i of arr (flat index, C order; not bounds-
    checked) towards the core (LLVM's prefetch: read, all cache levels). A hint only: no effect on results,
    and no fault for any address. Without the JIT (NUMBA_DISABLE_JIT) it does nothing."""


def prefetch_l2(arr, i):
    """prefetch into the core's second-level cache, not its first (x86: prefetcht1): for lines wanted a
    longer way ahead than the 32-48 KiB first level holds without evicting what is in use."""


@overload(prefetch, jit_options={"nogil": True})
def _prefetch_jit(arr, i):
    if isinstance(arr, types.Array):
        return lambda arr, i: _prefetch(arr, i)
    return None


@overload(prefetch_l2, jit_options={"nogil": True})
def _prefetch_l2_jit(arr, i):
    if isinstance(arr, types.Array):
        return lambda arr, i: _prefetch_l2(arr, i)
    return None
