"""`archrun inspect` and `archrun plugins`: what a file compiles to and what is installed."""

from __future__ import annotations

import os
import textwrap
import warnings
from collections import Counter
from typing import Any

from archrun.describe.compile import compile_gguf
from archrun.describe.layers import layer_patterns
from archrun.errors import UnknownVocabulary
from archrun.family import CONVENTIONS
from archrun.io.ggufset import open_gguf
from archrun.plugins import default_plugin_manager, installed_plugins
from archrun.run.bind import vocabulary_of
from archrun.run.cache import KV_TYPES, kv_options
from archrun.run.interpreter import kv_types_of
from archrun.text.tokenizer import pre_tokenizers, tokenizer_models
from archrun.vocab import build_vocabulary


def inspect_model(path: str | os.PathLike, hints: dict[str, Any] | None = None) -> dict[str, Any]:
    """Descriptor, op providers, unused keys and the conventions used for a GGUF file (JSON-ready)."""
    pm = default_plugin_manager()
    with open_gguf(path) as gguf, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = compile_gguf(gguf, plugins=pm, hints=hints)
        types = Counter(t.type_name for t in gguf.tensors.values())
        n_tensors = len(gguf.tensors)
        parts = [{"file": p.path.name, "tensors": len(p.tensors)} for p in getattr(gguf, "parts", (gguf,))]
    vocab = build_vocabulary(pm)
    providers = {}
    for slot, name in vocabulary_of(compiled.descriptor):
        try:
            providers[f"{slot}={name}"] = vocab.entry(slot, name).plugin
        except UnknownVocabulary:
            providers[f"{slot}={name}"] = None
    return {
        "file": str(path),
        "architecture": compiled.descriptor.architecture,
        "family": compiled.family,
        "tensors": n_tensors,
        "parts": parts,
        "tensor_types": dict(sorted(types.items())),
        "descriptor": compiled.descriptor.to_dict(),
        "providers": providers,
        "unused_keys": list(compiled.unused_keys),
        "conventions": {name: _plain(getattr(compiled.hints, name)) for name in CONVENTIONS},
        "memory": _memory(compiled.descriptor, vocab),
    }


def _memory(d: Any, vocab: Any) -> list[dict[str, Any]] | None:
    """Per trunk layer: its block op, the bytes its cache slot adds per token (K/V rows) and the
    bytes of its fixed per-sequence state (a ring, a recurrent state), asked of the op's own
    slot (made empty, never written) at the full context and one token less. A kept copy of a
    recurrent state (rewind, checkpoints) costs `state_bytes` more. None when an op is not installed."""
    out = []
    for layer in d.layers:
        a = layer.attention
        try:
            entry = vocab.entry(a.slot, a.kind).op
        except UnknownVocabulary:
            return None
        op = entry.reference(a)
        per_token, state = _slot_bytes(op, d.n_ctx)
        by_type = {t: _slot_bytes(op, d.n_ctx, t)[0] for t in KV_TYPES
                   if t in kv_types_of(op, entry.declared("reference"))}
        kind = a.kind
        if layer.parallel is not None:
            try:
                side_entry = vocab.entry(layer.parallel.slot, layer.parallel.kind).op
            except UnknownVocabulary:
                return None
            side = side_entry.reference(layer.parallel)
            state += _slot_bytes(side, d.n_ctx)[1]
            by_type = {t: b for t, b in by_type.items() if t in kv_types_of(side, side_entry.declared("reference"))}
            kind = f"{a.kind}+{layer.parallel.kind}"
        out.append({"kind": kind, "bytes_per_token": per_token, "state_bytes": state,
                    "kv_bytes_per_token": by_type})
    return out


def _slot_bytes(op: Any, n_ctx: int, kv_type: str = "f32") -> tuple[int, int]:
    """(bytes per token, fixed state bytes) of the slot `op` makes (storing kv_type), from its empty slots of
    n_ctx and n_ctx-1."""
    kw = kv_options(kv_type)
    full, less = op.new_slot(n_ctx, 0, **kw), op.new_slot(max(1, n_ctx - 1), 0, **kw)
    per_token = full.nbytes - less.nbytes
    return per_token, getattr(full, "state_bytes", full.nbytes - per_token * n_ctx)


def _memory_lines(memory: list[dict[str, Any]] | None) -> list[str]:
    """One line per run of layers with the same memory, then the sequence's total."""
    if memory is None:
        return ["memory        unknown (an op is not installed)"]
    out, start = [], 0
    for i in range(1, len(memory) + 1):
        if i == len(memory) or memory[i] != memory[start]:
            span = f"{start}" if i - 1 == start else f"{start}-{i - 1}"
            m = memory[start]
            out.append(f"memory {span:7s} {m['kind']}: {m['bytes_per_token']} B/token, state {m['state_bytes']} B")
            start = i
    per_token = sum(m["bytes_per_token"] for m in memory)
    state = sum(m["state_bytes"] for m in memory)
    kv = [f"{t} {sum(m['kv_bytes_per_token'][t] for m in memory)} B/token" for t in KV_TYPES
          if all(t in m["kv_bytes_per_token"] for m in memory)]
    out.append(f"kv types      {', '.join(kv)} (init_cache(kv_type=...), --kv-type; others: not stored by an op)")
    out.append(f"per sequence  {per_token} B/token + {state} B of state (each kept rewind copy: the recurrent "
               "layers' state again)")
    return out


def _plain(value: Any) -> Any:
    return value if value is None or isinstance(value, (str, int, float)) else str(value)


def render_text(info: dict[str, Any]) -> str:
    """Human-readable form of inspect_model's result."""
    d = info["descriptor"]
    lines = [
        f"file          {info['file']}",
        f"architecture  {info['architecture']} (family: {info['family']})",
        f"tensors       {info['tensors']}  " + ", ".join(f"{k}×{v}" for k, v in info["tensor_types"].items()),
        f"dims          n_vocab={d['n_vocab']} n_embd={d['n_embd']} n_ctx={d['n_ctx']} "
        f"layers={len(d['layers'])} nextn={len(d['nextn_layers'])}",
        f"norm          {d['norm']} eps={d['norm_eps']}  embed_scale={d['embed_scale']:.4g}  "
        f"tied_output={d['tied_output']}  logit_softcap={d['logit_softcap']}",
        f"block_style   {d['block_style']}",
    ]
    if len(info.get("parts", ())) > 1:  # a split model: one line per part
        n = len(info["parts"])
        lines[1:1] = [f"{f'part {i + 1}/{n}':14s}{p['file']} ({p['tensors']} tensors)"
                      for i, p in enumerate(info["parts"])]
    lines += [f"rope[{i}]       {_kv(r)}" for i, r in enumerate(d["rope_tables"])]
    lines += _layer_groups(d["layers"])
    lines += _memory_lines(info.get("memory"))
    lines.append("ops")
    lines += [f"  {op:28s} {plugin or 'NOT INSTALLED'}" for op, plugin in info["providers"].items()]
    if info["unused_keys"]:
        lines.append("unused keys   " + ", ".join(info["unused_keys"]))
    stated = {k: v for k, v in info["conventions"].items() if v is not None}
    lines.append("conventions   " + " ".join(f"{k}={v}" for k, v in stated.items()))
    return "\n".join(lines)


def _kv(d: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in d.items())


def _layer_groups(layers: list[dict[str, Any]]) -> list[str]:
    """One line per run of identical layers."""
    out, start = [], 0
    for i in range(1, len(layers) + 1):
        if i == len(layers) or layers[i] != layers[start]:
            span = f"{start}" if i - 1 == start else f"{start}-{i - 1}"
            ly = layers[start]
            out.append(f"layers {span:7s} attn[{_kv(ly['attention'])}]")
            out.append(f"               ffn[{_kv(ly['ffn'])}]" if ly["ffn"] else "               no ffn")
            rest = {k: v for k, v in ly.items() if k not in ("attention", "ffn")}
            out.append(f"               {_kv(rest)}")
            start = i
    return out


def list_plugins() -> dict[str, Any]:
    """Installed plugins, their vocabulary entries and the architectures families describe."""
    pm = default_plugin_manager()
    vocab = build_vocabulary(pm)
    families: dict[str, list[str]] = {}
    for impl in pm.hook.archrun_families.get_hookimpls():
        families[impl.plugin_name] = list(impl.function())
    families = dict(sorted(families.items()))
    patterns = layer_patterns(pm)
    return {
        "installed": installed_plugins(),
        "vocabulary": [{"slot": e.op.slot, "name": e.op.name, "plugin": e.plugin,
                        "fast": e.op.fast is not None, "doc": e.op.doc} for e in vocab],
        "families": families,
        "pre_tokenizers": sorted(pre_tokenizers(pm)),
        "tokenizer_models": sorted(tokenizer_models(pm)),
        "layer_patterns": [{"name": n, "property": p.property, "rank": p.rank, "doc": p.doc}
                           for n, p in sorted(patterns.items(), key=lambda np: (np[1].property, -np[1].rank))],
    }


def render_plugins(info: dict[str, Any]) -> str:
    """Human-readable form of list_plugins' result."""
    width = max([12, *map(len, info["installed"]), *map(len, info["families"])])
    lines = ["plugins"] + [f"  {n:{width}s} {mod}" for n, mod in info["installed"].items()]
    lines.append("vocabulary (slot=name  plugin  [fast])")
    for e in info["vocabulary"]:
        fast = " [fast]" if e["fast"] else ""
        lines.append(f"  {e['slot'] + '=' + e['name']:28s} {e['plugin']}{fast}  {e['doc']}")
    lines.append("families")
    lines += [f"  {p:{width}s} {', '.join(archs)}" for p, archs in info["families"].items()]
    lines.append(f"vocabulary kinds (tokenizer.ggml.model)  {', '.join(info['tokenizer_models'])}")
    lines.append(f"pre-tokenizers (tokenizer.ggml.pre, {len(info['pre_tokenizers'])})")
    lines += textwrap.wrap(", ".join(info["pre_tokenizers"]), 100, initial_indent="  ", subsequent_indent="  ")
    lines.append("layer patterns (property, rank: the first that answers decides)")
    lines += [f"  {p['property'] + ' ' + str(p['rank']):13s} {p['name']:24s} {p['doc']}"
              for p in info["layer_patterns"]]
    return "\n".join(lines)
