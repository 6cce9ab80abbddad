"""A short-convolution layer's decode step as one kernel (archrun_recurrent.shortconv's `fused_layer`).

The layer's block around the mixer (pre-norm; post-norm, dense FFN or mixture of experts, residual joins)
is the core's (archrun.kernels.decode.layer `mixer_input`) and the shared tail's (block_tail); the products go
through the decode product groups (and the worker pool, when their groups are registered with it). Every float
step is the op-by-op path's, in its order (archrun_recurrent.kernels.conv), so a token's result has the same
bits either way.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from archrun.kernels._jit import JIT
from archrun.kernels.decode import layer
from archrun.kernels.decode.block import product_group
from archrun_recurrent.kernels.block_tail import block_tail

_F32 = np.float32


@njit(**dict(JIT, inline="always"))
def conv_token(bcx, w, conv, kept, y):  # pragma: no cover - compiled
    """y [d] = C * the causal depthwise convolution of [conv ; B * x] for one token, bcx = B|C|x [3d],
    w [d, L]; the window conv [L-1, d] shifts in place (B * x enters it), then is copied into kept."""
    d = y.shape[0]
    taps = w.shape[1]
    for i in range(d):
        u = bcx[i] * bcx[2 * d + i]
        acc = _F32(0.0)
        for j in range(taps - 1):
            acc += w[i, j] * conv[j, i]
        acc += w[i, taps - 1] * u
        y[i] = bcx[d + i] * acc
        for j in range(taps - 2):
            conv[j, i] = conv[j + 1, i]
        conv[taps - 2, i] = u
    kept[:] = conv


@njit(**JIT)
def shortconv_layer(x, common, in_proj, out_proj, w, gids, moe, state, chunks, par):  # pragma: no cover - compiled
    """One short-convolution block on one token; x f32 [d] is updated in place.

    common[0]: the block's (gate_up, down, vecs, geo, fns, params) (archrun.kernels.decode.layer); in_proj,
    out_proj: product groups (3 uniform matrices) of B|C|x [3d] and of the output [d]; w [d, L] the taps;
    gids: their decode pool groups (-1: none); moe: None (a dense FFN or none) or the mixture of experts'
    moe_rows arguments (block_tail); state: ((conv window [L-1, d], its ring row),) from
    archrun_recurrent.state.StateSlot.step_arrays.
    """
    _, _, vecs, _, fns, params = common[0]
    d = x.shape[0]
    h = layer.mixer_input(x, vecs, fns, params)
    bcx = np.empty(3 * d, _F32)
    product_group(par, gids[0], in_proj, h, bcx, chunks)
    conv, kept = state[0]
    y = np.empty(d, _F32)
    conv_token(bcx, w, conv, kept, y)
    a = np.empty(d, _F32)
    product_group(par, gids[1], out_proj, y, a, chunks)
    block_tail(x, a, h, common, moe, chunks, par)
