"""MLA's projections (an archrun.vocab.AttentionLayout): absorbed, so attention runs on the latent.

DeepSeek-V2/V3 multi-head latent attention (llama.cpp src/models/deepseek2.cpp, HF
modeling_deepseek_v3.py), per token, with H heads, r = qk_rope, p = qk_nope, c = kv_lora_rank,
v = v_head_dim:

    q        = q_b(rms(q_a h))            (or attn_q h without a q LoRA, "Lite")   [H, p + r]
    ckv      = kv_a_mqa h                                                          [c + r]
    latent   = rms(kv_a_norm, ckv[:c]);  k_pe = ckv[c:]   (one rotary key shared by every head)
    naive    : k_h = [k_b_h latent | k_pe],  v_h = v_b_h latent,  scores q_h . k_h
    absorbed : q_h . k_h = (k_b_h^T q_nope_h) . latent + q_pe_h . k_pe

so each head's query becomes [q_pe | k_b_h^T q_nope_h] (r + c wide) against one cached key row
[k_pe | latent], and the value is the latent itself; head h's output latent goes through v_b_h,
then attn_output. Rotary dims go first so the model's rope op (which rotates the first n_rot
dims of a head) rotates exactly q_pe and k_pe. The scale is mscale^2 / sqrt(p + r) (YaRN's
mscale = 1 + 0.1 * mscale_all_dim * ln(factor), stored as `rope.scaling.yarn_log_multiplier`
= 0.1 * mscale_all_dim; 1 without YaRN).

The q_a / kv_a norms take the model's RMS epsilon (llama.cpp), or a fixed one (`MlaLayout(lora_norm_eps)`:
HF's Kimi Linear module builds those two norms with its default 1e-6 whatever the config's rms_norm_eps).

Legacy files carry the unsplit `attn_kv_b` {c, H (p + v)}; it is split per head at load exactly
as llama.cpp's converter splits it into `attn_k_b` {p, c, H} (transposed) and `attn_v_b` {c, v, H}.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from archrun.errors import MetadataError

F32 = np.float32


class MlaLayout:
    """describe: MLA's geometry from its keys and tensors; bind: the absorbed projections. `lora_norm_eps`:
    the q_a / kv_a norms' epsilon (None: the model's)."""

    def __init__(self, lora_norm_eps: float | None = None):
        self.lora_norm_eps = lora_norm_eps

    def describe(self, ctx: Any) -> dict[str, Any]:
        """AttentionSpec fields of layer ctx.layer (see archrun.vocab.AttentionLayout)."""
        m, t, i, d, n_head = ctx.meta, ctx.tensors, ctx.layer, ctx.n_embd, ctx.n_head
        lora = m.get("attention.kv_lora_rank", int)
        rope = m.get("rope.dimension_count", int)
        legacy = t.has("attn_kv_b", i)
        if legacy:  # key/value_length are the per-head widths there (llama.cpp: the *_mla keys default to them,
            # value_length to n_embd / n_head: MiniCPM3's files carry none)
            k_mla = m.get("attention.key_length_mla", int, 0) or m.get("attention.key_length", int)
            v_mla = m.get("attention.value_length_mla", int, 0) or m.get("attention.value_length", int, d // n_head)
        else:
            k_mla = m.get("attention.key_length_mla", int)
            v_mla = m.get("attention.value_length_mla", int)
            if m.get("attention.key_length", int, lora + rope) != lora + rope:
                raise MetadataError(f"{m.key('attention.key_length')!r} must be kv_lora_rank + rope dims "
                                    f"({lora} + {rope}) in an MLA file")
        nope = k_mla - rope
        if min(lora, rope, nope, v_mla) < 1 or rope % 2:
            raise MetadataError(f"MLA widths are impossible: kv_lora_rank {lora}, rope {rope}, "
                                f"qk_nope {nope}, v_head_dim {v_mla}")
        q_lora = _expect_query(m, t, i, d, n_head * k_mla)
        t.expect("attn_kv_a_mqa", i, (d, lora + rope))
        t.expect("attn_kv_a_norm", i, (lora,))
        if legacy:
            t.expect("attn_kv_b", i, (lora, n_head * (nope + v_mla)))
        else:
            t.expect("attn_k_b", i, (nope, lora, n_head))
            t.expect("attn_v_b", i, (lora, v_mla, n_head))
        t.expect("attn_output", i, (n_head * v_mla, d))
        return dict(
            n_head_kv=1, head_dim=rope + lora, v_head_dim=lora, scale=_mscale(m) ** 2 / math.sqrt(k_mla),
            params={"kv_lora_rank": lora, "qk_rope": rope, "qk_nope": nope, "v_head_dim": v_mla,
                    "q_lora_rank": q_lora, "legacy_kv_b": float(legacy)},
        )

    def bind(self, b: Any, spec: Any, i: int) -> tuple[Any, Any]:
        """(qkv, o) of layer i: the absorbed query/key/value and the output projection."""
        p = {name: int(value) for name, value in spec.params}
        norm = b.op("norm", b.d.norm, b.d.norm_eps if self.lora_norm_eps is None else self.lora_norm_eps)
        if p["q_lora_rank"]:
            query = _LoraQuery(b.matrix("attn_q_a", i), b.vector("attn_q_a_norm", i), b.matrix("attn_q_b", i), norm)
        else:
            query = b.matrix("attn_q", i)
        k_b, v_b = _absorbers(b, i, spec.n_head, p)
        qkv = _MlaQkv(query, b.matrix("attn_kv_a_mqa", i), b.vector("attn_kv_a_norm", i), norm, k_b, p)
        return qkv, _MlaOutput(v_b, b.matrix("attn_output", i))


def _expect_query(m: Any, t: Any, i: int, d: int, width: int) -> int:
    """Check the query projection (with or without a q LoRA); its LoRA rank (0: none)."""
    if not t.has("attn_q_a", i):
        t.expect("attn_q", i, (d, width))
        return 0
    q_lora = m.get("attention.q_lora_rank", int, 0) or t.shape("attn_q_a", i)[1]
    t.expect("attn_q_a", i, (d, q_lora))
    t.expect("attn_q_a_norm", i, (q_lora,))
    t.expect("attn_q_b", i, (q_lora, width))
    return q_lora


def _mscale(m: Any) -> float:
    """YaRN's attention magnitude of the scores (1 without YaRN or without yarn_log_multiplier)."""
    if m.get("rope.scaling.type", str, "none") != "yarn" or not m.has("rope.scaling.yarn_log_multiplier"):
        return 1.0
    factor = m.get("rope.scaling.factor", float, 1.0)
    log_mul = m.get("rope.scaling.yarn_log_multiplier", float) / 0.1  # stored as 0.1 * mscale_all_dim
    return 1.0 + 0.1 * log_mul * math.log(factor) if factor > 1.0 else 1.0


def _absorbers(b: Any, i: int, n_head: int, p: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """k_b [H, c, p] (q_nope -> latent space) and v_b [H, v, c] (latent -> value), float32."""
    lora, nope, vd = p["kv_lora_rank"], p["qk_nope"], p["v_head_dim"]
    if p["legacy_kv_b"]:
        kv_b = b.table("attn_kv_b", i).reshape(n_head, nope + vd, lora)  # numpy order [H (p + v), c]
        return (np.ascontiguousarray(kv_b[:, :nope].transpose(0, 2, 1)),
                np.ascontiguousarray(kv_b[:, nope:]))
    return b.table("attn_k_b", i), b.table("attn_v_b", i)


class _LoraQuery:
    """q = q_b(rms(q_a h)): h [n, d] -> [n, H (p + r)]."""

    def __init__(self, q_a: Any, q_a_norm: np.ndarray, q_b: Any, norm: Any):
        self.q_a, self.q_a_norm, self.q_b, self.norm = q_a, q_a_norm, q_b, norm

    def resid(self, h: np.ndarray) -> np.ndarray:
        """rms(q_a h) [n, q_lora]: what q_b reads (and DSA's indexer)."""
        return self.norm(self.q_a(h), self.q_a_norm)

    def __call__(self, h: np.ndarray) -> np.ndarray:
        return self.q_b(self.resid(h))


class _MlaQkv:
    """h [n, d] -> q [n, H (r + c)], k [n, r + c], v [n, c]: rotary dims first, latent after."""

    def __init__(self, query: Any, kv_a: Any, kv_a_norm: np.ndarray, norm: Any, k_b: np.ndarray,
                 p: dict[str, int]):
        self.query, self.kv_a, self.kv_a_norm, self.norm = query, kv_a, kv_a_norm, norm
        self.k_b_t = np.ascontiguousarray(k_b.transpose(0, 2, 1))  # [H, p, c]: q_nope [H, n, p] @ it
        self.lora, self.rope, self.nope = p["kv_lora_rank"], p["qk_rope"], p["qk_nope"]

    def __call__(self, h: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.project(h, self.query(h))

    def project(self, h: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """__call__ with the query projection q [n, H (p + r)] of h given."""
        n, n_head = len(h), self.k_b_t.shape[0]
        q = q.reshape(n, n_head, self.nope + self.rope)
        q_abs = np.matmul(q[:, :, :self.nope].transpose(1, 0, 2), self.k_b_t).transpose(1, 0, 2)  # [n, H, c]
        ckv = self.kv_a(h)                                                                       # [n, c + r]
        latent = self.norm(np.ascontiguousarray(ckv[:, :self.lora]), self.kv_a_norm)             # [n, c]
        q_full = np.concatenate([q[:, :, self.nope:], q_abs], axis=2).reshape(n, -1)
        k_full = np.concatenate([ckv[:, self.lora:], latent], axis=1)
        return q_full.astype(F32, copy=False), k_full.astype(F32, copy=False), latent


class _MlaOutput:
    """a [n, H c] (each head's output latent) -> v_b per head [n, H v] -> attn_output [n, d]."""

    def __init__(self, v_b: np.ndarray, o: Any):
        self.v_b_t = np.ascontiguousarray(v_b.transpose(0, 2, 1))  # [H, c, v]
        self.o = o

    def __call__(self, a: np.ndarray) -> np.ndarray:
        n_head, lora, _ = self.v_b_t.shape
        lat = a.reshape(len(a), n_head, lora).transpose(1, 0, 2)         # [H, n, c]
        out = np.matmul(lat, self.v_b_t).transpose(1, 0, 2).reshape(len(a), -1)
        return self.o(np.ascontiguousarray(out, dtype=F32))
