"""DeepSeek-V4's sliding-only attention against HF's DeepseekV4Attention (random weights, a window shorter
than the prompt, nonzero sinks); the rope tables are archrun's own, not HF's."""

from __future__ import annotations

import numpy as np
import pytest

from archrun_deepseek4_ops.v4_attention import sliding_attention

torch = pytest.importorskip("torch")
hf = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")
DeepseekV4Config = pytest.importorskip("transformers").DeepseekV4Config

F32 = np.float32
D, H, HD, R, G, OR, QL, WINDOW, THETA, N = 24, 4, 16, 8, 2, 6, 12, 4, 10000.0, 11


@pytest.fixture(scope="module")
def layer():
    torch.manual_seed(9)
    cfg = DeepseekV4Config(vocab_size=64, hidden_size=D, num_attention_heads=H, head_dim=HD, q_lora_rank=QL,
                           partial_rotary_factor=R / HD, o_groups=G, o_lora_rank=OR, sliding_window=WINDOW,
                           num_hidden_layers=2, layer_types=["sliding_attention"] * 2, rope_theta=THETA,
                           rms_norm_eps=1e-6)
    cfg._attn_implementation = "eager"
    attn = hf.DeepseekV4Attention(cfg, 0).float().eval()
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 0.4)
        attn.q_a_norm.weight.add_(1.0), attn.kv_norm.weight.add_(1.0)
    return cfg, attn


def _weights(attn) -> dict:
    g = {"q_a": attn.q_a_proj, "q_b": attn.q_b_proj, "kv": attn.kv_proj, "o_a": attn.o_a_proj, "o_b": attn.o_b_proj}
    w = {k: m.weight.detach().numpy().astype(F32) for k, m in g.items()}
    w.update(q_a_norm=attn.q_a_norm.weight.detach().numpy(), kv_norm=attn.kv_norm.weight.detach().numpy(),
             sinks=attn.sinks.detach().numpy())
    return w


def _hf(cfg, attn, h, pos):
    rope = hf.DeepseekV4RotaryEmbedding(cfg)
    x, p = torch.from_numpy(h)[None], torch.from_numpy(pos)[None]
    emb = {"main": rope(x, p, layer_type="main"), "compress": rope(x, p, layer_type="compress")}
    dist = pos[:, None] - pos[None, :]
    mask = np.where((dist >= 0) & (dist < WINDOW), 0.0, -np.inf).astype(F32)[None, None]
    with torch.no_grad():
        return attn(x, emb, p, torch.from_numpy(mask))[0][0].numpy()


@pytest.mark.parametrize("offset", [0, 37])
def test_sliding_layer_matches_hf(layer, offset):
    cfg, attn = layer
    h = np.random.default_rng(offset).standard_normal((N, D)).astype(F32)
    pos = np.arange(offset, offset + N)
    want = _hf(cfg, attn, h, pos)
    got = sliding_attention(h, _weights(attn), pos, WINDOW, THETA, R, H, G, 1e-6)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_window_and_sinks_reach_the_output(layer):
    cfg, attn = layer
    h, pos, w = np.random.default_rng(1).standard_normal((N, D)).astype(F32), np.arange(N), _weights(attn)
    base = sliding_attention(h, w, pos, WINDOW, THETA, R, H, G, 1e-6)
    wide = sliding_attention(h, w, pos, N, THETA, R, H, G, 1e-6)
    assert np.allclose(base[:WINDOW], wide[:WINDOW], atol=1e-6) and not np.allclose(base, wide, atol=1e-3)
    sunk = dict(w, sinks=w["sinks"] + 3.0)
    assert not np.allclose(sliding_attention(h, sunk, pos, WINDOW, THETA, R, H, G, 1e-6), base, atol=1e-3)
