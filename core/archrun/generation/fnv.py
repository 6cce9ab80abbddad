"""FNV-1a (64-bit) hashes of logits' float32 bytes: what two runs compare to prove the same bits."""

from __future__ import annotations

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
