"""Mixture-of-experts FFN kernels: routing and the selected experts' gated FFNs inside numba.

`moe_rows` computes archrun_blocks.reference.moe_topk for n tokens in one call, with no
Python loop over experts:

1. router logits [n, E] = h @ ffn_gate_inp.T (+ bias), a uniform matrix product;
2. routing per token, exactly as reference.route: gating (softmax or sigmoid) -> probs;
   select = probs (+ exp_probs_b, selection only); group limit (keep the n_group_used
   groups with the best top-2 sums); top-k with the reference's tie order (its stable
   argsort of -select: lower expert index first); weights = probs of the selected experts,
   optionally renormalised (sum floored at 6.103515625e-5) and scaled;
3. the tokens routed to each expert, in ascending expert order (the reference's order of
   accumulation), go through that expert's gate/up product, the activation (either kind of
   activation part: kernels.decode.layer.activate) and its down product as one batch (each
   expert's weights are read once per call; each product adds the expert's bias when it has
   one), and are added to the output with their routing weights;
4. shared experts, if any, run on every token and are added last.

Experts streamed from disk (archrun.io.experts): once the router has chosen, and before the first
expert's product, the kernel asks the OS to read every chosen expert matrix that is not mapped in
(archrun.kernels.pages.read_ahead on the store's page table), so their reads overlap each other and the
products. A hint: the bytes read and the results are the same.

The numerics are those of the op-by-op fast path for few tokens: every product quantizes
its activation rows to 8-bit blocks (kernels.decode.block.product_rows), as kernels.matmul does
for up to INT_MAX_TOKENS rows. Routing is compiled without fastmath, so ties and the -inf
of excluded groups compare exactly as in numpy.

Expert weights are passed without copying: `expert_list` holds one uniform matrix
(kernels.decode.block.uniform) per expert and role in a numba typed list, index 3 e + j with
j = 0 gate, 1 up, 2 down, each a view of that expert's prepared arrays. Experts of any
width work (no lane-multiple condition).

`decode_moe_layer` is archrun.kernels.decode.layer's block with this FFN: one call per MoE layer for
a single token. On more than one thread its products (router, each selected expert's gate/up and
down, the shared experts) are shared with the decode worker pool (kernels.decode.pool) like a dense
layer's: `pool_group_ids` registers them as product groups (gids: their ids), and a product goes
to the running pool `par` when it is big enough (kernels.decode.block.pooled_product), else it runs on
the calling thread. With a running pool the kernel is called with chunks = 1, so numba's own
threads never spin beside the pool's workers. Pooled or not, every output row is computed by one
thread with the same kernels: the results are the same bits.

Shapes are validated when the arrays are built (`moe_arrays`) and by the callers; the kernels do
not bounds-check.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from numba import njit, typed

from archrun.errors import ShapeMismatch
from archrun.kernels import pages
from archrun.kernels._jit import JIT
from archrun.kernels.decode import block, layer
from archrun.kernels.decode.lists import typed_list
from archrun.kernels.matmul.qmatrix import QMatrix

_F32 = np.float32
# Steps inlined into their callers at numba IR level (as kernels.decode.block's: fewer separately
# compiled levels that each re-optimize the linked product kernels).
_STEP = dict(JIT, inline="always")
# Routing compares scores exactly (no fastmath: ties and infinities behave as in numpy).
_EXACT = dict(cache=True, nogil=True)
_NORM_FLOOR = _F32(6.103515625e-5)  # llama.cpp's floor of the renormalisation sum (2^-14)

# Routing parameters rp (int64 tuple): indices of its fields.
RP_K, RP_GROUPS, RP_GROUPS_USED, RP_NORM = range(4)
# Pool group ids gids (int64 [4], -1: not registered): the router's, expert 0's gate/up (expert e's is
# GID_EXPERTS + 2 e, its down + 1), the shared experts' gate/up and down.
GID_ROUTER, GID_EXPERTS, GID_SHARED_GU, GID_SHARED_DOWN = range(4)
NO_GIDS = np.full(4, -1, np.int64)


# -- bind time: kernel arrays of a layer's expert weights -----------------------------------------


def expert_list(uniforms: Sequence[tuple]) -> typed.List:
    """A numba typed list of uniform matrices (list methods run cached, compiled code)."""
    return typed_list(uniforms)


def _check(what: str, q: QMatrix, n_out: int, n_in: int) -> None:
    if (q.n_out, q.n_in) != (n_out, n_in):
        raise ShapeMismatch(f"{what}: shape ({q.n_out}, {q.n_in}), expected ({n_out}, {n_in})")


def _bias(what: str, b: np.ndarray | None, n: int) -> np.ndarray | None:
    """b as float32 [n] (None: no bias); ShapeMismatch when it is not [n]."""
    if b is None:
        return None
    if np.shape(b) != (n,):
        raise ShapeMismatch(f"{what} bias of shape {np.shape(b)}, expected ({n},)")
    return np.ascontiguousarray(b, dtype=_F32)


def moe_arrays(router: QMatrix, router_bias: np.ndarray | None, probs_bias: np.ndarray | None,
               gate: Sequence[QMatrix], up: Sequence[QMatrix], down: Sequence[QMatrix],
               shared: tuple[QMatrix, QMatrix, QMatrix] | None, shared_gate: np.ndarray | None = None,
               expert_pages: Sequence[tuple[np.ndarray, int] | None] = (),
               biases: Sequence[np.ndarray | None] = (),
               shared_biases: Sequence[np.ndarray | None] = ()) -> tuple:
    """Kernel arrays of one MoE FFN: (router, experts, shared_gate_up, shared_down, probs_bias, shared_gate,
    page_table, page_rows).

    router [E, d] (+ bias [E]); gate/up E matrices [f, d], down E matrices [d, f]; shared
    (gate [fs, d], up [fs, d], down [d, fs]) or None; probs_bias [E] or None; shared_gate [d]
    (the shared experts' output times sigmoid(h . shared_gate)) or None (empty array); expert_pages:
    for the 3 E matrices in the experts' order (e's gate, up, down), (page table, row) of each mapped
    from an expert store (archrun.io.experts, Matrix.pages), or empty / any None: nothing to read ahead.
    biases: the experts' biases in that order (e's gate [f], up [f], down [d]; None: none; empty: no
    expert has one), shared_biases the shared experts' (gate, up, down): each product adds its bias, as
    a biased Matrix does. Raises ShapeMismatch on inconsistent shapes. The product groups are 3-tuples of
    uniform matrices (absent ones padding); the experts a typed list (see the module docstring).
    """
    n_exp, d = router.n_out, router.n_in
    if not (len(gate) == len(up) == len(down) == n_exp):
        raise ShapeMismatch(f"{n_exp} router rows but {len(gate)}/{len(up)}/{len(down)} gate/up/down experts")
    f = gate[0].n_out
    for e in range(n_exp):
        _check(f"expert {e} gate", gate[e], f, d)
        _check(f"expert {e} up", up[e], f, d)
        _check(f"expert {e} down", down[e], d, f)
    if router_bias is not None and np.shape(router_bias) != (n_exp,):
        raise ShapeMismatch(f"router bias of shape {np.shape(router_bias)}, expected ({n_exp},)")
    if probs_bias is not None and np.shape(probs_bias) != (n_exp,):
        raise ShapeMismatch(f"expert selection bias of shape {np.shape(probs_bias)}, expected ({n_exp},)")
    if len(biases) not in (0, 3 * n_exp):
        raise ShapeMismatch(f"{len(biases)} expert biases for {n_exp} experts (3 a expert, or none)")
    roles = (("gate", f), ("up", f), ("down", d))
    bs = [_bias(f"expert {i // 3} {roles[i % 3][0]}", b, roles[i % 3][1]) for i, b in enumerate(biases)]
    bs = bs or [None] * (3 * n_exp)
    absent = block.absent_matrix()
    experts = expert_list([block.uniform(m, bs[3 * e + j]) for e in range(n_exp)
                           for j, m in enumerate((gate[e], up[e], down[e]))])
    shared_gu, shared_down = (absent, absent, absent), (absent, absent, absent)
    if shared is not None:
        fs = shared[0].n_out
        _check("shared gate", shared[0], fs, d)
        _check("shared up", shared[1], fs, d)
        _check("shared down", shared[2], d, fs)
        sb = [_bias(f"shared {w}", b, n) for w, b, n in zip(("gate", "up", "down"), shared_biases or (None,) * 3,
                                                            (fs, fs, d), strict=True)]
        shared_gu = (block.uniform(shared[0], sb[0]), block.uniform(shared[1], sb[1]), absent)
        shared_down = (block.uniform(shared[2], sb[2]), absent, absent)
    if shared_gate is not None and (shared is None or np.shape(shared_gate) != (d,)):
        raise ShapeMismatch(f"shared expert gate of shape {np.shape(shared_gate)}, expected ({d},) with shared experts")
    pb = (np.empty(0, _F32) if probs_bias is None
          else np.ascontiguousarray(probs_bias, dtype=_F32))
    sg = np.empty(0, _F32) if shared_gate is None else np.ascontiguousarray(shared_gate, dtype=_F32)
    table, rows = np.zeros((0, 3), np.int64), np.zeros(0, np.int64)
    if len(expert_pages) == 3 * n_exp and all(p is not None and p[0] is expert_pages[0][0] for p in expert_pages):
        table, rows = expert_pages[0][0], np.array([p[1] for p in expert_pages], np.int64)
    return (block.uniform(router, router_bias), absent, absent), experts, shared_gu, shared_down, pb, sg, table, rows


def pool_group_ids(arrays: tuple, gate: Sequence[QMatrix], up: Sequence[QMatrix], down: Sequence[QMatrix],
                   group_id: Callable[[tuple, int], int]) -> np.ndarray:
    """Register the product groups of one MoE FFN for the decode pool; their ids gids (int64 [4], GID_*).

    arrays: moe_arrays' result for the same matrices; group_id(ms, n_in) registers a group of 3
    uniform matrices with input width n_in and returns its id (archrun.kernels.decode.fusion). Expert e's groups
    are (gate, up, absent) and (down, absent, absent), registered in expert order (consecutive ids),
    each a view of the expert's prepared arrays as in `arrays`.
    """
    router, _, shared_gu, shared_down = arrays[:4]
    absent = router[1]
    d = gate[0].n_in
    gids = NO_GIDS.copy()
    gids[GID_ROUTER] = group_id(router, d)
    for e in range(len(gate)):
        i = group_id((block.uniform(gate[e]), block.uniform(up[e]), absent), d)
        group_id((block.uniform(down[e]), absent, absent), down[e].n_in)
        if e == 0:
            gids[GID_EXPERTS] = i
    if shared_gu[0][block._NOUT]:
        gids[GID_SHARED_GU] = group_id(shared_gu, d)
        gids[GID_SHARED_DOWN] = group_id(shared_down, int(shared_gu[0][block._NOUT]))
    return gids


# -- routing --------------------------------------------------------------------------------------


@njit(**_EXACT)
def _top(score, allowed, k, ids):
    """ids[:k] = the k best allowed scores, best first, lower index first on ties; when fewer than
    k are allowed the rest are the lowest disallowed indices (the reference ranks them as -inf)."""
    n = score.shape[0]
    taken = np.zeros(n, np.bool_)
    for j in range(k):
        best = -1
        for e in range(n):
            if allowed[e] and not taken[e] and (best < 0 or score[e] > score[best]):
                best = e
        if best < 0:
            for e in range(n):
                if not taken[e]:
                    best = e
                    break
        taken[best] = True
        ids[j] = best


@njit(**_EXACT)
def _limit_groups(select, n_group, n_used, allowed):
    """allowed[e] = expert e's group is among the n_used best (group score: sum of its top-2)."""
    size = select.shape[0] // n_group
    score = np.empty(n_group, _F32)
    for g in range(n_group):
        a = b = _F32(0.0)
        for i in range(size):  # a >= b: the two largest of the group
            s = select[g * size + i]
            if i == 0 or s > a:
                if i > 0:
                    b = a
                a = s
            elif i == 1 or s > b:
                b = s
        score[g] = a + b if size > 1 else a
    keep = np.empty(n_used, np.int64)
    _top(score, np.ones(n_group, np.bool_), n_used, keep)
    allowed[:] = False
    for g in keep:
        allowed[g * size:(g + 1) * size] = True


@njit(**_EXACT)
def choose(probs, probs_bias, rp, scale, ids, wts):
    """One token's selection from its gating probs f32 [E]: ids int64 [k], wts f32 [k] (reference.route)."""
    n_exp = probs.shape[0]
    k = ids.shape[0]
    select = probs.copy()
    if probs_bias.shape[0]:
        for e in range(n_exp):
            select[e] = probs[e] + probs_bias[e]
    allowed = np.ones(n_exp, np.bool_)
    if rp[RP_GROUPS] > 1:
        _limit_groups(select, rp[RP_GROUPS], rp[RP_GROUPS_USED], allowed)
    _top(select, allowed, k, ids)
    s = _F32(0.0)
    for j in range(k):
        wts[j] = probs[ids[j]]
        s += wts[j]
    if rp[RP_NORM]:
        s = max(s, _NORM_FLOOR)
        for j in range(k):
            wts[j] = wts[j] / s
    if scale != 1.0:
        for j in range(k):
            wts[j] = wts[j] * _F32(scale)


@njit(**_EXACT)
def route_rows(logits, probs_bias, rp, scale, gate_fn, gate_p, ids, wts):
    """Routing of every row: logits f32 [n, E] -> ids int64 [n, k], wts f32 [n, k] (reference.route
    of the probs of the gating part gate_fn)."""
    probs = np.empty(logits.shape[1], _F32)
    for t in range(logits.shape[0]):
        gate_fn[0][0](gate_p, logits[t], probs)
        choose(probs, probs_bias, rp, scale, ids[t], wts[t])


# -- the FFN --------------------------------------------------------------------------------------


@njit(**_STEP)
def _gated_ffn(gate_up, down, x, act_fn, act_p, chunks, par, gid_gu, gid_down):
    """down(act(gate x) * up x) for x f32 [m, d] -> [m, d_out] (one product group each: pool groups
    gid_gu and gid_down of the running pool par, -1 for none)."""
    m = x.shape[0]
    f = gate_up[0][block._NOUT]
    gu = np.empty((m, 2 * f), _F32)
    block.pooled_product(par, gid_gu, gate_up, x, gu, chunks)
    a = np.empty((m, f), _F32)
    for i in range(m):  # act(gate) * up, or a gated part's act(gate, up)
        layer.activate(act_fn[0], act_p, gu[i][:f], gu[i][f:], a[i], True)
    y = np.empty((m, down[0][block._NOUT]), _F32)
    block.pooled_product(par, gid_down, down, a, y, chunks)
    return y


@njit(**_STEP)
def _by_expert(ids, n_exp):
    """Counting sort of the (token, slot) pairs by expert: start [E + 1] offsets into order [n * k]
    (pair index t * k + j), tokens ascending within an expert."""
    n, k = ids.shape
    start = np.zeros(n_exp + 1, np.int64)
    for t in range(n):
        for j in range(k):
            start[ids[t, j] + 1] += 1
    for e in range(n_exp):
        start[e + 1] += start[e]
    fill = start[:-1].copy()
    order = np.empty(n * k, np.int64)
    for t in range(n):
        for j in range(k):
            e = ids[t, j]
            order[fill[e]] = t * k + j
            fill[e] += 1
    return start, order


@njit(**JIT)
def moe_rows(h, out, router, experts, shared_gu, shared_down, probs_bias, shared_gate, page_table, page_rows, rp,
             scale, gate_fn, gate_p, act_fn, act_p, gids, chunks, par):
    """out f32 [n, d] = the MoE FFN of h f32 [n, d] (C-contiguous); arguments as `moe_arrays` builds
    them (page_rows empty: no expert to read ahead), rp (RP_* fields) and scale the routing parameters,
    gate_fn/act_fn the gating's and the experts' activation's kernel parts (their handles, Part.handle).
    Products split over `chunks` threads, or go to the running decode pool par (kernels.decode.pool.NO_POOL:
    none) as groups gids (`pool_group_ids`; NO_GIDS: none)."""
    n, d = h.shape
    absent = router[1]
    n_exp = router[0][block._NOUT]
    k = rp[RP_K]
    logits = np.empty((n, n_exp), _F32)
    block.pooled_product(par, gids[GID_ROUTER], router, h, logits, chunks)
    ids = np.empty((n, k), np.int64)
    wts = np.empty((n, k), _F32)
    route_rows(logits, probs_bias, rp, scale, gate_fn, gate_p, ids, wts)
    out[:] = 0
    start, order = _by_expert(ids, n_exp)
    if page_rows.shape[0]:  # experts streamed from disk: ask for every pick before computing the first
        for e in range(n_exp):
            if start[e + 1] > start[e]:
                for j in range(3):
                    pages.read_ahead(page_table, page_rows[3 * e + j])
    for e in range(n_exp):
        m = start[e + 1] - start[e]
        if m == 0:
            continue
        xe = np.empty((m, d), _F32)
        for i in range(m):
            xe[i] = h[order[start[e] + i] // k]
        g0 = gids[GID_EXPERTS] + 2 * e if gids[GID_EXPERTS] >= 0 else -1
        ye = _gated_ffn((experts[3 * e], experts[3 * e + 1], absent), (experts[3 * e + 2], absent, absent),
                        xe, act_fn, act_p, chunks, par, g0, g0 + 1 if g0 >= 0 else -1)
        for i in range(m):
            p = order[start[e] + i]
            t, w = p // k, wts[p // k, p % k]
            for c in range(d):
                out[t, c] += w * ye[i, c]
    if shared_gu[0][block._NOUT]:
        ys = _gated_ffn(shared_gu, shared_down, h, act_fn, act_p, chunks, par, gids[GID_SHARED_GU],
                        gids[GID_SHARED_DOWN])
        for t in range(n):
            s = _F32(1.0)
            if shared_gate.shape[0]:  # sigmoid(h[t] . shared_gate), accumulated in float64
                z = 0.0
                for c in range(d):
                    z += np.float64(h[t, c]) * np.float64(shared_gate[c])
                s = _F32(1.0 / (1.0 + np.exp(-z)))
            for c in range(d):
                out[t, c] += s * ys[t, c]


@njit(**JIT)
def decode_moe_layer(x, common, router, experts, shared_gu, shared_down, probs_bias, shared_gate, page_table,
                     page_rows, rp, moe_scale, gate_fn, gate_p, act_fn, act_p, gids, kc, vc, kpos, ring, row, pos, cos,
                     sin, chunks, par):
    """One decoder block with a MoE FFN on one token; x f32 [d] is updated in place.

    common[0] holds the layer's (qkv, o_mat, vecs, geo, fns, params) as archrun.kernels.decode.layer
    documents them (geo's FFN fields unused); its attention sub-block and residual joins run
    here, and the FFN is `moe_rows` (gate_fn/act_fn: the handles of the gating and activation
    parts; gids: the FFN's pool groups, `pool_group_ids`). The list and the expert list are top-level
    arguments: numba types a typed list nested in a tuple through its slow path, every array of the
    tuple included (~7 ms a call).
    """
    qkv, o_mat, vecs, geo, fns, params = common[0]
    a, h = layer.attention_block(x, qkv, o_mat, vecs, geo, fns, params, kc, vc, kpos, ring, row, pos, cos, sin,
                                 chunks, par)
    g = layer.ffn_input(x, a, h, vecs, fns, params)
    f = np.empty((1, x.shape[0]), _F32)
    moe_rows(g.reshape(1, x.shape[0]), f, router, experts, shared_gu, shared_down, probs_bias, shared_gate,
             page_table, page_rows, rp, moe_scale, gate_fn, gate_p, act_fn, act_p, gids, chunks, par)
    layer.join(x, a, f[0], vecs, fns, params)
