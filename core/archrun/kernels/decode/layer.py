"""One decoder block for one token in one jitted call, composed of the ops' kernel parts.

This is the interpreter's block (archrun.run.interpreter.Interpreter.run_block) for a single token, as
one numba function. It knows the anatomy of a block — pre-norm, q/k/v products, per-head q/k
norms, rotary embedding, attention over the cache, output product, post-norm, the residual
topology's two joins, the FFN's products and activation — and none of the math: every op is a
first-class function value (a `kernels.decode.parts.Part`) taken from the layer's arguments, so one
compiled kernel runs every combination of built-in and third-party ops.

A dense layer's arguments, built by archrun.kernels.decode.fusion (one tuple; `decode_layer` takes a typed
list of them, built once at load):

  qkv, o_mat, gate_up, down   product groups: 3 uniform matrices each (kernels.decode.block), absent
                              ones padding: (q, k, v) or (q|k|v, -, -); (o, -, -);
                              (gate, up, -), (gate|up, -, -) or (up, -, -) for a plain FFN; (down, -, -)
  vecs   float32 vectors, empty when absent: attn_norm, attn_norm bias, q_norm, k_norm,
         post_attn_norm, ffn_norm, ffn_norm bias, post_ffn_norm, [c] clamping Q/K/V to [-c, c]
         (OLMo, MPT clip_qkv; empty: none), attn_sub_norm (a norm of the attention's output
         [H * vd] before its projection), ffn_sub_norm (a norm of the FFN's hidden [n_ff] before
         the down projection) (no attn_norm: a block without pre-norms; q/k norms of a head's
         width apply per head, of all heads' width to the whole, or, when geo says so, a weight
         row per head: q_norm [H * hd], k_norm [KV * hd], head h normed with its row h)
  geo    int64: n_head, n_kv, head_dim, v_head_dim, n_ff, gated, rope (0/1), the pool
         group ids of qkv, o_mat, gate_up, down (-1: none), q/k norms after rope (0/1), the
         pool task id of the attention op (-1: none; the attention part gets it with the pool's ctrl),
         and q/k norms with a weight row per head (0/1)
  fns    parts' functions as first-class values (kernels.decode.parts.Part.value, called f[0](...)): norm, rope,
         attention, activation, residual ffn_input, residual combine; the activation is either kind of
         activation part (`activate`: act(gate) * up, or a gated part's act(gate, up), chosen by its type)
  params their float64 parameters in the same order (the residual's serve both of its functions)

A layer without FFN has n_ff 0 (gate_up and down absent; the activation slot NO_ACTIVATION, never called):
its block ends with the residual's combine of the attention output and a zero FFN output.

Layers whose FFN is not a dense product pair (e.g. a mixture of experts) run their op's own
layer kernel, which calls `attention_block` and `join` from here. A token mixer's layer (a mixer op's
`fused_layer`) runs the op's kernel, which computes the mixer's output from `mixer_input` and hands it
to `mixer_output` (the rest of the block: post-norm, dense FFN or none, residual joins). Its arguments
are then (gate_up, down, vecs, geo, fns, params) as above: geo's FFN fields and pool ids of gate_up
and down (n_ff 0: the block has no FFN), fns' attention and rope entries placeholders. A layer whose
token mixer runs beside its attention (a mixer op's `fused_beside`) runs the op's kernel with the dense
layer's arguments: it adds the mixer's output of `mixer_input` to `attention_output`'s and hands the sum to
`mixer_output`.

`decode_rows` is the same block on N rows at once (a batch of sequences, or a span of one
sequence's tokens: speculative verification), built from the same inlined steps: per row the same
part calls, and products (kernels.decode.block.product_group_rows) that read each weight block once for
all rows while computing every row as the one-token product does, so each row's output is
bit-identical to `decode_layer` on that token. It serves dense layers only; a layer with its own
FFN kernel runs op by op in a batch (archrun.run.decoders.FusedDecoder.forward_step_batch_spans).
"""

from __future__ import annotations

import inspect

import numpy as np
from numba import njit, types
from numba.extending import overload

from archrun.kernels import atomics
from archrun.kernels._jit import JIT
from archrun.kernels.decode import block, pool
from archrun.kernels.decode.addresses import address, array_at
from archrun.kernels.decode.block import product_group, product_group_rows

_F32 = np.float32
_STEP = dict(JIT, inline="always")

# vecs and geo fields
(V_ATTN_NORM, V_ATTN_NORM_B, V_Q_NORM, V_K_NORM, V_POST_ATTN, V_FFN_NORM, V_FFN_NORM_B, V_POST_FFN, V_CLAMP,
 V_ATTN_SUB, V_FFN_SUB) = range(11)
G_HEADS, G_KV, G_HD, G_VD, G_FF, G_GATED, G_ROPE, G_QKV, G_O, G_GU, G_DOWN, G_QK_LATE, G_TASK, G_QK_ROWS = range(14)
# fns / params fields
F_NORM, F_ROPE, F_ATTN, F_ACT, F_RES_IN, F_RES_OUT = range(6)
P_NORM, P_ROPE, P_ATTN, P_ACT, P_RES = range(5)


@njit(**_STEP)
def _heads_norm(norm, p, v, n_head, hd, w, rows):
    """Per-head norm of v [n_head * hd] in place (no bias): every head with w [hd], or, when `rows`,
    head h with its own row w[h * hd:(h + 1) * hd] of w [n_head * hd]."""
    none = np.empty(0, _F32)
    for h in range(n_head):
        seg = v[h * hd:(h + 1) * hd]
        norm[0](p, seg, w[h * hd:(h + 1) * hd] if rows else w, none, seg)


@njit(**_STEP)
def _qk_norm(norm, pn, q, k, vecs, n_head, n_kv, hd, rows):
    """q [n_head * hd] and k [n_kv * hd] through their norms in place: per head (norms of a head's
    width, or `rows`: a weight row per head), or one norm over all heads (norms of all heads' width)."""
    qh = n_head if rows or vecs[V_Q_NORM].shape[0] == hd else 1
    kh = n_kv if rows or vecs[V_K_NORM].shape[0] == hd else 1
    _heads_norm(norm, pn, q, qh, q.shape[0] // qh, vecs[V_Q_NORM], rows)
    _heads_norm(norm, pn, k, kh, k.shape[0] // kh, vecs[V_K_NORM], rows)


@njit(**_STEP)
def _sub_norm(v, w, fns, params):
    """v through a sub-layer norm (the block's norm part) of weight w in place, when the block has one
    (w not empty)."""
    if w.shape[0]:
        fns[F_NORM][0](params[P_NORM], v, w, np.empty(0, _F32), v)


@njit(**_STEP)
def _pre_norm(x, vecs, fns, params, h):
    """h [d] = the attention sub-block's normed input of x [d] (x itself in a block without pre-norms)."""
    if vecs[V_ATTN_NORM].shape[0]:
        fns[F_NORM][0](params[P_NORM], x, vecs[V_ATTN_NORM], vecs[V_ATTN_NORM_B], h)
    else:  # no pre-norms
        h[:] = x


@njit(**_STEP)
def _attend_row(y, vecs, geo, fns, params, kc, vc, kpos, ring, row, pos, cos, sin, att, ctrl):
    """One token's attention from its q|k|v projections y [nq + nk + nv] (clamped, q/k-normed and rotated
    in place) into att [n_head * vd]; its K/V go to cache row `row`. ctrl: the running pool's (empty: none),
    passed to the attention part with the op's pool task id."""
    n_head, n_kv, hd = geo[G_HEADS], geo[G_KV], geo[G_HD]
    norm, pn = fns[F_NORM], params[P_NORM]
    if vecs[V_CLAMP].shape[0]:
        c = vecs[V_CLAMP][0]
        for j in range(y.shape[0]):
            y[j] = min(max(y[j], -c), c)
    nq, nk = n_head * hd, n_kv * hd
    q, k, v = y[:nq], y[nq:nq + nk], y[nq + nk:]
    late, rows = geo[G_QK_LATE], geo[G_QK_ROWS] != 0
    if vecs[V_Q_NORM].shape[0] and not late:
        _qk_norm(norm, pn, q, k, vecs, n_head, n_kv, hd, rows)
    if geo[G_ROPE]:
        rope, pr = fns[F_ROPE], params[P_ROPE]
        rope[0](pr, q, n_head, hd, cos, sin)
        rope[0](pr, k, n_kv, hd, cos, sin)
    if vecs[V_Q_NORM].shape[0] and late:
        _qk_norm(norm, pn, q, k, vecs, n_head, n_kv, hd, rows)
    fns[F_ATTN][0](params[P_ATTN], q, k, v, kc, vc, kpos, ring, row, pos, att, ctrl, geo[G_TASK])


@njit(**_STEP)
def _post_attn(a, vecs, fns, params):
    """The post-attention norm of a [d] in place, when the block has one."""
    if vecs[V_POST_ATTN].shape[0]:
        fns[F_NORM][0](params[P_NORM], a, vecs[V_POST_ATTN], np.empty(0, _F32), a)


@njit(**_STEP)
def _qkv_width(geo):
    return geo[G_HEADS] * geo[G_HD] + geo[G_KV] * geo[G_HD] + geo[G_KV] * geo[G_VD]


@njit(**_STEP)
def attention_output(h, qkv, o_mat, vecs, geo, fns, params, kc, vc, kpos, ring, row, pos, cos, sin, chunks, par):
    """The attention's output [d] of the normed input h f32 [d], before the post-norm: the q|k|v products,
    attention (its K/V to cache row `row`), the sub-layer norm, the output product."""
    y = np.empty(_qkv_width(geo), _F32)
    product_group(par, geo[G_QKV], qkv, h, y, chunks)
    att = np.empty(geo[G_HEADS] * geo[G_VD], _F32)
    _attend_row(y, vecs, geo, fns, params, kc, vc, kpos, ring, row, pos, cos, sin, att, par[0])
    _sub_norm(att, vecs[V_ATTN_SUB], fns, params)
    a = np.empty(h.shape[0], _F32)
    product_group(par, geo[G_O], o_mat, att, a, chunks)
    return a


@njit(**_STEP)
def attention_block(x, qkv, o_mat, vecs, geo, fns, params, kc, vc, kpos, ring, row, pos, cos, sin, chunks, par):
    """The attention sub-block of x f32 [d]: (a, h) = (its output [d] after the post-norm, the normed input [d])."""
    h = np.empty(x.shape[0], _F32)
    _pre_norm(x, vecs, fns, params, h)
    a = attention_output(h, qkv, o_mat, vecs, geo, fns, params, kc, vc, kpos, ring, row, pos, cos, sin, chunks, par)
    _post_attn(a, vecs, fns, params)
    return a, h


@njit(**_STEP)
def ffn_input(x, a, h, vecs, fns, params):
    """The FFN sub-block's normed input [d]: the residual's ffn_input of (x, a), through ffn_norm; a
    block without its own ffn_norm (a parallel block sharing one norm) reads the attention's h, and
    a block without pre-norms the residual's ffn_input as is."""
    if not vecs[V_FFN_NORM].shape[0] and vecs[V_ATTN_NORM].shape[0]:
        return h
    g = np.empty(x.shape[0], _F32)
    fns[F_RES_IN][0](params[P_RES], x, a, g)
    if vecs[V_FFN_NORM].shape[0]:
        fns[F_NORM][0](params[P_NORM], g, vecs[V_FFN_NORM], vecs[V_FFN_NORM_B], g)
    return g


@njit(**_STEP)
def join(x, a, f, vecs, fns, params):
    """x <- the residual stream after the block, from the attention output a and FFN output f
    (f post-normed first when the block has a post-FFN norm)."""
    if vecs[V_POST_FFN].shape[0]:
        fns[F_NORM][0](params[P_NORM], f, vecs[V_POST_FFN], np.empty(0, _F32), f)
    fns[F_RES_OUT][0](params[P_RES], x, a, f)


def activate(f, p, gate, up, out, gated):
    """out [n] = the activation part f's (a first-class value, f[0](...)) of gate [n]: f(gate) * up when
    `gated`, f(gate) when not (up unused); a gated part (SIGNATURES["gated"]) computes f(gate, up) itself.
    Which call runs is fixed when the caller compiles, by f's type (the overload below). Plugins' FFN
    kernels call this for their experts' activations too."""
    if len(inspect.signature(getattr(f[0], "py_func", f[0])).parameters) == 4:  # pure Python (no JIT)
        f[0](p, gate, up, out)
        return
    f[0](p, gate, out)
    if gated:
        for i in range(out.shape[0]):
            out[i] = out[i] * up[i]


@overload(activate, jit_options=JIT)
def _activate_typed(f, p, gate, up, out, gated):
    if getattr(f[0], "nargs", 3) == 4:  # a gated part reads up itself
        def both(f, p, gate, up, out, gated):
            f[0](p, gate, up, out)
        return both

    def then_up(f, p, gate, up, out, gated):
        f[0](p, gate, out)
        if gated:
            for i in range(out.shape[0]):
                out[i] = out[i] * up[i]
    return then_up


@njit(**_STEP)
def _activate(gu, act, geo, fns, params):
    """act [n_ff] = act(gate) * up from gu = gate|up [2 n_ff], or act(up) from gu [n_ff] for a plain FFN."""
    n_ff = geo[G_FF]
    activate(fns[F_ACT], params[P_ACT], gu[:n_ff], gu[n_ff:], act, geo[G_GATED] != 0)


@njit(**_STEP)
def _dense_ffn(g, gate_up, down, vecs, geo, fns, params, chunks, par):
    """down(act(gate g) * up g) [d], or down(act(up g)) for a plain FFN, of the normed input g [d] (the hidden
    through the FFN's sub-layer norm first when it has one)."""
    n_ff = geo[G_FF]
    gu = np.empty(2 * n_ff if geo[G_GATED] else n_ff, _F32)
    product_group(par, geo[G_GU], gate_up, g, gu, chunks)
    act = np.empty(n_ff, _F32)
    _activate(gu, act, geo, fns, params)
    _sub_norm(act, vecs[V_FFN_SUB], fns, params)
    f = np.empty(g.shape[0], _F32)
    product_group(par, geo[G_DOWN], down, act, f, chunks)
    return f


@njit(**JIT)
def decode_layer(x, layers, i, kc, vc, kpos, ring, row, pos, cos, sin, chunks, par):
    """One decoder block with a dense FFN on one token; x f32 [d] is updated in place.

    The layer's arguments (qkv .. params, see the module docstring) are layers[i], a numba typed
    list: one list argument instead of ~150 arrays makes the call from Python ~15 us cheaper
    (numba unboxes every array of a call's arguments), and the parts' function values are
    converted once, when the list is built. The token's K/V go to cache row `row` of
    kc [cap, KV, hd] / vc [cap, KV, vd] (ring slots also record kpos[row] = pos); cos/sin
    [n_rot / 2] are the rotary angles at `pos`.
    """
    qkv, o_mat, gate_up, down, vecs, geo, fns, params = layers[i]
    a, h = attention_block(x, qkv, o_mat, vecs, geo, fns, params, kc, vc, kpos, ring, row, pos, cos, sin, chunks,
                           par)
    _ffn_join(x, a, h, gate_up, down, vecs, geo, fns, params, chunks, par)


@njit(**_STEP)
def _ffn_join(x, a, h, gate_up, down, vecs, geo, fns, params, chunks, par):
    """The rest of a block after its mixer's post-normed output a [d] (h: the mixer's normed input): the dense
    FFN and the residual joins, or, when geo's n_ff is 0 (a block without FFN), the residual's combine with a
    zero FFN output, as archrun.run.interpreter's block computes them; x [d] is updated in place."""
    if geo[G_FF] == 0:
        fns[F_RES_OUT][0](params[P_RES], x, a, np.zeros(x.shape[0], _F32))
        return
    g = ffn_input(x, a, h, vecs, fns, params)
    f = _dense_ffn(g, gate_up, down, vecs, geo, fns, params, chunks, par)
    join(x, a, f, vecs, fns, params)


# -- a token mixer's block: the mixer op's own layer kernel calls these ----------------------------------


@njit(**_STEP)
def mixer_input(x, vecs, fns, params):
    """The normed input h [d] a token mixer reads (a copy of x in a block without pre-norms)."""
    h = np.empty(x.shape[0], _F32)
    _pre_norm(x, vecs, fns, params, h)
    return h


@njit(**_STEP)
def mixer_output(x, a, h, gate_up, down, vecs, geo, fns, params, chunks, par):
    """The rest of a token mixer's block from the mixer's output a [d] (h: its normed input): the post-norm,
    the dense FFN (none when geo's n_ff is 0: the mixer is the block's only branch) and the residual joins,
    as archrun.run.interpreter's block computes them; x [d] is updated in place."""
    _post_attn(a, vecs, fns, params)
    _ffn_join(x, a, h, gate_up, down, vecs, geo, fns, params, chunks, par)


@njit(**JIT)
def empty_mixer_layer(x, common, chunks, par):
    """A block whose token mixer adds nothing and keeps no state (its op declares `empty`, e.g. an FFN-only
    block): the mixer's output is zeros, so the block is its norm, the post-norm of zeros, the FFN (reading
    the block's normed input when it has no norm of its own) and the residual joins, as the interpreter's
    block computes them with the op's zeros; common[0] = (gate_up, down, vecs, geo, fns, params) as a token
    mixer's (archrun.kernels.decode.fusion), x [d] updated in place."""
    gate_up, down, vecs, geo, fns, params = common[0]
    h = mixer_input(x, vecs, fns, params)
    mixer_output(x, np.zeros(x.shape[0], _F32), h, gate_up, down, vecs, geo, fns, params, chunks, par)


# -- several rows in one call: decode batches and verification spans ---------------------------------


@njit(**_STEP)
def _row_slot(slots, li, s, pos):
    """(kc, vc, kpos, ring, row) of layer li in sequence s's cache for the token at `pos`: a ring stores
    position p at row p % cap, a plain slot at row p."""
    kc, vc, kpos, ring = slots[s][li]
    return kc, vc, kpos, ring, pos % kc.shape[0] if ring else pos


# -- the attention of a batch's sequences on the decode pool (pool.ROWS_JOB) ---------------------------
# Rows of different sequences attend independently, so with the pool running, decode_rows publishes a
# layer's attention as one job whose chunks are the batch's runs of rows of one sequence (a span's rows
# stay in order within its chunk); the step's thread and the workers claim them as a product's chunks.
# A chunk calls every row's attention part exactly as the serial loop does, with no pool of its own (a
# long row's split attention then runs its chunks in order: the same bits, kernels.decode.parts), so a row's
# result does not depend on the thread that ran it. The job's arguments (int64, R_*) are addresses of
# the step's arrays (kernels.decode.addresses) and a table of each run's cache slot (T_*).

R_LAYER, R_N, R_Y, R_YW, R_ATT, R_AW, R_COS, R_SIN, R_ROT, R_POS, R_RUNS, R_TABLE, R_ARGS = range(13)
T_KC, T_VC, T_KPOS, T_CAP, T_KW, T_VW, T_NPOS, T_RING, T_FIELDS = range(9)


@njit(**JIT)
def attend_run(vecs, geo, fns, params, args, c):
    """Chunk c of a ROWS_JOB with the layer's vecs/geo/fns/params: the attention of run c's rows."""
    n, rot = args[R_N], args[R_ROT]
    Y = array_at(args[R_Y], (n, args[R_YW]), _F32)
    ATT = array_at(args[R_ATT], (n, args[R_AW]), _F32)
    cos, sin = array_at(args[R_COS], (n, rot), _F32), array_at(args[R_SIN], (n, rot), _F32)
    pos = array_at(args[R_POS], (n,), np.int64)
    bounds = array_at(args[R_RUNS], (n + 1,), np.int64)
    t = array_at(args[R_TABLE], (n, T_FIELDS), np.int64)[c]
    kv, cap = geo[G_KV], t[T_CAP]
    kc = array_at(t[T_KC], (cap, kv, t[T_KW]), _F32)
    vc = array_at(t[T_VC], (cap, kv, t[T_VW]), _F32)
    kpos = array_at(t[T_KPOS], (t[T_NPOS],), np.int64)
    ring = t[T_RING] != 0
    no_pool = np.empty(0, np.int64)
    for j in range(bounds[c], bounds[c + 1]):
        row = pos[j] % cap if ring else pos[j]
        _attend_row(Y[j], vecs, geo, fns, params, kc, vc, kpos, ring, row, pos[j], cos[j], sin[j], ATT[j], no_pool)


@njit(**JIT)
def attend_run_of(layers, args, c):
    """attend_run for a pool worker: the layer's arguments from the dense layers' list."""
    qkv, o_mat, gate_up, down, vecs, geo, fns, params = layers[args[R_LAYER]]
    attend_run(vecs, geo, fns, params, args, c)


@njit(**_STEP)
def _runs(seq):
    """Row bounds int64 [runs + 1] of seq's runs of equal sequence ids."""
    n = seq.shape[0]
    cuts = 1
    for j in range(1, n):
        cuts += seq[j] != seq[j - 1]
    bounds = np.empty(cuts + 1, np.int64)
    r = 0
    bounds[0] = 0
    for j in range(1, n):
        if seq[j] != seq[j - 1]:
            r += 1
            bounds[r] = j
    bounds[cuts] = n
    return bounds


@njit(**_STEP)
def _rows_job(i, Y, ATT, cos, sin, pos, bounds, slots, li, seq):
    """The ROWS_JOB's arguments for dense layer i (list index) = trunk layer li, and its slot table."""
    runs = bounds.shape[0] - 1
    table = np.zeros((Y.shape[0], T_FIELDS), np.int64)
    for r in range(runs):
        kc, vc, kpos, ring = slots[seq[bounds[r]]][li]
        table[r, T_KC], table[r, T_VC], table[r, T_KPOS] = address(kc), address(vc), address(kpos)
        table[r, T_CAP], table[r, T_KW], table[r, T_VW] = kc.shape[0], kc.shape[2], vc.shape[2]
        table[r, T_NPOS], table[r, T_RING] = kpos.shape[0], ring
    args = np.zeros(R_ARGS, np.int64)
    args[R_LAYER], args[R_N], args[R_ROT] = i, Y.shape[0], cos.shape[1]
    args[R_Y], args[R_YW], args[R_ATT], args[R_AW] = address(Y), Y.shape[1], address(ATT), ATT.shape[1]
    args[R_COS], args[R_SIN], args[R_POS] = address(cos), address(sin), address(pos)
    args[R_RUNS], args[R_TABLE] = address(bounds), address(table)
    return args, table


@njit(**_STEP)
def _rows_job_fits(ctrl, runs):
    """Whether the running pool takes a ROWS_JOB of `runs` runs (several, within its chunks, holding the layers)."""
    return runs > 1 and runs <= pool.MAX_CHUNKS and pool.shares_rows(ctrl)


@njit(**_STEP)
def _attend_rows_job(Y, ATT, i, vecs, geo, fns, params, slots, li, seq, pos, cos, sin, ctrl, bounds):
    """The rows' attention as a ROWS_JOB: this thread and the pool's workers claim its runs."""
    runs = bounds.shape[0] - 1
    args, table = _rows_job(i, Y, ATT, cos, sin, pos, bounds, slots, li, seq)
    shared = pool.publish_rows(ctrl, args, runs)
    while True:
        c, w = pool.claim(ctrl)
        if c == -1:
            break
        if c >= 0:
            attend_run(vecs, geo, fns, params, shared, c)
            pool.done(ctrl)
    pool.wait_done(ctrl, runs)
    # never true: a use of Y, bounds and table after the wait (numba frees an array after its last use,
    # and the chunks read and write them by address)
    if bounds[0] != 0 or table[0, T_CAP] < 0 or Y.shape[0] < 0:
        ATT[0, 0] = 0.0


def _rows_on_pool(Y, ATT, i, vecs, geo, fns, params, slots, li, seq, pos, cos, sin, ctrl, bounds):
    """Run the rows' attention as a ROWS_JOB when the pool takes it; returns whether it did. Float32 caches
    only: the job's chunks read their caches by address as float32 and call the pool's (float32) layers'
    parts, so rows on caches of other kv types (f16, q8_0) attend on the step's own thread (the compiled
    variant for those never contains the job)."""
    if slots[0][0][0].dtype != np.float32 or not _rows_job_fits(ctrl, bounds.shape[0] - 1):
        return False
    _attend_rows_job(Y, ATT, i, vecs, geo, fns, params, slots, li, seq, pos, cos, sin, ctrl, bounds)
    return True


@overload(_rows_on_pool, jit_options=JIT)
def _rows_on_pool_typed(Y, ATT, i, vecs, geo, fns, params, slots, li, seq, pos, cos, sin, ctrl, bounds):
    if slots.dtype.dtype.types[0].dtype != types.float32:
        return lambda Y, ATT, i, vecs, geo, fns, params, slots, li, seq, pos, cos, sin, ctrl, bounds: False

    def pooled(Y, ATT, i, vecs, geo, fns, params, slots, li, seq, pos, cos, sin, ctrl, bounds):
        if not _rows_job_fits(ctrl, bounds.shape[0] - 1):
            return False
        _attend_rows_job(Y, ATT, i, vecs, geo, fns, params, slots, li, seq, pos, cos, sin, ctrl, bounds)
        return True
    return pooled


@njit(**_STEP)
def _attend_rows(Y, ATT, i, vecs, geo, fns, params, slots, li, seq, pos, cos, sin, par):
    """Every row's attention (Y's q|k|v -> ATT): a ROWS_JOB when the running pool takes it and the rows
    belong to several sequences (float32 caches), else in order on this thread."""
    ctrl = par[0]
    if _rows_on_pool(Y, ATT, i, vecs, geo, fns, params, slots, li, seq, pos, cos, sin, ctrl, _runs(seq)):
        return
    for j in range(Y.shape[0]):  # in order: a span's later rows see the K/V its earlier rows stored
        kc, vc, kpos, ring, row = _row_slot(slots, li, seq[j], pos[j])
        _attend_row(Y[j], vecs, geo, fns, params, kc, vc, kpos, ring, row, pos[j], cos[j], sin[j], ATT[j], ctrl)


@njit(**JIT)
def decode_rows(X, layers, i, slots, li, seq, pos, cos, sin, chunks, par):
    """decode_layer on every row of X f32 [N, d] (updated in place): one token of each of several
    sequences and/or spans of several tokens of one sequence.

    Row j is the token of sequence seq[j] at position pos[j]; its K/V go to that sequence's cache:
    slots[seq[j]][li] = (kc, vc, kpos, ring) of layer li (a typed list per sequence, see
    archrun.kernels.decode.fusion.DecodeSteps.slot_lists; C-contiguous arrays, as pos and cos/sin). cos/sin f32
    [N, n_rot / 2]: row j's rotary angles. A span's rows run their attention in order, so its row j
    sees its rows before j; the runs of rows of different sequences share the running pool when it
    holds `layers` (pool.ROWS_JOB).

    Every per-row part is the one-token step's own (the same parts, called the same way), and each
    product reads every weight block once for all N rows while computing each row exactly as the
    one-token product does (per-row 8-bit activation blocks, the same per-block accumulation:
    kernels.matmul.dots): each row's result is bit-identical to decode_layer's on that token alone.
    """
    qkv, o_mat, gate_up, down, vecs, geo, fns, params = layers[i]
    n, d = X.shape
    H = np.empty((n, d), _F32)
    for j in range(n):
        _pre_norm(X[j], vecs, fns, params, H[j])
    Y = np.empty((n, _qkv_width(geo)), _F32)
    product_group_rows(par, geo[G_QKV], qkv, H, Y, chunks)
    ATT = np.empty((n, geo[G_HEADS] * geo[G_VD]), _F32)
    _attend_rows(Y, ATT, i, vecs, geo, fns, params, slots, li, seq, pos, cos, sin, par)
    for j in range(n):
        _sub_norm(ATT[j], vecs[V_ATTN_SUB], fns, params)
    A = np.empty((n, d), _F32)
    product_group_rows(par, geo[G_O], o_mat, ATT, A, chunks)
    n_ff = geo[G_FF]
    G = np.empty((n, d), _F32)
    for j in range(n):
        _post_attn(A[j], vecs, fns, params)
        if n_ff == 0:  # a block without FFN: the residual's combine with a zero FFN output
            fns[F_RES_OUT][0](params[P_RES], X[j], A[j], np.zeros(d, _F32))
        else:
            G[j] = ffn_input(X[j], A[j], H[j], vecs, fns, params)
    if n_ff == 0:
        return
    GU = np.empty((n, 2 * n_ff if geo[G_GATED] else n_ff), _F32)
    product_group_rows(par, geo[G_GU], gate_up, G, GU, chunks)
    ACT = np.empty((n, n_ff), _F32)
    for j in range(n):
        _activate(GU[j], ACT[j], geo, fns, params)
        _sub_norm(ACT[j], vecs[V_FFN_SUB], fns, params)
    F = np.empty((n, d), _F32)
    product_group_rows(par, geo[G_DOWN], down, ACT, F, chunks)
    for j in range(n):
        join(X[j], A[j], F[j], vecs, fns, params)


# -- the decode pool's workers ---------------------------------------------------------------------


@njit(**JIT)
def serve(ctrl, groups, tasks, layers, pxf, xq, dq, hq, py, idle_ticks, idle_spins):
    """A pool worker: compute claimed chunks of published jobs (groups[gid]: 3 uniform matrices;
    tasks[id]: a task's function value, called with the pool's args block; pool.ROWS_JOB: the attention
    of a batch's rows of the dense layer layers[i], attend_run; layers None: no such jobs)
    until the pool says sleep, or no job came for idle_ticks time-stamp ticks (or idle_spins spins)."""
    par = (ctrl, pxf, xq, dq, hq, py)
    idle = 0
    last = atomics.ticks()
    n_groups = len(groups)
    # read-ahead (block.prefetch_group): group ahead_gid from line ahead_pos on, `ahead` lines past the last
    # product group seen (seen); a worker that saw none yet reads nothing ahead
    seen, ahead_gid, ahead_pos, ahead = -1, 0, 0, 0
    ahead_ms = groups[0]
    while idle < idle_spins and atomics.ticks() - last <= idle_ticks:
        c, w = pool.claim(ctrl)
        if c >= 0:
            gid = pool.job_group(w)
            if gid < pool.TASK_BIT and gid != seen:  # a new product group: read ahead from the one after it
                if seen >= 0 and ahead_gid != gid and (ahead_gid - gid) % n_groups < (ahead_gid - seen) % n_groups:
                    ahead -= block.prefetch_group(groups[gid], 0, 0)  # ahead of it already: keep going
                else:
                    ahead_gid, ahead_pos, ahead = (gid + 1) % n_groups, 0, 0
                    ahead_ms = groups[ahead_gid]
                seen = gid
            if gid == pool.ROWS_JOB:
                if layers is not None:
                    attend_run_of(layers, ctrl[pool.ARGS:], c)
                atomics.add(ctrl, pool.WORKER_TASK_CHUNKS, 1)
            elif gid >= pool.TASK_BIT:
                tasks[gid - pool.TASK_BIT][0](ctrl[pool.ARGS:], c)
                atomics.add(ctrl, pool.WORKER_TASK_CHUNKS, 1)
            else:
                ms = groups[gid]
                n_total = ms[0][block._NOUT] + ms[1][block._NOUT] + ms[2][block._NOUT]
                xs, X, DX, QH, ys = block._pool_views(par, atomics.load(ctrl, pool.N), atomics.load(ctrl, pool.N_IN),
                                                n_total)
                block._group_chunk(ms, c, pool.job_chunks(w), xs, X, DX, QH, ys)
            pool.worker_done(ctrl)
            idle = 0
            last = atomics.ticks()
        elif c == -1:
            if pool.should_sleep(ctrl):
                return
            if seen >= 0 and ahead < ctrl[pool.READ_AHEAD]:
                total = block.prefetch_group(ahead_ms, ahead_pos, ahead_pos + pool.READ_AHEAD_SLICE)
                ahead_pos += pool.READ_AHEAD_SLICE
                ahead += pool.READ_AHEAD_SLICE
                if ahead_pos >= total:
                    ahead_gid, ahead_pos = (ahead_gid + 1) % n_groups, 0
                    ahead_ms = groups[ahead_gid]
                continue
            atomics.pause()
            idle += 1
