"""What generic layers (generate, chat, speculative, serve) and trunk heads may rely on.

`Decoder` is the contract between a runnable model and the generic layers: they accept any
object that satisfies it and never look inside. `Cache` is the per-sequence state a Decoder
makes. `Trunk` is what a head that hangs off a model's trunk (e.g. a multi-token-prediction
draft head) may use: the model's own bound ops and weights, never its internals.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import attrs
import numpy as np

from archrun.descriptor import Descriptor, LayerSpec


@attrs.frozen
class Caps:
    """What a decoder can do beyond forward_step (a block style declares its caps)."""

    rewind: bool = True          # cache.rewind(n) is supported up to cache.max_rewind (and to its restore points)
    batch: bool = False          # forward_step_batch(batch, caches) exists (fused block style)
    host_step: bool = False      # host_step(ids, cache, mtp_cache=None) exists (host_reference block style)
    all_logits: bool = True      # forward_step(..., all_logits=True) returns [n, vocab]
    workers: bool = False        # rest_workers() sends the decoder's spinning worker threads to sleep now


@runtime_checkable
class Cache(Protocol):
    """Per-sequence state of a Decoder (archrun.run.cache.KvCache is one).

    A cache whose state cannot be truncated (recurrent layers) also offers `restore_point(length)`
    (the longest length <= length it can return to exactly) and `checkpoint()` (keep the current
    state as one); generic layers ask `archrun.run.cache.restore_point(cache, length)`, which falls
    back to `max_rewind` for caches without them.
    """

    capacity: int

    def __len__(self) -> int:
        """Tokens held."""
        ...

    @property
    def max_rewind(self) -> int:
        """How many of the last tokens `rewind` can forget exactly."""
        ...

    def rewind(self, n: int) -> None:
        """Forget the last n tokens (n <= max_rewind)."""
        ...

    def clear(self) -> None:
        """Forget everything."""
        ...


@runtime_checkable
class Decoder(Protocol):
    """A runnable model. Generic layers accept any Decoder and never look inside it.

    Optional entries are present exactly when `caps` says so (batch: forward_step_batch;
    host_step: host_step).
    """

    descriptor: Descriptor
    caps: Caps

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer (archrun.text.tokenizer.Tokenizer: encode, decode, special tokens)."""
        ...

    @property
    def chat_template(self) -> str | None:
        """The chat template to render conversations with: the file's, else its family's default."""
        ...

    def init_cache(self, max_tokens: int | None = None, max_rewind: int = 64, kv_type: str = "f32") -> Cache:
        """A new, empty cache for up to max_tokens tokens (default: the context length).

        kv_type: how K/V rows are stored ("f32", "f16", "q8_0"); a type some layer's op cannot
        store raises archrun.errors.KvTypeUnsupported.
        """
        ...

    def forward_step(self, token_ids: Sequence[int] | np.ndarray, cache: Any, all_logits: bool = False) -> np.ndarray:
        """Append token_ids to cache; return float32 logits of the last position ([vocab]) or all ([n, vocab])."""
        ...


@runtime_checkable
class Trunk(Protocol):
    """What a head hanging off a model's trunk (e.g. an MTP draft head) may use.

    Shapes: n tokens, d model width. Everything is the model's own, bound once at load.
    """

    descriptor: Descriptor
    caps: Caps

    def forward_step_hidden(self, token_ids: Sequence[int] | np.ndarray, cache: Any) -> Any:
        """Append token_ids; HostStep(logits [n, vocab], hidden [n, d] after the trunk's output norm)."""
        ...

    def has_tensor(self, role: str, layer: int | None = None) -> bool:
        """Whether the file holds the tensor of `role` (in block `layer`)."""
        ...

    def bind_matrix(self, role: str, layer: int | None = None) -> Any:
        """The product of the tensor of `role`: a callable x[n, n_in] -> [n, n_out] (archrun.io.weights.Matrix)."""
        ...

    def bind_vector(self, role: str, layer: int | None = None) -> np.ndarray:
        """The tensor of `role` as float32."""
        ...

    def bind_block(self, index: int, spec: LayerSpec) -> Any:
        """Block `index` of the file (e.g. an MTP block after the trunk) bound with the model's ops."""
        ...

    def norm(self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        """The model's norm op over the last axis."""
        ...

    @property
    def output_norm(self) -> np.ndarray:
        """The trunk's final norm weight [d]."""
        ...

    def embed(self, ids: np.ndarray, start: int | None = None) -> np.ndarray:
        """Token embeddings [n, d] (scaled as the model scales them; plus learned position rows
        start..start+n-1 when the model has a position table)."""
        ...

    def rope_angles(self, positions: np.ndarray) -> list:
        """Per rope table, (cos, sin) at these positions (None for tables without rope)."""
        ...

    def run_block(self, block: Any, x: np.ndarray, slot: Any, start: int, angles: list, sub: str | None = None,
                  ids: np.ndarray | None = None) -> np.ndarray:
        """A bound block on x [n, d] at positions start.., with its K/V in `slot` (made by block.attention); sub
        "attention" / "ffn": that branch only (archrun.run.interpreter.StreamBlock); ids: the rows' token ids,
        which a mixture that routes by token id needs (MoeFfn.token_ids)."""
        ...

    def head(self, hidden: np.ndarray) -> np.ndarray:
        """The output head on normed hidden states [n, d] -> logits [n, vocab]."""
        ...
