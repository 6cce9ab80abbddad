"""What a run computed, as digests two users can compare (docs/determinism.md).

- `fnv1a64(logits)`: the FNV-1a (64-bit) hash of one step's float32 logits, as 16 hex digits. The
  logits' bits depend only on the model file and the token ids on one machine class, so two runs that
  report the same hashes computed the same thing (`archrun run --hash`, `generate(..., logit_hashes=True)`,
  the server's `archrun.logit_hashes` request option).
- `system_fingerprint(model)`: OpenAI's `system_fingerprint` of a response: a digest of the
  descriptor, the weights file's SHA-256, the kernel sources this process compiled or loaded, the
  machine class (CPU features, numba/llvmlite/numpy/BLAS versions: what the bits depend on) and the
  backend. Equal fingerprints and equal requests give equal answers.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import numpy as np

_FNV_OFFSET, _FNV_PRIME = np.uint64(0xCBF29CE484222325), np.uint64(0x100000001B3)


def fnv1a64_rows(logits: np.ndarray) -> list[str]:
    """FNV-1a (64-bit) of each row's float32 little-endian bytes, as 16 hex digits."""
    rows = np.ascontiguousarray(np.atleast_2d(logits), dtype="<f4")
    data = rows.view(np.uint8).reshape(len(rows), -1)
    h = np.full(len(rows), _FNV_OFFSET, np.uint64)
    with np.errstate(over="ignore"):
        for j in range(data.shape[1]):  # one byte of every row at a time
            h = (h ^ data[:, j].astype(np.uint64)) * _FNV_PRIME
    return [f"{int(v):016x}" for v in h]


def fnv1a64(logits: np.ndarray) -> str:
    """FNV-1a (64-bit) of one step's logits [vocab] (float32 little-endian bytes), as 16 hex digits."""
    return fnv1a64_rows(np.asarray(logits).reshape(1, -1))[0]


_FILE_DIGESTS: dict[tuple, str] = {}   # (real path, size, mtime) -> SHA-256: each weights file is read once
_FINGERPRINTS: dict[tuple, str] = {}   # (model key, backend) -> fingerprint


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file, read once per (path, size, modification time) in this process."""
    st = os.stat(path)
    key = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
    if key not in _FILE_DIGESTS:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
        _FILE_DIGESTS[key] = h.hexdigest()
    return _FILE_DIGESTS[key]


def kernel_sources() -> str:
    """A digest of the kernel sources this process registered (the core's and each plugin kernel folder's)."""
    from archrun.kernels import _jit

    digests = sorted(f"{os.path.basename(folder)}:{src.digest}" for folder, src in _jit._REGISTERED.items())
    return hashlib.sha256("\n".join(digests).encode()).hexdigest()


def system_fingerprint(model: Any) -> str:
    """'fp_' and 16 hex digits naming what `model` computes with (module docstring); computed once per
    model file and backend (the weights file is read whole the first time)."""
    from archrun.conformance import bithash

    key = (model.cache_owner.key, model.backend)
    if key not in _FINGERPRINTS:
        parts = [repr(model.descriptor), file_sha256(model.gguf.path), kernel_sources(),
                 bithash.class_id(bithash.machine_class()), model.backend]
        _FINGERPRINTS[key] = "fp_" + hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    return _FINGERPRINTS[key]
