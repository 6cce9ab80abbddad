"""A mixer whose layer decodes fused (archrun.kernels.decode.fusion.MixerBlock, and BesideBlock where it runs
beside the attention): its `slot_arrays`, `fused_layer` and `fused_beside` members (FusedMixer), and what its
layer kernel takes of its matrices (product groups of up to 3 matrices, their decode pool ids) and of the
layer's mixture of experts when it has one (archrun-blocks' `ffn_args`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def product_groups(mats: Sequence[Any], group_id: Callable | None) -> tuple[list[tuple], np.ndarray, bool] | None:
    """(a product group of 3 uniform matrices per item of `mats`, their pool group ids int64 (-1: none), whether a
    matrix is big enough to split over threads), or None when a matrix is not prepared for the fast kernels. An
    item is a matrix (a group of one) or a tuple of up to 3 matrices of one input width (one group: their
    outputs one after another; an empty tuple: a group of absent matrices, which the kernel does not run).
    group_id(ms, n_in) -> id, when given, registers each group (but an empty one) with the decode pool."""
    from archrun.kernels.decode.block import absent_matrix, uniform
    from archrun.kernels.matmul.qmatrix import PARALLEL_MIN_BYTES

    items = [tuple(m) if isinstance(m, tuple) else (m,) for m in mats]
    flat = [m for item in items for m in item]
    if any(m is None or m.prepared is None for m in flat):
        return None
    if any(len(item) > 3 or len({m.n_in for m in item}) > 1 for item in items):
        raise ValueError("a product group takes at most 3 matrices of one input width")
    groups = [tuple(uniform(m.prepared, m.bias) for m in item) + (absent_matrix(),) * (3 - len(item))
              for item in items]
    gids = np.full(len(items), -1, np.int64)
    if group_id is not None:
        gids[:] = [group_id(g, item[0].n_in) if item else -1 for g, item in zip(groups, items, strict=True)]
    return groups, gids, max(m.prepared.nbytes for m in flat) >= PARALLEL_MIN_BYTES


def moe_arguments(moe: Any, group_id: Callable | None) -> tuple[Any, bool] | None:
    """(the layer kernel's `moe` argument, whether the mixture's experts are big enough to split over threads):
    (None, False) for a dense FFN or none (moe None), else (a one-item numba typed list of the tuple of
    archrun-blocks' moe_rows arguments of the layer's mixture of experts (moe: its bound MoeFfn), ...), or None
    when its op has none (`ffn_args`). A typed list, not the tuple: numba types a typed list argument at once,
    but a tuple holding typed lists (the experts' products, the parts' handles) anew on every call, which costs
    more than the layer's step. group_id as for product_groups: the router's and experts' products then go to
    the decode pool."""
    from archrun.kernels.decode.lists import typed_list

    if moe is None:
        return None, False
    ffn_args = getattr(moe.moe, "ffn_args", None)
    made = None if ffn_args is None else ffn_args(moe.weights, group_id)
    return None if made is None else (typed_list([tuple(made[0])]), made[1])


class FusedMixer:
    """The fused-decode members of a recurrent mixer (a mixin before the mixer's class): the subclass says what
    its layer kernel takes in `_fused_parts() -> (kernel, matrices, weights)`; the kernel is called as
    kernel(x, common, *product groups of the matrices, *weights, pool ids, moe, state, chunks, par), moe None
    with a dense FFN (or none), else the layer's mixture of experts as moe_arguments gives it (a typed list)
    (archrun_recurrent.kernels.block_tail runs either)."""

    def _fused_parts(self) -> tuple[Any, Sequence[Any], tuple]:
        raise NotImplementedError

    def slot_arrays(self, slot: Any, start: int) -> tuple:
        """The state a one-token step at `start` updates: (state array, its ring row) per state array
        (archrun_recurrent.state.StateSlot.step_arrays)."""
        return slot.step_arrays(start)

    def fused_layer(self, common: Any, group_id: Callable | None = None, moe: Any = None) -> tuple | None:
        """(kernel, args, parallel) of the layer's decode step, or None when a matrix is not prepared for the
        fast kernels or the layer's mixture of experts (moe: its bound MoeFfn, None for a dense FFN or none) has
        no kernel arguments. group_id(ms, n_in) -> id, when given, registers the products with the decode pool."""
        kernel, mats, weights = self._fused_parts()
        made = product_groups(mats, group_id)
        if made is None:
            return None
        groups, gids, big = made
        ffn = moe_arguments(moe, group_id)
        if ffn is None:
            return None
        moe_args, moe_big = ffn
        return kernel, (common, *groups, *weights, gids, moe_args), big or moe_big

    def _beside_parts(self) -> tuple[Any, Sequence[Any], tuple]:
        """(kernel, matrices, weights) of the layer where the mixer runs beside the attention (`fused_beside`)."""
        raise NotImplementedError

    def fused_beside(self, layer: Any, group_id: Callable | None = None) -> tuple | None:
        """(kernel, args, parallel) of the decode step of a layer where this mixer runs beside the attention
        (archrun.kernels.decode.fusion.BesideBlock), or None when a matrix is not prepared for the fast kernels.
        layer: the dense layer kernel's one-item argument list; the kernel is called as kernel(x, layer,
        *product groups of the matrices, *weights, pool ids, kc, vc, kpos, ring, row, pos, cos, sin, state,
        chunks, par)."""
        kernel, mats, weights = self._beside_parts()
        made = product_groups(mats, group_id)
        if made is None:
            return None
        groups, gids, big = made
        return kernel, (layer, *groups, *weights, gids), big
