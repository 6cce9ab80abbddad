"""The fast gelu_quick op: the kernel part over whole arrays, and the part itself for the fused path."""

from __future__ import annotations

import numpy as np

from archrun.kernels.decode.parts import part
from archrun_example_vocab import parts
from archrun_example_vocab.reference import ALPHA


def gelu_quick():
    """Factory of slot "activation", same contract as reference.gelu_quick; the bound op carries `fused`."""
    p = part(parts.gelu_quick, ALPHA)  # a Part: the numba function and its parameters (float64 [1])

    def act(x: np.ndarray, up: np.ndarray | None = None) -> np.ndarray:
        # the part's convention is 1-D float32: run it once over the flattened (C-contiguous) array
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.empty_like(x)
        p.fn(p.params, x.reshape(-1), out.reshape(-1))
        return out if up is None else out * np.asarray(up, dtype=np.float32)

    act.fused = p  # what archrun.kernels.decode.fusion looks for: with it, layers using this op decode fused
    return act
