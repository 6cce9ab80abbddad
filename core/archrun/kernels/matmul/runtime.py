"""Thread-runtime settings for the parallel kernels, applied once before the first parallel call.

Threading layer. A decode step runs ~100 parallel regions (four per layer). With numba's
OpenMP layer every region waits at its join for every worker; on a host where another process
holds a core, a descheduled worker stalls each region for a scheduler slice (measured,
SmolLM2 with 2 threads beside one busy process: 6 tok/s with OpenMP, 44 with TBB, whose
work-stealing lets the running thread take the stalled thread's share). archrun therefore
prefers numba's TBB layer: the `tbb` package is a dependency on x86-64 Linux, and since a pip
venv does not put its lib/ on the loader path, its libtbb is preloaded here so numba's
tbbpool module can load. Users who set NUMBA_THREADING_LAYER keep their choice.

OpenMP fallback. libgomp spin-waits ~300k iterations between parallel regions by default,
which on a busy host costs milliseconds per region (measured: Qwen2.5-0.5B decode 78 -> 1094
ms/token with 2 threads); a short spin keeps the wake-up cheap on an idle machine and yields
quickly on a busy one. libgomp reads the variable when its pool starts; users who set
GOMP_SPINCOUNT or OMP_WAIT_POLICY keep their values.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys

SPINCOUNT = "20000"
_done = [False]


def configure() -> None:
    """Apply the defaults once (idempotent); called before the kernels' first parallel call."""
    if _done[0]:
        return
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ.setdefault("GOMP_SPINCOUNT", SPINCOUNT)
    if "NUMBA_THREADING_LAYER" not in os.environ:
        _preload_tbb()
    _done[0] = True


def _preload_tbb() -> None:
    """Load the venv's libtbb (if installed) globally, so numba's default layer order picks TBB."""
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix)):
        path = os.path.join(prefix, "lib", "libtbb.so.12")
        if os.path.exists(path):
            with contextlib.suppress(OSError):  # unloadable: numba falls back to OpenMP
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            return
