"""The Decoder protocol: what generic layers (generate, chat, speculative, serve) may rely on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import attrs
import numpy as np

from archrun.descriptor import Descriptor


@attrs.frozen
class Caps:
    """What a decoder can do beyond forward_step."""

    rewind: bool = True          # cache.rewind(n) is supported (and O(1))
    batch: bool = False          # forward_step_batch exists (fused block style)
    host_step: bool = False      # host_step exists (host_reference block style)
    all_logits: bool = True      # forward_step(..., all_logits=True) returns [n, vocab]


@runtime_checkable
class Decoder(Protocol):
    """A runnable model. Generic layers accept any Decoder and never look inside it."""

    descriptor: Descriptor
    caps: Caps

    def init_cache(self, max_tokens: int): ...

    def forward_step(self, token_ids: Sequence[int] | np.ndarray, cache, all_logits: bool = False) -> np.ndarray:
        """Append token_ids to cache; return float32 logits of the last position ([vocab]) or all ([n, vocab])."""
        ...
