"""Position schemes besides rotary embedding, on synthetic GGUF models checked against float64 numpy
forwards written here (from the file's raw tensors, read back with gguf-py):

- ALiBi (bloom, mpt): attention kind "alibi" from the conventions, `attention.max_alibi_bias` from
  the file, rope_pairing "none" (no rope op bound). Decodes fused; token by token equals prefill;
  fast equals the reference backend.
- Learned absolute positions (gpt2, starcoder): a `position_embd` table found by tensor presence,
  added to the token embeddings; positions past the table raise ContextOverflow.
"""

from __future__ import annotations

import math

import gguf
import numpy as np
import pytest
from support.synth import attn_output_bias, chain, fuse_qkv, norm_biases, plain_ffn

import archrun
from archrun.describe.compile import compile_gguf, describe
from archrun.errors import ContextOverflow, InvalidRequest, ShapeMismatch
from archrun.run.bind import vocabulary_of

IDS = [5, 17, 3, 42, 8, 60, 11, 2, 29, 77, 1, 50]
MAX_BIAS = 8.0


def rel(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def decode(m, ids, cache=None) -> np.ndarray:
    cache = cache if cache is not None else m.init_cache(len(ids))
    return np.stack([m.forward_step([t], cache) for t in ids])


def tensors(path) -> dict[str, np.ndarray]:
    """The file's tensors as float64 in numpy order."""
    r = gguf.GGUFReader(str(path))
    return {t.name: np.asarray(t.data, dtype=np.float64).reshape([int(x) for x in reversed(t.shape)])
            for t in r.tensors}


def alibi_slopes(n_head: int, max_bias: float) -> np.ndarray:
    """ggml_soft_max_ext: m0^(h+1) for the first 2^floor(log2 n_head) heads, then odd powers of m1."""
    n = 2 ** int(math.floor(math.log2(n_head)))
    m0, m1 = 2 ** (-max_bias / n), 2 ** (-max_bias / 2 / n)
    return np.array([m0 ** (h + 1) if h < n else m1 ** (2 * (h - n) + 1) for h in range(n_head)])


def attention(q, k, v, scale, slopes=None) -> np.ndarray:
    """Causal attention, q [n, H, hd], k/v [n, KV, .] at positions 0..n-1; ALiBi adds slope_h (j - i)."""
    n, heads, _ = q.shape
    group = heads // k.shape[1]
    out = np.zeros((n, heads, v.shape[2]))
    for h in range(heads):
        kv = h // group
        s = q[:, h] @ k[:, kv].T * scale  # [n, n]
        if slopes is not None:
            s = s + slopes[h] * (np.arange(n)[None, :] - np.arange(n)[:, None])
        s = np.where(np.tri(n, dtype=bool), s, -np.inf)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        out[:, h] = (p / p.sum(axis=1, keepdims=True)) @ v[:, kv]
    return out


# -- ALiBi ----------------------------------------------------------------------------------------------

ALIBI_HINTS = {"attention": "alibi", "rope_pairing": "none", "activation": "silu", "residual": "sequential",
               "embed_scale": 1.0}
# 6 query heads (not a power of two: slopes from both m0 and m1) over 2 kv heads
ALIBI = dict(arch="alibi-test", qk_norm=False, n_embd=48, n_head=6, n_head_kv=2, head_dim=8, n_ff=64, n_ctx=64,
             drop_keys=("rope.freq_base",), key_overrides={"attention.max_alibi_bias": MAX_BIAS})


def alibi_forward(path, ids) -> np.ndarray:
    """float64 logits of the llama-like ALiBi model: RMSNorm, q/k/v, ALiBi GQA, SwiGLU, sequential."""
    t = tensors(path)
    n_head, n_kv, hd = ALIBI["n_head"], ALIBI["n_head_kv"], ALIBI["head_dim"]

    def rms(x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6) * w

    n = len(ids)
    x = t["token_embd.weight"][ids]
    slopes = alibi_slopes(n_head, MAX_BIAS)
    for i in range(2):
        p = f"blk.{i}."
        h = rms(x, t[p + "attn_norm.weight"])
        q = (h @ t[p + "attn_q.weight"].T).reshape(n, n_head, hd)
        k = (h @ t[p + "attn_k.weight"].T).reshape(n, n_kv, hd)
        v = (h @ t[p + "attn_v.weight"].T).reshape(n, n_kv, hd)
        x = x + attention(q, k, v, hd ** -0.5, slopes).reshape(n, -1) @ t[p + "attn_output.weight"].T
        g = rms(x, t[p + "ffn_norm.weight"])
        gate, up = g @ t[p + "ffn_gate.weight"].T, g @ t[p + "ffn_up.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ t[p + "ffn_down.weight"].T
    return rms(x, t["output_norm.weight"]) @ t["output.weight"].T


def test_alibi_descriptor(synth_model):
    path = synth_model(**ALIBI)
    result = compile_gguf(path, hints=ALIBI_HINTS)
    d = result.descriptor
    assert {(layer.attention.kind, layer.attention.alibi_max_bias) for layer in d.layers} == {("alibi", MAX_BIAS)}
    assert [(r.pairing, r.n_rot) for r in d.rope_tables] == [("none", 0)]
    assert not any(slot == "rope" for slot, _ in vocabulary_of(d))  # "none": no rope op needed
    assert "alibi-test.attention.max_alibi_bias" not in result.unused_keys


def test_alibi_model_matches_numpy_and_decodes_fused(synth_model):
    path = synth_model(**ALIBI)
    want = alibi_forward(path, IDS)
    ref = archrun.load(path, backend="reference", hints=ALIBI_HINTS)
    fast = archrun.load(path, hints=ALIBI_HINTS)
    assert not any(p.startswith("rope=") for p in fast.plan.providers)
    assert fast.plan.providers["attention=alibi"] == "blocks"
    assert fast.fused_blocks is not None
    ref_logits, prefill = ref.logits(IDS), fast.logits(IDS)
    assert rel(ref_logits, want) <= 1e-5
    assert rel(prefill, want) <= 1e-4
    assert rel(prefill, ref_logits) <= 1e-4
    steps = decode(fast, IDS)  # the fused one-call-per-layer path
    assert rel(steps, prefill) <= 1e-4
    assert rel(decode(ref, IDS), ref_logits) <= 1e-5
    # a prefill continued token by token: the fused steps see the prefill's cache rows at their positions
    cache = fast.init_cache(len(IDS))
    fast.forward_step(IDS[:5], cache)
    assert rel(decode(fast, IDS[5:], cache), prefill[5:]) <= 1e-4


def test_alibi_is_not_causal(synth_model):
    """The bias is there: the same file run as plain causal attention (bias 0) gives other logits."""
    path = synth_model(**{**ALIBI, "key_overrides": {}})
    causal = archrun.load(path, hints={**ALIBI_HINTS, "attention": "causal"}).logits(IDS)
    alibi0 = archrun.load(path, hints=ALIBI_HINTS).logits(IDS)  # max bias 0: ggml's slope 1 for every head
    assert rel(alibi0, causal) > 1e-2


# -- learned absolute positions -------------------------------------------------------------------------

N_POS = 8  # rows of the position table (the file's context is longer)
LEARNED_HINTS = {"attention": "causal", "rope_pairing": "none", "activation": "gelu", "residual": "sequential",
                 "embed_scale": 1.0}
EPS = 1e-5


def position_table(rows: int, seed: int = 7):
    def add(t: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        n_embd = t["token_embd.weight"].shape[1]
        t["position_embd.weight"] = (np.random.default_rng(seed).standard_normal((rows, n_embd)) * 0.5
                                     ).astype(np.float32)
        return t

    return add


# gpt2-like: LayerNorm with biases, one attn_qkv with bias, output bias, plain GELU FFN, no rope
LEARNED = dict(arch="learnedpos-test", qk_norm=False, qkv_bias=True, n_embd=32, n_head=4, n_head_kv=4, head_dim=8,
               n_ff=64, n_ctx=16, drop_keys=("attention.layer_norm_rms_epsilon", "rope.freq_base"),
               key_overrides={"attention.layer_norm_epsilon": EPS})


def learned_model(synth_model, rows: int = N_POS):
    return synth_model(**LEARNED, transform=chain(fuse_qkv, plain_ffn, norm_biases(1), attn_output_bias(2),
                                                  position_table(rows)))


def learned_forward(path, ids, start: int = 0) -> np.ndarray:
    """float64 logits of the gpt2-like model at positions start..: x = tok[ids] + pos[start..]."""
    t = tensors(path)
    n_head, hd = LEARNED["n_head"], LEARNED["head_dim"]
    erf = np.vectorize(math.erf)

    def ln(x, w, b):
        mu = x.mean(axis=-1, keepdims=True)
        return (x - mu) / np.sqrt(((x - mu) ** 2).mean(axis=-1, keepdims=True) + EPS) * w + b

    n = len(ids)
    x = t["token_embd.weight"][ids] + t["position_embd.weight"][start:start + n]
    for i in range(2):
        p = f"blk.{i}."
        h = ln(x, t[p + "attn_norm.weight"], t[p + "attn_norm.bias"])
        qkv = h @ t[p + "attn_qkv.weight"].T + t[p + "attn_qkv.bias"]
        q, k, v = (qkv[:, j * n_head * hd:(j + 1) * n_head * hd].reshape(n, n_head, hd) for j in range(3))
        a = attention(q, k, v, hd ** -0.5).reshape(n, -1) @ t[p + "attn_output.weight"].T + t[p + "attn_output.bias"]
        x = x + a
        g = ln(x, t[p + "ffn_norm.weight"], t[p + "ffn_norm.bias"])
        u = g @ t[p + "ffn_up.weight"].T
        x = x + (0.5 * u * (1 + erf(u / math.sqrt(2)))) @ t[p + "ffn_down.weight"].T
    return ln(x, t["output_norm.weight"], t["output_norm.bias"]) @ t["output.weight"].T


def test_learned_positions_descriptor(synth_model):
    path = learned_model(synth_model)
    d = describe(path, hints=LEARNED_HINTS)
    assert d.position_embedding and d.tensor_name("position_embd") == "position_embd.weight"
    assert not describe(synth_model(**LEARNED, transform=chain(fuse_qkv, plain_ffn, norm_biases(1))),
                        hints=LEARNED_HINTS).position_embedding


@pytest.mark.parametrize("backend", ["reference", "fast"])
def test_learned_positions_match_numpy(synth_model, backend):
    path = learned_model(synth_model)
    m = archrun.load(path, backend=backend, hints=LEARNED_HINTS)
    ids = IDS[:N_POS]
    want = learned_forward(path, ids)
    prefill = m.logits(ids)
    assert rel(prefill, want) <= (1e-5 if backend == "reference" else 1e-4)
    steps = decode(m, ids)  # fast: the fused path, one position row per step
    if backend == "fast":
        assert m.fused_blocks is not None
    assert rel(steps, want) <= 1e-4
    # the rows follow the cache's position: a prefill of 3, then the rest token by token
    cache = m.init_cache(N_POS)
    m.forward_step(ids[:3], cache)
    assert rel(decode(m, ids[3:], cache), want[3:]) <= 1e-4


@pytest.mark.parametrize("backend", ["reference", "fast"])
def test_positions_past_the_table_raise_context_overflow(synth_model, backend):
    path = learned_model(synth_model)
    m = archrun.load(path, backend=backend, hints=LEARNED_HINTS)
    assert m.descriptor.n_ctx == LEARNED["n_ctx"] > N_POS  # the table, not the context, is the bound here
    with pytest.raises(ContextOverflow, match="learned positions"):
        m.logits(IDS[:N_POS + 1])
    cache = m.init_cache()
    m.forward_step(IDS[:N_POS - 1], cache)
    with pytest.raises(ContextOverflow):
        m.forward_step(IDS[:2], cache)  # positions 7, 8: 8 is past the table
    assert len(cache) == N_POS - 1  # refused before anything ran
    m.forward_step([IDS[0]], cache)  # position 7, the table's last row (the fused step on fast)
    with pytest.raises(ContextOverflow):
        m.forward_step([IDS[1]], cache)
    assert len(cache) == N_POS
    with pytest.raises(InvalidRequest, match="start"):
        m.embed(np.array([1, 2]))  # the position rows need the start position


def test_a_table_as_long_as_the_context(synth_model):
    """The usual file (gpt2: n_ctx_train rows): the context bounds it (the cache refuses first)."""
    path = learned_model(synth_model, rows=LEARNED["n_ctx"])
    m = archrun.load(path, hints=LEARNED_HINTS)
    ids = (IDS * 2)[:LEARNED["n_ctx"]]
    assert rel(m.logits(ids), learned_forward(path, ids)) <= 1e-4
    with pytest.raises(ContextOverflow):
        m.logits(ids + [1])


def test_a_bad_position_table_is_refused(synth_model):
    def wrong_width(t):
        t["position_embd.weight"] = np.zeros((N_POS, 7), np.float32)
        return t

    path = synth_model(**LEARNED, transform=chain(fuse_qkv, plain_ffn, norm_biases(1), wrong_width))
    with pytest.raises(ShapeMismatch, match="position_embd"):
        describe(path, hints=LEARNED_HINTS)
