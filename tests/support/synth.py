"""Synthetic GGUF models written with the real gguf.GGUFWriter (random weights, standard layout).

`write_model(path, **spec)` writes a small decoder in the standard `<arch>.*` layout; keyword
arguments drop keys/tensors or override values so tests can build broken files on purpose.
The tensors depend only on the seed and the dimensions (not on the architecture name), so two
files written with the same spec hold the same weights. `transform` rewrites the tensor dict
before it is written: the structure helpers below (fused QKV, packed gate|up, plain FFN,
LayerNorm biases, one shared norm) turn the standard layout into the same weights in another
layout, or into new structure; `quantize` stores weights in a ggml block type.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from archrun.conformance.synthetic import Quantized, write_gguf


def model_tensors(rng: np.random.Generator, *, n_vocab: int, n_embd: int, n_layer: int, n_head: int,
                  n_head_kv: int, head_dim: int, n_ff: int, qk_norm: bool, qkv_bias: bool, tied: bool,
                  n_expert: int = 0, n_ff_exp: int = 0) -> dict[str, np.ndarray]:
    """Random float32 tensors in numpy (torch) order, keyed by GGUF name."""

    def w(*shape: int, scale: float = 0.1) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    t = {"token_embd.weight": w(n_vocab, n_embd, scale=0.5), "output_norm.weight": 1 + w(n_embd)}
    if not tied:
        t["output.weight"] = w(n_vocab, n_embd)
    for i in range(n_layer):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = 1 + w(n_embd)
        t[p + "attn_q.weight"] = w(n_head * head_dim, n_embd)
        t[p + "attn_k.weight"] = w(n_head_kv * head_dim, n_embd)
        t[p + "attn_v.weight"] = w(n_head_kv * head_dim, n_embd)
        t[p + "attn_output.weight"] = w(n_embd, n_head * head_dim)
        if qkv_bias:
            t[p + "attn_q.bias"] = w(n_head * head_dim)
            t[p + "attn_k.bias"] = w(n_head_kv * head_dim)
            t[p + "attn_v.bias"] = w(n_head_kv * head_dim)
        if qk_norm:
            t[p + "attn_q_norm.weight"] = 1 + w(head_dim)
            t[p + "attn_k_norm.weight"] = 1 + w(head_dim)
        t[p + "ffn_norm.weight"] = 1 + w(n_embd)
        if n_expert:
            t[p + "ffn_gate_inp.weight"] = w(n_expert, n_embd, scale=0.5)
            t[p + "ffn_gate_exps.weight"] = w(n_expert, n_ff_exp, n_embd)
            t[p + "ffn_up_exps.weight"] = w(n_expert, n_ff_exp, n_embd)
            t[p + "ffn_down_exps.weight"] = w(n_expert, n_embd, n_ff_exp)
        else:
            t[p + "ffn_gate.weight"] = w(n_ff, n_embd)
            t[p + "ffn_up.weight"] = w(n_ff, n_embd)
            t[p + "ffn_down.weight"] = w(n_embd, n_ff)
    return t


def write_model(path: str | Path, *, arch: str = "qwen3", seed: int = 0, n_vocab: int = 96, n_embd: int = 32,
                n_layer: int = 2, n_head: int = 4, n_head_kv: int = 2, head_dim: int = 16, n_ff: int = 48,
                qk_norm: bool = True, qkv_bias: bool = False, tied: bool = False, n_expert: int = 0,
                n_expert_used: int = 2, n_ff_exp: int = 16, n_ctx: int = 256,
                drop_keys: tuple[str, ...] = (), drop_tensors: tuple[str, ...] = (),
                key_overrides: dict[str, Any] | None = None,
                tensor_overrides: dict[str, np.ndarray] | None = None,
                quant_types: dict[str, int] | None = None,
                transform: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None) -> Path:
    """Write a random model; return its path. Key names in drop_keys/key_overrides omit the arch prefix.

    quant_types: tensor name -> ggml type for tensors given as raw uint8 blocks in tensor_overrides.
    transform: tensors (numpy order, after tensor_overrides) -> the tensors to write.
    """
    rng = np.random.default_rng(seed)
    tensors = model_tensors(rng, n_vocab=n_vocab, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
                            n_head_kv=n_head_kv, head_dim=head_dim, n_ff=n_ff, qk_norm=qk_norm,
                            qkv_bias=qkv_bias, tied=tied, n_expert=n_expert, n_ff_exp=n_ff_exp)
    tensors.update(tensor_overrides or {})
    if transform is not None:
        tensors = transform(dict(tensors))
    keys: dict[str, Any] = {
        "context_length": n_ctx, "embedding_length": n_embd, "block_count": n_layer,
        "feed_forward_length": n_ff, "attention.head_count": n_head, "attention.head_count_kv": n_head_kv,
        "attention.key_length": head_dim, "attention.value_length": head_dim,
        "attention.layer_norm_rms_epsilon": 1e-6, "rope.freq_base": 10000.0,
    }
    if n_expert:
        keys.update({"expert_count": n_expert, "expert_used_count": n_expert_used,
                     "expert_feed_forward_length": n_ff_exp})
    keys.update(key_overrides or {})
    quant_types = quant_types or {}
    return write_gguf(path, arch, {f"{arch}.{k}": v for k, v in keys.items() if k not in drop_keys},
                      {name: Quantized(arr, quant_types[name]) if name in quant_types else arr
                       for name, arr in tensors.items() if name not in drop_tensors}, n_vocab=n_vocab)


# -- structure transforms (for `transform=`): tensors in, tensors out ---------------------------------


def _blocks(t: dict[str, np.ndarray]) -> list[str]:
    """The `blk.{i}.` prefixes present."""
    return sorted({k[: k.index(".", 4) + 1] for k in t if k.startswith("blk.")}, key=lambda p: int(p[4:-1]))


def fuse_qkv(t: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """attn_q/k/v (and their biases) -> one attn_qkv whose outputs are q | k | v (same weights)."""
    for p in _blocks(t):
        t[p + "attn_qkv.weight"] = np.concatenate([t.pop(p + f"attn_{r}.weight") for r in "qkv"])
        if p + "attn_q.bias" in t:
            t[p + "attn_qkv.bias"] = np.concatenate([t.pop(p + f"attn_{r}.bias") for r in "qkv"])
    return t


def pack_gate_up(t: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """ffn_gate + ffn_up -> one ffn_up of 2 n_ff outputs, gate | up (same weights)."""
    for p in _blocks(t):
        t[p + "ffn_up.weight"] = np.concatenate([t.pop(p + "ffn_gate.weight"), t[p + "ffn_up.weight"]])
    return t


def plain_ffn(t: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Drop ffn_gate: a plain FFN down(act(up x))."""
    for p in _blocks(t):
        t.pop(p + "ffn_gate.weight")
    return t


def shared_norm(t: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Drop ffn_norm (and its bias): the FFN reads the attention's normed input (a parallel block)."""
    for p in _blocks(t):
        t.pop(p + "ffn_norm.weight")
        t.pop(p + "ffn_norm.bias", None)
    return t


def norm_biases(seed: int = 0, scale: float = 0.1) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """A transform adding a random bias to every attn_norm, ffn_norm and output_norm (LayerNorm with bias)."""

    def add(t: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        for name in [k for k in t if k.endswith(("attn_norm.weight", "ffn_norm.weight")) or k == "output_norm.weight"]:
            t[name.replace(".weight", ".bias")] = (rng.standard_normal(t[name].shape) * scale).astype(np.float32)
        return t

    return add


def attn_output_bias(seed: int = 0, scale: float = 0.1) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """A transform adding a random bias to every attn_output."""

    def add(t: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        for p in _blocks(t):
            n = t[p + "attn_output.weight"].shape[0]
            t[p + "attn_output.bias"] = (rng.standard_normal(n) * scale).astype(np.float32)
        return t

    return add


def chain(*transforms: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
          ) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """Apply transforms left to right."""

    def run(t: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        for f in transforms:
            t = f(t)
        return t

    return run


def quantize(ggml_type: int, select: Callable[[str], bool] = lambda name: name.startswith("blk.")
             ) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """A transform storing the selected 2-D weights in `ggml_type` (gguf-py's quantizer; rows are
    quantized independently, so a fused or packed tensor holds exactly its parts' blocks)."""

    def run(t: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        for name, arr in t.items():
            if select(name) and arr.ndim == 2 and name.endswith(".weight"):
                data = gguf.quants.quantize(np.ascontiguousarray(arr, np.float32), gguf.GGMLQuantizationType(ggml_type))
                t[name] = Quantized(data.view(np.uint8).reshape(arr.shape[0], -1), int(ggml_type))
        return t

    return run
