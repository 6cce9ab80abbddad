"""Memory budgets of `archrun serve`: bytes reserved against a bound before they are allocated.

`--max-memory` bounds the loaded models' weights and KV caches together (archrun.serve.models),
`--max-kv` each model's KV caches. An engine reserves a slot's cache before making it
(archrun.serve.engine); a request whose own cache could never fit is refused with
KvCacheTooLarge (HTTP 400), one that does not fit now with MemoryBudgetExceeded (HTTP 503).
"""

from __future__ import annotations

import math
import re
import threading

from archrun.errors import ArchrunError, InvalidRequest

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12,
          "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


class MemoryBudgetExceeded(ArchrunError):
    """Serving the request would take memory past the server's budget (HTTP 503); the server goes on."""

    http_status, http_kind = 503, "server_error"


class KvCacheTooLarge(InvalidRequest):
    """The request's own KV cache can never fit the server's memory budget (HTTP 400)."""


def parse_bytes(value: str | int) -> int:
    """A byte count: an integer, or a number with a unit ("2GB", "512MiB", "1.5G"; K/M/G/T are powers of
    1000, KiB/MiB/GiB/TiB of 1024)."""
    if isinstance(value, int) and not isinstance(value, bool):
        number, unit = float(value), ""
    else:
        match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([A-Za-z]*)\s*", str(value))
        if match is None or match.group(2).lower() not in _UNITS:
            raise InvalidRequest(f"a memory size is a number of bytes with an optional unit (e.g. 2GB, 512MiB), "
                                 f"got {str(value)[:40]!r}")
        number, unit = float(match.group(1)), match.group(2).lower()
    size = number * _UNITS[unit]
    if not math.isfinite(size) or size < 1:
        raise InvalidRequest(f"a memory size must be at least 1 byte, got {value!r}")
    return int(size)


def size_text(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


class MemoryBudget:
    """Bytes reserved against a bound (None: no bound), from any thread."""

    def __init__(self, limit: int | None, name: str = "--max-memory"):
        self.limit, self.name = limit, name
        self.used = 0
        self._lock = threading.Lock()

    def try_reserve(self, n: int) -> bool:
        """Reserve n bytes if they fit; whether they did."""
        with self._lock:
            if self.limit is not None and self.used + n > self.limit:
                return False
            self.used += n
            return True

    def free(self, n: int) -> None:
        with self._lock:
            self.used = max(0, self.used - n)

    def describe(self) -> str:
        return f"{size_text(self.used)} of the {size_text(self.limit or 0)} of {self.name} are in use"


def weights_bytes(model: object) -> int:
    """Bytes of the file(s) a model's weights come from (0 when it does not say)."""
    import os

    paths = getattr(getattr(model, "gguf", None), "paths", None) or ()
    return sum(os.path.getsize(p) for p in paths)
