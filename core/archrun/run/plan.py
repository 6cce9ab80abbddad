"""A bound model: the ops and weights the per-token path calls, resolved once (archrun.run.bind builds it).

Shapes: n tokens, d model width.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import numpy as np

from archrun.descriptor import Descriptor, LayerSpec
from archrun.io.weights import Matrix, MoeWeights


class Projections:
    """Bound products sharing one input: x[n, d] -> [x @ W_r.T (+ b_r) for each role r].

    matrices: one Matrix per role, or a single stacked Matrix whose output columns `spans`
    (one (start, end) per role) split back into the roles.
    """

    def __init__(self, matrices: list[Matrix], spans: list[tuple[int, int]] | None = None):
        self.matrices = matrices
        self.spans = spans

    def __call__(self, x: np.ndarray) -> list[np.ndarray]:
        if self.spans is None:
            return [m(x) for m in self.matrices]
        y = self.matrices[0](x)
        return [y[:, a:b] for a, b in self.spans]


class DenseFfn:
    """A bound dense FFN: x[n, d] -> down(act(gate x) * up x) [n, d], or down(act(up x)) when not gated.

    gate_up yields [gate, up] for a gated FFN and [up] for a plain one.
    """

    def __init__(self, act: Callable[..., np.ndarray], gate_up: Projections, down: Matrix, gated: bool,
                 sub_norm: Callable[[np.ndarray], np.ndarray] | None = None):
        self.act, self.gate_up, self.down, self.gated = act, gate_up, down, gated
        # a norm of the hidden before the down projection (BitNet), or None; the binder's keeps its norm op and
        # weight as sub_norm.op and sub_norm.weight (the fused layer kernel computes it with them)
        self.sub_norm = sub_norm

    def __call__(self, x: np.ndarray, ids: np.ndarray | None = None) -> np.ndarray:
        """ids: the rows' token ids, which a dense FFN does not read (the call is the same as a mixture's)."""
        h = self.act(*self.gate_up(x))
        return self.down(h if self.sub_norm is None else self.sub_norm(h))


class MoeFfn:
    """A bound mixture-of-experts FFN: x[n, d] -> moe(x, weights) [n, d]; an op that declares `token_ids`
    (archrun.contracts) is called moe(x, weights, ids) with the rows' token ids ids int64 [n]."""

    def __init__(self, moe: Callable[..., np.ndarray], weights: MoeWeights, token_ids: bool = False):
        self.moe, self.weights, self.token_ids = moe, weights, token_ids

    def __call__(self, x: np.ndarray, ids: np.ndarray | None = None) -> np.ndarray:
        if not self.token_ids:
            return self.moe(x, self.weights)
        if ids is None or len(ids) != len(x):
            from archrun.errors import InvalidRequest

            got = "none" if ids is None else len(ids)
            raise InvalidRequest("this mixture of experts routes by token id: run it through a model step, which "
                                 f"gives each of its {len(x)} rows' token id (got {got})")
        return self.moe(x, self.weights, np.asarray(ids, np.int64))


@attrs.define
class LayerPlan:
    """Bound ops and weights of one block."""

    spec: LayerSpec
    attn_norm: np.ndarray | None       # None: the block has no pre-norms
    qkv: Projections | Callable | None  # h[n, d] -> [q, k, v] (one stacked product when the types allow;
    o: Matrix | Callable | None        #   an attention op's own layout binds both: archrun.vocab.AttentionLayout)
    attention: Any                     # bound attention op (makes this layer's cache slot)
    residual: Any                      # bound residual op: ffn_input(x, a), combine(x, a, f)
    ffn_norm: np.ndarray | None        # None: the FFN reads the attention's normed input
    ffn: DenseFfn | MoeFfn | None      # None: the block has no FFN (MoeFfn.token_ids: it reads the rows' ids)
    attn_norm_b: np.ndarray | None = None
    ffn_norm_b: np.ndarray | None = None
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None
    post_attn_norm: np.ndarray | None = None
    post_ffn_norm: np.ndarray | None = None
    ffn_applies_norm: bool = False     # the FFN op applies ffn_norm itself (a mixture op's own_ffn_norm)
    attn_sub_norm: np.ndarray | None = None  # a norm of the attention output before its projection
    mixer: Callable | None = None      # a token-mixer op (qkv and o None): mix(h[n, d], slot, start) -> [n, d]
    parallel: Any = None               # a token-mixer op beside the attention (its slot: PairSlot.mixer)


@attrs.define
class Plan:
    """Everything the per-token path calls, resolved once."""

    descriptor: Descriptor
    embed: Matrix | None                # None: a pipeline stage that neither starts the model nor has a tied head
    output: Matrix | None               # None: a pipeline stage that does not end the model
    output_norm: np.ndarray | None     # None: the trunk ends without a final norm (post-norm encoders)
    output_norm_b: np.ndarray | None
    norm: Callable[..., np.ndarray]    # norm(x, w, b=None)
    ropes: list[Any]                   # one bound rope op per descriptor rope table (None: no rope)
    layers: list[LayerPlan]
    softcap: Callable[[np.ndarray], np.ndarray] | None
    providers: dict[str, str]          # "slot=name" -> plugin that provides it
    binder: Any                        # archrun.run.bind's binder: binds further blocks on request
    positions: np.ndarray | None = None  # learned absolute position table f32 [n_positions, d], or None
    embed_norm: np.ndarray | None = None  # a norm over the embeddings (weight [d], bias [d] or None)
    embed_norm_b: np.ndarray | None = None
    token_type: np.ndarray | None = None  # f32 [d] added to every token's embedding (BERT's segment 0 row)
    # a pipeline stage's blocks (start, end), None for the whole model: a stage that does not start the
    # model has no embeddings (it takes hidden states), one that does not end it no output head
    span: tuple[int, int] | None = None
    # False (archrun.load(fused=False)): one-token steps and batches run every layer op by op, even where
    # the ops declare kernel parts
    fused: bool = True
    pager: Any = None  # archrun.io.experts.ExpertPager when MoE experts are streamed from disk, else None
    final_norm_op: Callable[..., np.ndarray] | None = None  # the final norm's op when it is not `norm`
    # the op carrying the residual stream through the blocks (Descriptor.stream), None: one stream
    stream: Any = None
