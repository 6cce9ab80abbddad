"""A mixer whose layer decodes fused (archrun.kernels.decode.fusion.MixerBlock): its `slot_arrays` and `fused_layer`
members (FusedMixer), and what its layer kernel takes of its matrices (one product group each, their decode pool
ids)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def product_groups(mats: Sequence[Any], group_id: Callable | None) -> tuple[list[tuple], np.ndarray, bool] | None:
    """(a product group of 3 uniform matrices per matrix, their pool group ids int64 (-1: none), whether a
    matrix is big enough to split over threads), or None when a matrix is not prepared for the fast kernels.
    group_id(ms, n_in) -> id, when given, registers each group with the decode pool."""
    from archrun.kernels.decode.block import absent_matrix, uniform
    from archrun.kernels.matmul.qmatrix import PARALLEL_MIN_BYTES

    if any(m is None or m.prepared is None for m in mats):
        return None
    groups = [(uniform(m.prepared, m.bias), absent_matrix(), absent_matrix()) for m in mats]
    gids = np.full(len(mats), -1, np.int64)
    if group_id is not None:
        gids[:] = [group_id(g, m.n_in) for g, m in zip(groups, mats, strict=True)]
    return groups, gids, max(m.prepared.nbytes for m in mats) >= PARALLEL_MIN_BYTES


class FusedMixer:
    """The fused-decode members of a recurrent mixer (a mixin before the mixer's class): the subclass says what
    its layer kernel takes in `_fused_parts() -> (kernel, matrices, weights)`; the kernel is called as
    kernel(x, common, *product groups of the matrices, *weights, pool ids, state, chunks, par)."""

    def _fused_parts(self) -> tuple[Any, Sequence[Any], tuple]:
        raise NotImplementedError

    def slot_arrays(self, slot: Any, start: int) -> tuple:
        """The state a one-token step at `start` updates: (state array, its ring row) per state array
        (archrun_recurrent.state.StateSlot.step_arrays)."""
        return slot.step_arrays(start)

    def fused_layer(self, common: Any, group_id: Callable | None = None) -> tuple | None:
        """(kernel, args, parallel) of the layer's decode step, or None when a matrix is not prepared for the
        fast kernels. group_id(ms, n_in) -> id, when given, registers the products with the decode pool."""
        kernel, mats, weights = self._fused_parts()
        made = product_groups(mats, group_id)
        if made is None:
            return None
        groups, gids, big = made
        return kernel, (common, *groups, *weights, gids), big
