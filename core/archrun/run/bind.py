"""The binder: a Descriptor's vocabulary values resolved to bound ops and its weights bound, once per model.

`build_plan` looks every op up in the vocabulary, checks what each declares (archrun.contracts), binds
every layer's weights (on a thread pool) and returns the Plan the interpreter runs; tensors no layer
binds, a causality mismatch or a missing tensor are typed errors before any kernel runs.
"""

from __future__ import annotations

import fnmatch
import os
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType

from archrun.contracts import NONE as NO_CAPABILITIES
from archrun.contracts import OpCapabilities, check_bound
from archrun.descriptor import NO_ROPE, Descriptor, LayerSpec, MoeSpec
from archrun.errors import (
    ArchrunWarning,
    InvalidRequest,
    MetadataError,
    MissingTensor,
    ShapeMismatch,
    UnexpectedTensor,
    UnsupportedQuantType,
    shown,
)
from archrun.io import quant
from archrun.io.ggufio import GGUFFile, TensorInfo
from archrun.io.weights import Matrix, MoeWeights
from archrun.run.plan import DenseFfn, LayerPlan, MoeFfn, Plan, Projections
from archrun.vocab import Vocabulary

F32 = np.float32


class _Binder:
    """Resolves vocabulary and binds weights for one model."""

    pager: Any = None  # archrun.io.experts.ExpertPager of a model whose experts are streamed from disk
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

    def integers(self, role: str, layer: int | None = None) -> np.ndarray:
        """An integer tensor (I8, I16, I32, I64) as int64 in numpy order, e.g. a token -> experts table."""
        name = self.d.tensor_name(role, layer)
        if name not in self.gguf.tensors:
            raise MissingTensor(f"required tensor {name!r} is missing")
        info = self.gguf.tensors[name]
        kinds = {GGMLQuantizationType.I8: "<i1", GGMLQuantizationType.I16: "<i2", GGMLQuantizationType.I32: "<i4",
                 GGMLQuantizationType.I64: "<i8"}
        if info.ggml_type not in kinds:
            raise UnsupportedQuantType(f"tensor {name!r} ({info.type_name}) is not an integer tensor")
        self.bound.add(name)
        values = self.gguf.raw(name).view(kinds[GGMLQuantizationType(info.ggml_type)])
        return values.reshape(info.np_shape).astype(np.int64)

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

    def experts_halves(self, role: str, layer: int) -> tuple[list[Matrix], list[Matrix]]:
        """Split a stacked expert tensor {n_in, 2 n_out, E} holding each expert's two projections one after the
        other (llama.cpp's `ffn_gate_up_exps`: gate rows, then up rows) into two lists of E matrices (views)."""
        info = self._checked(role, layer)
        if info.shape[1] % 2:
            raise ShapeMismatch(f"{info.name} has {info.shape[1]} rows an expert: not two halves")
        halves = self._reuse(("expert_halves", info.name), (info.name,),
                             lambda: self._experts(info, layer, None, parts=2))
        return halves[0::2], halves[1::2]

    def _experts(self, info: TensorInfo, layer: int, bias_role: str | None, parts: int = 1) -> list[Matrix]:
        """E * parts matrices: expert e's part p (its rows split into `parts` equal runs) at e * parts + p."""
        name = info.name
        n_in, n_rows, n_exp = info.shape
        rows = self.gguf.raw_rows(name)  # [E * n_rows, row_bytes]
        n_out = n_rows // parts
        biases = self.table(bias_role, layer).reshape(n_exp, n_out) if bias_role else [None] * n_exp
        pager = self.pager if self.pager is not None and not self.pager.finished else None
        mats = [Matrix(rows[e * n_rows + p * n_out : e * n_rows + (p + 1) * n_out], info.ggml_type, n_in,
                       self.backend, biases[e], f"{name}[{e}]" if parts == 1 else f"{name}[{e}][{p}]",
                       lazy=pager is not None)
                for e in range(n_exp) for p in range(parts)]
        if pager is not None:  # experts streamed from disk (archrun.io.experts): each prepared, stored, dropped
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
    if d.stream:
        wanted.append(("stream", d.stream))
    wanted.append(("block_style", d.block_style))
    return list(dict.fromkeys(wanted))


def build_plan(d: Descriptor, gguf: GGUFFile, vocab: Vocabulary, backend: str = "fast",
               progress: Callable[[str, int, int], None] | None = None,
               layers: tuple[int, int] | None = None, expert_memory: int | None = None,
               share_with: Plan | None = None, fused: bool = True) -> Plan:
    """Resolve the descriptor's vocabulary and bind its weights (once per model).

    Every vocabulary value is checked first, so a missing op fails before any weight is touched.
    Tensors of the file that neither the plan nor the descriptor's MTP blocks use are reported
    (ArchrunWarning), like unused metadata keys.

    layers=(start, end): a pipeline stage's plan (archrun.pipeline): only blocks start..end-1 are bound,
    the embeddings only when start is 0 and the output head only when end is the last block's; such a
    plan takes and gives hidden states where it does not begin or end the model.

    expert_memory: bytes of MoE expert matrices kept resident; the others are paged in from an expert
    store on demand (archrun.io.experts; fast backend only). None: every expert resident.
    share_with: the plan of a model of the same file on the same backend: its bound matrices are reused for
    every tensor this file's LoRA adapters leave unchanged (one copy of the base for several adapters).
    fused: False runs every step op by op (Plan.fused).
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
    if d.stream:  # the residual stream is the op's: it binds its own tensors (the whole model: no stages)
        plan.stream = b.op("stream", d.stream, d, **dict(d.stream_params))
        plan.stream.bind(b)
    plan.fused = fused
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
    """The expert store of a model loaded with expert_memory (archrun.io.experts), or None."""
    from archrun.io.experts import ExpertPager, check_expert_memory, directory

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
    if d.stream and (start, end) != (0, d.n_layer):
        raise InvalidRequest(f"{d.architecture} carries its residual stream through the blocks with stream op "
                             f"{d.stream!r} (more than one [n, d] array): it runs in one process, not in "
                             "pipeline stages")
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
        for lp in pool.map(lambda item: bind_layer(b, *item), specs):
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


def bind_layer(b: _Binder, i: int, spec: LayerSpec) -> LayerPlan:
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
    if isinstance(lp.ffn, MoeFfn) and b.declared(lp.ffn.moe).own_ffn_norm:  # the op applies the FFN norm itself
        lp.ffn_applies_norm = True
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
    """x -> norm(x, w): a norm with its weight bound; its op and weight stay readable as `.op` and `.weight`
    (what the fused layer kernel takes: archrun.kernels.decode.fusion)."""
    def normed(x: np.ndarray) -> np.ndarray:
        return norm(x, w)

    normed.op, normed.weight = norm, w
    return normed


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
    if spec.packed:  # one {d, 2 n_ff, E} tensor: each expert's gate rows, then its up rows
        gate, up = b.experts_halves("ffn_gate_up_exps", i)
    else:
        gate = b.experts("ffn_gate_exps", i, "ffn_gate_exps.bias" if spec.gate_bias else None)
        up = b.experts("ffn_up_exps", i, "ffn_up_exps.bias" if spec.up_bias else None)
    weights = MoeWeights(
        gate_inp=b.matrix("ffn_gate_inp", i, "ffn_gate_inp.bias" if spec.router_input_bias else None),
        probs_bias=b.vector("exp_probs_b", i) if spec.router_bias else None,
        gate=gate,
        up=up,
        down=b.experts("ffn_down_exps", i, "ffn_down_exps.bias" if spec.down_bias else None),
        shared=shared,
        shared_gate=b.vector("ffn_gate_inp_shexp", i) if spec.shared_gate else None,
    )
    caps = b.declared(moe)
    if caps.binds:  # tensors of its own (e.g. a token -> experts table)
        moe.bind(b, i)
    return MoeFfn(moe, weights, caps.token_ids)
