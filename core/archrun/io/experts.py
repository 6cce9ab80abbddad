"""MoE experts streamed from disk: expert weights paged on demand under a memory cap.

`archrun.load(path, expert_memory=BYTES)` keeps at most about BYTES of a mixture-of-experts model's expert
matrices resident. At load each expert matrix is prepared for the kernels as usual (one at a time), written
to an expert store (a temporary file, unlinked at once) and dropped from memory; the kernels then read the
experts through a private mapping of the store, so the OS pages in an expert when the router first picks it.
Before every step the pager asks the OS which experts are mapped in (the page table's present bits) and,
past the cap, drops the least recently paged-in ones (madvise DONTNEED): a hot expert that was dropped
pages in again from the page cache or the disk. The kernels and the bytes they read are the same as with
every expert resident, so the logits are bit for bit those of the resident model.

The cap holds between steps, and between the layers of a prompt (the interpreter calls the pager after
every block of its op-by-op path): within one layer of a prompt every expert its tokens pick is paged in.
The LRU is by page-in time: an expert that stays resident ages even while it is used, and is paged in
again (and refreshed) after it is dropped.

Prefetch from the router's choice: every stored matrix has a row in the pager's page table (address,
length, a flag; archrun.kernels.pages). A MoE kernel that reads its experts from the store gets the table
and, as soon as its router has chosen, asks the OS to read every chosen expert that is not mapped in
(madvise WILLNEED) before it computes the first one: the reads of a token's experts overlap each other and
the products. Between steps the pager sets each row's flag to whether the matrix is mapped in.
"""

from __future__ import annotations

import mmap
import os
import tempfile
import threading
from typing import Any

import attrs
import numpy as np

from archrun.errors import InvalidRequest, shown
from archrun.kernels import pages

PAGE = mmap.PAGESIZE
_ALIGN = 64  # each array of a matrix starts on a cache line


def check_expert_memory(value: Any) -> int | None:
    """expert_memory as a positive int of bytes (None: every expert resident), else InvalidRequest."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise InvalidRequest(f"expert_memory must be a positive number of bytes, got {shown(value)}")
    return int(value)


class ExpertPager:
    """The expert store of one model: prepared expert matrices in a mapped file, kept under `budget` bytes."""

    def __init__(self, budget: int, directory: str | None = None):
        self.budget = budget
        self._file = tempfile.TemporaryFile(dir=directory, prefix="archrun-experts-")  # noqa: SIM115 (kept)
        self._pending: list[tuple[Any, list[tuple[int, np.dtype, tuple, bool]], Any]] = []
        self._size = 0
        self._map: mmap.mmap | None = None
        self.units: list[tuple[int, int]] = []  # (start, end) of each matrix in the store, page-aligned
        self._stamp: np.ndarray = np.zeros(0, np.int64)
        self._resident = np.zeros(0, bool)
        self._tick = 0
        self.evictions = 0  # matrices dropped so far
        self._lock = threading.Lock()  # layers are bound on two threads
        self.table = np.zeros((0, 3), np.int64)  # archrun.kernels.pages' page table: a row per matrix
        self._lengths = np.zeros(0, np.int64)  # bytes of each stored matrix (its page range)
        self._release_file_cache = False

    @property
    def finished(self) -> bool:
        """Whether the store is mapped (later experts, e.g. an MTP block's, stay in memory)."""
        return self._map is not None

    @property
    def store_bytes(self) -> int:
        """Bytes of every expert matrix in the store."""
        return self._size

    def add(self, matrix: Any, q: Any) -> None:
        """Write the prepared `q` (archrun.kernels.QMatrix) of expert `matrix` to the store; `matrix` takes the
        mapped copy at finish(). q's own memory is the caller's to drop."""
        with self._lock:
            start = self._size = -(-self._size // PAGE) * PAGE
            layout = []
            for a in q.arrays:
                self._size = -(-self._size // _ALIGN) * _ALIGN
                self._file.seek(self._size)
                self._file.write(np.ascontiguousarray(a).tobytes())
                layout.append((self._size, a.dtype, a.shape, a.flags.writeable))
                self._size += a.nbytes
            self.units.append((start, -(-self._size // PAGE) * PAGE))
            self._pending.append((matrix, layout, attrs.evolve(q, arrays=())))  # q's arrays are not kept

    def finish(self) -> None:
        """Map the store and hand each matrix its mapped arrays (a private mapping: pages come from the file)."""
        if not self.units:
            return
        self._file.truncate(self.units[-1][1])
        self._file.flush()
        self._map = mmap.mmap(self._file.fileno(), self.units[-1][1], flags=mmap.MAP_PRIVATE,
                              prot=mmap.PROT_READ | mmap.PROT_WRITE)
        self._map.madvise(mmap.MADV_DONTNEED)  # written, not yet read: nothing resident
        self._base = np.frombuffer(self._map, np.uint8)
        self._lengths = np.array([b - a for a, b in self.units], np.int64)
        self.table = np.zeros((len(self.units), 3), np.int64)
        self.table[:, pages.ADDRESS] = [self._base.ctypes.data + a for a, _ in self.units]
        self.table[:, pages.LENGTH] = self._lengths
        for unit, (matrix, layout, q) in enumerate(self._pending):
            arrays = []
            for offset, dtype, shape, writeable in layout:
                a = np.frombuffer(self._map, dtype, int(np.prod(shape)), offset).reshape(shape)
                a.flags.writeable = writeable
                arrays.append(a)
            matrix.use_prepared(attrs.evolve(q, arrays=tuple(arrays)), pages=(self.table, unit))
        self._pending.clear()
        self._stamp = np.zeros(len(self.units), np.int64)
        self._resident = np.zeros(len(self.units), bool)
        self._unit_pages = np.array([a // PAGE for a, _ in self.units], np.int64)

    def resident(self) -> np.ndarray:
        """bool [matrices]: which expert matrices have pages mapped in this process now (the page table's
        present bits, /proc/self/pagemap; mincore would say which are in the OS's page cache)."""
        if self._map is None:
            return np.zeros(0, bool)
        n_pages = self.units[-1][1] // PAGE
        try:
            with open("/proc/self/pagemap", "rb", buffering=0) as f:
                f.seek(self._base.ctypes.data // PAGE * 8)
                entries = np.frombuffer(f.read(n_pages * 8), np.uint64)
        except OSError:
            return np.ones(len(self.units), bool)  # unknown: treat all as resident (evicting is harmless)
        present = (entries >> np.uint64(63)).astype(np.int64)
        return np.add.reduceat(present, self._unit_pages) > 0  # units are contiguous and non-empty

    def resident_bytes(self) -> int:
        """Bytes of the expert matrices with pages in memory now (whole matrices)."""
        return int(self._lengths[self.resident()].sum()) if self._map is not None else 0

    def between_steps(self) -> None:
        """Stamp the matrices paged in since the last call, then drop the oldest until under the budget."""
        if self._map is None:
            return
        self._tick += 1
        now = self.resident()
        self._stamp[now & ~self._resident] = self._tick
        over = int(self._lengths[now].sum()) - self.budget
        if over > 0:
            for i in np.argsort(np.where(now, self._stamp, np.iinfo(np.int64).max), kind="stable"):
                if over <= 0 or not now[i]:
                    break
                a, b = self.units[i]
                self._map.madvise(mmap.MADV_DONTNEED, a, b - a)
                if self._release_file_cache:
                    os.posix_fadvise(self._file.fileno(), a, b - a, os.POSIX_FADV_DONTNEED)
                now[i] = False
                over -= b - a
                self.evictions += 1
        self._resident = now
        self.table[:, pages.ASKED] = now  # a kernel asks for the others when its router picks them

    def set_prefetch(self, on: bool) -> None:
        """Whether MoE kernels ask the OS to read their routers' picks ahead (on by default)."""
        if self._map is not None:
            self.table[:, pages.LENGTH] = self._lengths if on else 0

    def release_file_cache(self) -> None:
        """From now on also drop evicted experts from the OS's file cache (posix_fadvise DONTNEED), so they
        are read from the disk again when picked: as with a store larger than the machine's memory. For
        measuring reads from disk; by default the OS keeps them cached while it has room."""
        if self._map is not None:
            self._file.flush()
            os.fsync(self._file.fileno())  # only clean pages leave the file cache
        self._release_file_cache = True

    def close(self) -> None:
        self._file.close()


def directory() -> str | None:
    """Where expert stores go: $ARCHRUN_EXPERT_DIR, else the system's temporary folder."""
    return os.environ.get("ARCHRUN_EXPERT_DIR") or None
