"""What a benchmark ran on: the CPU's model name and the SIMD flags archrun's kernels dispatch on.

Every benchmark prints `describe()` beside its figures (the kernels choose AVX2, AVX-512 VNNI or the
portable loops from these flags, and llama.cpp's reference build does the same), and puts `machine()`
in its JSON.
"""

from __future__ import annotations

import os
from pathlib import Path

# the flags the kernels (and llama.cpp's native build) dispatch on; amx_tile is listed because the
# llama.cpp references are built without it (its tile code faults in the VMs measured here)
WANTED = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni", "avx512_bf16",
          "amx_tile")


def _cpuinfo_field(name: str) -> str | None:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return None
    return next((ln.split(":", 1)[1].strip() for ln in lines if ln.split(":", 1)[0].strip() == name), None)


def cpu_flags() -> str:
    """The WANTED flags this CPU reports, space-separated ("unknown" without /proc/cpuinfo)."""
    flags = _cpuinfo_field("flags")
    if flags is None:
        return "unknown"
    have = set(flags.split())
    return " ".join(f for f in WANTED if f in have)


def machine() -> dict[str, object]:
    """{cpu, cores, flags} for a benchmark's JSON."""
    return {"cpu": _cpuinfo_field("model name") or "unknown", "cores": os.cpu_count(), "flags": cpu_flags()}


def describe() -> str:
    """One line: CPU model, cores and flags."""
    m = machine()
    return f"CPU {m['cpu']}, {m['cores']} cores; flags: {m['flags']}"
