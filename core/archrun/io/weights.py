"""Weights bound to the plan: quantized matrices with a matmul, expert stacks, small vectors.

The reference backend dequantizes a matrix to float32 once, on first use (the auditable
path; memory = 4 bytes per weight). The fast backend hands the GGUF blocks to
archrun.kernels, which multiply without materialising float32 weights.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np

from archrun.errors import ShapeMismatch
from archrun.io import quant


class Matrix:
    """A weight of torch shape (n_out, n_in) kept in its GGUF encoding.

    `m(x)` computes x[n, n_in] @ W.T -> [n, n_out] (+ bias); `m.rows(ids)` dequantizes
    selected rows (embedding lookup).
    """

    def __init__(self, raw_rows: np.ndarray | Sequence[np.ndarray], ggml_type: int, n_in: int, backend: str,
                 bias: np.ndarray | None = None, name: str = "", lazy: bool = False):
        # uint8 [n_out, row_bytes], usually a view of the file mapping; or a sequence of such
        # blocks stacked along the rows (e.g. q, k, v), joined only while a joined copy is
        # needed, so a stacked matrix keeps no private copy of its GGUF bytes (Qwen2.5-0.5B: 145 MB)
        self._parts = (raw_rows,) if isinstance(raw_rows, np.ndarray) else tuple(raw_rows)
        self.ggml_type = ggml_type
        self.n_in = n_in
        self.n_out = sum(p.shape[0] for p in self._parts)
        self.bias = bias
        self.name = name
        self._dense: np.ndarray | None = None
        # (page table, row) of the mapped range a kernel may ask the OS to read ahead (archrun.kernels.pages;
        # experts streamed from disk), else None
        self.pages: tuple[np.ndarray, int] | None = None
        self._fast = backend == "fast"
        # lazy: kernel-ready copy made on the first product (a token embedding that is only
        # looked up row by row never needs one)
        self._q = _prepare_fast(self._parts, ggml_type, n_in) if self._fast and not lazy else None

    @property
    def raw_rows(self) -> np.ndarray:
        """uint8 [n_out, row_bytes]: the GGUF rows (a new joined array when stacked from parts)."""
        return self._parts[0] if len(self._parts) == 1 else np.concatenate(self._parts)

    @property
    def prepared(self):
        """The kernel-ready archrun.kernels.QMatrix (fast backend, after preparation), else None."""
        return self._q

    @property
    def dense(self) -> np.ndarray:
        """float32 [n_out, n_in], dequantized on first use and kept."""
        if self._dense is None:
            self._dense = quant.dequantize(self.raw_rows, self.ggml_type, (self.n_out, self.n_in))
        return self._dense

    def prepare_copy(self):
        """A new kernel-ready copy of this matrix (archrun.kernels.QMatrix), or None without fast kernels for
        its type; the matrix does not keep it (see use_prepared)."""
        return _prepare_fast(self._parts, self.ggml_type, self.n_in) if self._fast else None

    def use_prepared(self, q, pages: tuple[np.ndarray, int] | None = None) -> None:
        """Multiply with `q`, a kernel-ready copy of this matrix held elsewhere (e.g. mapped from an expert store:
        archrun.io.experts); pages: (page table, row) of q's mapped range (archrun.kernels.pages), or None."""
        self._q = q
        self.pages = pages

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if x.ndim != 2 or x.shape[1] != self.n_in:
            raise ShapeMismatch(f"{self.name}: input {x.shape} does not match n_in={self.n_in}")
        if self._fast and self._q is None:
            self._q = _prepare_fast(self._parts, self.ggml_type, self.n_in)
            self._fast = self._q is not None
        if self._q is not None:
            from archrun import kernels

            y = kernels.matmul(self._q, np.ascontiguousarray(x, dtype=np.float32))
        else:
            y = x @ self.dense.T
        if self.bias is not None:
            y += self.bias
        return y

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """float32 [len(ids), n_in]: the selected rows, dequantized exactly."""
        if self._dense is not None:
            return self._dense[ids]
        if self._fast and self.ggml_type != quant.MXFP4:
            from archrun import kernels

            return kernels.embedding_rows(self.raw_rows, self.ggml_type, self.n_in, ids)
        sel = np.ascontiguousarray(self.raw_rows[ids])
        return quant.dequantize(sel, self.ggml_type, (len(ids), self.n_in))


def _prepare_fast(parts: tuple[np.ndarray, ...], ggml_type: int, n_in: int):
    """Prepare a kernel-ready matrix from row blocks, or None when no fast kernel exists for this type.

    Stacked parts are joined into a temporary; their file pages are released afterwards (a
    single view of the file has its pages released by the repack itself).
    """
    try:
        from archrun import kernels
    except ImportError:
        return None
    if ggml_type == quant.MXFP4:  # exactly as BF16 (float32 activations): the same values, 3.8x MXFP4's bytes
        parts, ggml_type = tuple(quant.mxfp4_as_bf16(p) for p in parts), quant.BF16
    if ggml_type not in getattr(kernels, "SUPPORTED_TYPES", ()):
        return None
    if len(parts) == 1:
        return kernels.prepare(parts[0], ggml_type, n_in)
    from archrun.io.ggufio import release_view

    q = kernels.prepare(np.concatenate(parts), ggml_type, n_in)
    for p in parts:
        release_view(p)
    return q


@attrs.frozen
class MoeWeights:
    """Weights of one MoE FFN: router, per-expert gated FFNs, optional shared expert."""

    gate_inp: Matrix                      # [E, d]
    probs_bias: np.ndarray | None         # exp_probs_b [E], selection only
    gate: Sequence[Matrix]                # E matrices [f, d]
    up: Sequence[Matrix]                  # E matrices [f, d]
    down: Sequence[Matrix]                # E matrices [d, f]
    shared: tuple[Matrix, Matrix, Matrix] | None = None  # (gate, up, down) of the shared experts
    shared_gate: np.ndarray | None = None  # [d]: the shared experts' output times sigmoid(x . shared_gate)
