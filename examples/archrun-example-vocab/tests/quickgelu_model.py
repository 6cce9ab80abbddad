"""The quickgelu-llama fixtures the conformance kit writes, and an independent float64 forward pass of them.

``VARIANTS``: synthetic models (``archrun.conformance.Synthetic``) the kit writes with the real
gguf.GGUFWriter in the standard llama layout (RMSNorm, NORM-paired rope, grouped-query attention,
gated FFN) under the architecture string "quickgelu-llama", which only this package's family
knows: a dense one, and one whose second layer is a mixture of experts.

``forward(path, ids)`` reads such a file back with gguf.GGUFReader and computes the logits in
float64 numpy from what quickgelu-llama *is*, knowing nothing of archrun: the gated FFN's
activation is QuickGELU x * sigmoid(1.702 x); experts are chosen by softmax over the router's
logits, top-k, with the chosen weights renormalised to sum to 1; the final logits are softcapped,
30 tanh(x / 30), unless the file states another cap. The kit checks archrun against it
(``Conformance.reference``).
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from archrun.conformance import Synthetic

ARCH = "quickgelu-llama"
ALPHA = 1.702
DEFAULT_SOFTCAP = 30.0

VARIANTS = (
    Synthetic("quickgelu_dense", ARCH, seed=1),
    Synthetic("quickgelu_moe", ARCH, seed=2, n_layer=2, n_expert=4, n_expert_used=2, leading_dense=1),
)


def read(path: str | Path) -> tuple[dict[str, np.ndarray], dict[str, object]]:
    """(tensors dequantized to float64 in numpy order, ``quickgelu-llama.*`` keys without the prefix)."""
    reader = gguf.GGUFReader(str(path))
    tensors = {}
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed(t.shape))
        tensors[t.name] = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float64)
    keys = {k.removeprefix(ARCH + "."): f.contents() for k, f in reader.fields.items() if k.startswith(ARCH + ".")}
    return tensors, keys


def gelu_quick(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-ALPHA * x))


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope_norm(x: np.ndarray, pos: np.ndarray, base: float) -> np.ndarray:
    """Rotate adjacent pairs (x[2i], x[2i+1]) of every head of x [n, H, hd] by pos * base^(-2i/hd)."""
    hd = x.shape[-1]
    theta = pos[:, None] * base ** (-np.arange(0, hd, 2) / hd)          # [n, hd/2]
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


def _moe(g: np.ndarray, t: dict[str, np.ndarray], p: str, k: int) -> np.ndarray:
    """Softmax router, top-k experts per token, chosen weights renormalised, gated QuickGELU experts."""
    logits = g @ t[p + "ffn_gate_inp.weight"].T                            # [n, E]
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.zeros_like(g)
    for i in range(len(g)):
        top = np.argsort(-probs[i], kind="stable")[:k]
        weights = probs[i, top] / probs[i, top].sum()
        for e, wgt in zip(top, weights, strict=True):
            h = gelu_quick(t[p + "ffn_gate_exps.weight"][e] @ g[i]) * (t[p + "ffn_up_exps.weight"][e] @ g[i])
            out[i] += wgt * (t[p + "ffn_down_exps.weight"][e] @ h)
    return out


def forward(path: str | Path, ids) -> np.ndarray:
    """Logits [n, vocab] (float64) of ``ids``, from the file alone (see the module docstring)."""
    t, kv = read(path)
    ids = np.asarray(ids)
    n, H, KV = len(ids), int(kv["attention.head_count"]), int(kv["attention.head_count_kv"])
    hd, eps, base = int(kv["attention.key_length"]), float(kv["attention.layer_norm_rms_epsilon"]), \
        float(kv["rope.freq_base"])
    pos = np.arange(n, dtype=np.float64)
    x = t["token_embd.weight"][ids]
    for i in range(int(kv["block_count"])):
        p = f"blk.{i}."
        h = _rms(x, t[p + "attn_norm.weight"], eps)
        q = _rope_norm((h @ t[p + "attn_q.weight"].T).reshape(n, H, hd), pos, base)
        k = _rope_norm((h @ t[p + "attn_k.weight"].T).reshape(n, KV, hd), pos, base)
        v = (h @ t[p + "attn_v.weight"].T).reshape(n, KV, hd)
        k, v = np.repeat(k, H // KV, axis=1), np.repeat(v, H // KV, axis=1)  # head j reads kv head j // (H/KV)
        s = np.einsum("ihd,jhd->hij", q, k) / np.sqrt(hd)
        s = np.where(np.tril(np.ones((n, n), bool))[None], s, -np.inf)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        x = x + np.einsum("hij,jhd->ihd", a, v).reshape(n, H * hd) @ t[p + "attn_output.weight"].T
        g = _rms(x, t[p + "ffn_norm.weight"], eps)
        if p + "ffn_gate_inp.weight" in t:
            x = x + _moe(g, t, p, int(kv["expert_used_count"]))
        else:
            ff = gelu_quick(g @ t[p + "ffn_gate.weight"].T) * (g @ t[p + "ffn_up.weight"].T)
            x = x + ff @ t[p + "ffn_down.weight"].T
    head = t.get("output.weight", t["token_embd.weight"])
    logits = _rms(x, t["output_norm.weight"], eps) @ head.T
    cap = float(kv.get("final_logit_softcapping", DEFAULT_SOFTCAP))
    return cap * np.tanh(logits / cap)
