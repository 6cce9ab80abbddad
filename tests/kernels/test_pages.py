"""archrun.kernels.pages.read_ahead: a kernel asks the OS to read a file mapping's range ahead.

The oracle is the OS itself: mincore(2) says which pages of a mapping are in memory. A file whose pages
were dropped from the OS's file cache (fsync, posix_fadvise DONTNEED) has none; after read_ahead on its
range (compiled, and as plain Python as without the JIT) the OS reads them in the background.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import time

import numpy as np
import pytest
from numba import njit

from archrun.kernels import pages

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
SIZE = 64 * mmap.PAGESIZE


def _in_memory(address: int, size: int) -> np.ndarray:
    vec = (ctypes.c_ubyte * (size // mmap.PAGESIZE))()
    assert _libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(size), vec) == 0
    return np.frombuffer(vec, np.uint8) & 1 == 1


@njit(cache=False)
def _compiled(table, unit):
    pages.read_ahead(table, unit)


@pytest.fixture
def dropped(tmp_path):
    """A mapped file none of whose pages are in memory, and its page table (one range)."""
    path = tmp_path / "store"
    path.write_bytes(np.random.default_rng(0).integers(0, 255, SIZE, dtype=np.uint8).tobytes())
    with open(path, "rb") as f:
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, SIZE, os.POSIX_FADV_DONTNEED)
        m = mmap.mmap(f.fileno(), SIZE, prot=mmap.PROT_READ)
    address = np.frombuffer(m, np.uint8).ctypes.data
    if _in_memory(address, SIZE).any():
        pytest.skip("this file system keeps the file's pages in memory (no file cache to drop)")
    yield m, address, np.array([[address, SIZE, 0]], np.int64)
    m.close()


@pytest.mark.parametrize("call", [_compiled, pages.read_ahead], ids=["jit", "python"])
def test_read_ahead_brings_the_range_in(dropped, call):
    m, address, table = dropped
    call(table, 0)
    assert table[0, pages.ASKED] == 1
    deadline = time.monotonic() + 5
    while not _in_memory(address, SIZE).all() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _in_memory(address, SIZE).all()


@pytest.mark.parametrize("call", [_compiled, pages.read_ahead], ids=["jit", "python"])
def test_read_ahead_skips_asked_and_empty_ranges(dropped, call):
    m, address, table = dropped
    table[0, pages.ASKED] = 1
    call(table, 0)
    table[0, pages.ASKED], table[0, pages.LENGTH] = 0, 0
    call(table, 0)
    assert table[0, pages.ASKED] == 0
    time.sleep(0.2)
    assert not _in_memory(address, SIZE).any()
