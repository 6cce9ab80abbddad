"""The interpreter: one family-independent decoder that runs any descriptor.

`build_plan` resolves every vocabulary value of the descriptor to a bound op and binds
every weight, once per model. The per-token path (`Interpreter._forward`) only calls the
bound ops; it does no registry lookups and knows no architecture.

Block styles are vocabulary too (slot "block_style"): `FusedDecoder` carries the batched
entries, `HostReferenceDecoder` carries `host_step`; each refuses the other's entries
with WrongBlockStyle, and says what it carries in `caps`.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import os
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from typing import Any

import attrs
import numpy as np

from archrun import quant
from archrun.cache import CacheOwner, KvCache, PairSlot, kv_options
from archrun.contracts import NONE as NO_CAPABILITIES
from archrun.contracts import OpCapabilities, check_bound
from archrun.decoder import Caps
from archrun.descriptor import NO_ROPE, Descriptor, LayerSpec, MoeSpec
from archrun.errors import (
    ArchrunWarning,
    ContextOverflow,
    InvalidRequest,
    KvTypeUnsupported,
    MetadataError,
    MissingTensor,
    NotGenerative,
    UnexpectedTensor,
    UnsupportedQuantType,
    WrongBlockStyle,
    check_flag,
    shown,
)
from archrun.fusion import ROWS_MAX, DecodeSteps
from archrun.ggufio import GGUFFile, TensorInfo
from archrun.kernels.pool import NO_POOL
from archrun.plan import DenseFfn, LayerPlan, MoeFfn, Plan, Projections
from archrun.vocab import Vocabulary
from archrun.weights import Matrix, MoeWeights

F32 = np.float32


class _Binder:
    """Resolves vocabulary and binds weights for one model."""

    pager: Any = None  # archrun.experts.ExpertPager of a model whose experts are streamed from disk
    made: dict | None = None     # the matrices bound so far by key (what another model may share: reuse)
    shared: dict | None = None   # another model's `made` (same file): its matrices are reused here ...
    adapted: frozenset = frozenset()  # ... except those of tensors a LoRA adapter changes in this model

    def _reuse(self, key: tuple, names: Sequence[str], make: Callable[[], Any]) -> Any:
        """The matrices of `key` shared with another model of the same file when none of `names` is adapted
        here, else make() (kept by key for models that share this one's)."""
        if self.shared is not None and key in self.shared and not self.adapted.intersection(names):
            found = self.shared[key]
        else:
            found = make()
        if self.made is not None:
            self.made[key] = found
        return found

    def __init__(self, d: Descriptor, gguf: GGUFFile, vocab: Vocabulary, backend: str, op_backend: str):
        self.d, self.gguf, self.vocab, self.backend = d, gguf, vocab, backend
        self.op_backend = op_backend  # the backend of the small ops (the block style may audit them)
        self.providers: dict[str, str] = {}
        self.bound: set[str] = set()  # names of the tensors bound so far
        self._declared: dict[int, tuple[Any, OpCapabilities]] = {}  # id(bound op) -> (op, its declaration)

    def op(self, slot: str, name: str, *args: Any, backend: str | None = None, **params: Any) -> Any:
        """The op (slot, name) bound by its factory for `backend` (default: the small ops' backend),
        checked against what it declares (archrun.contracts.check_bound)."""
        entry = self.vocab.entry(slot, name)
        self.providers[f"{slot}={name}"] = entry.plugin
        backend = backend or self.op_backend
        obj = entry.op.factory(backend)(*args, **params)
        caps = entry.op.declared(backend)
        check_bound(obj, caps, slot, name)
        self._declared[id(obj)] = (obj, caps)
        return obj

    def declared(self, obj: Any) -> OpCapabilities:
        """What the bound op `obj` declares it carries (archrun.contracts); nothing for an object this
        binder did not bind (e.g. a caller's own)."""
        held = self._declared.get(id(obj))
        return held[1] if held is not None and held[0] is obj else NO_CAPABILITIES

    def vector(self, role: str, layer: int | None = None) -> np.ndarray:
        """A 1-D tensor f32 [n] (a file may store it with trailing unit dims, as [n, 1])."""
        return self.table(role, layer).reshape(-1)

    def table(self, role: str, layer: int | None = None) -> np.ndarray:
        """A tensor dequantized to f32 in numpy order (e.g. a position table [n_positions, d])."""
        return np.ascontiguousarray(self.gguf.dequantize(self._checked(role, layer).name), dtype=F32)

    def norm_weight(self, role: str, layer: int | None = None) -> np.ndarray:
        """A norm's weight [d]: its tensor, or ones when the model's norms have no learned weights."""
        return self.vector(role, layer) if self.d.norm_weights else np.ones(self.d.n_embd, F32)

    def _checked(self, role: str, layer: int | None) -> TensorInfo:
        """The tensor of `role`, refused at load when archrun cannot execute its quant type."""
        name = self.d.tensor_name(role, layer)
        if name not in self.gguf.tensors:
            raise MissingTensor(f"required tensor {name!r} is missing")
        self.bound.add(name)
        info = self.gguf.tensors[name]
        if info.ggml_type not in quant.SUPPORTED_TYPES:
            raise UnsupportedQuantType(f"tensor {name!r} uses quantization type {info.type_name}, "
                                       "which archrun cannot execute")
        return info

    def matrix(self, role: str, layer: int | None = None, bias_role: str | None = None,
               lazy: bool = False) -> Matrix:
        info = self._checked(role, layer)
        name = info.name

        def make() -> Matrix:
            bias = self.vector(bias_role, layer) if bias_role else None
            return Matrix(self.gguf.raw_rows(name), info.ggml_type, info.shape[0], self.backend, bias, name, lazy)

        return self._reuse(("matrix", name, bias_role, lazy), (name,), make)

    def packed(self, role: str, layer: int, widths: list[int], bias_role: str | None = None) -> Projections:
        """One tensor whose output columns hold several products side by side (fused QKV, gate|up)."""
        ends = np.cumsum(widths).tolist()
        return Projections([self.matrix(role, layer, bias_role)], list(zip([0, *ends[:-1]], ends, strict=True)))

    def projections(self, roles: tuple[str, ...], layer: int,
                    bias_roles: tuple[str | None, ...] | None = None) -> Projections:
        """x[n, d] -> [x @ W_r.T (+ b_r) for r in roles].

        On the fast backend, weights of one quant type are stacked into one matrix at load, so a
        token pays one kernel call and one activation quantization instead of len(roles).
        """
        bias_roles = bias_roles or (None,) * len(roles)
        infos = [self._checked(r, layer) for r in roles]
        same = len({(t.ggml_type, t.shape[0]) for t in infos}) == 1
        biases = [br is not None for br in bias_roles]
        if self.backend != "fast" or not same or (any(biases) and not all(biases)):
            return Projections([self.matrix(r, layer, br) for r, br in zip(roles, bias_roles, strict=True)])

        def make() -> Matrix:
            raw = [self.gguf.raw_rows(t.name) for t in infos]  # Matrix stacks them, keeping no joined copy
            bias = np.concatenate([self.vector(br, layer) for br in bias_roles]) if all(biases) else None
            return Matrix(raw, infos[0].ggml_type, infos[0].shape[0], self.backend, bias, "+".join(roles))

        names = tuple(t.name for t in infos)
        stacked = self._reuse(("stacked", names, tuple(bias_roles)), names, make)
        ends = np.cumsum([t.shape[1] for t in infos]).tolist()
        return Projections([stacked], list(zip([0, *ends[:-1]], ends, strict=True)))

    def experts(self, role: str, layer: int, bias_role: str | None = None) -> list[Matrix]:
        """Split a stacked expert tensor {n_in, n_out, E} into E matrices (views, no copy); with
        bias_role, expert e adds row e of that {n_out, E} tensor."""
        info = self._checked(role, layer)
        return self._reuse(("experts", info.name, bias_role), (info.name,),
                           lambda: self._experts(info, layer, bias_role))

    def _experts(self, info: TensorInfo, layer: int, bias_role: str | None) -> list[Matrix]:
        name = info.name
        n_in, n_out, n_exp = info.shape
        rows = self.gguf.raw_rows(name)  # [E * n_out, row_bytes]
        biases = self.table(bias_role, layer).reshape(n_exp, n_out) if bias_role else [None] * n_exp
        pager = self.pager if self.pager is not None and not self.pager.finished else None
        mats = [Matrix(rows[e * n_out : (e + 1) * n_out], info.ggml_type, n_in, self.backend, biases[e],
                       f"{name}[{e}]", lazy=pager is not None)
                for e in range(n_exp)]
        if pager is not None:  # experts streamed from disk (archrun.experts): each prepared, stored, dropped
            for m in mats:
                q = m.prepare_copy()
                if q is not None:  # (a type without fast kernels stays lazy: prepared on first product)
                    pager.add(m, q)
        return mats


def vocabulary_of(d: Descriptor) -> list[tuple[str, str]]:
    """Every (slot, name) the descriptor names, in first-use order, without duplicates."""
    wanted = [("norm", d.norm)]
    wanted += [("rope", r.pairing) for r in d.rope_tables if r.pairing != NO_ROPE and r.n_rot]
    for layer in (*d.layers, *d.nextn_layers):
        wanted += [(layer.attention.slot, layer.attention.kind), ("residual", layer.residual)]
        if layer.parallel is not None:
            wanted.append((layer.parallel.slot, layer.parallel.kind))
        if layer.ffn is None:
            continue
        if isinstance(layer.ffn, MoeSpec):
            wanted += [("gating", layer.ffn.gating), ("activation", layer.ffn.activation), ("moe", layer.ffn.kind)]
        else:
            wanted.append(("activation", layer.ffn.activation))
    if d.logit_softcap:
        wanted.append(("softcap", d.softcap))
    if d.final_norm:
        wanted.append(("norm", d.final_norm))
    wanted.append(("block_style", d.block_style))
    return list(dict.fromkeys(wanted))


def build_plan(d: Descriptor, gguf: GGUFFile, vocab: Vocabulary, backend: str = "fast",
               progress: Callable[[str, int, int], None] | None = None,
               layers: tuple[int, int] | None = None, expert_memory: int | None = None,
               share_with: Plan | None = None) -> Plan:
    """Resolve the descriptor's vocabulary and bind its weights (once per model).

    Every vocabulary value is checked first, so a missing op fails before any weight is touched.
    Tensors of the file that neither the plan nor the descriptor's MTP blocks use are reported
    (ArchrunWarning), like unused metadata keys.

    layers=(start, end): a pipeline stage's plan (archrun.pipeline): only blocks start..end-1 are bound,
    the embeddings only when start is 0 and the output head only when end is the last block's; such a
    plan takes and gives hidden states where it does not begin or end the model.

    expert_memory: bytes of MoE expert matrices kept resident; the others are paged in from an expert
    store on demand (archrun.experts; fast backend only). None: every expert resident.
    share_with: the plan of a model of the same file on the same backend: its bound matrices are reused for
    every tensor this file's LoRA adapters leave unchanged (one copy of the base for several adapters).
    """
    span = check_layer_span(d, layers)
    first, last = span is None or span[0] == 0, span is None or span[1] == d.n_layer
    for slot, name in vocabulary_of(d):
        vocab.entry(slot, name)
    op_backend = vocab.entry("block_style", d.block_style).op.capabilities.op_backend  # the style's small ops
    b = _Binder(d, gguf, vocab, backend, op_backend or backend)
    norm = b.op("norm", d.norm, d.norm_eps)
    ropes = [_bind_rope(b, spec) for spec in d.rope_tables]
    b.pager = _expert_pager(d, backend, expert_memory)
    b.made = {}
    if share_with is not None:
        b.shared, b.adapted = share_with.binder.made, frozenset(getattr(gguf, "adapted", ()))
    bound = _bind_layers(b, gguf, progress, span or (0, d.n_layer))
    if b.pager is not None:
        b.pager.finish()
    embed = b.matrix("token_embd", lazy=not d.tied_output) if first or (last and d.tied_output) else None
    output = None
    if last:
        output = embed if d.tied_output else b.matrix("output", None, "output.bias" if d.output_bias else None)
    softcap = b.op("softcap", d.softcap, d.logit_softcap) if d.logit_softcap and last else None
    b.op("block_style", d.block_style)
    output_norm_b = b.vector("output_norm.bias") if d.output_norm_bias and last else None
    positions = b.table("position_embd") if d.position_embedding and first else None  # [n_positions, d]
    final_norm = b.norm_weight("output_norm") if d.output_norm and last else None
    plan = Plan(d, embed, output, final_norm, output_norm_b, norm, ropes, bound, softcap,
                b.providers, b, positions, span=span, pager=b.pager)
    if d.final_norm and last:
        plan.final_norm_op = b.op("norm", d.final_norm, d.norm_eps)
    _check_causality(d, bound, b)
    if d.token_types and first:  # every token is segment 0 ("sentence A"), as llama.cpp feeds BERT
        plan.token_type = np.ascontiguousarray(b.table("token_types").reshape(-1, d.n_embd)[0])
    if d.embed_norm and first:
        plan.embed_norm = b.vector("token_embd_norm")
        plan.embed_norm_b = b.vector("token_embd_norm.bias") if d.embed_norm_bias else None
    if span is None:  # a stage leaves the other stages' tensors alone
        _check_unused_tensors(d, gguf, b.bound)
    return plan


def _expert_pager(d: Descriptor, backend: str, expert_memory: Any) -> Any:
    """The expert store of a model loaded with expert_memory (archrun.experts), or None."""
    from archrun.experts import ExpertPager, check_expert_memory, directory

    budget = check_expert_memory(expert_memory)
    if budget is None:
        return None
    if backend != "fast":
        raise InvalidRequest("expert_memory streams the fast kernels' experts: it needs the fast backend")
    if not any(isinstance(s.ffn, MoeSpec) for s in d.layers):
        raise InvalidRequest(f"expert_memory streams MoE experts, and {d.architecture} has none")
    return ExpertPager(budget, directory())


def check_layer_span(d: Descriptor, layers: Any) -> tuple[int, int] | None:
    """A stage's blocks (start, end) as ints with 0 <= start < end <= n_layer (None: the whole model), else
    InvalidRequest; the whole model's span is None too."""
    if layers is None:
        return None
    start = end = None
    if isinstance(layers, tuple | list) and len(layers) == 2:  # nothing else is iterated: it may raise anything
        start, end = (int(v) if isinstance(v, int | np.integer) and not isinstance(v, bool) else None for v in layers)
    if start is None or end is None or not 0 <= start < end <= d.n_layer:
        raise InvalidRequest(f"layers must be (start, end) with 0 <= start < end <= {d.n_layer} (the model's "
                             f"blocks), got {shown(layers)}")
    if not d.causal:
        raise InvalidRequest(f"{d.architecture} is an encoder: it runs in one process, not in pipeline stages")
    return None if (start, end) == (0, d.n_layer) else (start, end)


def _check_causality(d: Descriptor, layers: list[LayerPlan], b: _Binder) -> None:
    """Every layer's attention masks as the file says (`attention.causal`): an op declares `causal=False`
    (OpCapabilities) when its queries see every position of the sequence; ops that do not say are causal."""
    for i, lp in enumerate(layers):
        if b.declared(lp.attention).causal != d.causal:
            kind = lp.spec.attention.kind
            raise MetadataError(f"{d.architecture}: the file says attention.causal = {str(d.causal).lower()} but "
                                f"layer {i}'s attention op {kind!r} is {'not ' if d.causal else ''}causal")


def _check_unused_tensors(d: Descriptor, gguf: GGUFFile, bound: set[str]) -> None:
    """Refuse a file with tensors the plan does not use (UnexpectedTensor); warn for ignorable ones."""
    mtp = tuple(f"blk.{i}." for i in range(d.n_layer, d.n_layer + d.n_nextn))  # bound by MTP heads on request
    unused = [n for n in gguf.tensors if n not in bound and not n.startswith(mtp)]
    ignored = [n for n in unused if any(fnmatch.fnmatchcase(n, p) for p in d.ignored_tensors)]
    refused = [n for n in unused if n not in ignored]
    if refused:
        raise UnexpectedTensor(f"{d.architecture}: the file has tensors archrun's plan does not use: {_few(refused)} "
                               "(running without them would be wrong; a family plugin must describe them)")
    if ignored:
        warnings.warn(f"{d.architecture}: ignoring tensors: {_few(ignored)}", ArchrunWarning, stacklevel=3)


def _few(names: list[str], n: int = 12) -> str:
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def _bind_layers(b: _Binder, gguf: GGUFFile, progress: Callable[[str, int, int], None] | None,
                 span: tuple[int, int]) -> list[LayerPlan]:
    """Bind the trunk layers span[0]..span[1]-1; on the fast backend two layers are repacked at a time
    (numpy releases the GIL), and the file's pages are released as layers finish so the mapped file
    and the repacked copies do not pile up."""
    specs = list(enumerate(b.d.layers))[span[0]:span[1]]
    workers = min(2, os.cpu_count() or 1) if b.backend == "fast" else 1
    layers: list[LayerPlan] = []
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for lp in pool.map(lambda item: _bind_layer(b, *item), specs):
            layers.append(lp)
            if b.backend == "fast":
                gguf.release_pages()
            if progress:
                progress("binding weights", len(layers), len(specs))
    return layers


def _bind_rope(b: _Binder, spec) -> Any:
    if spec.pairing == NO_ROPE or spec.n_rot == 0:
        return None
    factors = b.vector(spec.freq_factors) if spec.freq_factors else None
    if spec.long_factors:  # longrope's two divisor tables
        return b.op("rope", spec.pairing, spec, factors, b.vector(spec.long_factors), b.vector(spec.short_factors))
    return b.op("rope", spec.pairing, spec, factors)


def _bind_layer(b: _Binder, i: int, spec: LayerSpec) -> LayerPlan:
    a = spec.attention
    residual = b.op("residual", spec.residual, spec.residual_scale)
    empty = a.mixer and b.vocab.entry(a.slot, a.kind).op.capabilities.empty  # a mixer that adds nothing
    if spec.ffn is not None and spec.attn_norm and not spec.ffn_norm and not (
            b.declared(residual).ffn_reads_input or empty):
        # only a topology whose FFN reads the block's input (or a block whose mixer adds nothing) can share its norm
        raise MissingTensor(f"block {i} has no {b.d.tensor_name('ffn_norm', i)!r}, which its residual topology "
                            f"{spec.residual!r} needs")
    layout = b.vocab.entry(a.slot, a.kind).op.layout
    if a.mixer:  # the op is the whole token mixer: it binds its own tensors
        qkv = o = None
    elif layout is not None:  # the attention op brings its own projections (e.g. MLA's latents)
        qkv, o = layout.bind(b, a, i)
    else:
        qkv, o = _bind_qkv(b, i, spec), b.matrix("attn_output", i, "attn_output.bias" if a.output_bias else None)
    lp = LayerPlan(
        spec=spec,
        attn_norm=b.norm_weight("attn_norm", i) if spec.attn_norm else None,
        qkv=qkv,
        o=o,
        attention=b.op(a.slot, a.kind, a),
        residual=residual,
        ffn_norm=b.norm_weight("ffn_norm", i) if spec.ffn_norm else None,
        ffn=_bind_ffn(b, i, spec.ffn),
    )
    if spec.attn_sub_norm:
        lp.attn_sub_norm = b.vector("attn_sub_norm", i)
    if spec.ffn_sub_norm:
        lp.ffn.sub_norm = _normed(b.op("norm", b.d.norm, b.d.norm_eps), b.vector("ffn_sub_norm", i))
    if spec.norm_bias:
        lp.attn_norm_b = b.vector("attn_norm.bias", i)
        lp.ffn_norm_b = b.vector("ffn_norm.bias", i) if spec.ffn_norm else None
    if a.mixer or b.declared(lp.attention).binds:  # tensors of its own (a mixer's, attention sinks)
        lp.attention.bind(b, i)
    if b.declared(residual).binds:  # the topology reads per-layer tensors of its own (a post-norm block's norms)
        residual.bind(b, i)
    if a.qk_norm_per_head:  # [H, hd] and [KV, hd]: a weight row per head
        lp.q_norm, lp.k_norm = b.table("attn_q_norm", i), b.table("attn_k_norm", i)
    elif a.qk_norm:
        lp.q_norm, lp.k_norm = b.vector("attn_q_norm", i), b.vector("attn_k_norm", i)
    if spec.post_attn_norm:
        lp.post_attn_norm = b.vector("post_attn_norm", i)
    if spec.post_ffn_norm:
        lp.post_ffn_norm = b.vector("post_ffn_norm", i)
    if a.mixer:
        lp.mixer = lp.attention.mix
    if spec.parallel is not None:  # a token mixer beside the attention (its own tensors, its own state)
        if a.window:  # PairSlot rewinds as its mixer does: the attention's rows must truncate anywhere
            raise MetadataError(f"block {i}: a token mixer beside sliding-window attention is not supported")
        lp.parallel = b.op(spec.parallel.slot, spec.parallel.kind, spec.parallel)
        lp.parallel.bind(b, i)
    return lp


def _normed(norm: Callable[..., np.ndarray], w: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """x -> norm(x, w): a norm with its weight bound."""
    return lambda x: norm(x, w)


def _qk_norm(norm, lp: LayerPlan, a, q: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q [n, H, hd] and K [n, KV, hd] through their norms: per head (shared weights, or a weight row
    per head), or one norm over all heads."""
    if a.qk_norm_per_head:
        return (np.stack([norm(q[:, h], lp.q_norm[h]) for h in range(q.shape[1])], axis=1),
                np.stack([norm(k[:, h], lp.k_norm[h]) for h in range(k.shape[1])], axis=1))
    if a.qk_norm_full:
        n = q.shape[0]
        return (norm(q.reshape(n, -1), lp.q_norm).reshape(q.shape),
                norm(k.reshape(n, -1), lp.k_norm).reshape(k.shape))
    return norm(q, lp.q_norm), norm(k, lp.k_norm)


def _bind_qkv(b: _Binder, i: int, spec: LayerSpec) -> Projections:
    a = spec.attention
    if a.qkv_packed:
        widths = [a.n_head * a.head_dim, a.n_head_kv * a.head_dim, a.n_head_kv * a.v_head_dim]
        return b.packed("attn_qkv", i, widths, "attn_qkv.bias" if a.qkv_bias else None)
    biases = ("attn_q.bias", "attn_k.bias", "attn_v.bias") if a.qkv_bias else (None, None, None)
    return b.projections(("attn_q", "attn_k", "attn_v"), i, biases)


def _bind_ffn(b: _Binder, i: int, spec: Any) -> DenseFfn | MoeFfn | None:
    if spec is None:
        return None
    return _bind_moe(b, i, spec) if isinstance(spec, MoeSpec) else _bind_dense(b, i, spec)


def _bind_dense(b: _Binder, i: int, spec) -> DenseFfn:
    up_bias = "ffn_up.bias" if spec.up_bias else None
    if spec.packed:
        gate_up = b.packed("ffn_up", i, [spec.n_ff, spec.n_ff], up_bias)
    elif spec.gated:
        gate_up = b.projections(("ffn_gate", "ffn_up"), i, ("ffn_gate.bias" if spec.gate_bias else None, up_bias))
    else:
        gate_up = Projections([b.matrix("ffn_up", i, up_bias)])
    down = b.matrix("ffn_down", i, "ffn_down.bias" if spec.down_bias else None)
    return DenseFfn(b.op("activation", spec.activation, **dict(spec.activation_params)), gate_up, down, spec.gated)


def _bind_moe(b: _Binder, i: int, spec: MoeSpec) -> MoeFfn:
    # the mixture runs on the model's backend in every block style (the experts are heavy
    # linears), so its gating and activation are bound for that backend too
    gating = b.op("gating", spec.gating, backend=b.backend)
    act = b.op("activation", spec.activation, backend=b.backend, **dict(spec.activation_params))
    moe = b.op("moe", spec.kind, spec, gating, act, backend=b.backend)
    shared = None
    if spec.n_shared:
        bias = spec.shared_bias
        shared = tuple(b.matrix(f"ffn_{p}_shexp", i, f"ffn_{p}_shexp.bias" if bias else None)
                       for p in ("gate", "up", "down"))
    weights = MoeWeights(
        gate_inp=b.matrix("ffn_gate_inp", i, "ffn_gate_inp.bias" if spec.router_input_bias else None),
        probs_bias=b.vector("exp_probs_b", i) if spec.router_bias else None,
        gate=b.experts("ffn_gate_exps", i, "ffn_gate_exps.bias" if spec.gate_bias else None),
        up=b.experts("ffn_up_exps", i, "ffn_up_exps.bias" if spec.up_bias else None),
        down=b.experts("ffn_down_exps", i, "ffn_down_exps.bias" if spec.down_bias else None),
        shared=shared,
        shared_gate=b.vector("ffn_gate_inp_shexp", i) if spec.shared_gate else None,
    )
    return MoeFfn(moe, weights)


@attrs.frozen
class HostStep:
    """Result of host_step: logits [n, vocab] and the trunk's final hidden states [n, d].

    hidden is what the output head reads (after output_norm): the state MTP heads consume.
    """

    logits: np.ndarray
    hidden: np.ndarray


def cache_owner(d: Descriptor, gguf: GGUFFile) -> CacheOwner:
    """The identity and geometry a model stamps on the caches it makes (archrun.cache.CacheOwner)."""
    file = gguf.identity()  # a split model's: every part's
    key = hashlib.sha256(repr((file, attrs.evolve(d, block_style=""))).encode()).hexdigest()[:24]
    geometry = tuple((s.attention.kind, s.attention.n_head_kv, s.attention.head_dim, s.attention.v_head_dim,
                      s.attention.window) for s in d.layers)
    return CacheOwner(gguf.path.name, key, geometry)


class Interpreter:
    """Runs a Plan. Subclasses (block styles) add their guarded entries and say so in `caps`."""

    caps = Caps()
    # a style whose steps keep worker threads spinning between calls sends them to sleep with this (None: none)
    rest_workers: Callable[[], None] | None = None
    prefill_chunk = 512  # tokens per pass of a long prompt (_forward); llama.cpp's default micro-batch

    def __init__(self, plan: Plan, gguf: GGUFFile, tokenizer_factory: Callable[[], Any] | None = None,
                 chat_template: str | None = None):
        self.plan = plan
        self.descriptor = plan.descriptor
        self.gguf = gguf
        self._tokenizer_factory = tokenizer_factory
        self._tokenizer = None
        self.default_chat_template = chat_template
        self.cache_owner = cache_owner(plan.descriptor, gguf)  # stamped on every cache init_cache makes
        if not plan.descriptor.causal:  # an encoder has no cache to batch, rewind or read logits from
            self.caps = Caps(rewind=False, all_logits=False)

    # -- public entries (Decoder protocol) --------------------------------------------------

    @property
    def backend(self) -> str:
        """"fast" or "reference": whose kernels compute the weight products."""
        return self.plan.binder.backend

    @property
    def tokenizer(self):
        """The tokenizer built from the file's metadata (built on first use)."""
        if self._tokenizer is None and self._tokenizer_factory is not None:
            self._tokenizer = self._tokenizer_factory()
        return self._tokenizer

    def init_cache(self, max_tokens: int | None = None, max_rewind: int = 64, kv_type: str = "f32") -> KvCache:
        """A cache for up to max_tokens tokens (default: the model's context length).

        max_rewind bounds how far `cache.rewind` can go back on sliding-window layers, whose
        ring buffers hold window + max_rewind rows (global layers can always rewind fully).
        kv_type: how K/V rows are stored, "f32", "f16" or "q8_0" (ggml's blocks), as far as every
        layer's op supports it (`op.kv_types`; ops without it store f32 only): else KvTypeUnsupported.
        An encoder (bidirectional attention) has no cache to extend: NotGenerative.
        """
        if not self.causal:
            raise NotGenerative(f"{self.descriptor.architecture} is an encoder (bidirectional attention): it "
                                "embeds text (archrun.embed, POST /v1/embeddings) and cannot generate")
        return self._new_cache(max_tokens, max_rewind, kv_type)

    def _new_cache(self, max_tokens: int | None, max_rewind: int, kv_type: str) -> KvCache:
        n_ctx = self.descriptor.n_ctx
        max_tokens = n_ctx if max_tokens is None else max_tokens
        max_tokens = int(max_tokens) if isinstance(max_tokens, np.integer) else max_tokens  # numpy ints too
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise InvalidRequest(f"max_tokens must be a positive integer, got {shown(max_tokens)}")
        if max_tokens > n_ctx:
            raise ContextOverflow(f"max_tokens {max_tokens} exceeds the model's context length {n_ctx}")
        if not isinstance(max_rewind, int) or isinstance(max_rewind, bool) or max_rewind < 0:
            raise InvalidRequest(f"max_rewind must be a non-negative integer, got {shown(max_rewind)}")
        check_kv_type(self.plan.layers, kv_type, self.plan.binder.declared)
        return KvCache([_new_slot(lp, max_tokens, max_rewind, kv_type) for lp in self.plan.layers], max_tokens,
                       kv_type=kv_type, owner=self.cache_owner)

    def forward_step(self, token_ids: Sequence[int] | np.ndarray, cache: KvCache,
                     all_logits: bool = False) -> np.ndarray:
        """Append token_ids to cache; float32 logits of the last position [vocab] or of all [n, vocab]."""
        ids = self._check_ids(token_ids)
        all_logits = check_flag("all_logits", all_logits)
        self._check_cache(cache)
        cache.check_room(len(ids))
        logits, _ = self._forward(ids, cache, all_logits)
        return logits if all_logits else logits[-1]

    def forward_step_hidden(self, token_ids: Sequence[int] | np.ndarray, cache: KvCache) -> HostStep:
        """Append token_ids; logits [n, vocab] of every position and the trunk's final hidden states
        [n, d] (after output_norm): what a head on the trunk reads (an MTP drafter). Every block style."""
        ids = self._check_ids(token_ids)
        self._check_cache(cache)
        cache.check_room(len(ids))
        return HostStep(*self._forward(ids, cache, True))

    @property
    def causal(self) -> bool:
        """False for an encoder: its attention sees the whole sequence, so it embeds and does not generate."""
        return self.descriptor.causal

    def hidden_states(self, token_ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """float32 [n, d]: the trunk's final hidden states of a whole sequence (after the final norm, when the
        model has one), without a caller-visible cache: what pooling (archrun.embed) reads. A decoder runs
        its prefill path (in chunks of `prefill_chunk`); an encoder runs the sequence in one pass, so every
        position sees every other."""
        ids = self._check_ids(token_ids)
        if len(ids) > self.descriptor.n_ctx:
            raise ContextOverflow(f"{len(ids)} tokens exceed the context length {self.descriptor.n_ctx}")
        cache = self._new_cache(len(ids), 0, "f32")
        if self.rest_workers is not None:  # the prefill's BLAS threads need the cores
            self.rest_workers()
        if not self.causal:
            return self._forward_span(ids, cache, False)[1]
        return Interpreter._forward(self, ids, cache, False)[1]

    def logits(self, token_ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """float32 logits [n, vocab] of a whole sequence, without a caller-visible cache."""
        ids = self._check_ids(token_ids)
        if len(ids) > self.descriptor.n_ctx:
            raise ContextOverflow(f"{len(ids)} tokens exceed the context length {self.descriptor.n_ctx}")
        logits, _ = self._forward(ids, self.init_cache(len(ids)), True)
        return logits

    # -- the interpreter ---------------------------------------------------------------------

    def _check_cache(self, cache: Any) -> None:
        """Before any kernel runs: `cache` is a KvCache this model (its file and geometry) made, holding the
        slots and arrays it was made with (KvCache.verify; ModelMismatch names what differs)."""
        if not isinstance(cache, KvCache):
            raise InvalidRequest(f"cache must be a KvCache from init_cache(), got {type(cache).__name__}")
        cache.verify(self.cache_owner)

    @property
    def takes_hidden(self) -> bool:
        """Whether this is a pipeline stage after the first (build_plan's layers): its steps take the previous
        stage's hidden states, float32 [n, d], where a model takes token ids."""
        return self.plan.span is not None and self.plan.span[0] > 0

    @property
    def gives_hidden(self) -> bool:
        """Whether this is a pipeline stage before the last: its steps give the hidden states [n, d] of every
        position after its last block (no final norm, no head) where a model gives logits."""
        return self.plan.span is not None and self.plan.span[1] < self.descriptor.n_layer

    def step_paths(self) -> tuple:
        """What decides which kernel path a step takes on this model's blocks: pipeline stages of one model
        (archrun.pipeline) must agree on it to compute what one process computes."""
        return (type(self).__name__,)

    def _check_hidden(self, x: Any) -> np.ndarray:
        d = self.descriptor.n_embd
        if not isinstance(x, np.ndarray) or x.ndim != 2 or not len(x) or x.shape[1] != d or x.dtype != F32:
            got = f"{x.dtype} {list(x.shape)}" if isinstance(x, np.ndarray) else type(x).__name__
            raise InvalidRequest(f"this pipeline stage starts at block {self.plan.span[0]}: it takes hidden states "
                                 f"(float32 [n, {d}], n >= 1) where a model takes token ids, got {got}")
        return x

    def _check_ids(self, token_ids: Sequence[int] | np.ndarray) -> np.ndarray:
        if self.takes_hidden:
            return self._check_hidden(token_ids)
        try:
            arr = np.asarray(token_ids)
        except (ValueError, TypeError, RecursionError):  # ragged, self-referencing, ...
            raise InvalidRequest("token_ids must be a non-empty 1-D sequence of integers") from None
        if arr.ndim != 1 or arr.size == 0 or arr.dtype.kind not in "iu":
            raise InvalidRequest("token_ids must be a non-empty 1-D sequence of integers")
        if arr.min() < 0 or arr.max() >= self.descriptor.n_vocab:
            raise InvalidRequest(f"token ids must lie in [0, {self.descriptor.n_vocab})")
        return arr.astype(np.int64)

    def _forward(self, ids: np.ndarray, cache: KvCache, all_logits: bool) -> tuple[np.ndarray, np.ndarray]:
        """Run ids through every layer, appending to cache; returns (logits, normed final hidden states).

        A prompt longer than `prefill_chunk` goes in chunks of that many tokens, each attending to the cache
        the previous ones filled: the same math (to float rounding), but every intermediate of a layer
        ([n, ffn] activations, [n, n_kv] scores) stays a few MB instead of growing with the prompt
        (a 4096-token prompt of Qwen2.5-0.5B: 5 x 80 MB of fresh activations a layer, 43 s -> 27 s)."""
        n = self.prefill_chunk
        if len(ids) <= n:
            return self._forward_span(ids, cache, all_logits)
        steps = [self._forward_span(ids[i:i + n], cache, all_logits or i + n >= len(ids))
                 for i in range(0, len(ids), n)]
        logits = np.concatenate([s[0] for s in steps]) if all_logits else steps[-1][0]
        return logits, np.concatenate([s[1] for s in steps])

    def _forward_span(self, ids: np.ndarray, cache: KvCache, all_logits: bool) -> tuple[np.ndarray, np.ndarray]:
        """_forward for one chunk of tokens (all of them in one pass through every layer)."""
        p = self.plan
        start = len(cache)
        x = self.embed(ids, start)
        angles = self.rope_angles(np.arange(start, start + len(ids)))
        for lp, slot in zip(p.layers, cache.slots, strict=True):
            x = self.run_block(lp, x, slot, start, angles)
        cache.advance(len(ids))
        hidden = self._final_norm(x)
        return self.head(hidden if all_logits else hidden[-1:]), hidden

    def _final_norm(self, x: np.ndarray) -> np.ndarray:
        """The trunk's final norm on x [n, d] (x itself without one, and on a stage before the last)."""
        p = self.plan
        if p.output_norm is None or self.gives_hidden:
            return x
        return (p.final_norm_op or p.norm)(x, p.output_norm, p.output_norm_b)

    @property
    def chat_template(self) -> str | None:
        """The chat template: the file's (tokenizer.chat_template), else the family's default."""
        tok = self.tokenizer
        return (tok.chat_template if tok is not None else None) or self.default_chat_template

    # -- the Trunk interface (archrun.decoder.Trunk): for heads that hang off the trunk -------------

    def has_tensor(self, role: str, layer: int | None = None) -> bool:
        """Whether the file holds the tensor of `role` (in block `layer`)."""
        try:
            name = self.descriptor.tensor_name(role, layer)
        except KeyError:  # the family maps this role to no tensor
            return False
        return name in self.gguf.tensors

    def bind_matrix(self, role: str, layer: int | None = None) -> Matrix:
        """The product of the tensor of `role` (x[n, n_in] -> [n, n_out]), on the model's backend."""
        return self.plan.binder.matrix(role, layer)

    def bind_vector(self, role: str, layer: int | None = None) -> np.ndarray:
        """The tensor of `role` as float32."""
        return self.plan.binder.vector(role, layer)

    def norm(self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        """The model's norm op over the last axis."""
        return self.plan.norm(x, w, b)

    @property
    def output_norm(self) -> np.ndarray:
        """The trunk's final norm weight [d]."""
        return self.plan.output_norm

    def embed(self, ids: np.ndarray, start: int | None = None) -> np.ndarray:
        """Token embeddings [n, d], scaled by the descriptor's embed_scale; a model with a learned
        position table adds its rows start..start+n-1 (start is required then)."""
        self.gguf.check_intact()  # every step starts here: a truncated file is an error, not SIGBUS
        if self.plan.pager is not None:  # experts streamed from disk: back under their cap before the step
            self.plan.pager.between_steps()
        if self.takes_hidden:  # a later pipeline stage: the previous stage's hidden states (a copy: steps write it)
            return np.array(ids, dtype=F32)
        x = self.plan.embed.rows(ids)
        if self.descriptor.embed_scale != 1.0:
            x *= F32(self.descriptor.embed_scale)
        table = self.plan.positions
        if table is not None:
            if start is None:
                raise InvalidRequest("this model adds learned position embeddings: embed(ids, start) needs the "
                                     "position of ids[0]")
            end = start + len(ids)
            if start < 0 or end > len(table):
                raise ContextOverflow(f"positions {start}..{end - 1} are past the model's {len(table)} learned "
                                      "positions")
            x += table[start:end]
        if self.plan.token_type is not None:
            x += self.plan.token_type
        if self.plan.embed_norm is not None:
            x = self.plan.norm(x, self.plan.embed_norm, self.plan.embed_norm_b)
        return x

    def head(self, hidden: np.ndarray) -> np.ndarray:
        """Output head on normed hidden states [n, d] -> logits [n, vocab] (scaled and softcapped if the
        model says so); a stage before the last gives the hidden states back."""
        if self.gives_hidden:
            return hidden
        return self.finish_logits(self.plan.output(hidden))

    def finish_logits(self, logits: np.ndarray) -> np.ndarray:
        """The output product's logits [n, vocab] times the logit scale, then softcapped."""
        if self.gives_hidden:  # a stage before the last: its "logits" are hidden states
            return logits
        if self.descriptor.logit_scale != 1.0:
            logits *= F32(self.descriptor.logit_scale)
        return self.plan.softcap(logits) if self.plan.softcap is not None else logits

    def rope_angles(self, positions: np.ndarray) -> list:
        """(cos, sin) of every rope table at these positions (None for tables without rope)."""
        return [rope.cos_sin(positions) if rope is not None else None for rope in self.plan.ropes]

    def bind_block(self, index: int, spec: LayerSpec) -> LayerPlan:
        """Bind the weights of block `index` (e.g. an MTP block after the trunk) with this model's ops."""
        return _bind_layer(self.plan.binder, index, spec)

    def run_block(self, lp: LayerPlan, x: np.ndarray, slot: Any, start: int, angles: list) -> np.ndarray:
        """One decoder block on x [n, d]; its K/V (or state) go to `slot` at rows start..start+n-1."""
        if lp.mixer is not None:
            return self._block(lp, x, angles, lambda h: lp.mixer(h, slot, start))
        if lp.parallel is not None:
            return self._block(lp, x, angles, lambda q, k, v: lp.attention(q, k, v, slot.attention, start),
                               lambda h: lp.parallel.mix(h, slot.mixer, start))
        return self._block(lp, x, angles, lambda q, k, v: lp.attention(q, k, v, slot, start))

    def _block(self, lp: LayerPlan, x: np.ndarray, angles: list, attend: Callable[..., np.ndarray],
               beside: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
        """A decoder block on x [n, d] whose attention is attend(q [n,H,hd], k, v) -> [n, H, vd], or,
        for a layer whose op is the whole token mixer, attend(h [n, d]) -> [n, d]; beside(h) -> [n, d]
        is the token mixer running beside the attention (added to its output), if any."""
        norm = self.plan.norm
        h = x if lp.attn_norm is None else norm(x, lp.attn_norm, lp.attn_norm_b)
        o = attend(h) if lp.mixer is not None else self._attend(lp, h, angles, attend)
        if beside is not None:
            o = o + beside(h)
        if lp.post_attn_norm is not None:
            o = norm(o, lp.post_attn_norm)
        if lp.ffn is None:  # the mixer is the block's only branch
            return lp.residual.combine(x, o, np.zeros_like(x))
        if lp.ffn_norm is not None:
            g = norm(lp.residual.ffn_input(x, o), lp.ffn_norm, lp.ffn_norm_b)
        else:  # a parallel block's shared norm, or (no pre-norms) the FFN's input as is
            g = h if lp.attn_norm is not None else lp.residual.ffn_input(x, o)
        f = lp.ffn(g)
        if lp.post_ffn_norm is not None:
            f = norm(f, lp.post_ffn_norm)
        return lp.residual.combine(x, o, f)

    def _attend(self, lp: LayerPlan, h: np.ndarray, angles: list,
                attend: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]) -> np.ndarray:
        """The attention branch on normed h [n, d]: projections, q/k norms, rope, attend, output -> [n, d]."""
        norm, a = self.plan.norm, lp.spec.attention
        n = len(h)
        q, k, v = lp.qkv(h)
        if a.clamp_kqv:  # OLMo / MPT clip_qkv
            c = F32(a.clamp_kqv)
            q, k, v = np.clip(q, -c, c), np.clip(k, -c, c), np.clip(v, -c, c)
        q = q.reshape(n, a.n_head, a.head_dim)
        k = k.reshape(n, a.n_head_kv, a.head_dim)
        v = v.reshape(n, a.n_head_kv, a.v_head_dim)
        if lp.q_norm is not None and not a.qk_norm_after_rope:
            q, k = _qk_norm(norm, lp, a, q, k)
        rope = self.plan.ropes[a.rope]
        if rope is not None:
            cos, sin = angles[a.rope]
            q, k = rope(q, cos, sin), rope(k, cos, sin)
        if lp.q_norm is not None and a.qk_norm_after_rope:
            q, k = _qk_norm(norm, lp, a, q, k)
        out = attend(q, k, v).reshape(n, a.n_head * a.v_head_dim)
        return lp.o(out if lp.attn_sub_norm is None else norm(out, lp.attn_sub_norm))


class FusedDecoder(Interpreter):
    """The fast decoder shape: one-token steps run each layer as one fused kernel call
    (archrun.fusion) when every op of the model can; batched decode entries; refuses host_step."""

    caps = Caps(batch=True)

    def __init__(self, plan: Plan, gguf: GGUFFile, tokenizer_factory: Callable[[], Any] | None = None,
                 chat_template: str | None = None):
        super().__init__(plan, gguf, tokenizer_factory, chat_template)
        self._decode = DecodeSteps(plan)
        # None: some layer runs op by op (reference backend, or an op without a kernel description)
        self.fused_blocks = self._decode.blocks

    def _forward(self, ids: np.ndarray, cache: KvCache, all_logits: bool) -> tuple[np.ndarray, np.ndarray]:
        if 1 < len(ids) <= ROWS_MAX and self._span_rows(cache):
            # a short span (a verification of drafted tokens, a short prompt or chunk): the multi-row kernel,
            # so every position has the bits of its one-token step
            logits, hidden, _ = self._rows_pass([ids], [cache], all_logits)
            return logits, hidden
        if len(ids) != 1 or self.fused_blocks is None:
            self._decode.rest()  # a prefill's BLAS threads need the cores
            return super()._forward(ids, cache, all_logits)
        start = len(cache)
        x = np.ascontiguousarray(self.embed(ids, start)[0])
        angles = self.rope_angles(np.array([start]))
        blocks = self._decode.blocks_for(cache.kv_type)  # resolved once per kv type, then a dict hit
        if blocks is None:  # an op without a fused part for this kv type: op by op
            return super()._forward(ids, cache, all_logits)
        with self._decode.running() as par:  # the worker pool, when there is one, for this step
            for fb, slot in zip(blocks, cache.slots, strict=True):
                fb(x, slot, start, angles, par)
            cache.advance(1)
            hidden = self._final_norm(x[None, :])
            logits = self._head_rows(hidden, par)
        return self.finish_logits(logits), hidden

    def step_paths(self) -> tuple:
        """(fused one-token steps, the multi-row kernel, every block dense, rows per product pass)."""
        blocks = self.fused_blocks
        return (type(self).__name__, blocks is not None, self._decode.rows_ready,
                blocks is not None and all(fb.dense for fb in blocks), self._rows_per_pass[0])

    def _head_rows(self, hidden: np.ndarray, par: tuple) -> np.ndarray:
        """The output product of a fused step's rows (through the pool); a stage before the last gives the
        hidden states back."""
        return hidden if self.gives_hidden else self._decode.head(hidden, par)

    def rest_workers(self) -> None:
        """Send the decode worker pool's threads to sleep now, instead of ~3 ms after the last step (a
        caller about to run Python work between steps, e.g. a server sampling and streaming for many
        sequences, gives their core to its other threads). The next step wakes them; a no-op without a pool."""
        self._decode.rest()

    def forward_step_batch(self, batch: Sequence[Sequence[int]], caches: Sequence[KvCache]) -> list[np.ndarray]:
        """Append each batch[i] (one token or a span of several) to caches[i], all in one pass.

        Every weight product runs once on the rows of all sequences together (each weight is
        read once per step, not once per sequence); attention runs per sequence, each at its
        own position in its own cache. Returns the last-position logits [vocab] of each.

        Where the model decodes fused, the rows of spans of up to ROWS_MAX tokens (decode steps,
        verification of drafted tokens) go through the dense layers' multi-row kernel
        (kernels.layer.decode_rows): every position's logits are bit-identical to one-token
        forward_step calls on the same cache. Layers whose FFN op brings its own layer kernel (a
        mixture of experts) run op by op on the rows inside that pass, and so do models with a
        token mixer or ops without kernel parts, and longer spans (prompt chunks: the prefill's
        int8 GEMM is faster there); those agree with one-token steps within the prefill path's rounding.
        A batch of one sequence is forward_step itself (what generate and chat compute).
        """
        return [logits[-1] for logits in self.forward_step_batch_spans(batch, caches)]

    def forward_step_batch_spans(self, batch: Sequence[Sequence[int]], caches: Sequence[KvCache],
                                 all_logits: bool = False) -> list[np.ndarray]:
        """forward_step_batch returning, per sequence, logits [n_i, vocab] of every position of
        its span (all_logits) or [1, vocab] of the last (what verification of drafted tokens and
        chunked prefill of several requests need)."""
        all_logits = check_flag("all_logits", all_logits)
        for name, value in (("batch", batch), ("caches", caches)):
            if isinstance(value, str | bytes | bytearray | np.ndarray) or not isinstance(value, Sequence):
                raise InvalidRequest(f"forward_step_batch's {name} must be a list, got {type(value).__name__}")
        if len(batch) != len(caches) or not batch:
            raise InvalidRequest("forward_step_batch needs one cache per sequence (and at least one)")
        if len({id(c) for c in caches}) != len(caches):
            raise InvalidRequest("forward_step_batch needs a distinct cache per sequence")
        spans = [self._check_ids(ids) for ids in batch]
        for ids, cache in zip(spans, caches, strict=True):
            self._check_cache(cache)
            cache.check_room(len(ids))
        out: list[np.ndarray] = [np.empty(0)] * len(spans)
        # one sequence asking for its last position only (one token, or a prompt chunk): forward_step's own
        # path, so a lone request computes exactly what generate/chat compute on the same cache (a prompt chunk
        # takes the prefill GEMM there); spans whose every position is wanted (verification) take the rows kernel
        lone = len(spans) == 1 and (len(spans[0]) == 1 or not all_logits)
        short = [i for i, (ids, c) in enumerate(zip(spans, caches, strict=True))
                 if not lone and len(ids) <= ROWS_MAX and self._rows_blocks(c) is not None]
        rest = [i for i in range(len(spans)) if i not in set(short)]
        kinds = [getattr(c, "kv_type", "f32") for c in caches]
        for kind in dict.fromkeys(kinds[i] for i in short):  # one pass per cache type
            same = [i for i in short if kinds[i] == kind]
            for group in _group_rows([len(spans[i]) for i in same], ROWS_MAX):
                idx = [same[g] for g in group]
                logits = self._forward_rows([spans[i] for i in idx], [caches[i] for i in idx], all_logits)
                for i, lg in zip(idx, logits, strict=True):
                    out[i] = lg
        if len(rest) == 1:  # one sequence: its own (fused, for one token) path
            i = rest[0]
            logits = self.forward_step(spans[i], caches[i], all_logits=all_logits)
            out[i] = logits if all_logits else logits[None, :]
        elif rest:
            self._decode.rest()  # the multi-row products' BLAS threads need the cores
            for group in _group_rows([len(spans[i]) for i in rest], self._rows_per_pass[0]):
                idx = [rest[g] for g in group]
                logits = self._forward_spans([spans[i] for i in idx], [caches[i] for i in idx], all_logits)
                for i, lg in zip(idx, logits, strict=True):
                    out[i] = lg
        return out

    def _rows_blocks(self, cache: KvCache) -> list | None:
        """The fused blocks that run a batch's rows on `cache`'s layers through the multi-row kernel (those of
        its kv type), or None when its rows take the op-by-op path (no dense fused layer, or an op without a
        part for that kv type)."""
        if not self._decode.rows_ready:
            return None
        blocks = self._decode.blocks_for(getattr(cache, "kv_type", "f32"))
        return blocks if blocks is not None and any(fb.dense for fb in blocks) else None

    def _span_rows(self, cache: KvCache) -> bool:
        """Whether a span on `cache` takes the multi-row kernel with every row its one-token step's bits: every
        layer dense and fused (an FFN op with its own layer kernel runs op by op on rows)."""
        blocks = self._rows_blocks(cache)
        return blocks is not None and all(fb.dense for fb in blocks)

    def _forward_rows(self, spans: list[np.ndarray], caches: Sequence[KvCache], all_logits: bool) -> list[np.ndarray]:
        """Spans of several sequences (at most ROWS_MAX rows) through the fused layers' multi-row kernel;
        logits per span as forward_step_batch_spans returns them (each row = its one-token step, bitwise).
        A layer whose FFN op brings its own layer kernel runs op by op on the rows (without the pool)."""
        logits, _, ends = self._rows_pass(spans, caches, all_logits)
        if all_logits:
            return np.split(logits, ends[:-1])
        return [logits[i:i + 1] for i in range(len(spans))]

    def _rows_pass(self, spans: list[np.ndarray], caches: Sequence[KvCache],
                   all_logits: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """_forward_rows' pass: (logits and normed hidden states of every row, or of each span's last, and the
        row bounds of the spans)."""
        p = self.plan
        blocks = self._rows_blocks(caches[0])
        dense = all(fb.dense for fb in blocks)
        starts = [len(c) for c in caches]
        lengths = [len(ids) for ids in spans]
        ends = np.cumsum(lengths)                                             # row bounds of each span
        x = np.ascontiguousarray(np.concatenate([self.embed(ids, st) for ids, st in zip(spans, starts, strict=True)]),
                                 dtype=np.float32)                            # [N, d]
        pos = np.concatenate([np.arange(st, st + n, dtype=np.int64) for st, n in zip(starts, lengths, strict=True)])
        seq = np.repeat(np.arange(len(spans), dtype=np.int64), lengths)
        angles = self.rope_angles(pos)
        slots = self._decode.slot_lists(list(caches), blocks)
        if not dense:
            self._decode.rest()  # the op-by-op layers' threads need the cores
        with self._decode.running(len(x)) if dense else nullcontext(NO_POOL) as par:  # the pool, sized for the rows
            for li, (lp, fb) in enumerate(zip(p.layers, blocks, strict=True)):
                if fb.dense:
                    fb.rows(x, slots, li, seq, pos, angles, par)
                else:  # an FFN op with its own layer kernel: op by op on the rows
                    run = _per_span(lp.attention, [c.slots[li] for c in caches], starts, ends)
                    x = np.ascontiguousarray(self._block(lp, x, angles, run), dtype=np.float32)
            for n, cache in zip(lengths, caches, strict=True):
                cache.advance(n)
            rows = np.arange(len(x)) if all_logits else ends - 1
            hidden = self._final_norm(x[rows])
            logits = self.finish_logits(self._head_rows(hidden, par))
        return logits, hidden, ends

    @functools.cached_property
    def _rows_per_pass(self) -> tuple[int, int]:
        """(blocks, head): most rows a product of the blocks' / the output head's weights takes on the
        weight-reading integer paths (unbounded for the GEMM's types). Past it a product dequantizes
        tiles of the whole matrix first, which pays off for a prefill but not for a batch of decode
        steps, so batches are cut there."""
        if self.plan.binder.backend != "fast":
            return (1 << 30, 1 << 30)
        from archrun.kernels.qmatrix import rows_per_pass

        def limit(names: list[str]) -> int:
            types = {self.gguf.tensors[n].ggml_type for n in names if n in self.gguf.tensors}
            return min([rows_per_pass(t) for t in types] or [1 << 30])

        bound = sorted(self.plan.binder.bound)
        if self.plan.span is not None:  # a pipeline stage cuts where the whole model does: every block's types
            blocks = tuple(f"blk.{i}." for i in range(self.descriptor.n_layer))
            bound = sorted(n for n in self.gguf.tensors if n.startswith(blocks))
        head = self.descriptor.tensor_name("token_embd" if self.descriptor.tied_output else "output")
        return limit([n for n in bound if n.startswith("blk.")]), limit([head])

    def _forward_spans(self, spans: list[np.ndarray], caches: Sequence[KvCache], all_logits: bool) -> list[np.ndarray]:
        p = self.plan
        starts = [len(c) for c in caches]
        ends = np.cumsum([len(ids) for ids in spans])                       # row bounds of each span
        x = np.concatenate([self.embed(ids, st) for ids, st in zip(spans, starts, strict=True)])  # [N, d]
        angles = self.rope_angles(np.concatenate([np.arange(st, st + len(ids))
                                                  for ids, st in zip(spans, starts, strict=True)]))
        for li, lp in enumerate(p.layers):
            slots = [c.slots[li] for c in caches]
            beside = None
            if lp.mixer is not None:
                run = _per_span(lp.mixer, slots, starts, ends)
            elif lp.parallel is not None:
                run = _per_span(lp.attention, [s.attention for s in slots], starts, ends)
                beside = _per_span(lp.parallel.mix, [s.mixer for s in slots], starts, ends)
            else:
                run = _per_span(lp.attention, slots, starts, ends)
            x = self._block(lp, x, angles, run, beside)
        for ids, cache in zip(spans, caches, strict=True):
            cache.advance(len(ids))
        rows = np.arange(len(x)) if all_logits else ends - 1
        hidden = self._final_norm(x[rows])
        k = self._rows_per_pass[1]
        parts = range(0, len(hidden), k) if len(hidden) <= 4 * k else [0]
        logits = np.concatenate([self.head(hidden[i:i + k] if len(parts) > 1 else hidden) for i in parts])
        if all_logits:
            return np.split(logits, ends[:-1])
        return [logits[i:i + 1] for i in range(len(spans))]

    def host_step(self, *args: Any, **kwargs: Any) -> HostStep:
        raise WrongBlockStyle("host_step belongs to block style 'host_reference'; this model is 'fused' "
                              "(load with block_style='host_reference' to audit it)")


class HostReferenceDecoder(Interpreter):
    """The auditable host-side float32 shape: host_step; refuses the fused batched entries."""

    caps = Caps(host_step=True)

    def host_step(self, token_ids: Sequence[int] | np.ndarray, cache: KvCache, mtp_cache: Any = None) -> HostStep:
        """Append token_ids; return all-position logits and the trunk's final hidden states.

        mtp_cache is the nullable seam for a family-side multi-token-prediction cache: when
        given, `mtp_cache.advance(token_ids, hidden)` is called after the trunk step so the
        family's MTP block stays in step. The trunk never reads it.
        """
        ids = self._check_ids(token_ids)
        self._check_cache(cache)
        if mtp_cache is not None and not callable(getattr(mtp_cache, "advance", None)):
            raise InvalidRequest(f"mtp_cache must be an MTP head's cache (with advance(ids, hidden)), got "
                                 f"{type(mtp_cache).__name__}")
        cache.check_room(len(ids))
        logits, hidden = self._forward(ids, cache, True)
        if mtp_cache is not None:
            mtp_cache.advance(ids, hidden)
        return HostStep(logits, hidden)

    def forward_step_batch(self, *args: Any, **kwargs: Any) -> list[np.ndarray]:
        raise WrongBlockStyle("forward_step_batch belongs to block style 'fused'; this model is 'host_reference'")

    def forward_step_batch_spans(self, *args: Any, **kwargs: Any) -> list[np.ndarray]:
        raise WrongBlockStyle("forward_step_batch_spans belongs to block style 'fused'; "
                              "this model is 'host_reference'")


def _group_rows(lengths: list[int], limit: int) -> list[list[int]]:
    """Indices of spans grouped so each group's rows stay within `limit`; longer spans go together
    into one group of their own (their products take the many-row path anyway)."""
    groups: list[list[int]] = []
    rows = limit
    long = [i for i, n in enumerate(lengths) if n > limit]
    for i, n in enumerate(lengths):
        if n > limit:
            continue
        if rows + n > limit:
            groups.append([])
            rows = 0
        groups[-1].append(i)
        rows += n
    return groups + ([long] if long else [])


def _per_span(op: Any, slots: list, starts: list[int], ends: np.ndarray) -> Callable:
    """attend(q, k, v) (or a token mixer's attend(h)) over the rows of several sequences: each span
    runs in its own slot."""

    def attend(*rows: np.ndarray) -> np.ndarray:
        bounds = zip([0, *ends[:-1]], ends, strict=True)
        return np.concatenate([op(*(r[a:b] for r in rows), slot, start)
                               for (a, b), slot, start in zip(bounds, slots, starts, strict=True)])

    return attend


def kv_types_of(op: Any, caps: OpCapabilities) -> tuple[str, ...]:
    """The kv types an op's slots can store: its `kv_types` when it declares them, else f32 only."""
    return tuple(op.kv_types) if caps.kv_types else ("f32",)


def check_kv_type(layers: Sequence[LayerPlan], kv_type: Any, declared: Callable[[Any], OpCapabilities]) -> None:
    """Raise KvTypeUnsupported unless every layer's op (and the mixer beside it) stores kv_type
    (declared: the binder's declaration of a bound op)."""
    kv_options(kv_type)
    for i, lp in enumerate(layers):
        for op, spec in ((lp.attention, lp.spec.attention), (lp.parallel, lp.spec.parallel)):
            if op is not None and kv_type not in (have := kv_types_of(op, declared(op))):
                raise KvTypeUnsupported(f"layer {i}'s op {spec.kind!r} ({type(op).__name__}) cannot store a "
                                        f"{kv_type} cache; it stores {', '.join(have)}")


def _new_slot(lp: LayerPlan, capacity: int, max_rewind: int, kv_type: str = "f32") -> Any:
    """A layer's cache slot, made by its op (with its parallel mixer's beside it: a PairSlot); the kv type
    is passed only when it is not f32 (ops that store f32 only need not take it)."""
    kw = {} if kv_type == "f32" else {"kv_type": kv_type}
    slot = lp.attention.new_slot(capacity, max_rewind, **kw)
    return slot if lp.parallel is None else PairSlot(slot, lp.parallel.new_slot(capacity, max_rewind, **kw))


def fused_style() -> type[Interpreter]:
    """block_style factory: the fused decoder class."""
    return FusedDecoder


def host_reference_style() -> type[Interpreter]:
    """block_style factory: the host_reference decoder class."""
    return HostReferenceDecoder
