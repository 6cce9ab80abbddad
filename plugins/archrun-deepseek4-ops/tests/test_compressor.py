"""DeepSeek-V4's HCA compressor against HF's DeepseekV4HCACompressor (stateless prompt): its entries with
the YaRN "compress" rope table from archrun-blocks' rope_scaling, and which queries see them."""

from __future__ import annotations

import numpy as np
import pytest

from archrun_blocks.rope_scaling import frequencies
from archrun_deepseek4_ops.compressor import csa_selected, hca_entries, visible

torch = pytest.importorskip("torch")
hf = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")
DeepseekV4Config = pytest.importorskip("transformers").DeepseekV4Config

F32 = np.float32
D, HD, R, RATE, N, THETA = 20, 16, 8, 4, 14, 160000.0
YARN = dict(factor=16.0, original_max_position_embeddings=64, beta_fast=32.0, beta_slow=1.0)


@pytest.fixture(scope="module")
def compressor():
    torch.manual_seed(4)
    cfg = DeepseekV4Config(vocab_size=64, hidden_size=D, head_dim=HD, partial_rotary_factor=R / HD,
                           num_hidden_layers=2, layer_types=["heavily_compressed_attention"] * 2,
                           compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": RATE},
                           compress_rope_theta=THETA, rope_parameters={"rope_type": "yarn", **YARN},
                           max_position_embeddings=1024, rms_norm_eps=1e-6)
    c = hf.DeepseekV4HCACompressor(cfg).float()
    with torch.no_grad():
        for p in (c.kv_proj.weight, c.gate_proj.weight, c.position_bias):
            p.normal_(0, 0.6)
        c.kv_norm.weight.normal_(1.0, 0.3)
    return c


def test_entries_and_visibility_match_hf(compressor):
    h = np.random.default_rng(0).standard_normal((N, D)).astype(F32)
    pos = np.arange(N)
    with torch.no_grad():
        want, bias = compressor(torch.from_numpy(h)[None], None, torch.from_numpy(pos)[None], None, 0)
    want, bias = want[0, 0].numpy(), bias[0, 0].numpy()
    inv, magnitude = frequencies("yarn", R, THETA, factor=YARN["factor"], original_context=64, attn_factor=1.0)
    assert magnitude == 1.0
    w = {"wkv": compressor.kv_proj.weight.detach().numpy(), "wgate": compressor.gate_proj.weight.detach().numpy(),
         "ape": compressor.position_bias.detach().numpy(), "norm": compressor.kv_norm.weight.detach().numpy()}
    got = hca_entries(h, w, RATE, inv, 1e-6)
    assert got.shape == (N // RATE, HD)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    np.testing.assert_array_equal(visible(pos, len(got), RATE), np.isfinite(bias))
    plain = hca_entries(h, w, RATE, 1.0 / THETA ** (np.arange(0, R, 2) / R), 1e-6)
    assert np.abs(plain - want).max() > 1e-3 * np.abs(want).max()  # the YaRN table matters


HI, DI, QL, TOPK, NC = 4, 16, 12, 2, 23


@pytest.fixture(scope="module")
def csa():
    torch.manual_seed(6)
    cfg = DeepseekV4Config(vocab_size=64, hidden_size=D, head_dim=HD, partial_rotary_factor=R / HD, q_lora_rank=QL,
                           num_hidden_layers=2, layer_types=["compressed_sparse_attention"] * 2, index_n_heads=HI,
                           index_head_dim=DI, index_topk=TOPK,
                           compress_rates={"compressed_sparse_attention": RATE, "heavily_compressed_attention": 8},
                           compress_rope_theta=THETA, rope_parameters={"rope_type": "yarn", **YARN},
                           max_position_embeddings=1024, rms_norm_eps=1e-6)
    c = hf.DeepseekV4CSACompressor(cfg).float()
    with torch.no_grad():
        for p in c.parameters():
            p.normal_(0, 0.6)
        c.kv_norm.weight.normal_(1.0, 0.3), c.indexer.kv_norm.weight.normal_(1.0, 0.3)
    return c


def _compressor_weights(m) -> dict:
    return {"wkv": m.kv_proj.weight.detach().numpy(), "wgate": m.gate_proj.weight.detach().numpy(),
            "ape": m.position_bias.detach().numpy(), "norm": m.kv_norm.weight.detach().numpy()}


def test_csa_entries_and_indexer_selection_match_hf(csa):
    rng = np.random.default_rng(3)
    h, q_lora, pos = rng.standard_normal((NC, D)).astype(F32), rng.standard_normal((NC, QL)).astype(F32), np.arange(NC)
    with torch.no_grad():
        want, bias = csa(torch.from_numpy(h)[None], torch.from_numpy(q_lora)[None], torch.from_numpy(pos)[None], None,
                         0)
    want, bias = want[0, 0].numpy(), bias[0, 0].numpy()
    inv, _ = frequencies("yarn", R, THETA, factor=YARN["factor"], original_context=64, attn_factor=1.0)
    got = hca_entries(h, _compressor_weights(csa), RATE, inv, 1e-6, overlap=True)
    assert got.shape == (NC // RATE, HD)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    ix = csa.indexer
    w = dict(_compressor_weights(ix), q_b=ix.q_b_proj.weight.detach().numpy(),
             proj=ix.scorer.weights_proj.weight.detach().numpy())
    chosen = csa_selected(h, q_lora, w, pos, RATE, inv, TOPK, HI, 1e-6)
    np.testing.assert_array_equal(chosen, np.isfinite(bias))
    assert (chosen.sum(axis=1) < visible(pos, len(got), RATE).sum(axis=1)).any()  # the top-k drops entries
