"""The numpy reference of gelu_quick: the definition the fast op and the kernel part are tested against."""

from __future__ import annotations

import numpy as np

ALPHA = 1.702  # QuickGELU: sigmoid(1.702 x) approximates the normal CDF Phi(x)


def gelu_quick():
    """Factory of slot "activation" (archrun.vocab): act(x[n, f], up[n, f] | None) -> float32 [n, f].

    gelu_quick(x) = x * sigmoid(1.702 x), computed in float64 (exp only of non-positive arguments:
    no overflow for any finite x); gated (up given): gelu_quick(x) * up.
    """

    def act(x: np.ndarray, up: np.ndarray | None = None) -> np.ndarray:
        g = np.asarray(x, dtype=np.float64)
        e = np.exp(-ALPHA * np.abs(g))
        y = (g * np.where(g >= 0, 1.0, e) / (1.0 + e)).astype(np.float32)
        return y if up is None else y * np.asarray(up, dtype=np.float32)

    return act
