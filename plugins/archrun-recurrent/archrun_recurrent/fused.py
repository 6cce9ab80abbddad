"""What a mixer's fused decode layer (its `fused_layer`, archrun.kernels.decode.fusion.MixerBlock) takes of its
matrices: one product group each, and their decode pool ids."""

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
