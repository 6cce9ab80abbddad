"""Gemma 3n's attention projections: Gemma 4's layout (archrun_gemma4_ops.layout) with one head width.

llama.cpp src/models/gemma3n-iswa.cpp, HF Gemma3nTextAttention: q/k RMS norms, an unweighted RMS norm on
V, unscaled scores, and the last `attention.shared_kv_layers` layers reusing the keys and values of the
last earlier layer of their kind (sliding or full) — as Gemma 4. Both layer kinds have the width
`attention.key_length` (the file has no `_swa` widths); the per-layer inputs are Gemma 3n's stream op's
(archrun_gemma3n_ops.altup).
"""

from __future__ import annotations

from typing import Any

from archrun_gemma4_ops.layout import Gemma4Layout


class Gemma3nLayout(Gemma4Layout):
    """Gemma4Layout with `attention.key_length` / `value_length` on every layer."""

    kind = "gemma3n"

    def widths(self, meta: Any, sliding: bool) -> tuple[int, int, str]:
        hd = meta.get("attention.key_length", int)
        return hd, meta.get("attention.value_length", int, hd), ""
