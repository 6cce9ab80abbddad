"""Reading mapped file pages ahead from numba kernels: `read_ahead` asks the OS (madvise MADV_WILLNEED) to
start reading a range of a file mapping, so the reads of several ranges overlap each other and the
work the kernel does meanwhile.

A range is a row of a page table, int64 [n, 3]: its address (page-aligned), its length in bytes and a
flag, 1 once the range was asked for (or is known to be in memory); the owner of the mapping clears the
flag of a range it drops (archrun.io.experts). A hint only: the bytes a kernel then reads are the same,
and a failed call changes nothing. Without the JIT (NUMBA_DISABLE_JIT) the same call goes through ctypes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap

from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload

ADDRESS, LENGTH, ASKED = range(3)  # the columns of a page table
MADV_WILLNEED = int(getattr(mmap, "MADV_WILLNEED", 3))

_madvise = types.ExternalFunction("madvise", types.int32(types.voidptr, types.uintp, types.int32))
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


@intrinsic
def _pointer(typingctx, address):
    """An int64 address as a void pointer."""

    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return types.voidptr(types.int64), codegen


def read_ahead(table, unit):
    """Ask the OS to read range `unit` of the page table `table` ahead, unless its ASKED flag is set; then
    set the flag. Ranges of zero length are skipped. Not bounds-checked."""
    if table[unit, ASKED] or table[unit, LENGTH] <= 0:
        return
    _libc.madvise(ctypes.c_void_p(int(table[unit, ADDRESS])), ctypes.c_size_t(int(table[unit, LENGTH])),
                  ctypes.c_int(MADV_WILLNEED))
    table[unit, ASKED] = 1


@overload(read_ahead, jit_options={"nogil": True})
def _read_ahead_jit(table, unit):
    if not (isinstance(table, types.Array) and table.dtype == types.int64 and table.ndim == 2):
        return None
    advice = MADV_WILLNEED

    def impl(table, unit):
        if table[unit, ASKED] or table[unit, LENGTH] <= 0:
            return
        _madvise(_pointer(table[unit, ADDRESS]), table[unit, LENGTH], advice)
        table[unit, ASKED] = 1

    return impl

