"""archrun-gemma3n's conventions, each flipped or removed on the tiny HF fixtures, must move the logits far
from HF (beyond the kit's sensitivity margin): the kit's own flips cover rope pairing, activation and norm;
these cover what is Gemma 3n's own — the gate's sparsity cut, the embedding scale, LAuReL, the AltUp router
and correction scale, the per-layer inputs — and the layout of the files llama.cpp's converter writes."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

import archrun
from archrun.conformance import hf
from archrun.conformance.gguf_edit import rewrite_gguf
from archrun.conformance.tiny_hf import assert_far_from_hf

GOLDENS = Path(__file__).resolve().parent / "goldens"
NAMES = ("gemma3n_e2b_layout", "gemma3n_active1_untied")
FLIPS = {
    "activation": {"activation": "gelu_tanh"},       # no Gaussian cut of the first layers' gates
    "embed_scale": {"embed_scale": 1.0},
    "attention": {"attention": "gemma4"},             # Gemma 4's per-kind widths: the file has none (refused)
}
# tensors set to zero: a part the model must not run without (numpy-order shapes from the file)
ZEROED = {
    "laurel": "blk.{i}.laurel_r.weight",               # LAuReL's branch reduced to the normed input
    "altup_router": "blk.{i}.altup_router.weight",      # no routed prediction / correction coefficients
    "correct_scale": "blk.{i}.altup_correct_scale.weight",  # no per-layer input joins the streams
    "per_layer_table": "per_layer_token_embd.weight",  # the per-layer inputs from the projection alone
    "altup_proj": "altup_proj.weight",                 # the extra streams start at zero (then 1e-5 floored)
}


@pytest.mark.parametrize("flip", FLIPS)
@pytest.mark.parametrize("name", NAMES)
def test_flipped_convention_moves_logits(name, flip):
    assert_far_from_hf(GOLDENS / f"{name}.gguf", GOLDENS / f"{name}.npz", f"{name}: {FLIPS[flip]}", FLIPS[flip])


@pytest.mark.parametrize("part", ZEROED)
def test_zeroed_part_moves_logits(part, tmp_path):
    name = NAMES[0]
    src = GOLDENS / f"{name}.gguf"
    tensors = hf.gguf_tensors(src)
    names = [ZEROED[part].format(i=i) for i in range(len(hf.load_golden(GOLDENS / f"{name}.npz")["config"]
                                                         ["layer_types"]))]
    names = list(dict.fromkeys(names))
    zeros = {n: np.zeros_like(tensors[n]) for n in names}
    path = rewrite_gguf(src, tmp_path / f"{part}.gguf", drop_tensors=names, add_tensors=zeros)
    assert_far_from_hf(path, GOLDENS / f"{name}.npz", f"{name}: {path.name}")


@pytest.mark.parametrize("name", NAMES)
def test_converter_layout(name):
    """The keys the stream op, the sparse gate and KV sharing read; the stacked AltUp projections; no
    k/v projections on the KV-sharing layers."""
    cfg = hf.load_golden(GOLDENS / f"{name}.npz")["config"]
    kv = hf.gguf_kv(gguf.GGUFReader(GOLDENS / f"{name}.gguf"))
    tensors = hf.gguf_tensors(GOLDENS / f"{name}.gguf")
    n, d, s = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["altup_num_inputs"]
    assert kv["gemma3n.altup.num_inputs"] == s and kv["gemma3n.altup.active_idx"] == cfg["altup_active_idx"]
    assert kv["gemma3n.embedding_length_per_layer_input"] == cfg["hidden_size_per_layer_input"]
    assert kv["gemma3n.attention.shared_kv_layers"] == cfg["num_kv_shared_layers"]
    scale = np.asarray(kv["gemma3n.activation_sparsity_scale"])
    sparse = np.asarray(cfg["activation_sparsity_pattern"]) > 0
    assert sparse.any() and not sparse.all()
    np.testing.assert_allclose(scale[sparse], 1.6448536, rtol=1e-6)  # the normal quantile of 0.95
    assert np.isneginf(scale[~sparse]).all()
    assert tensors["altup_proj.weight"].shape == tensors["altup_unembd_proj.weight"].shape == (s - 1, d, d)
    first_shared = n - cfg["num_kv_shared_layers"]
    for i in range(n):
        for role in ("attn_k", "attn_v", "attn_k_norm"):
            assert (f"blk.{i}.{role}.weight" in tensors) == (i < first_shared), (name, i, role)


def test_shared_layers_cost_no_cache_memory():
    """`archrun inspect`: the KV-sharing layers add no bytes per token; the others their K/V rows."""
    from archrun.describe.inspect import inspect_model

    name = NAMES[0]
    cfg = hf.load_golden(GOLDENS / f"{name}.npz")["config"]
    memory = inspect_model(GOLDENS / f"{name}.gguf")["memory"]
    first_shared = cfg["num_hidden_layers"] - cfg["num_kv_shared_layers"]
    rows = 2 * cfg["num_key_value_heads"] * cfg["head_dim"] * 4
    for i, (m, kind) in enumerate(zip(memory, cfg["layer_types"], strict=True)):
        assert m["bytes_per_token"] == (0 if i >= first_shared or kind == "sliding_attention" else rows), (i, m)


def test_released_layout_with_unused_shared_projections_loads(tmp_path):
    """A file converted from a released checkpoint carries k/v projections on the KV-sharing layers, unused
    (HF and llama.cpp reuse the source layer's rows): it loads with a warning and computes the same logits."""
    from archrun.errors import ArchrunWarning

    name = NAMES[0]
    golden = hf.load_golden(GOLDENS / f"{name}.npz")
    cfg = golden["config"]
    kvw, d, hd = cfg["num_key_value_heads"] * cfg["head_dim"], cfg["hidden_size"], cfg["head_dim"]
    extra = {}
    for i in range(cfg["num_hidden_layers"] - cfg["num_kv_shared_layers"], cfg["num_hidden_layers"]):
        extra.update({f"blk.{i}.attn_k.weight": np.ones((kvw, d), np.float32),
                      f"blk.{i}.attn_v.weight": np.ones((kvw, d), np.float32),
                      f"blk.{i}.attn_k_norm.weight": np.ones(hd, np.float32)})
    path = rewrite_gguf(GOLDENS / f"{name}.gguf", tmp_path / "released.gguf", add_tensors=extra)
    with pytest.warns(ArchrunWarning, match="ignoring tensors"):
        model = archrun.load(path, backend="reference")
    ids = golden["ids"].astype(np.int64)
    np.testing.assert_array_equal(model.logits(ids), archrun.load(GOLDENS / f"{name}.gguf", backend="reference")
                                  .logits(ids))


def test_pipeline_stages_are_refused():
    """The residual stream is four arrays: a stage boundary cannot carry it (a typed error, before any step)."""
    from archrun.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="stream op 'altup'"):
        archrun.load(GOLDENS / f"{NAMES[0]}.gguf", backend="reference", layers=(0, 5))
