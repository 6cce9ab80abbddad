"""Structure found by tensor presence, checked by equivalence rather than against archrun's own output.

- A fused attn_qkv (with its bias) is the same model as separate q/k/v of the same weights; a
  packed gate|up ffn_up the same as separate gate/up: equal logits on both backends, through the
  fused decode path token by token, and fast against reference (tests/support/synth.py's transforms
  write the same weights in the other layout).
- A parallel-residual LayerNorm model with a plain GELU FFN (biases on its norms, a fused QKV
  with bias, an output bias, partial rotary) matches a float64 numpy implementation of the same
  block written here from the file's raw tensors (read back with gguf-py).
"""

from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T
from support.synth import attn_output_bias, chain, fuse_qkv, norm_biases, pack_gate_up, plain_ffn, quantize, shared_norm

import archrun
from archrun.describe.compile import describe
from archrun.io.ggufset import open_gguf

IDS = [5, 17, 3, 42, 8, 60, 11, 2, 29, 77, 1, 50]
# qwen2: NEOX rope, QKV biases; n_ff and every width a multiple of 32 (Q8_0 rows)
SPEC = dict(arch="qwen2", qk_norm=False, qkv_bias=True, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_ff=96)


def rel(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def decode(m, ids) -> np.ndarray:
    cache = m.init_cache(len(ids))
    return np.stack([m.forward_step([t], cache) for t in ids])


LAYOUTS = {"fused_qkv": fuse_qkv, "packed_gate_up": pack_gate_up, "both": chain(fuse_qkv, pack_gate_up)}


@pytest.mark.parametrize("wtype", [T.F32, T.Q8_0], ids=lambda t: T(t).name)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_fused_and_packed_projections_equal_separate_ones(synth_model, layout, wtype):
    q = [quantize(wtype)] if wtype != T.F32 else []
    separate = synth_model(**SPEC, transform=chain(*q) if q else None)
    joined = synth_model(**SPEC, transform=chain(LAYOUTS[layout], *q))
    a, f = describe(joined).layers[0].attention, describe(joined).layers[0].ffn
    assert a.qkv_packed == (layout != "packed_gate_up") and a.qkv_bias
    assert f.packed == (layout != "fused_qkv") and f.gated and f.n_ff == SPEC["n_ff"]
    assert not describe(separate).layers[0].attention.qkv_packed and not describe(separate).layers[0].ffn.packed
    ref_sep = archrun.load(separate, backend="reference").logits(IDS)
    ref_joined = archrun.load(joined, backend="reference").logits(IDS)
    assert rel(ref_joined, ref_sep) <= 1e-6  # the same float32 math, only the tensors' layout differs
    fast_sep, fast_joined = archrun.load(separate), archrun.load(joined)
    assert fast_joined.fused_blocks is not None and fast_sep.fused_blocks is not None
    prefill = fast_joined.logits(IDS)
    assert rel(prefill, fast_sep.logits(IDS)) <= 1e-5
    steps = decode(fast_joined, IDS)  # the fused one-call-per-layer path
    assert rel(steps, decode(fast_sep, IDS)) <= 1e-5
    op_path = archrun.load(joined, fused=False)  # the same one-token products, op by op
    assert op_path.fused_blocks is None and rel(steps, decode(op_path, IDS)) <= 1e-4
    # token by token vs the whole sequence, fast vs reference: float32 weights within 1e-4; Q8_0 at the
    # level of its 8-bit activations (one-token products quantize them, wide prefills and numpy do not)
    tol = 1e-4 if wtype == T.F32 else 3e-2
    assert rel(steps, prefill) <= tol
    assert rel(prefill, ref_joined) <= tol
    assert rel(steps, ref_joined) <= tol


# -- a parallel-residual LayerNorm GELU model against numpy -------------------------------------------

PAR_HINTS = {"rope_pairing": "neox", "attention": "causal", "activation": "gelu", "residual": "parallel",
             "embed_scale": 1.0}
EPS = 1e-5
N_ROT = 8  # partial rotary: half of each 16-wide head


def _parallel_model(synth_model, one_norm: bool):
    transforms = [fuse_qkv, plain_ffn, norm_biases(1), attn_output_bias(2)]
    if one_norm:
        transforms.append(shared_norm)
    return synth_model(**dict(SPEC, arch="parlay"), drop_keys=("attention.layer_norm_rms_epsilon",),
                       key_overrides={"attention.layer_norm_epsilon": EPS, "rope.dimension_count": N_ROT},
                       transform=chain(*transforms))


def _tensors(path) -> dict[str, np.ndarray]:
    """Every tensor of the file, dequantized to float64 in numpy order (gguf-py's reader)."""
    out = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        data = gguf.quants.dequantize(t.data, t.tensor_type)
        out[t.name] = np.asarray(data, np.float64).reshape([int(x) for x in reversed(t.shape)])
    return out


def _layer_norm(x, w, b):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + EPS) * w + b


_ERF = np.vectorize(math.erf)


def _gelu(x):
    return 0.5 * x * (1.0 + _ERF(x / math.sqrt(2.0)))


def _neox(x, pos):
    """Rotate the first N_ROT dims of x [n, H, hd] by pos * 10000^(-2i/N_ROT), pairs (i, i + N_ROT/2)."""
    half = N_ROT // 2
    theta = pos[:, None] * 10000.0 ** (-np.arange(half) * 2.0 / N_ROT)
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    out = x.copy()
    a, b = x[..., :half], x[..., half:N_ROT]
    out[..., :half] = a * c - b * s
    out[..., half:N_ROT] = b * c + a * s
    return out


def numpy_parallel_model(t: dict[str, np.ndarray], ids, n_layer: int, n_head: int, n_kv: int, hd: int):
    """x -> x + attn(LN(x)) + ffn(LN'(x)) per block (LN' = LN when the file has no ffn_norm);
    attn: one qkv product (+ bias), NEOX partial rope, causal GQA softmax(q.k / sqrt(hd)), output (+ bias);
    ffn: down(gelu(up h)); logits = LN(x) @ output.T."""
    x = t["token_embd.weight"][ids]
    n = len(ids)
    pos = np.arange(n, dtype=np.float64)
    mask = np.tril(np.ones((n, n), bool))
    for i in range(n_layer):
        p = f"blk.{i}."
        h = _layer_norm(x, t[p + "attn_norm.weight"], t[p + "attn_norm.bias"])
        qkv = h @ t[p + "attn_qkv.weight"].T + t[p + "attn_qkv.bias"]
        q = qkv[:, :n_head * hd].reshape(n, n_head, hd)
        k = qkv[:, n_head * hd:(n_head + n_kv) * hd].reshape(n, n_kv, hd)
        v = qkv[:, (n_head + n_kv) * hd:].reshape(n, n_kv, hd)
        q, k = _neox(q, pos), _neox(k, pos)
        att = np.empty((n, n_head, hd))
        for head in range(n_head):
            kv = head // (n_head // n_kv)
            s = np.where(mask, q[:, head] @ k[:, kv].T / math.sqrt(hd), -np.inf)
            w = np.exp(s - s.max(axis=-1, keepdims=True))
            att[:, head] = (w / w.sum(axis=-1, keepdims=True)) @ v[:, kv]
        a = att.reshape(n, n_head * hd) @ t[p + "attn_output.weight"].T + t[p + "attn_output.bias"]
        g = _layer_norm(x, t[p + "ffn_norm.weight"], t[p + "ffn_norm.bias"]) if p + "ffn_norm.weight" in t else h
        f = _gelu(g @ t[p + "ffn_up.weight"].T) @ t[p + "ffn_down.weight"].T
        x = x + a + f
    return _layer_norm(x, t["output_norm.weight"], t["output_norm.bias"]) @ t["output.weight"].T


@pytest.mark.parametrize("one_norm", [True, False], ids=["shared-norm", "two-norms"])
def test_parallel_layernorm_gelu_model_matches_numpy(synth_model, one_norm):
    path = _parallel_model(synth_model, one_norm)
    d = describe(path, hints=PAR_HINTS)
    layer = d.layers[0]
    assert d.norm == "layer" and d.norm_eps == pytest.approx(EPS) and d.output_norm_bias
    assert layer.residual == "parallel" and layer.norm_bias and layer.ffn_norm == (not one_norm)
    assert not layer.ffn.gated and layer.ffn.activation == "gelu"
    assert layer.attention.qkv_packed and layer.attention.qkv_bias and layer.attention.output_bias
    assert d.rope_tables[0].n_rot == N_ROT
    want = numpy_parallel_model(_tensors(path), IDS, 2, SPEC["n_head"], SPEC["n_head_kv"], SPEC["head_dim"])
    ref = archrun.load(path, backend="reference", hints=PAR_HINTS)
    assert rel(ref.logits(IDS), want) <= 1e-5  # measured ~2e-7
    # the oracle tells the conventions apart: tanh-GELU, NORM pairing and (with two norms) a
    # sequential block all give other logits (without ffn_norm, sequential and parallel coincide)
    wrong = [{"activation": "gelu_tanh"}, {"rope_pairing": "norm"}] + ([] if one_norm else [{"residual": "sequential"}])
    for change in wrong:
        other = archrun.load(path, backend="reference", hints=dict(PAR_HINTS, **change)).logits(IDS)
        assert rel(other, want) > 5e-5, change
    fast = archrun.load(path, hints=PAR_HINTS)
    assert fast.fused_blocks is not None and len(fast.fused_blocks) == 2
    assert rel(fast.logits(IDS), want) <= 1e-4
    assert rel(decode(fast, IDS), want) <= 1e-4
    assert rel(decode(ref, IDS), want) <= 1e-4


def test_a_tensor_the_plan_does_not_use_fails_the_load(synth_model):
    """Running without a tensor the file carries would be silently wrong: the load names it."""
    from archrun.errors import UnexpectedTensor

    extra = {"blk.1.mystery.weight": np.ones(8, np.float32)}
    path = synth_model(**SPEC, tensor_overrides=extra)
    for backend in ("reference", "fast"):
        with pytest.raises(UnexpectedTensor, match=r"blk\.1\.mystery\.weight"):
            archrun.load(path, backend=backend)


def test_ignorable_tensors_only_warn(synth_model):
    """Old converters' rotary caches (IGNORED_TENSORS) load with a warning naming them; a family may add globs."""
    from archrun.errors import ArchrunWarning, UnexpectedTensor

    rot = {"blk.0.attn_rot_embd.weight": np.ones(8, np.float32)}
    with pytest.warns(ArchrunWarning, match=r"ignoring tensors: blk\.0\.attn_rot_embd\.weight"):
        archrun.load(synth_model(**SPEC, tensor_overrides=rot), backend="reference")
    extra = {"blk.0.extra_scale.weight": np.ones(8, np.float32)}
    path = synth_model(**SPEC, tensor_overrides=extra, seed=1)
    with pytest.raises(UnexpectedTensor):
        archrun.load(path, backend="reference")
    with pytest.warns(ArchrunWarning, match="extra_scale"):
        archrun.load(path, backend="reference", hints={"ignored_tensors": ("blk.*.extra_scale.weight",)})


def test_glm4moe_without_its_mtp_tensors_loads_the_trunk(tmp_path):
    """A file that declares nextn_predict_layers but carries no tensors for those blocks (converted from a
    transformers-saved GLM-4.5 checkpoint) loads the trunk with a warning; MTP says it is unavailable."""
    from pathlib import Path

    from archrun.conformance.gguf_edit import rewrite_gguf
    from archrun.errors import ArchrunWarning, MissingTensor

    src = Path(__file__).resolve().parents[2] / "families/archrun-glm4moe/tests/goldens/glm4moe_base.gguf"
    full = describe(src)
    assert full.n_nextn == 1
    trunk = rewrite_gguf(src, tmp_path / "no_mtp.gguf", drop_tensors=[f"blk.{full.n_layer}."])
    with pytest.warns(ArchrunWarning, match="multi-token prediction is unavailable"):
        m = archrun.load(trunk, backend="reference", block_style="host_reference")
    assert m.descriptor.n_nextn == 0 and m.descriptor.n_layer == full.n_layer
    ref = archrun.load(src, backend="reference", block_style="host_reference").logits(IDS)
    np.testing.assert_array_equal(m.logits(IDS), ref)
    from archrun_glm4moe.mtp import MtpHead

    with pytest.raises(MissingTensor):
        MtpHead(m)


# -- shared-expert biases (by presence) ----------------------------------------------------------


def _with_shared_biases(src: Path, dst: Path, scale: float) -> Path:
    """src with `ffn_{gate,up,down}_shexp.bias` added to every MoE block (random * scale)."""
    from archrun.conformance.gguf_edit import rewrite_gguf

    rng = np.random.default_rng(9)
    with open_gguf(src) as g:
        shapes = {n: t.shape for n, t in g.tensors.items() if "_shexp.weight" in n and "gate_inp" not in n}
    biases = {n.replace(".weight", ".bias"): (rng.normal(0, 1, shape[1]) * scale).astype(np.float32)
              for n, shape in shapes.items()}
    return rewrite_gguf(src, dst, add_tensors=biases)


def test_shared_expert_biases_are_read_by_presence(tmp_path):
    src = Path(__file__).parents[2] / "families/archrun-qwen2moe/tests/goldens/qwen2moe_4experts.gguf"
    ids = np.arange(1, 12)
    base = archrun.load(src, backend="reference").logits(ids)
    zero = archrun.load(_with_shared_biases(src, tmp_path / "zero.gguf", 0.0), backend="reference")
    assert zero.descriptor.layers[0].ffn.shared_bias
    np.testing.assert_allclose(zero.logits(ids), base, rtol=0, atol=1e-6)  # zero biases: the same model
    biased = _with_shared_biases(src, tmp_path / "biased.gguf", 0.5)
    ref = archrun.load(biased, backend="reference").logits(ids)
    assert np.abs(ref - base).max() > 1e-2 * np.abs(base).max()          # read, not dropped
    fast = archrun.load(biased, backend="fast").logits(ids)              # the reference mixture, fast products
    assert np.abs(fast - ref).max() <= 1e-4 * np.abs(ref).max()
