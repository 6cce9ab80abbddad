"""archrun-gemma4's conventions, each flipped on the tiny HF fixtures, must move the logits far from
HF (beyond the kit's sensitivity margin): the kit's own flips cover rope pairing, activation and norm;
these cover what is Gemma 4's own — its attention (per-kind widths, V norm, unscaled scores; a flip
that no longer loads is a typed error, also seen), the layer scalar, the embedding scale and the
sliding layers' plain rope. Also the layout of the files llama.cpp's converter writes."""

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
NAMES = ("gemma4_dense", "gemma4_k_eq_v", "gemma4_kv_shared", "gemma4_ple", "gemma4_moe")
FLIPS = {
    "attention": {"attention": "causal"},            # standard projections, 1/sqrt(hd), no V norm
    "embed_scale": {"embed_scale": 1.0},
    "swa_rope": {"swa_rope": "global"},              # sliding layers given the global frequency factors
}


@pytest.mark.parametrize("flip", FLIPS)
@pytest.mark.parametrize("name", NAMES)
def test_flipped_convention_moves_logits(name, flip):
    assert_far_from_hf(GOLDENS / f"{name}.gguf", GOLDENS / f"{name}.npz", f"{name}: {FLIPS[flip]}", FLIPS[flip])


@pytest.mark.parametrize("name", NAMES)
def test_layer_scalar_matters(name, tmp_path):
    """Without the layer_output_scale tensors (scale 1) the model is far from HF."""
    path = rewrite_gguf(GOLDENS / f"{name}.gguf", tmp_path / "noscale.gguf", drop_tensors=["layer_output_scale"])
    assert_far_from_hf(path, GOLDENS / f"{name}.npz", f"{name}: {path.name}")


@pytest.mark.parametrize("name", NAMES)
def test_converter_layout(name):
    """Both layer kinds' widths, the global-only frequency factors (1e30 past the rotated pairs), attn_v
    on exactly the layers that do not reuse their keys, attn_k only on the layers that do not share."""
    cfg = hf.load_golden(GOLDENS / f"{name}.npz")["config"]
    kv = hf.gguf_kv(gguf.GGUFReader(GOLDENS / f"{name}.gguf"))
    tensors = hf.gguf_tensors(GOLDENS / f"{name}.gguf")
    global_hd = {c["head_dim"] for c in cfg["per_layer_config"].values()}.pop()  # the full layers' width
    assert kv["gemma4.attention.key_length"] == global_hd != cfg["head_dim"]
    assert kv["gemma4.attention.key_length_swa"] == cfg["head_dim"]
    assert kv["gemma4.rope.dimension_count_swa"] == cfg["head_dim"]
    n_rot = int(global_hd * cfg["rope_parameters"]["full_attention"]["partial_rotary_factor"]) // 2
    factors = tensors["rope_freqs.weight"]
    assert (factors[:n_rot] == 1).all() and (factors[n_rot:] > 1e29).all()
    first_shared = cfg["num_hidden_layers"] - cfg["num_kv_shared_layers"]
    assert kv["gemma4.attention.shared_kv_layers"] == cfg["num_kv_shared_layers"]
    for i, kind in enumerate(cfg["layer_types"]):
        shared = i >= first_shared
        reuse = shared or (cfg["attention_k_eq_v"] and kind == "full_attention")
        assert (f"blk.{i}.attn_v.weight" in tensors) != reuse, (name, i)
        assert (f"blk.{i}.attn_k.weight" in tensors) != shared, (name, i)


def test_shared_layers_cost_no_cache_memory():
    """`archrun inspect`: the KV-sharing layers add no bytes per token; the others their K/V rows."""
    from archrun.describe.inspect import inspect_model

    cfg = hf.load_golden(GOLDENS / "gemma4_kv_shared.npz")["config"]
    memory = inspect_model(GOLDENS / "gemma4_kv_shared.gguf")["memory"]
    first_shared = cfg["num_hidden_layers"] - cfg["num_kv_shared_layers"]
    widths = {"sliding_attention": cfg["head_dim"], "full_attention": cfg["per_layer_config"]["4"]["head_dim"]}
    for i, (m, kind) in enumerate(zip(memory, cfg["layer_types"], strict=True)):
        # a sliding layer's ring is fixed state; a full layer's K and V rows are float32
        rows = 2 * cfg["num_key_value_heads"] * widths[kind] * 4
        assert m["bytes_per_token"] == (0 if i >= first_shared or kind == "sliding_attention" else rows), (i, m)
        assert m["state_bytes"] == 0 or i < first_shared, (i, m)  # a shared layer holds nothing


def test_both_attention_layouts_are_covered():
    reuse = [hf.load_golden(GOLDENS / f"{n}.npz")["config"]["attention_k_eq_v"] for n in NAMES]
    assert any(reuse) and not all(reuse)


# (moe_weights_norm, the top-k weights renormalized to sum 1, scales each row's expert sum by one number,
# which post_ffw_norm_2 then divides out: unrenormalized weights move the logits by 4.2e-4 of max |logit|,
# through the norm's epsilon only)
MOE_FLIPS = {
    "gating": {"gating": "sigmoid"},              # HF's router: softmax over every expert
    "moe": {"moe": "topk"},                       # the standard mixture: no dense half, normed router input
}


@pytest.mark.parametrize("flip", MOE_FLIPS)
def test_mixture_conventions_move_logits(flip):
    assert_far_from_hf(GOLDENS / "gemma4_moe.gguf", GOLDENS / "gemma4_moe.npz", f"gemma4_moe: {MOE_FLIPS[flip]}",
                       MOE_FLIPS[flip])


@pytest.mark.parametrize("scale", ["ffn_gate_inp.scale", "ffn_down_exps.scale"])
def test_each_router_scale_matters(scale, tmp_path):
    """The router's input scale and the per-expert scales, set to ones, move the logits far from HF."""
    tensors = hf.gguf_tensors(GOLDENS / "gemma4_moe.gguf")
    ones = {name: np.ones_like(a) for name, a in tensors.items() if name.endswith(scale)}
    path = rewrite_gguf(GOLDENS / "gemma4_moe.gguf", tmp_path / "ones.gguf", drop_tensors=list(ones),
                        add_tensors=ones)
    assert_far_from_hf(path, GOLDENS / "gemma4_moe.npz", f"gemma4_moe with {scale} ones")


def test_per_layer_inputs_run_as_a_stream_only_where_the_file_has_them(tmp_path):
    """gemma4_ple runs the stream op gemma4_ple; files without per-layer inputs run one stream; a file that
    states a width without the tensors is refused with the missing tensor's name."""
    from archrun.errors import MissingTensor

    assert archrun.load(GOLDENS / "gemma4_ple.gguf", backend="reference").descriptor.stream == "gemma4_ple"
    assert archrun.load(GOLDENS / "gemma4_dense.gguf", backend="reference").descriptor.stream == ""
    path = rewrite_gguf(GOLDENS / "gemma4_dense.gguf", tmp_path / "ple.gguf",
                        add_keys={"gemma4.embedding_length_per_layer_input": 8})
    with pytest.raises(MissingTensor, match="per_layer"):
        archrun.load(path, backend="reference")


@pytest.mark.parametrize("drop", ["per_layer_token_embd", "per_layer_model_proj"])
def test_each_per_layer_input_part_matters(drop, tmp_path):
    """Either half of the per-layer inputs zeroed (the token table, the projection of the embeddings) moves
    the logits far from HF."""
    tensors = hf.gguf_tensors(GOLDENS / "gemma4_ple.gguf")
    name = f"{drop}.weight"
    path = rewrite_gguf(GOLDENS / "gemma4_ple.gguf", tmp_path / "zero.gguf", drop_tensors=[name],
                        add_tensors={name: np.zeros_like(tensors[name])})
    assert_far_from_hf(path, GOLDENS / "gemma4_ple.npz", f"gemma4_ple without {drop}")


def test_gemma4_tokenizer_runs_the_model(tmp_path):
    """A fixture carrying a `tokenizer.ggml.model = gemma4` vocabulary (as released files do) loads,
    tokenizes (▁ for spaces, merges, byte fallback, BOS always added) and runs the prompt."""
    words = ["▁", "a", "b", "▁a", "ab", "▁ab", "\n", "\n\n"]
    n_vocab = hf.load_golden(GOLDENS / "gemma4_dense.npz")["logits"].shape[1]
    words += [f"▁w{i}" for i in range(n_vocab - 260 - len(words))]
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", *(f"<0x{b:02X}>" for b in range(256)), *words]
    keys = {"tokenizer.ggml.model": "gemma4", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": [3] * 4 + [6] * 256 + [1] * len(words),
            "tokenizer.ggml.merges": ["▁ a", "a b", "▁a b", "\n \n"], "tokenizer.ggml.bos_token_id": 2,
            "tokenizer.ggml.eos_token_id": 1}
    path = rewrite_gguf(GOLDENS / "gemma4_dense.gguf", tmp_path / "tok.gguf", add_keys=keys,
                        drop_keys=["tokenizer.ggml.pre"])
    model = archrun.load(path, backend="reference")
    ids = model.tokenizer.encode("ab ab€")
    assert [model.tokenizer.token_text(i) for i in ids] == ["<bos>", "ab", "▁ab", "<0xE2>", "<0x82>", "<0xAC>"]
    assert model.tokenizer.decode(ids[1:]) == "ab ab€"
    assert np.isfinite(model.logits(ids)).all()
