"""BLAS on archrun's own threads: the prefill products that still call BLAS (float32 tiles of the
types without a GEMM, e.g. Q2_K) run it single-threaded, their tiles split over archrun's threads.

OpenBLAS's worker threads spin for a while after every call (2^28 cycles by default, ~0.1 s) before
they sleep. Between two BLAS calls of a prefill run the kernels' own threads (numba's), so the two
pools shared two cores: measured on a 2-core AMD Zen 3 (AVX2), Gemma 3 270M prefilled 128 tokens at
157 tok/s on two threads against 340 tok/s per CPU-second on one, while one Q8_0 product a layer went
through BLAS. Inside `split` BLAS runs on one thread (threadpoolctl sets the loaded BLAS libraries'
count and restores it after), and the product's tiles are divided among archrun's threads: no
thread outlives the call. (Float32 weights keep one BLAS call with BLAS's own threads: a split of
their output rows changed the bits the conformance kit's records pin, as a BLAS result may depend
on the shape it is called with.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

_state: dict = {}


def _controller():
    """threadpoolctl's view of the BLAS libraries loaded now (numpy's), made once."""
    if "controller" not in _state:
        try:
            import threadpoolctl

            _state["controller"] = threadpoolctl.ThreadpoolController()
        except ImportError:  # without threadpoolctl, BLAS keeps its own threads
            _state["controller"] = None
    return _state["controller"]


@contextlib.contextmanager
def one_thread():
    """BLAS calls in this block run on the calling thread alone."""
    ctl = _controller()
    if ctl is None:
        yield
        return
    with ctl.limit(limits=1, user_api="blas"):
        yield


def _pool(workers: int) -> ThreadPoolExecutor:
    pool = _state.get("pool")
    if pool is None or pool._max_workers < workers:
        if pool is not None:
            pool.shutdown(wait=False)
        pool = _state["pool"] = ThreadPoolExecutor(workers, thread_name_prefix="archrun-blas")
    return pool


def split(n_units: int, threads: int, part: Callable[[int, int], None]) -> None:
    """part(u0, u1) for contiguous ranges covering 0..n_units, on `threads` threads (the caller's and
    threads - 1 pool threads), BLAS single-threaded in each. `part` must release the GIL for the ranges
    to overlap (numpy's BLAS calls and archrun's kernels do) and write disjoint outputs."""
    threads = max(1, min(threads, n_units))
    bounds = [n_units * i // threads for i in range(threads + 1)]
    with one_thread():
        if threads == 1:
            part(0, n_units)
            return
        futures = [_pool(threads - 1).submit(part, bounds[i], bounds[i + 1]) for i in range(1, threads)]
        part(bounds[0], bounds[1])
        for f in futures:
            f.result()


__all__ = ["one_thread", "split"]
