"""Thread-runtime settings for the parallel kernels, applied once before the first parallel call.

numba's OpenMP layer (GNU libgomp) spin-waits ~300k iterations between parallel regions by
default. On a host where another process holds a core, every parallel matmul then costs
milliseconds (measured: Qwen2.5-0.5B decode 78 -> 1094 ms/token with 2 threads). A short spin
keeps the wake-up cheap on an idle machine and yields quickly on a busy one. libgomp reads the
variable when its thread pool starts, so this must run before the first parallel kernel; users
who set GOMP_SPINCOUNT or OMP_WAIT_POLICY themselves keep their values.
"""

from __future__ import annotations

import os

SPINCOUNT = "20000"
_done = [False]


def configure() -> None:
    """Apply the defaults once (idempotent); called by archrun.load and kernels.set_threads."""
    if _done[0]:
        return
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ.setdefault("GOMP_SPINCOUNT", SPINCOUNT)
    _done[0] = True
