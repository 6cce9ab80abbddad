"""Fused decode blocks: one jitted call per layer for a single token (the fused block style's fast path).

A layer runs fused when every op bound to it carries a kernel part (archrun.kernels.decode.parts:
`op.fused`, and the residual op's `fused_input`) and every weight is prepared for the fast
kernels. Dense layers run archrun.kernels.decode.layer.decode_layer (their arguments in one typed
list), whose parts are first-class function values: any op, from any plugin, decodes fused.
A layer whose FFN op brings its own layer kernel (`ffn_op.fused_layer`, e.g. a mixture of
experts) runs that. A token mixer's layer (a recurrent layer: a short convolution, a state-space
model, a delta rule) runs its mixer op's layer kernel (`mixer_op.fused_layer(common, group_id=None)`,
a MixerBlock): the op computes the mixer's output from the block's normed input and hands it to
kernels.decode.layer's `mixer_output` (a layer whose FFN is a mixture of experts: fused_layer gets
the layer's bound MoeFfn as `moe=`, and its kernel runs that FFN too or it answers None); the layer's
recurrent state reaches the kernel through the op's `slot_arrays(slot, start)` (the state arrays
of the token at `start`, updated in place). A token mixer beside the attention (a parallel layer) brings
that layer's kernel too (`mixer_op.fused_beside(layer, group_id=None)`, a BesideBlock: the dense layer's
arguments, to which its kernel adds the mixer's output). An attention op with its own projection layout (e.g.
latent attention) brings its layer's kernel the same way (`fuse_attention_layer`:
`op.fused_layer(qkv, o, common, moe, group_id=None)`). Ops without parts, and the reference
backend, keep the op-by-op path, which computes the same block. The
core only moves parts and arrays into the kernel: it knows no math.

On more than one thread, the products of a one-token step (every layer's product groups and the
output head) are shared with a worker pool (kernels.decode.pool.DecodePool) when every layer takes part:
dense layers do, and so does an FFN op's layer kernel that registers its products (its
`fused_layer(weights, common, group_id)` calls group_id, e.g. a mixture of experts: router and
experts). `DecodeSteps.running()` wakes its workers for one step.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from numba.core.errors import TypingError

from archrun.contracts import OpCapabilities
from archrun.errors import ContextOverflow, InvalidRequest
from archrun.io.weights import Matrix
from archrun.kernels.decode import block, layer, pool
from archrun.kernels.decode.lists import typed_list
from archrun.kernels.decode.parts import NO_ACTIVATION, NO_ROPE, Part, activation_part, compiled_for, is_gated, usable
from archrun.kernels.matmul import qmatrix
from archrun.run.plan import DenseFfn, LayerPlan, Projections

_EMPTY_F32 = np.empty(0, np.float32)
# Most rows one multi-row pass (kernels.decode.layer.decode_rows) takes: decode batches and verification spans
# (speculative decoding drafts at most 16 tokens). The pool's buffers grow to hold that many rows of every
# product, the output head's included; longer spans (prompt chunks) take the prefill's int8 GEMM.
ROWS_MAX = 32


def _vec(v: np.ndarray | None) -> np.ndarray:
    return _EMPTY_F32 if v is None else np.ascontiguousarray(v, dtype=np.float32)


def _uniforms(matrices: list[Matrix], width: int) -> tuple | None:
    """`width` uniform matrices (absent ones padding a stacked product), or None if one is not prepared."""
    prepared = [m.prepared for m in matrices]
    if any(q is None for q in prepared):
        return None
    us = [block.uniform(q, m.bias) for q, m in zip(prepared, matrices, strict=True)]
    return tuple(us + [block.absent_matrix()] * (width - len(us)))


class FusedBlock:
    """One layer's decode step as one kernel call: `fb(x, slot, start, angles)` updates x f32 [d] in place."""

    pooled = False  # an op's layer kernel whose products go to the decode pool (set by fuse_layer)

    def __init__(self, kernel: Any, args: tuple | None, slot_arrays: Any, rope: int, parallel: bool,
                 layer_args: tuple | None = None):
        self._kernel = kernel       # layer.decode_layer or an FFN op's layer kernel
        self._args = args           # the kernel's arguments before the cache ones (None: from layer_args)
        self.layer_args = layer_args  # a dense layer's (qkv .. params), listed by _share_dense_args
        self._slot_arrays = slot_arrays
        self._rope = rope           # index into the per-token rope angles (-1: no rope)
        self._parallel = parallel   # big enough to split products over the threads

    def __call__(self, x: np.ndarray, slot: Any, start: int, angles: list, par: tuple = pool.NO_POOL) -> None:
        if self._args is None:  # a layer on its own: its one-item list (built once)
            self._args = (typed_list([self.layer_args]), np.int64(0))
        chunks = qmatrix.current_threads() if self._parallel and par is pool.NO_POOL else 1
        self._kernel(x, *self._args, *self._cache_args(slot, start, angles), chunks, par)

    def _cache_args(self, slot: Any, start: int, angles: list) -> tuple:
        """(kc, vc, kpos, ring, row, pos, cos, sin) of the token at `start` in the attention's slot."""
        k, v, kpos, ring = self._slot_arrays(slot)
        if ring:
            row = start % k.shape[0]
        elif start < k.shape[0]:
            row = start
        else:
            raise ContextOverflow(f"position {start} is past the cache slot's {k.shape[0]} rows")
        if self._rope >= 0:
            cos, sin = angles[self._rope]
            cos, sin = cos[0], sin[0]
        else:
            cos = sin = _EMPTY_F32
        return k, v, kpos, ring, row, start, cos, sin

    @property
    def dense(self) -> bool:
        """Whether this layer runs kernels.decode.layer's dense block (and so `rows` too)."""
        return self.layer_args is not None

    def rows(self, x: np.ndarray, slots: Any, li: int, seq: np.ndarray, pos: np.ndarray, angles: list,
             par: tuple = pool.NO_POOL) -> None:
        """This dense layer on rows x f32 [N, d] (C-contiguous, in place): row j is the token at position
        pos[j] of sequence seq[j], whose cache slots are slots[seq[j]] (DecodeSteps.slot_lists) and this
        layer is trunk layer li; angles: the rope tables' (cos, sin) [N, n_rot / 2] of the rows.
        Each row's result is bit-identical to this layer's one-token step on it (kernels.decode.layer.decode_rows)."""
        if self._args is None:
            self._args = (typed_list([self.layer_args]), np.int64(0))
        if self._rope >= 0:
            cos, sin = (np.ascontiguousarray(a) for a in angles[self._rope])  # the pool's workers read addresses
        else:
            cos = sin = np.empty((x.shape[0], 0), np.float32)
        chunks = qmatrix.current_threads() if self._parallel and par is pool.NO_POOL else 1
        layer.decode_rows(x, *self._args, slots, np.int64(li), seq, pos, cos, sin, chunks, par)


class MixerBlock(FusedBlock):
    """A token mixer's layer as one kernel call, the mixer op's own (its `fused_layer`): `fb(x, slot, start,
    angles)` updates x f32 [d] and the layer's recurrent state in place. The op's `slot_arrays(slot, start)`
    checks that the slot's state continues at `start` and gives the state arrays the kernel reads and
    updates (a tuple), passed after the op's own arguments: kernel(x, *args, state, chunks, par)."""

    def __init__(self, kernel: Any, args: tuple, slot_arrays: Any, parallel: bool):
        super().__init__(kernel, args, slot_arrays, -1, parallel)

    def __call__(self, x: np.ndarray, slot: Any, start: int, angles: list, par: tuple = pool.NO_POOL) -> None:
        state = self._slot_arrays(slot, start)
        chunks = qmatrix.current_threads() if self._parallel and par is pool.NO_POOL else 1
        self._kernel(x, *self._args, state, chunks, par)


class BesideBlock(FusedBlock):
    """A layer whose token mixer runs beside its attention (the interpreter's PairSlot) as one kernel call, the
    mixer op's own (its `fused_beside`): `fb(x, slot, start, angles)` updates x f32 [d], the attention's cached
    rows and the mixer's state in place. The kernel is called as kernel(x, *args, kc, vc, kpos, ring, row, pos,
    cos, sin, state, chunks, par): the attention's slot arrays as a dense layer's, then the mixer op's
    `slot_arrays(slot.mixer, start)`."""

    def __init__(self, kernel: Any, args: tuple, slot_arrays: Any, mixer_arrays: Any, rope: int, parallel: bool):
        super().__init__(kernel, args, slot_arrays, rope, parallel)
        self._mixer_arrays = mixer_arrays

    def __call__(self, x: np.ndarray, slot: Any, start: int, angles: list, par: tuple = pool.NO_POOL) -> None:
        state = self._mixer_arrays(slot.mixer, start)
        chunks = qmatrix.current_threads() if self._parallel and par is pool.NO_POOL else 1
        self._kernel(x, *self._args, *self._cache_args(slot.attention, start, angles), state, chunks, par)


class EmptyMixerBlock(MixerBlock):
    """A layer whose token mixer adds nothing and keeps no state (its op declares `empty`, e.g. an FFN-only
    block) as one kernel call (kernels.decode.layer.empty_mixer_layer): `fb(x, slot, start, angles)` updates
    x f32 [d] in place; the slot (which holds nothing) is not read."""

    def __init__(self, common: Any, parallel: bool):
        FusedBlock.__init__(self, layer.empty_mixer_layer, (common,), None, -1, parallel)

    def __call__(self, x: np.ndarray, slot: Any, start: int, angles: list, par: tuple = pool.NO_POOL) -> None:
        chunks = qmatrix.current_threads() if self._parallel and par is pool.NO_POOL else 1
        self._kernel(x, *self._args, chunks, par)


def fused_part(op: Any, caps: OpCapabilities, slot: str) -> Part | None:
    """The Part `op.fused` of an op that declares one, usable by the layer kernel for `slot`; else None."""
    return usable(op.fused, slot) if caps.fused else None


def dense_activation(ffn: DenseFfn, caps: OpCapabilities) -> Part | None:
    """The activation part of a dense FFN's op: either kind (kernels.decode.parts.activation_part), a gated one
    only in a gated FFN (it reads up); else None."""
    act = activation_part(ffn.act.fused) if caps.fused else None
    return None if act is None or (is_gated(act) and not ffn.gated) else act


def attention_part(op: Any, caps: OpCapabilities, kv_type: str = "f32") -> Part | None:
    """The attention op's Part for caches of kv_type: `op.fused` for f32, else `op.fused_for(kv_type)`
    (compiled for SIGNATURES["attention:<kv type>"]), or None when it declares none."""
    if kv_type == "f32":
        return fused_part(op, caps, "attention")
    if not caps.fused_for or op.fused_for is None:
        return None
    return usable(op.fused_for(kv_type), f"attention:{kv_type}")


def _parts(lp: LayerPlan, norm: Any, rope: Any, kv_type: str,
           declared: Callable[[Any], OpCapabilities]) -> tuple[tuple, tuple] | None:
    """(fns, params) of the layer's parts in kernels.decode.layer's order, or None when an op declares none
    (declared: what a bound op declares, the binder's)."""
    if lp.ffn is None:  # a block without FFN: the activation slot is never called
        act = NO_ACTIVATION
    elif isinstance(lp.ffn, DenseFfn):
        act = dense_activation(lp.ffn, declared(lp.ffn.act))
    else:
        moe = declared(lp.ffn.moe)
        act = activation_part(lp.ffn.moe.act_part) if moe.act_part else None
    residual, attention = declared(lp.residual), declared(lp.attention)
    found = [fused_part(norm, declared(norm), "norm"),
             NO_ROPE if rope is None else fused_part(rope, declared(rope), "rope"),
             attention_part(lp.attention, attention, kv_type), act,
             usable(lp.residual.fused_input, "residual") if residual.fused_input else None,
             fused_part(lp.residual, residual, "residual")]
    if any(p is None for p in found) or not attention.slot_arrays or lp.attention.slot_arrays is None:
        return None
    fns = tuple(p.value for p in found)
    params = tuple(p.params for p in found[:5])  # the residual's two functions share its parameters
    return fns, params


def _geo(lp: LayerPlan, rope_on: bool, ids: list[int], task: int) -> tuple:
    a = lp.spec.attention
    dense = isinstance(lp.ffn, DenseFfn)
    n_ff = lp.ffn.down.n_in if dense else 0
    gated = int(dense and lp.ffn.gated)
    return tuple(int(g) for g in (a.n_head, a.n_head_kv, a.head_dim, a.v_head_dim, n_ff, gated, rope_on, *ids,
                                  a.qk_norm_after_rope, task, a.qk_norm_per_head))


def _vecs(lp: LayerPlan) -> tuple:
    """The layer kernel's vecs (kernels.decode.layer), flat: per-head q/k norm rows [H, hd] as [H * hd]."""
    c = lp.spec.attention.clamp_kqv
    clamp = np.array([c], np.float32) if c else None
    sub = lp.ffn.sub_norm if isinstance(lp.ffn, DenseFfn) else None
    return tuple(_vec(v).reshape(-1) for v in (lp.attn_norm, lp.attn_norm_b, lp.q_norm, lp.k_norm, lp.post_attn_norm,
                                               lp.ffn_norm, lp.ffn_norm_b, lp.post_ffn_norm, clamp, lp.attn_sub_norm,
                                               None if sub is None else sub.weight))


def _sub_norms_fuse(lp: LayerPlan, norm_part: Part, declared: Callable[[Any], OpCapabilities]) -> bool:
    """Whether the layer kernel computes the block's sub-layer norms (an attention output's, `attn_sub_norm`,
    normed by the block's norm op; a dense FFN's hidden's, `DenseFfn.sub_norm`): the FFN's sub-norm must be
    a norm op bound with its weight (`.op`, `.weight`) whose part is the block norm's (the same function and
    parameters), so the block's norm part computes it."""
    sub = lp.ffn.sub_norm if isinstance(lp.ffn, DenseFfn) else None
    if sub is None:
        return True
    op, w = getattr(sub, "op", None), getattr(sub, "weight", None)
    p = None if op is None else fused_part(op, declared(op), "norm")
    return (p is not None and isinstance(w, np.ndarray) and w.shape == (lp.ffn.down.n_in,)
            and p.fn is norm_part.fn and np.array_equal(p.params, norm_part.params))


def _task_id(tasks: list | None, op: Any, caps: OpCapabilities) -> int:
    """Register the attention op's pool task (`op.pool_task`, compiled for SIGNATURES["task"]) for the
    decode pool, once per function; its id, or -1 when there is no pool or the op declares no task."""
    fn = op.pool_task if caps.pool_task else None
    if tasks is None or fn is None or not compiled_for(fn, "task"):
        return -1
    for i, t in enumerate(tasks):
        if t is fn:
            return i
    tasks.append(fn)
    return len(tasks) - 1


def _group_id(groups: list[tuple], ms: tuple, n_in: int) -> int:
    """Register a product group (3 uniform matrices of input width n_in) for the decode pool; its id."""
    groups.append((ms, n_in))
    return len(groups) - 1


def _ffn_products(lp: LayerPlan) -> tuple | None:
    """(gate_up, down) uniform groups of the layer's dense FFN (absent ones without an FFN), or None when a
    matrix is not prepared."""
    if lp.ffn is None:
        absent = (block.absent_matrix(),) * 3
        return absent, absent
    gate_up, down = _uniforms(lp.ffn.gate_up.matrices, 3), _uniforms([lp.ffn.down], 3)
    return None if gate_up is None or down is None else (gate_up, down)


def _own_kernel_common(lp: LayerPlan, norm: Any, rope: Part, declared: Callable[[Any], OpCapabilities],
                       groups: list[tuple] | None) -> tuple | None:
    """(common, pool groups before the op's) for an op that brings the layer's kernel (a token mixer's, or an
    attention op's with its own projection layout): common is a typed list of the block's (gate_up, down, vecs,
    geo, fns, params) (kernels.decode.layer: geo's FFN fields and pool ids of a dense FFN, n_ff 0 without one
    or with a mixture of experts, whose op the layer's op runs; fns' attention entry a placeholder), or None
    when a part is missing or the FFN has a norm inside."""
    dense = isinstance(lp.ffn, DenseFfn)
    if dense and lp.ffn.sub_norm is not None:
        return None  # a norm inside the FFN: op by op
    residual = declared(lp.residual)
    act = dense_activation(lp.ffn, declared(lp.ffn.act)) if dense else NO_ACTIVATION
    found = [fused_part(norm, declared(norm), "norm"), rope, NO_ROPE, act,  # (no attention part)
             usable(lp.residual.fused_input, "residual") if residual.fused_input else None,
             fused_part(lp.residual, residual, "residual")]
    absent = (block.absent_matrix(),) * 3
    products = _ffn_products(lp) if dense or lp.ffn is None else (absent, absent)
    if any(p is None for p in found) or products is None:
        return None
    gate_up, down = products
    ids = [-1] * 4  # pool groups of (qkv, o: the op's own), gate_up, down
    if groups is not None and dense:
        ids[2:] = [_group_id(groups, gate_up, lp.ffn.gate_up.matrices[0].n_in),
                   _group_id(groups, down, lp.ffn.down.n_in)]
    fns = tuple(p.value for p in found)
    params = tuple(p.params for p in found[:5])
    geo = _geo(lp, rope is not NO_ROPE, ids, -1)
    return typed_list([(gate_up, down, _vecs(lp), geo, fns, params)]), len(groups) if groups is not None else 0


def fuse_mixer(lp: LayerPlan, norm: Any, declared: Callable[[Any], OpCapabilities],
               groups: list[tuple] | None = None) -> MixerBlock | None:
    """The fused decode step of a token mixer's layer (its op's `fused_layer`), or None when it must run op
    by op (an op without a layer kernel or parts, an FFN that is neither a dense product pair nor a mixture of
    experts the op's kernel takes: fused_layer gets the layer's bound MoeFfn as `moe` and answers None)."""
    op, caps = lp.attention, declared(lp.attention)
    if not (caps.fused_layer and caps.slot_arrays) or op.fused_layer is None or op.slot_arrays is None:
        return None
    # a mixture of experts: the op's layer kernel runs it too, or its fused_layer answers None (op by op)
    moe = None if lp.ffn is None or isinstance(lp.ffn, DenseFfn) else lp.ffn
    made = _own_kernel_common(lp, norm, NO_ROPE, declared, groups)
    if made is None:
        return None
    common, first = made
    made = (op.fused_layer(common, moe=moe) if groups is None else
            op.fused_layer(common, lambda ms, n_in: _group_id(groups, ms, n_in), moe=moe))
    if made is None:
        return None
    kernel, args, big = made
    fb = MixerBlock(kernel, args, op.slot_arrays, big)
    fb.pooled = groups is not None and len(groups) > first  # the op registered its products
    return fb


def fuse_empty_mixer(lp: LayerPlan, norm: Any, declared: Callable[[Any], OpCapabilities],
                     groups: list[tuple] | None = None) -> EmptyMixerBlock | None:
    """The fused decode step of a layer whose token mixer declares `empty` (it adds nothing and keeps no
    state) and whose FFN is a dense product pair, or None (op by op). With `groups`, the FFN's product
    groups are registered for the decode pool (they are all the layer's products)."""
    if not isinstance(lp.ffn, DenseFfn):
        return None
    made = _own_kernel_common(lp, norm, NO_ROPE, declared, groups)
    if made is None:
        return None
    fb = EmptyMixerBlock(made[0], lp.ffn.down.prepared.nbytes >= qmatrix.PARALLEL_MIN_BYTES)
    fb.pooled = groups is not None
    return fb


def fuse_attention_layer(lp: LayerPlan, norm: Any, ropes: list, declared: Callable[[Any], OpCapabilities],
                         groups: list[tuple] | None = None) -> FusedBlock | None:
    """The fused decode step of a layer whose attention op brings the layer's kernel (`fused_layer`: an op with
    its own projection layout, e.g. latent attention), or None when it must run op by op. The op gets its
    layout's bound (qkv, o), the block's common list and the layer's mixture of experts (its bound MoeFfn, or
    None for a dense FFN, whose products are common's); its kernel is called as kernel(x, *args, kc, vc, kpos,
    ring, row, pos, cos, sin, chunks, par) with its slot_arrays and the layer's rope angles at pos."""
    op, caps = lp.attention, declared(lp.attention)
    if not (caps.fused_layer and caps.slot_arrays) or op.fused_layer is None or op.slot_arrays is None:
        return None
    a = lp.spec.attention
    rope = ropes[a.rope]
    rope_part = NO_ROPE if rope is None else fused_part(rope, declared(rope), "rope")
    made = None if rope_part is None else _own_kernel_common(lp, norm, rope_part, declared, groups)
    if made is None:
        return None
    common, first = made
    moe = None if isinstance(lp.ffn, DenseFfn) else lp.ffn
    made = (op.fused_layer(lp.qkv, lp.o, common, moe) if groups is None else
            op.fused_layer(lp.qkv, lp.o, common, moe, lambda ms, n_in: _group_id(groups, ms, n_in)))
    if made is None:
        return None
    kernel, args, big = made
    fb = FusedBlock(kernel, args, op.slot_arrays, a.rope if rope is not None else -1, big)
    fb.pooled = groups is not None and len(groups) > first  # the op registered its products
    return fb


def fuse_layer(lp: LayerPlan, norm: Any, ropes: list, declared: Callable[[Any], OpCapabilities],
               groups: list[tuple] | None = None, kv_type: str = "f32", tasks: list | None = None) -> FusedBlock | None:
    """The fused decode step of a bound layer over caches of kv_type, or None when it must run op by op.

    declared: what each bound op declares it carries (the plan's binder.declared; archrun.contracts).
    groups: when given, a dense layer's product groups are appended (pool group ids); tasks: when given,
    the attention op's pool task, unless already there (pool task ids).
    """
    if lp.mixer is not None:
        if lp.parallel is not None:
            return None
        if declared(lp.attention).empty:  # no token mixer: the block's norm and FFN
            return fuse_empty_mixer(lp, norm, declared, groups)
        return fuse_mixer(lp, norm, declared, groups)
    beside = lp.parallel
    if beside is not None:
        caps = declared(beside)
        if not (caps.fused_beside and caps.slot_arrays) or beside.fused_beside is None or beside.slot_arrays is None:
            return None  # a token mixer beside the attention without its layer kernel: op by op
        if (lp.ffn is not None and not isinstance(lp.ffn, DenseFfn)) or declared(lp.attention).fused_layer:
            return None  # a mixture of experts or an attention layout of its own beside a mixer: op by op
    sub_norms = lp.attn_sub_norm is not None or (isinstance(lp.ffn, DenseFfn) and lp.ffn.sub_norm is not None)
    if declared(lp.attention).fused_layer:  # an attention op with its own layout and layer kernel
        if sub_norms or lp.ffn is None:
            return None  # norms inside the branches, or no FFN, which an op's own kernel does not take: op by op
        return fuse_attention_layer(lp, norm, ropes, declared, groups) if kv_type == "f32" else None
    a = lp.spec.attention
    rope = ropes[a.rope]
    found = _parts(lp, norm, rope, kv_type, declared)
    if found is None or not isinstance(lp.qkv, Projections) or not isinstance(lp.o, Matrix):
        return None  # an op without a kernel part, or an attention op's own projection layout
    if sub_norms and not (isinstance(lp.ffn, DenseFfn) and _sub_norms_fuse(lp, fused_part(norm, declared(norm),
                                                                                          "norm"), declared)):
        return None  # sub-layer norms in a mixture's layer (its op's kernel), or not the block's norm: op by op
    qkv, o = _uniforms(lp.qkv.matrices, 3), _uniforms([lp.o], 3)
    if qkv is None or o is None:
        return None
    fns, params = found
    rope_index = a.rope if rope is not None else -1
    task = _task_id(tasks, lp.attention, declared(lp.attention))
    if lp.ffn is not None and not isinstance(lp.ffn, DenseFfn):  # an FFN op with its own layer kernel (e.g. MoE)
        fused_layer = lp.ffn.moe.fused_layer if declared(lp.ffn.moe).fused_layer else None
        ids, first = [-1] * 4, len(groups) if groups is not None else 0
        if groups is not None:  # the attention's groups; the op registers its own through group_id
            ids[:2] = [_group_id(groups, qkv, lp.qkv.matrices[0].n_in), _group_id(groups, o, lp.o.n_in)]
        common = typed_list([(qkv, o, _vecs(lp), _geo(lp, rope is not None, ids, task), fns, params)])
        made = None
        if fused_layer is not None:
            made = (fused_layer(lp.ffn.weights, common) if groups is None else
                    fused_layer(lp.ffn.weights, common, lambda ms, n_in: _group_id(groups, ms, n_in)))
        if made is None:
            return None
        kernel, args, big = made
        fb = FusedBlock(kernel, args, lp.attention.slot_arrays, rope_index, big)
        fb.pooled = groups is not None and len(groups) > first + 2  # the op registered its products
        return fb
    products = _ffn_products(lp)  # absent ones in a block without FFN
    if products is None:
        return None
    gate_up, down = products
    ids = [-1] * 4  # pool groups of qkv, o, gate_up, down
    if groups is not None:
        ids[:2] = [_group_id(groups, qkv, lp.qkv.matrices[0].n_in), _group_id(groups, o, lp.o.n_in)]
        if lp.ffn is not None:
            ids[2:] = [_group_id(groups, gate_up, lp.ffn.gate_up.matrices[0].n_in),
                       _group_id(groups, down, lp.ffn.down.n_in)]
    args = (qkv, o, gate_up, down, _vecs(lp), _geo(lp, rope is not None, ids, task), fns, params)
    parallel = lp.o.prepared.nbytes >= qmatrix.PARALLEL_MIN_BYTES
    if beside is not None:  # the mixer's kernel, with this layer's arguments
        group_id = None if groups is None else (lambda ms, n_in: _group_id(groups, ms, n_in))
        made = beside.fused_beside(typed_list([args]), group_id)
        if made is None:
            return None
        kernel, own, big = made
        fb = BesideBlock(kernel, own, lp.attention.slot_arrays, beside.slot_arrays, rope_index, parallel or big)
        fb.pooled = groups is not None
        return fb
    return FusedBlock(layer.decode_layer, None, lp.attention.slot_arrays, rope_index, parallel, layer_args=args)


def fuse_layers(plan: Any, groups: list[tuple] | None = None, kv_type: str = "f32",
                tasks: list | None = None) -> list[FusedBlock] | None:
    """Fused steps of every trunk layer over caches of kv_type, or None when any layer must run op by op."""
    blocks = []
    for lp in plan.layers:
        fb = fuse_layer(lp, plan.norm, plan.ropes, plan.binder.declared, groups, kv_type, tasks)
        if fb is None:
            return None
        blocks.append(fb)
    _share_dense_args(blocks)
    return blocks


def _share_dense_args(blocks: list[FusedBlock]) -> None:
    """Dense layers share one typed list of their arguments (when all of them have one numba type,
    as every dense layer built here does; else each keeps its own one-item list)."""
    dense = [fb for fb in blocks if fb.layer_args is not None]
    if not dense:
        return
    try:  # (reading items back from a typed list in Python would compile its methods: ~30 s)
        layers = typed_list([fb.layer_args for fb in dense])
    except TypingError:  # layers of different argument types: each keeps its own list
        return
    for i, fb in enumerate(dense):
        fb._args = (layers, np.int64(i))


def _row_slots(blocks: list[FusedBlock], slots: list) -> list[tuple]:
    """(k, v, kpos, ring) of every layer's slot as the multi-row kernel reads them; a token mixer's layer
    (which runs op by op on rows) gets empty arrays of the attention layers' types in its place."""
    arrays = [None if isinstance(fb, MixerBlock) else fb._slot_arrays(slot)
              for fb, slot in zip(blocks, slots, strict=True)]
    k, v, kpos, _ = next(a for a in arrays if a is not None)
    empty = (np.empty((0,) * 3, k.dtype), np.empty((0,) * 3, v.dtype), np.empty(0, kpos.dtype), True)
    return [empty if a is None else a for a in arrays]


class DecodeSteps:
    """A model's fused one-token step: its layers' FusedBlocks, the output head, and the worker pool
    that shares their products when the model is dense and runs on more than one thread."""

    def __init__(self, plan: Any):
        groups: list[tuple] = []
        self._tasks: list = []  # the attention ops' pool tasks (kernels.decode.pool), by task id
        # a plan loaded with fused=False runs op by op: no fused blocks, no multi-row kernel, no pool
        self.blocks = fuse_layers(plan, groups, tasks=self._tasks) if plan.fused else None
        # plan.output is None on a pipeline stage before the last (archrun.pipeline): it has no head
        head = _uniforms([plan.output], 3) if self.blocks is not None and plan.output is not None else None
        self._head_id = _group_id(groups, head, plan.output.n_in) if head is not None else -1
        self._head = head
        self._output = plan.output
        shared = self.blocks is not None and all(fb._kernel is layer.decode_layer or fb.pooled for fb in self.blocks)
        headless = plan.output is None
        self._groups = groups if shared and (head is not None or headless) and pool.enabled() else None
        self._pool: pool.DecodePool | None = None
        self._plan = plan
        self._by_kv_type: dict[str, list[FusedBlock] | None] = {"f32": self.blocks}
        self._pool_rows = 0  # rows of activations the pool's buffers hold
        self._slot_lists: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def blocks_for(self, kv_type: str) -> list[FusedBlock] | None:
        """The fused steps over caches of kv_type (built on the first such cache, then kept), or None when
        an op has no part for it. Their product groups are the f32 blocks' (the same pool ids: the layers
        are fused in the same order), and so are their pool tasks'."""
        if kv_type not in self._by_kv_type:
            pooled = self._groups is not None
            self._by_kv_type[kv_type] = None if self.blocks is None else fuse_layers(
                self._plan, [] if pooled else None, kv_type, [] if pooled else None)
        return self._by_kv_type[kv_type]

    @property
    def rows_ready(self) -> bool:
        """Whether several rows can run through the dense layers' kernel (decode_rows): every layer fused
        and at least one of them dense (the others, e.g. a mixture of experts, run op by op on the rows)."""
        return self.blocks is not None and any(fb.dense for fb in self.blocks)

    def _get_pool(self, rows: int = 1) -> pool.DecodePool | None:
        """The pool, with buffers for at least `rows` rows of every product (a pool too small for a batch
        is replaced by a larger one: powers of two; the old one's workers stop when it is dropped)."""
        if self._groups is None:
            return None
        if self._pool is None or self._pool_rows < rows:
            cap = 1 << max(0, rows - 1).bit_length()
            max_in = max(n_in for _, n_in in self._groups)
            max_out = max(sum(int(m[block._NOUT]) for m in ms) for ms, _ in self._groups)
            if self._pool is not None:
                self._pool.rest()
            self._pool = pool.DecodePool([ms for ms, _ in self._groups], max_in * cap, max_out * cap, layer.serve,
                                         tuple(self._tasks), self._shared_layers())
            self._pool_rows = cap
            self._pool.warm_up()  # compile the workers' loop here, not in a worker during a step
        return self._pool

    def _shared_layers(self) -> Any:
        """The typed list of arguments every dense layer reads (`_share_dense_args`), which the pool's
        workers then hold for the attention of a batch's sequences; None when the layers keep lists of
        their own."""
        dense = [fb for fb in self.blocks or () if fb.dense]
        lists = {id(fb._args[0]) if fb._args is not None else None for fb in dense}
        return dense[0]._args[0] if dense and None not in lists and len(lists) == 1 else None

    def slot_lists(self, caches: list, blocks: list[FusedBlock]) -> Any:
        """decode_rows' `slots`: a typed list per cache of its layers' (k, v, kpos, ring) arrays as `blocks`
        read them (built once per cache and kept while its slots are the same objects)."""
        lists = []
        for cache in caches:
            kept = self._slot_lists.get(cache)
            if kept is None or len(kept[0]) != len(cache.slots) or any(
                    a is not b for a, b in zip(kept[0], cache.slots, strict=True)):
                arrays = _row_slots(blocks, cache.slots)
                for k, v, kpos, ring in arrays:
                    if not ring and k.shape[0] < cache.capacity:  # the kernel does not bounds-check
                        raise ContextOverflow(f"a cache slot holds {k.shape[0]} rows, fewer than the cache's "
                                              f"capacity {cache.capacity}")
                    if not all(a.flags.c_contiguous for a in (k, v, kpos)):  # the pool's workers read addresses
                        raise InvalidRequest("a cache slot's arrays must be C-contiguous for the multi-row kernel")
                kept = (tuple(cache.slots), typed_list([(k, v, kpos, bool(ring)) for k, v, kpos, ring in arrays]))
                self._slot_lists[cache] = kept
            lists.append(kept[1])
        return typed_list(lists)

    @contextmanager
    def running(self, rows: int = 1) -> Iterator[tuple]:
        """Kernel arguments of the pool for one step of `rows` rows (pool.NO_POOL on one thread or
        without a pool)."""
        threads = qmatrix.current_threads()
        p = self._get_pool(rows) if threads > 1 else None
        if p is None:
            self.rest()
            yield pool.NO_POOL
            return
        with p.running(threads) as par:
            yield par

    def rest(self) -> None:
        """Send the pool's spinning workers to sleep (before work that needs the cores, e.g. a prefill)."""
        if self._pool is not None:
            self._pool.rest()

    def head(self, hidden: np.ndarray, par: tuple) -> np.ndarray:
        """Logits f32 [n, vocab] = hidden [n, d] @ output.T (no softcap), through the pool when running."""
        if self._head is None:
            return self._output(hidden)
        x = np.ascontiguousarray(hidden, dtype=np.float32)
        y = np.empty((x.shape[0], self._output.n_out), np.float32)
        chunks = qmatrix.current_threads() if par is pool.NO_POOL else 1
        block.pooled_product(par, self._head_id, self._head, x, y, chunks)
        return y

