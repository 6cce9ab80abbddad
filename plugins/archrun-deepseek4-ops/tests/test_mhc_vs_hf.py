"""mHC against HF's own modules: DeepseekV4HyperConnection's weights and collapse, the decoder layer's
stream mixing, DeepseekV4HyperHead; the reference and the numba kernels, on random weights."""

from __future__ import annotations

import numpy as np
import pytest

from archrun.errors import ShapeMismatch
from archrun_deepseek4_ops.mhc import HyperConnection, HyperHead

torch = pytest.importorskip("torch")
hf = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")
DeepseekV4Config = pytest.importorskip("transformers").DeepseekV4Config

F32 = np.float32
N, D, T = 4, 24, 7


@pytest.fixture(scope="module")
def hc_modules():
    torch.manual_seed(11)
    cfg = DeepseekV4Config(vocab_size=64, hidden_size=D, hc_mult=N, hc_sinkhorn_iters=20, hc_eps=1e-6,
                           rms_norm_eps=1e-6, num_hidden_layers=2)
    conn, head = hf.DeepseekV4HyperConnection(cfg).float(), hf.DeepseekV4HyperHead(cfg).float()
    with torch.no_grad():
        for p in (conn.fn, head.hc_fn):
            p.normal_(0, 0.5)
        for p in (conn.base, conn.scale, head.hc_base, head.hc_scale):
            p.normal_(0, 1.0)
    return conn, head


def _streams(seed=0):
    return (np.random.default_rng(seed).standard_normal((T, N, D)) * 2).astype(F32)


def _ours(conn, fast):
    return HyperConnection(conn.fn.detach().numpy(), conn.base.detach().numpy(), conn.scale.detach().numpy(),
                           iters=20, hc_eps=1e-6, norm_eps=1e-6, fast=fast)


@pytest.mark.parametrize("fast", [False, True], ids=["reference", "fast"])
def test_sub_layer_mixing_matches_hf(hc_modules, fast):
    conn, _ = hc_modules
    s = _streams()
    post_t, comb_t, collapsed_t = (a.detach().numpy() for a in conn(torch.from_numpy(s)[None]))
    ours = _ours(conn, fast)
    pre, post, comb = ours.weights(s)
    np.testing.assert_allclose(post, post_t[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(comb, comb_t[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(comb.sum(axis=-1), 1, atol=1e-4)  # doubly stochastic
    h = ours.collapse(s, pre)
    np.testing.assert_allclose(h, collapsed_t[0], rtol=1e-5, atol=1e-5 * np.abs(h).max())
    y = np.tanh(h)  # any sub-layer output
    # DeepseekV4DecoderLayer: post * y + comb^T @ streams
    want = (torch.from_numpy(post_t).unsqueeze(-1) * torch.from_numpy(y)[None].unsqueeze(-2)
            + torch.matmul(torch.from_numpy(comb_t).transpose(-1, -2), torch.from_numpy(s)[None]))[0].numpy()
    got = ours.expand(s, post, comb, y)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_head_matches_hf(hc_modules):
    _, head = hc_modules
    s = _streams(1)
    want = head(torch.from_numpy(s)[None])[0].detach().numpy()
    ours = HyperHead(head.hc_fn.detach().numpy(), head.hc_base.detach().numpy(), head.hc_scale.detach().numpy(),
                     hc_eps=1e-6, norm_eps=1e-6)
    np.testing.assert_allclose(ours(s), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_fewer_sinkhorn_iterations_differ(hc_modules):
    """The iteration count reaches the result: 1 iteration (columns only) leaves rows off 1."""
    conn, _ = hc_modules
    one = HyperConnection(conn.fn.detach().numpy(), conn.base.detach().numpy(), conn.scale.detach().numpy(),
                          iters=1, hc_eps=1e-6, norm_eps=1e-6)
    comb = one.weights(_streams())[2]
    np.testing.assert_allclose(comb.sum(axis=-2), 1, atol=1e-5)
    assert np.abs(comb.sum(axis=-1) - 1).max() > 1e-3


def test_bad_shapes_are_typed_errors(hc_modules):
    conn, _ = hc_modules
    with pytest.raises(ShapeMismatch, match="streams"):
        _ours(conn, False).weights(np.zeros((2, N + 1, D), F32))
    with pytest.raises(ShapeMismatch, match=r"\(2\+N\)N"):
        HyperConnection(np.zeros((23, N * D), F32), np.zeros(23, F32), np.zeros(3, F32), 20, 1e-6, 1e-6)


class _Binder:
    """The tensors the stream op binds, by role and layer (HF's module weights)."""

    def __init__(self, layers, head):
        self.t = {}
        for i, (attn, ffn) in enumerate(layers):
            for kind, m in (("attn", attn), ("ffn", ffn)):
                for part in ("fn", "base", "scale"):
                    self.t[f"{i}.hc_{kind}_{part}"] = getattr(m, part).detach().numpy()
        for part in ("fn", "base", "scale"):
            self.t[f"output_hc_{part}"] = getattr(head, f"hc_{part}").detach().numpy()

    def table(self, role, layer=None):
        return self.t[role if layer is None else f"{layer}.{role}"]

    vector = table


class _Branches:
    """Stand-in attention and FFN branches of one block (any [n, d] maps), counting their calls."""

    def __init__(self, seed):
        rng = np.random.default_rng(seed)
        self.wa, self.wf = (rng.standard_normal((D, D)).astype(F32) * D ** -0.5 for _ in range(2))
        self.calls = 0

    def attention(self, h):
        self.calls += 1
        return np.tanh(np.asarray(h, F32) @ self.wa) * 2

    def ffn(self, g):
        self.calls += 1
        return np.asarray(g, F32) @ self.wf


@pytest.mark.parametrize("fast", [False, True], ids=["reference", "fast"])
def test_stream_op_matches_hf_decoder_layers(hc_modules, fast):
    """Two layers: each HF DeepseekV4DecoderLayer's stream arithmetic around its attention and MLP, then
    DeepseekV4HyperHead; the same branches on both sides."""
    from types import SimpleNamespace

    from archrun_deepseek4_ops.mhc_stream import MhcStream

    _, head = hc_modules
    cfg = DeepseekV4Config(vocab_size=64, hidden_size=D, hc_mult=N, hc_sinkhorn_iters=20, hc_eps=1e-6,
                           rms_norm_eps=1e-6, num_hidden_layers=2)
    torch.manual_seed(3)
    layers = [(hf.DeepseekV4HyperConnection(cfg).float(), hf.DeepseekV4HyperConnection(cfg).float()) for _ in range(2)]
    with torch.no_grad():
        for pair in layers:
            for m in pair:
                m.fn.normal_(0, 0.5), m.base.normal_(0, 1.0), m.scale.normal_(0, 1.0)
    branches = [_Branches(7), _Branches(8)]
    x = (np.random.default_rng(4).standard_normal((T, D)) * 2).astype(F32)

    s = torch.from_numpy(x)[None].unsqueeze(2).expand(-1, -1, N, -1).contiguous()
    for (attn, ffn), br in zip(layers, branches, strict=True):
        for conn, fn in ((attn, br.attention), (ffn, br.ffn)):
            post, comb, collapsed = conn(s)
            y = torch.from_numpy(fn(collapsed[0].detach().numpy()))[None]
            s = post.unsqueeze(-1) * y.unsqueeze(-2) + torch.matmul(comb.transpose(-1, -2), s)
    want = head(s)[0].detach().numpy()

    op = MhcStream(SimpleNamespace(n_embd=D, n_layer=2, norm_eps=1e-6), n_stream=N, iters=20, hc_eps=1e-6, fast=fast)
    op.bind(_Binder(layers, head))
    state = op.enter(x, np.arange(T))
    for i, br in enumerate(branches):
        br.calls = 0
        state = op.layer(i, state, br)
        assert br.calls == 2  # each branch once
    got = op.leave(state)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
