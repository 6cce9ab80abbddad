"""Synthetic GGUF models written with the real gguf.GGUFWriter (random weights, standard layout).

`write_model(path, **spec)` writes a small decoder in the standard `<arch>.*` layout; keyword
arguments drop keys/tensors or override values so tests can build broken files on purpose.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np


def _tokenizer(w: gguf.GGUFWriter, n_vocab: int) -> None:
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    # ids 0-3 spell "<", "t", "<t", ">" so one real merge exists; every other id is "<tN>"
    w.add_token_list(["<", "t", "<t", ">"] + [f"<t{i}>" for i in range(4, n_vocab)])
    w.add_token_types([1] * n_vocab)
    w.add_token_merges(["< t"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)


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
                quant_types: dict[str, int] | None = None) -> Path:
    """Write a random model; return its path. Key names in drop_keys/key_overrides omit the arch prefix.

    quant_types: tensor name -> ggml type for tensors given as raw uint8 blocks in tensor_overrides.
    """
    rng = np.random.default_rng(seed)
    tensors = model_tensors(rng, n_vocab=n_vocab, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
                            n_head_kv=n_head_kv, head_dim=head_dim, n_ff=n_ff, qk_norm=qk_norm,
                            qkv_bias=qkv_bias, tied=tied, n_expert=n_expert, n_ff_exp=n_ff_exp)
    tensors.update(tensor_overrides or {})
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
    w = gguf.GGUFWriter(str(path), arch)
    for k, v in keys.items():
        if k not in drop_keys:
            _add(w, f"{arch}.{k}", v)
    _tokenizer(w, n_vocab)
    for name, arr in tensors.items():
        if name in drop_tensors:
            continue
        if quant_types and name in quant_types:
            w.add_tensor(name, arr, raw_dtype=quant_types[name])
        else:
            w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def _add(w: gguf.GGUFWriter, key: str, value: Any) -> None:
    if isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, int):
        (w.add_uint32 if value < 2**32 else w.add_uint64)(key, value)
    elif isinstance(value, float):
        w.add_float32(key, value)
    elif isinstance(value, str):
        w.add_string(key, value)
    else:
        w.add_array(key, list(value))
