"""Synthetic GGUF fixtures for the conformance kit: small random models written with gguf.GGUFWriter.

A package declares variants (``Synthetic``) of the architectures it describes; the kit writes
each into a temporary folder and runs its model-free checks on it (no torch, no download). The
file uses the standard ``<arch>.*`` key layout and the standard tensor names, remapped by the
family's own ``FamilyHints.tensor_names`` (a role the family maps to ``None`` is not written),
without norm weights when the family says ``norm_weights=False`` and without pre-norms when it
says ``pre_norms=False``. Weights are random (seeded), with larger query/key weights so attention
is far from uniform and norm weights around 1.

``corruptions(path)`` yields bad inputs applied to such a file (truncation at
every section, bad magic/version, huge counts, unknown tensor type, offsets past the end, a tensor
whose shape contradicts the metadata, a missing key, zero heads, a missing or an unexpected
tensor), each with the typed archrun errors a load must raise.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import gguf
import numpy as np

from archrun.conformance.gguf_edit import add_key, finish
from archrun.descriptor import DEFAULT_TENSOR_NAMES
from archrun.errors import (
    MetadataError,
    MissingTensor,
    ModelLoadError,
    ShapeMismatch,
    UnexpectedTensor,
    UnsupportedQuantType,
)


@attrs.frozen
class Synthetic:
    """One synthetic model of architecture ``arch`` (see the module docstring).

    Dimensions are tiny (float32 files of a few hundred kB at most). Structure: ``qkv_bias``,
    ``qk_norm`` (per-head q/k norms), ``post_norms`` (post-attention and post-FFN norms),
    ``tied`` (no output matrix), ``n_rot`` (rope.dimension_count; partial rope when < head_dim),
    MoE with ``n_expert`` > 0 (``n_expert_used`` of them, width ``n_ff_exp``; ``n_shared``
    shared experts; ``router_bias`` a selection bias; the first ``leading_dense`` layers
    dense; ``gating_func`` writes ``expert_gating_func`` (1 softmax, 2 sigmoid)).
    ``norm_key``: "rms" writes ``attention.layer_norm_rms_epsilon``, "layer" ``layer_norm_epsilon``
    (and norm biases). ``keys``: more ``<arch>.*`` keys (names after the prefix) to write;
    ``file_keys``: keys to write under their full names (gguf-py's unprefixed ones, e.g. ``xielu.beta``).
    """

    name: str
    arch: str
    seed: int = 0
    n_vocab: int = 96
    n_embd: int = 32
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    n_ff: int = 48
    n_ctx: int = 128
    n_rot: int | None = None
    tied: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    post_norms: bool = False
    n_expert: int = 0
    n_expert_used: int = 2
    n_ff_exp: int = 16
    n_shared: int = 0
    router_bias: bool = False
    leading_dense: int = 0
    gating_func: int | None = None
    norm_key: str = attrs.field(default="rms", validator=attrs.validators.in_(("rms", "layer")))
    keys: Mapping[str, Any] = attrs.field(factory=dict)
    file_keys: Mapping[str, Any] = attrs.field(factory=dict)


def tensors(spec: Synthetic, hints: Any = None) -> dict[str, np.ndarray]:
    """The random float32 tensors of ``spec`` (numpy order, [n_out, n_in]), keyed by GGUF name.

    ``hints``: the family's FamilyHints (tensor remaps, norm weights, pre-norms), or None.
    """
    rng = np.random.default_rng(spec.seed)
    names = {**DEFAULT_TENSOR_NAMES, **(dict(hints.tensor_names) if hints is not None else {})}
    norm_weights = hints.norm_weights if hints is not None else True
    pre_norms = hints.pre_norms if hints is not None else True
    d, hd, f = spec.n_embd, spec.head_dim, spec.n_ff
    out: dict[str, np.ndarray] = {}

    def put(role: str, layer: int | None, value: np.ndarray) -> None:
        template = names.get(role)
        if isinstance(template, tuple):  # alternatives the family accepts: write the first
            template = template[0]
        if template is not None:
            out[template.format(i=layer) if "{i}" in template else template] = value

    def w(*shape: int, std: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def norm(role: str, layer: int | None, width: int = d) -> None:
        if not norm_weights:
            return
        put(role, layer, 1 + w(width, std=0.1))
        if spec.norm_key == "layer":
            put(role + ".bias", layer, w(width, std=0.1))

    put("token_embd", None, w(spec.n_vocab, d, std=1.0))
    norm("output_norm", None)
    if not spec.tied:
        put("output", None, w(spec.n_vocab, d))
    for i in range(spec.n_layer):
        if pre_norms:
            norm("attn_norm", i)
        put("attn_q", i, w(spec.n_head * hd, d, std=0.4))
        put("attn_k", i, w(spec.n_head_kv * hd, d, std=0.4))
        put("attn_v", i, w(spec.n_head_kv * hd, d))
        put("attn_output", i, w(d, spec.n_head * hd))
        if spec.qkv_bias:
            put("attn_q.bias", i, w(spec.n_head * hd, std=0.1))
            put("attn_k.bias", i, w(spec.n_head_kv * hd, std=0.1))
            put("attn_v.bias", i, w(spec.n_head_kv * hd, std=0.1))
        if spec.qk_norm:
            put("attn_q_norm", i, 1 + w(hd, std=0.1))
            put("attn_k_norm", i, 1 + w(hd, std=0.1))
        if spec.post_norms:
            put("post_attn_norm", i, 1 + w(d, std=0.1))
            put("post_ffn_norm", i, 1 + w(d, std=0.1))
        if pre_norms:
            norm("ffn_norm", i)
        if spec.n_expert and i >= spec.leading_dense:
            e, fe = spec.n_expert, spec.n_ff_exp
            put("ffn_gate_inp", i, w(e, d, std=0.5))
            put("ffn_gate_exps", i, w(e, fe, d, std=0.3))
            put("ffn_up_exps", i, w(e, fe, d))
            put("ffn_down_exps", i, w(e, d, fe))
            if spec.router_bias:
                put("exp_probs_b", i, w(e, std=0.1))
            if spec.n_shared:
                fs = fe * spec.n_shared
                put("ffn_gate_shexp", i, w(fs, d, std=0.3))
                put("ffn_up_shexp", i, w(fs, d))
                put("ffn_down_shexp", i, w(d, fs))
        else:
            put("ffn_gate", i, w(f, d, std=0.3))
            put("ffn_up", i, w(f, d))
            put("ffn_down", i, w(d, f))
    return out


def metadata(spec: Synthetic) -> dict[str, Any]:
    """The ``<arch>.*`` keys of ``spec`` (names after the prefix)."""
    keys: dict[str, Any] = {
        "context_length": spec.n_ctx, "embedding_length": spec.n_embd, "block_count": spec.n_layer,
        "feed_forward_length": spec.n_ff, "attention.head_count": spec.n_head,
        "attention.head_count_kv": spec.n_head_kv, "attention.key_length": spec.head_dim,
        "attention.value_length": spec.head_dim, "rope.freq_base": 10000.0,
    }
    keys["attention.layer_norm_rms_epsilon" if spec.norm_key == "rms" else "attention.layer_norm_epsilon"] = 1e-5
    if spec.n_rot is not None:
        keys["rope.dimension_count"] = spec.n_rot
    if spec.n_expert:
        keys.update({"expert_count": spec.n_expert, "expert_used_count": spec.n_expert_used,
                     "expert_feed_forward_length": spec.n_ff_exp})
        if spec.n_shared:
            keys["expert_shared_count"] = spec.n_shared
        if spec.leading_dense:
            keys["leading_dense_block_count"] = spec.leading_dense
        if spec.gating_func is not None:
            keys["expert_gating_func"] = spec.gating_func
    keys.update(spec.keys)
    return keys


@attrs.frozen
class Quantized:
    """A tensor for `write_gguf` as raw ggml blocks: data uint8 [..., row bytes] of type ggml_type."""

    data: np.ndarray
    ggml_type: int


def write_gguf(path: str | Path, arch: str, keys: Mapping[str, Any], tensors: Mapping[str, Any], *,
               n_vocab: int | None = None, alignment: int | None = None) -> Path:
    """Write a synthetic GGUF file with gguf.GGUFWriter: the one writer of archrun's synthetic files.

    keys: full key -> value (gguf_edit.add_key: a Python value, or (value, GGUFValueType[, element
    type]) for an explicit type). tensors: name -> array in numpy order (written as its dtype) or
    `Quantized` blocks. n_vocab: also write a minimal byte-level BPE vocabulary of that many tokens
    (ids 0-3 spell "<", "t", "<t", ">", one real merge; every other id is "<tN>"; bos 0, eos 1).
    """
    w = gguf.GGUFWriter(str(path), arch)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for k, v in keys.items():
        add_key(w, k, v)
    if n_vocab is not None:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen2")
        w.add_token_list(["<", "t", "<t", ">"] + [f"<t{i}>" for i in range(4, n_vocab)])
        w.add_token_types([1] * n_vocab)
        w.add_token_merges(["< t"])
        w.add_bos_token_id(0)
        w.add_eos_token_id(1)
    finish(w, ((name, a.data, gguf.GGMLQuantizationType(a.ggml_type)) if isinstance(a, Quantized) else (name, a, None)
               for name, a in tensors.items()))
    return Path(path)


def write(path: str | Path, spec: Synthetic, hints: Any = None, *,
          edit_keys: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
          edit_tensors: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None) -> Path:
    """Write ``spec`` as a GGUF file (with a minimal BPE tokenizer); return its path.

    ``edit_keys`` / ``edit_tensors`` rewrite the keys (names after ``<arch>.``) / tensors before
    they are written (how the bad-input variants are made).
    """
    keys = metadata(spec)
    ts = tensors(spec, hints)
    if edit_keys is not None:
        keys = edit_keys(dict(keys))
    if edit_tensors is not None:
        ts = edit_tensors(dict(ts))
    return write_gguf(path, spec.arch, {**{f"{spec.arch}.{k}": v for k, v in keys.items()}, **spec.file_keys}, ts,
                      n_vocab=spec.n_vocab)


# ------------------------------------------------------------------------------ bad inputs

#: what a load of a corrupted container may raise: a damaged file is a ModelLoadError (its
#: subclasses name the case); a tensor type archrun cannot run may also say so by name
_DAMAGED = (ModelLoadError,)


def _layout(path: Path) -> dict[str, int]:
    """Byte offsets of a file's sections and of its first tensor info's type and offset fields."""
    r = gguf.GGUFReader(str(path))
    first = r.tensors[0]
    info = first.field.offset  # start of the first tensor info: name (u64 len + bytes), n_dims, dims, type, offset
    n_dims = len(first.shape)
    type_at = info + 8 + len(first.name.encode()) + 4 + 8 * n_dims
    kv_start = 24  # magic, version, n_tensors (u64), n_kv (u64)
    return {"kv": kv_start, "infos": info, "data": r.data_offset, "type": type_at, "offset": type_at + 4,
            "size": path.stat().st_size}


def _patch(data: bytes, at: int, fmt: str, value: int) -> bytes:
    raw = bytearray(data)
    struct.pack_into(fmt, raw, at, value)
    return bytes(raw)


def corruptions(spec: Synthetic, hints: Any = None) -> dict[str, tuple[Callable[[Path], Path], tuple[type, ...]]]:
    """name -> (write(dst) -> dst: ``spec``'s file with one corruption, the error types a load must raise)."""

    def from_bytes(edit: Callable[[bytes, dict[str, int]], bytes]) -> Callable[[Path], Path]:
        def make(dst: Path) -> Path:
            good = write(dst.with_name(dst.stem + ".good.gguf"), spec, hints)
            dst.write_bytes(edit(good.read_bytes(), _layout(good)))
            return dst
        return make

    def rewritten(**edits: Any) -> Callable[[Path], Path]:
        return lambda dst: write(dst, spec, hints, **edits)

    first_matrix = next(n for n, a in tensors(spec, hints).items() if n.startswith("blk.0.") and a.ndim == 2)
    last_block = f"blk.{spec.n_layer - 1}."

    def shrink(ts: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ts[first_matrix] = ts[first_matrix][:-1]  # one output row fewer than the metadata implies
        return ts

    def drop(ts: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        name = next(n for n in ts if n.startswith(last_block) and ts[n].ndim >= 2)
        del ts[name]
        return ts

    def extra(ts: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ts["blk.0.conformance_unknown.weight"] = np.ones((4, spec.n_embd), np.float32)
        return ts

    def without(key: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
        return lambda keys: {k: v for k, v in keys.items() if k != key}

    return {
        # F1: empty or truncated in every section
        "F1_empty": (from_bytes(lambda b, at: b""), _DAMAGED),
        "F1_truncated_header": (from_bytes(lambda b, at: b[:12]), _DAMAGED),
        "F1_truncated_kv": (from_bytes(lambda b, at: b[: (at["kv"] + at["infos"]) // 2]), _DAMAGED),
        "F1_truncated_tensor_infos": (from_bytes(lambda b, at: b[: at["offset"]]), _DAMAGED),
        "F1_truncated_data": (from_bytes(lambda b, at: b[: (at["data"] + at["size"]) // 2]), _DAMAGED),
        # F2: bad magic or version
        "F2_bad_magic": (from_bytes(lambda b, at: b"GGUX" + b[4:]), _DAMAGED),
        "F2_bad_version": (from_bytes(lambda b, at: _patch(b, 4, "<I", 99)), _DAMAGED),
        # F3: huge counts
        "F3_huge_n_tensors": (from_bytes(lambda b, at: _patch(b, 8, "<Q", 1 << 62)), _DAMAGED),
        "F3_huge_n_kv": (from_bytes(lambda b, at: _patch(b, 16, "<Q", 1 << 62)), _DAMAGED),
        # F6 / M3: a tensor type no ggml version has
        "F6_unknown_tensor_type": (from_bytes(lambda b, at: _patch(b, at["type"], "<I", 999)),
                                   (ModelLoadError, UnsupportedQuantType)),
        # F10: a tensor's data past the end of the file
        "F10_offset_past_eof": (from_bytes(lambda b, at: _patch(b, at["offset"], "<Q", 1 << 40)), _DAMAGED),
        # M1: a required key missing, impossible head counts
        "M1_missing_block_count": (rewritten(edit_keys=without("block_count")), (MetadataError,)),
        "M1_zero_heads": (rewritten(edit_keys=lambda k: {**k, "attention.head_count": 0}), (MetadataError,)),
        # M2: a tensor shape that disagrees with the metadata
        "M2_wrong_tensor_shape": (rewritten(edit_tensors=shrink), (ShapeMismatch,)),
        # tensors: one the plan needs is missing; one the plan does not know is present
        "missing_tensor": (rewritten(edit_tensors=drop), (MissingTensor,)),
        "unexpected_tensor": (rewritten(edit_tensors=extra), (UnexpectedTensor,)),
    }


#: the corruption names ``corruptions`` returns, in order (tests are parametrized by them before files exist)
CORRUPTIONS = ("F1_empty", "F1_truncated_header", "F1_truncated_kv", "F1_truncated_tensor_infos",
               "F1_truncated_data", "F2_bad_magic", "F2_bad_version", "F3_huge_n_tensors", "F3_huge_n_kv",
               "F6_unknown_tensor_type", "F10_offset_past_eof", "M1_missing_block_count", "M1_zero_heads",
               "M2_wrong_tensor_shape", "missing_tensor", "unexpected_tensor")
