"""A loopback Ray cluster for the Ray tests, bounded in time and always torn down."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def loopback_cluster(deadline_s: int, what: str) -> Iterator[Any]:
    """Join a fresh 2-CPU Ray cluster on 127.0.0.1 for the block (yields the `ray` module). Past deadline_s the
    block fails with TimeoutError naming `what` (SIGALRM); the cluster is shut down however the block ends, and
    one another test left joined in this process is shut down first."""
    import ray

    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"{what} took longer than {deadline_s} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(deadline_s)
    try:
        if ray.is_initialized():
            ray.shutdown()
        ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
                 configure_logging=False)
        yield ray
    finally:
        ray.shutdown()
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
