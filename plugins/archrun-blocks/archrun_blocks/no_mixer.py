"""The "no_mixer" token mixer: what stands in the mixer's place of a layer that has none.

A layer without a token mixer (archrun.describe.layers' `mixerless` property, e.g. Nemotron-H's MLP layers:
norm -> FFN -> residual) is a block whose mixer adds nothing: its output is zeros, it binds no
tensors and keeps no state, and it declares so (`empty`), which lets the block's FFN read the
normed input of its only norm (llama.cpp src/models/nemotron-h.cpp, HF NemotronHBlock).
"""

from __future__ import annotations

from typing import Any

import numpy as np


class NoMixerLayout:
    """Its geometry (archrun.vocab.MixerLayout): none."""

    def describe(self, ctx: Any) -> dict[str, Any]:
        return {"params": {}}


class EmptySlot:
    """A cache slot that holds nothing."""

    nbytes = 0
    state_bytes = 0


class NoMixer:
    """The bound mixer of a layer without one: mix(h [n, d], slot, start) -> zeros [n, d]."""

    def __init__(self, spec: Any):
        del spec

    def bind(self, binder: Any, layer: int) -> None:
        """No tensors of its own."""

    def new_slot(self, capacity: int, max_rewind: int = 0, **kv: Any) -> EmptySlot:
        return EmptySlot()

    def mix(self, h: np.ndarray, slot: EmptySlot, start: int) -> np.ndarray:
        return np.zeros_like(h)
