"""Gemma 3n's residual: LAuReL, a learned low-rank branch beside the attention.

HF Gemma3nTextDecoderLayer / Gemma3nTextLaurelBlock, llama.cpp gemma3n-iswa.cpp (`laurel`), per block on
its input x (the active AltUp stream), h = attn_norm(x), a = the post-normed attention output:

    laurel = h + laurel_post_norm(laurel_r(laurel_l(h)))        rank `laurel_l`'s width
    g      = (x + a + laurel) / sqrt(2)                          what the FFN's pre-norm reads
    out    = g + f                                               f = the post-normed FFN output

The branch reads the block's normed input, which the residual's contract does not pass: the op binds
the block's `attn_norm` and norms x itself (one RMS norm of [n, d] more per block).
"""

from __future__ import annotations

import math
import threading

import numpy as np

F32 = np.float32
INV_SQRT2 = F32(1.0 / math.sqrt(2.0))


class Laurel:
    """ffn_input(x, a) = (x + s a + laurel(x)) / sqrt(2); combine(x, a, f) = that + s f (module docstring)."""

    def __init__(self, scale: float = 1.0):
        self.scale = F32(scale)
        self._last = threading.local()  # (x, a, g) of this thread's latest ffn_input: combine reuses g

    def bind(self, b, layer: int) -> None:
        """The block's attn_norm and its LAuReL tensors (laurel_l, laurel_r, laurel_post_norm)."""
        self.norm = b.op("norm", b.d.norm, b.d.norm_eps)
        self.attn_norm = b.norm_weight("attn_norm", layer)
        self.left, self.right = b.matrix("laurel_l", layer), b.matrix("laurel_r", layer)
        self.post_norm = b.vector("laurel_post_norm", layer)

    def branch(self, x: np.ndarray) -> np.ndarray:
        """laurel(x) [n, d]: the normed input plus its normed low-rank image."""
        h = self.norm(x, self.attn_norm)
        return h + self.norm(self.right(self.left(h)), self.post_norm)

    def ffn_input(self, x: np.ndarray, a: np.ndarray) -> np.ndarray:
        g = ((x + self.scale * a + self.branch(x)) * INV_SQRT2).astype(F32)
        self._last.value = (x, a, g)
        return g

    def combine(self, x: np.ndarray, a: np.ndarray, f: np.ndarray) -> np.ndarray:
        last = getattr(self._last, "value", None)
        g = last[2] if last is not None and last[0] is x and last[1] is a else self.ffn_input(x, a)
        self._last.value = None
        return g + self.scale * f
