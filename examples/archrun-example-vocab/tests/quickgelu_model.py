"""A tiny quickgelu-llama GGUF (written with the real gguf.GGUFWriter) and an independent float64 forward pass.

The file is a llama-shaped decoder (standard GGUF tensor names, RMSNorm, NORM-paired rope,
grouped-query attention, gated FFN) whose architecture string is "quickgelu-llama": only this
package's family knows it, and its FFN activation is this package's gelu_quick. Weights are
random with std >= 0.2 (q/k larger) so attention is far from uniform.

`forward(path, ids)` reads the file back with gguf.GGUFReader and computes the logits in float64
numpy, knowing nothing of archrun.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

ARCH = "quickgelu-llama"
DIMS = dict(n_vocab=96, n_embd=32, n_layer=2, n_head=4, n_head_kv=2, head_dim=16, n_ff=64, n_ctx=128)
EPS = 1e-5
FREQ_BASE = 10000.0
ALPHA = 1.702


def write_model(path: str | Path, seed: int = 0) -> Path:
    """Write the model (float32 tensors) with a minimal BPE tokenizer; return its path."""
    d = DIMS
    rng = np.random.default_rng(seed)

    def w(*shape: int, std: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    e, hd, f = d["n_embd"], d["head_dim"], d["n_ff"]
    t = {"token_embd.weight": w(d["n_vocab"], e, std=1.0), "output_norm.weight": 1 + w(e, std=0.1),
         "output.weight": w(d["n_vocab"], e)}
    for i in range(d["n_layer"]):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = 1 + w(e, std=0.1)
        t[p + "attn_q.weight"] = w(d["n_head"] * hd, e, std=0.4)
        t[p + "attn_k.weight"] = w(d["n_head_kv"] * hd, e, std=0.4)
        t[p + "attn_v.weight"] = w(d["n_head_kv"] * hd, e)
        t[p + "attn_output.weight"] = w(e, d["n_head"] * hd)
        t[p + "ffn_norm.weight"] = 1 + w(e, std=0.1)
        t[p + "ffn_gate.weight"] = w(f, e, std=0.3)
        t[p + "ffn_up.weight"] = w(f, e)
        t[p + "ffn_down.weight"] = w(e, f)

    wr = gguf.GGUFWriter(str(path), ARCH)
    wr.add_context_length(d["n_ctx"])
    wr.add_embedding_length(e)
    wr.add_block_count(d["n_layer"])
    wr.add_feed_forward_length(f)
    wr.add_head_count(d["n_head"])
    wr.add_head_count_kv(d["n_head_kv"])
    wr.add_key_length(hd)
    wr.add_value_length(hd)
    wr.add_layer_norm_rms_eps(EPS)
    wr.add_rope_freq_base(FREQ_BASE)
    # tokenizer: ids 0-3 spell "<", "t", "<t", ">" (one real merge); every other id is "<tN>"
    wr.add_tokenizer_model("gpt2")
    wr.add_tokenizer_pre("qwen2")
    wr.add_token_list(["<", "t", "<t", ">"] + [f"<t{i}>" for i in range(4, d["n_vocab"])])
    wr.add_token_types([1] * d["n_vocab"])
    wr.add_token_merges(["< t"])
    wr.add_bos_token_id(0)
    wr.add_eos_token_id(1)
    for name, arr in t.items():
        wr.add_tensor(name, arr)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return Path(path)


def read_tensors(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of the file, dequantized to float64, in numpy order ([n_out, n_in] for matrices)."""
    reader = gguf.GGUFReader(str(path))
    out = {}
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed(t.shape))
        out[t.name] = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float64)
    return out


def _rms(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS) * w


def _rope_norm(x: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Rotate adjacent pairs (x[2i], x[2i+1]) of every head of x [n, H, hd] by pos * base^(-2i/hd)."""
    hd = x.shape[-1]
    theta = pos[:, None] * FREQ_BASE ** (-np.arange(0, hd, 2) / hd)          # [n, hd/2]
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


def gelu_quick(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-ALPHA * x))


def forward(path: str | Path, ids, act=gelu_quick) -> tuple[np.ndarray, list[np.ndarray]]:
    """(logits [n, vocab] float64, per-layer attention probabilities [H, n, n]) of ids, from the file alone."""
    t, d = read_tensors(path), DIMS
    ids = np.asarray(ids)
    n, H, KV, hd = len(ids), d["n_head"], d["n_head_kv"], d["head_dim"]
    pos = np.arange(n, dtype=np.float64)
    x = t["token_embd.weight"][ids]
    probs = []
    for i in range(d["n_layer"]):
        p = f"blk.{i}."
        h = _rms(x, t[p + "attn_norm.weight"])
        q = _rope_norm((h @ t[p + "attn_q.weight"].T).reshape(n, H, hd), pos)
        k = _rope_norm((h @ t[p + "attn_k.weight"].T).reshape(n, KV, hd), pos)
        v = (h @ t[p + "attn_v.weight"].T).reshape(n, KV, hd)
        k, v = np.repeat(k, H // KV, axis=1), np.repeat(v, H // KV, axis=1)  # head j reads kv head j // (H/KV)
        s = np.einsum("ihd,jhd->hij", q, k) / np.sqrt(hd)
        s = np.where(np.tril(np.ones((n, n), bool))[None], s, -np.inf)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        probs.append(a)
        att = np.einsum("hij,jhd->ihd", a, v).reshape(n, H * hd)
        x = x + att @ t[p + "attn_output.weight"].T
        g = _rms(x, t[p + "ffn_norm.weight"])
        ff = act(g @ t[p + "ffn_gate.weight"].T) * (g @ t[p + "ffn_up.weight"].T)
        x = x + ff @ t[p + "ffn_down.weight"].T
    return _rms(x, t["output_norm.weight"]) @ t["output.weight"].T, probs
