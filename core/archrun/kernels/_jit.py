"""Shared numba options and layout constants of the kernels."""

from __future__ import annotations

import hashlib
from pathlib import Path

# Every kernel: cached per CPU model, fast float math, releases the GIL.
JIT = dict(cache=True, fastmath=True, nogil=True)
# Kernels that split output rows over numba's thread pool.
JIT_PAR = dict(JIT, parallel=True)

# Output rows are interleaved in groups of LANES: one SIMD lane per row, so a 32-element
# block of all rows of a group is dotted with one activation block without horizontal sums.
LANES = 32
# Quantized activations and repacked weights use 32-element blocks for every type.
QB = 32


# -- a cache that follows the sources ----------------------------------------------------------
# numba checks a cached kernel only against its own source file, but a kernel's cached code
# also contains the kernels it calls from other files (block.py calls dots.py, moe.py calls
# block.py): after an edit or an upgrade that changes only a callee, the caller's stale code
# would run against new data layouts (seen: segfaults). So the kernels' cache carries a
# digest of every kernel source and of numba's version, and is emptied when it changes.

_STAMP = "archrun-kernels.stamp"


def _probe() -> None:
    """A function of this folder: numba's cache locator for it gives the kernels' cache folder."""


def _sources_digest(*folders: Path) -> str:
    import numba

    h = hashlib.sha256(numba.__version__.encode())
    for folder in folders:
        for src in sorted(folder.glob("*.py")):
            text = src.read_bytes()
            if b"@njit" in text or b"@intrinsic" in text:  # only files with kernels (editing warmup.py keeps the cache)
                h.update(src.name.encode() + b"\0" + text)
    return h.hexdigest()


def guard_cache(probe: object) -> None:
    """Empty the numba cache folder of `probe`'s module when any kernel source of its folder or of the
    core's kernels (or numba) changed since it was filled.

    Vocabulary plugins whose kernels call the core's (products, the layer kernel's steps) call
    this once at import with any plain function of theirs: their cached code embeds the core's.
    """
    try:
        from numba.core.caching import FunctionCache

        cache_dir = Path(FunctionCache(probe)._cache_path)
        digest = _sources_digest(Path(__file__).parent, Path(probe.__code__.co_filename).parent)
        stamp = cache_dir / _STAMP
        if stamp.exists() and stamp.read_text() == digest:
            return
        for f in [*cache_dir.glob("*.nbi"), *cache_dir.glob("*.nbc")]:
            f.unlink(missing_ok=True)
        stamp.write_text(digest)
    except (OSError, RuntimeError, ImportError, AttributeError):  # no usable cache folder (or another numba)
        return


def purge_stale_cache() -> None:
    """Empty the kernels' numba cache when any kernel source (or numba) changed since it was filled."""
    guard_cache(_probe)


purge_stale_cache()
