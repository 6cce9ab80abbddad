"""Fast factories of the core vocabulary, backed by numba kernels.

Each factory has the same contract as its reference twin in archrun_blocks.reference (the
plugin's tests check every pair on random inputs); only the inner computation is swapped
for a kernel. Each fast op also carries its kernel part (`op.fused`, an
archrun.kernels.decode.parts.Part from archrun_blocks.parts) so the fused decode path runs it; the
op-by-op path runs the same part over rows (archrun_blocks.elementwise). Shapes and
validation stay with the callers, which build them from the descriptor, so the kernels never
see an unchecked index.
"""

from __future__ import annotations

import functools

import numpy as np

from archrun.descriptor import AttentionSpec, MoeSpec, RopeSpec
from archrun.errors import ShapeMismatch
from archrun.kernels.decode import pool
from archrun.kernels.decode.parts import Part, activation_part, part, usable
from archrun.kernels.matmul import qmatrix
from archrun_blocks import decode_attention, elementwise, kv_codec, parts, reference
from archrun_blocks import moe_kernels as mk

F32 = np.float32
_NO_POS = np.empty(0, np.int64)


# -- norms ---------------------------------------------------------------------------------------


def _norm(fn, eps: float, offset: float = 0.0):
    p = part(fn, eps, offset)

    def norm(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        shape = x.shape
        x2 = np.ascontiguousarray(x, dtype=F32).reshape(-1, shape[-1])
        return elementwise.norm_rows(p.handle, p.params, x2, w, b).reshape(shape)

    norm.fused = p  # lets archrun.kernels.decode.fusion run it inside a fused decode block
    return norm


def rms_norm(eps: float):
    """RMSNorm over the last axis (any leading shape)."""
    return _norm(parts.rms_norm, eps)


def layer_norm(eps: float):
    """LayerNorm over the last axis (any leading shape)."""
    return _norm(parts.layer_norm, eps)


def rms_norm_1p(eps: float):
    """RMSNorm with unit-offset weights: the part's weight offset is 1."""
    return _norm(parts.rms_norm, eps, 1.0)


def layer_norm_1p(eps: float):
    """LayerNorm with unit-offset weights (LayerNorm1p)."""
    return _norm(parts.layer_norm, eps, 1.0)


# -- rope ----------------------------------------------------------------------------------------


class _FastRope(reference.Rope):
    @property
    def fused(self) -> Part:
        return part(parts.rope, self.n_rot, 1.0 if self.neox else 0.0)

    def __call__(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        return elementwise.rope(np.ascontiguousarray(x, dtype=F32), cos, sin, self.n_rot, self.neox)


def rope_neox(spec: RopeSpec, freq_factors: np.ndarray | None = None, *factors: np.ndarray) -> reference.Rope:
    return _FastRope(spec, freq_factors, True, *factors)


def rope_norm(spec: RopeSpec, freq_factors: np.ndarray | None = None, *factors: np.ndarray) -> reference.Rope:
    return _FastRope(spec, freq_factors, False, *factors)


# -- attention -----------------------------------------------------------------------------------


def _attend(q, k, v, q_pos, k_pos, scale: float, window: int, softcap: float = 0.0,
            slopes: np.ndarray | None = None, sinks: np.ndarray | None = None) -> np.ndarray:
    return elementwise.attention(np.ascontiguousarray(q), np.ascontiguousarray(k), np.ascontiguousarray(v),
                                 np.ascontiguousarray(q_pos, dtype=np.int64),
                                 np.ascontiguousarray(k_pos, dtype=np.int64), scale, window, softcap, slopes,
                                 None if sinks is None else np.ascontiguousarray(sinks, dtype=F32))


def _slot_arrays(slot) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """(k [cap, KV, *], v [cap, KV, *] (stored rows of the slot's kv type), pos int64 [cap or 0], ring) of a
    KvSlot / RingKvSlot: a ring
    keeps each row's position in pos (-1: empty) and stores position p at row p % cap; a plain
    slot stores p at row p."""
    if isinstance(slot, reference.RingKvSlot):
        return slot.k, slot.v, slot.pos, True
    return slot.k, slot.v, _NO_POS, False


class KernelKvCodec:
    """reference.NumpyKvCodec's conversions by archrun_blocks.kv_codec's kernels (the same bits)."""

    @staticmethod
    def encode(kv_type: str, x: np.ndarray) -> np.ndarray:
        """float32 rows x [n, KV, width] -> stored rows of kv_type."""
        x = np.ascontiguousarray(x, dtype=F32)
        out = np.empty((*x.shape[:2], kv_codec.row_width(kv_type, x.shape[2])), kv_codec.KV_DTYPES[kv_type])
        kv_codec.encode_rows(x, out)
        return out

    @staticmethod
    def decode(kv_type: str, raw: np.ndarray) -> np.ndarray:
        """Stored rows raw [n, KV, stored] of kv_type -> float32 [n, KV, width] (float32: as they are)."""
        if kv_type == "f32":
            return raw
        out = np.empty((*raw.shape[:2], kv_codec.value_width(kv_type, raw.shape[2])), F32)
        kv_codec.decode_rows(np.ascontiguousarray(raw), out)
        return out


def _kv_parts(name: str, params: tuple, kv_type: str) -> Part | None:
    """The attention part `name` for caches of kv_type (archrun_blocks.kv_parts, imported on first use)."""
    if kv_type == "f32":
        return part(getattr(parts, name), *params)
    from archrun_blocks import kv_parts

    fn = getattr(kv_parts, f"{name}_{kv_type}", None)
    return None if fn is None else part(fn, *params)


def _with_kernels(op, name: str, params: tuple):
    """op with the kernel attention: op-by-op kernel, kernel row codec, fused parts for every kv type."""
    op.attend = _attend
    op.codec = KernelKvCodec
    op.fused = part(getattr(parts, name), *params)
    op.fused_for = functools.partial(_kv_parts, name, params)  # kv type -> Part (archrun.kernels.decode.fusion)
    op.pool_task = decode_attention.attend_chunk  # the parts' chunks of a long context (decode pool task)
    op.slot_arrays = _slot_arrays  # the fused block reads and writes the cache through these
    return op


class _SinkAttention(reference.CausalAttention):
    """Causal attention with learned per-head sink logits (gpt-oss): its kernel part's parameters hold the
    layer's sinks after the fixed fields (parts.causal_attention), so its parts exist once they are bound."""

    def bind(self, binder, layer: int) -> None:
        super().bind(binder, layer)
        s = self.spec
        if self.sinks is None or np.shape(self.sinks) != (s.n_head,):
            raise ShapeMismatch(f"attn_sinks of layer {layer}: shape {np.shape(self.sinks)}, expected ({s.n_head},)")
        _with_kernels(self, "causal_attention", (s.scale, s.window, s.softcap, *np.asarray(self.sinks, np.float64)))


def causal_attention(spec: AttentionSpec) -> reference.CausalAttention:
    if spec.sinks:  # parts once its sinks are bound (_SinkAttention.bind); the kernel attention op by op
        op = _SinkAttention(spec)
        op.attend, op.codec = _attend, KernelKvCodec
        op.fused = op.fused_for = None
        op.pool_task, op.slot_arrays = decode_attention.attend_chunk, _slot_arrays
        return op
    return _with_kernels(reference.CausalAttention(spec), "causal_attention", (spec.scale, spec.window, spec.softcap))


def alibi_attention(spec: AttentionSpec) -> reference.AlibiAttention:
    op = reference.AlibiAttention(spec)
    return _with_kernels(op, "alibi_attention", (spec.scale, spec.window, spec.softcap, spec.alibi_max_bias,
                                                 spec.n_head, *op.slopes))


# -- activations ---------------------------------------------------------------------------------


def _activation(fn):
    p = part(fn)

    def act(x: np.ndarray, up: np.ndarray | None = None) -> np.ndarray:
        # float32 views pass as they are (column slices of a fused gate/up product: read in place)
        return elementwise.activation(p.handle, p.params, np.asarray(x, dtype=F32),
                                      None if up is None else np.asarray(up, dtype=F32))

    act.fused = p
    return act


def silu():
    return _activation(parts.silu)


def gelu_tanh():
    return _activation(parts.gelu_tanh)


def gelu():
    return _activation(parts.gelu)


def relu2():
    return _activation(parts.relu2)


def swiglu_oai(alpha: float = 1.702, limit: float = 7.0):
    """reference.swiglu_oai by its gated kernel part (parts.swiglu_oai: it reads up itself)."""
    p = part(parts.swiglu_oai, alpha, limit)

    def act(x: np.ndarray, up: np.ndarray | None = None) -> np.ndarray:
        if up is None:
            raise ValueError("swiglu_oai is a gated activation: it needs the up projection")
        return elementwise.gated_activation(p.handle, p.params, np.asarray(x, dtype=F32), np.asarray(up, dtype=F32))

    act.fused = p
    return act


# -- residual topologies -------------------------------------------------------------------------


def sequential(scale: float = 1.0) -> reference.Sequential:
    op = reference.Sequential(scale)
    op.fused_input = part(parts.sequential_input, scale)
    op.fused = part(parts.sequential_combine, scale)
    return op


def parallel(scale: float = 1.0) -> reference.Parallel:
    op = reference.Parallel(scale)
    op.fused_input = part(parts.parallel_input, scale)
    op.fused = part(parts.parallel_combine, scale)
    return op


# -- gating and MoE --------------------------------------------------------------------------------


def gating_softmax():
    probs = reference.gating_softmax()
    probs.fused = part(parts.gating_softmax)  # lets the MoE kernel route inside numba
    return probs


def gating_sigmoid():
    probs = reference.gating_sigmoid()
    probs.fused = part(parts.gating_sigmoid)
    return probs


def gating_sparsemixer(jitter_eps: float = 0.01):
    probs = reference.gating_sparsemixer(jitter_eps)
    probs.fused = part(parts.gating_sparsemixer, jitter_eps)
    return probs


def _moe_arrays(w) -> tuple | None:
    """Kernel arrays of MoeWeights w (moe_kernels.moe_arrays), or None when a matrix is not
    prepared for the fast kernels."""
    shared = tuple(w.shared) if w.shared is not None else ()
    mats = [w.gate_inp, *w.gate, *w.up, *w.down, *shared]
    if any(m.prepared is None for m in mats):
        return None
    experts = [m for e in range(len(w.gate)) for m in (w.gate[e], w.up[e], w.down[e])]
    biased = any(m.bias is not None for m in mats[1:])  # expert biases (gpt-oss): each product adds its own
    return mk.moe_arrays(w.gate_inp.prepared, w.gate_inp.bias, w.probs_bias,
                         [m.prepared for m in w.gate], [m.prepared for m in w.up], [m.prepared for m in w.down],
                         tuple(m.prepared for m in shared) if shared else None, w.shared_gate,
                         [m.pages for m in experts], [m.bias for m in experts] if biased else (),
                         [m.bias for m in shared] if biased else ())


def big_experts(w) -> bool:
    """Whether an expert matrix is big enough to split its products over the threads."""
    return max(w.gate[0].prepared.nbytes, w.down[0].prepared.nbytes) >= qmatrix.PARALLEL_MIN_BYTES


class FastMoe:
    """reference.moe_topk computed by moe_kernels (routing and experts in one call).

    Needs kernel parts of the gating and of the activation; otherwise, or with weights not
    prepared for the fast kernels, the reference mixture runs. The kernel arrays of a layer's
    MoeWeights are built on first use and kept (the op is bound to one layer).

    A mixture op of another package whose numba kernels take the same arguments (moe_kernels'
    arrays, routing parameters and parts) subclasses it, naming its own `kernels` (rows kernel,
    decode layer kernel) and `reference_mixture`, and `weight_arrays` when it refuses some weights.
    """

    #: (rows kernel, decode layer kernel): moe_rows(h, out, *ffn_args, chunks, par) and
    #: decode_moe_layer(x, common, *ffn_args, kc, vc, kpos, ring, row, pos, cos, sin, chunks, par)
    kernels = (mk.moe_rows, mk.decode_moe_layer)
    #: the numpy mixture (same arguments as this op's factory), run when the kernels cannot
    reference_mixture = staticmethod(reference.moe_topk)

    def __init__(self, spec: MoeSpec, gating, act):
        self.ref = self.reference_mixture(spec, gating, act)
        self.spec = spec
        # the model's gating and activation on the fast backend carry their parts (archrun_blocks' ops)
        self.gate_part = usable(getattr(gating, "fused", None), "gating")
        self.act_part = activation_part(getattr(act, "fused", None))  # either kind (a gated one reads up)
        self.rp = (spec.n_expert_used, spec.n_group, spec.n_group_used, int(spec.weights_norm))
        self.scale = float(spec.weights_scale)
        self._bound: list = [None, None]  # (weights, their kernel arrays) of the last weights seen

    def arrays(self, w) -> tuple | None:
        if self.gate_part is None or self.act_part is None:
            return None
        if self._bound[0] is not w:
            if w.gate_inp.n_out != self.spec.n_expert:
                raise ShapeMismatch(f"moe: {w.gate_inp.n_out} router rows, the descriptor says "
                                    f"{self.spec.n_expert} experts")
            self._bound[:] = [w, self.weight_arrays(w)]
        return self._bound[1]

    def weight_arrays(self, w) -> tuple | None:
        """moe_kernels.moe_arrays of MoeWeights w, or None when the kernels cannot run them."""
        return _moe_arrays(w)

    def __call__(self, x: np.ndarray, w) -> np.ndarray:
        a = self.arrays(w)
        if a is None:
            return self.ref(x, w)
        d = w.gate_inp.n_in
        if not isinstance(x, np.ndarray) or x.ndim != 2 or x.shape[1] != d:
            raise ShapeMismatch(f"moe: input {getattr(x, 'shape', None)} does not match [n, {d}]")
        x = np.ascontiguousarray(x, dtype=F32)
        out = np.empty_like(x)
        chunks = qmatrix.current_threads() if big_experts(w) else 1
        self.kernels[0](x, out, *a, self.rp, self.scale, self.gate_part.handle, self.gate_part.params,
                        self.act_part.handle, self.act_part.params, mk.NO_GIDS, chunks, pool.NO_POOL)
        return out

    def fused_layer(self, w, common: tuple, group_id=None):
        """(kernel, args, parallel) of a whole decode layer with this FFN, or None.

        common: a typed list holding the layer's (qkv, o_mat, vecs, geo, fns, params) as
        archrun.kernels.decode.layer documents them; the kernel is called as kernel(x, *args, kc, vc,
        kpos, ring, row, pos, cos, sin, chunks, par). group_id(ms, n_in) -> id, when given,
        registers product groups with the decode pool: the router's and every expert's products
        then go to the running pool (moe_kernels.pool_group_ids).
        """
        made = self.kernel_args(w, group_id)
        if made is None:
            return None
        args, big = made
        return self.kernels[1], (common, *args), big

    def ffn_args(self, w, group_id=None) -> tuple[tuple, bool] | None:
        """kernel_args: what another op's layer kernel passes to moe_kernels.moe_rows for this FFN (e.g. a latent
        attention's). A subclass whose kernels compute another mixture sets it to None."""
        return self.kernel_args(w, group_id)

    def kernel_args(self, w, group_id=None) -> tuple[tuple, bool] | None:
        """(the rows kernel's arguments after (h, out) and before (chunks, parallel), whether the experts are
        big enough to split over the threads), or None. group_id as for fused_layer."""
        a = self.arrays(w)
        if a is None:
            return None
        gids = mk.NO_GIDS if group_id is None else mk.pool_group_ids(
            a, [m.prepared for m in w.gate], [m.prepared for m in w.up], [m.prepared for m in w.down], group_id)
        return (*a, self.rp, self.scale, self.gate_part.handle, self.gate_part.params, self.act_part.handle,
                self.act_part.params, gids), big_experts(w)


def moe_topk(spec: MoeSpec, gating, act) -> FastMoe:
    return FastMoe(spec, gating, act)
