"""What a run computed, as digests two users can compare (docs/determinism.md).

- `fnv1a64(logits)`: the FNV-1a (64-bit) hash of one step's float32 logits, as 16 hex digits. The
  logits' bits depend only on the model file and the token ids on one machine class, so two runs that
  report the same hashes computed the same thing (`archrun run --hash`, `generate(..., logit_hashes=True)`,
  the server's `logit_hashes` request field).
- `system_fingerprint(model)`: OpenAI's `system_fingerprint` of a response: a digest of the
  descriptor, the weights file's SHA-256, the kernel sources this process compiled or loaded, the
  machine class (CPU features, numba/llvmlite/numpy/BLAS versions: what the bits depend on) and the
  backend. Equal fingerprints and equal requests give equal answers.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from archrun.generation.fnv import fnv1a64, fnv1a64_rows

__all__ = ["file_sha256", "fnv1a64", "fnv1a64_rows", "kernel_sources", "system_fingerprint"]

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

    # any Decoder: archrun's models name their file and backend; another Decoder is named by its descriptor
    owner, path = getattr(model, "cache_owner", None), getattr(getattr(model, "gguf", None), "path", None)
    backend = str(getattr(model, "backend", ""))
    key = (owner.key if owner is not None else repr(model.descriptor), backend)
    if key not in _FINGERPRINTS:
        parts = [repr(model.descriptor), file_sha256(path) if path is not None else "", kernel_sources(),
                 bithash.class_id(bithash.machine_class()), backend]
        _FINGERPRINTS[key] = "fp_" + hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    return _FINGERPRINTS[key]
