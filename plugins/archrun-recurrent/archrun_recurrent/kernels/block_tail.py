"""The rest of a block after its token mixer's (or its own attention's) output, shared by every layer kernel of
archrun-recurrent (short convolution, Mamba, Mamba2, gated DeltaNet, KDA, gated attention): the post-norm, the
FFN — the block's dense products (archrun.kernels.decode.layer `mixer_output`) or a mixture of experts
(archrun-blocks' `moe_rows`, its arguments the MoE op's `ffn_args`) — and the residual joins, in the op-by-op
block's order (archrun.run.interpreter), so a fused token has its bits.

Float flags: archrun.kernels._jit.JIT (nnan, ninf only), as every mixer kernel.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from archrun.kernels._jit import JIT
from archrun.kernels.decode import layer
from archrun_blocks.moe_kernels import moe_rows

_F32 = np.float32


@njit(**JIT)
def block_tail(x, a, h, common, moe, chunks, par):  # pragma: no cover - compiled
    """x f32 [d] <- the block's residual stream after its mixer's output a [d] (h: the mixer's normed input).

    common[0]: the block's (gate_up, down, vecs, geo, fns, params) (archrun.kernels.decode.layer); moe: None
    for a dense FFN (or none: geo's n_ff 0), else a typed list whose item 0 is the tuple of moe_rows' arguments
    between (h, out) and (chunks, par) (the MoE op's `ffn_args`: archrun_recurrent.fused.moe_arguments). numba
    compiles one branch per type of moe (its `is None` test is pruned at compile time), so the dense layers'
    code has no mixture in it.
    """
    gate_up, down, vecs, geo, fns, params = common[0]
    if moe is None:
        layer.mixer_output(x, a, h, gate_up, down, vecs, geo, fns, params, chunks, par)
        return
    if vecs[layer.V_POST_ATTN].shape[0]:
        fns[layer.F_NORM][0](params[layer.P_NORM], a, vecs[layer.V_POST_ATTN], np.empty(0, _F32), a)
    g = layer.ffn_input(x, a, h, vecs, fns, params)
    f = np.empty((1, x.shape[0]), _F32)
    moe_rows(g.reshape(1, x.shape[0]), f, *moe[0], chunks, par)
    layer.join(x, a, f[0], vecs, fns, params)
