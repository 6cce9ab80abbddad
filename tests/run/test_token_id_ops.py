"""A mixture op that declares `token_ids` (archrun.contracts) is called moe(x, weights, ids) with each row's
token id, on every path that runs it: a whole prompt, prompt chunks, one-token steps, batched sequences, and
through a stream op's branches; one that declares `binds` binds tensors of its own at load.

The test op ("by_token") is archrun-blocks' top-k mixture scaled per row by 1 + (token id mod 3) / 4; the
oracle is the same file under top-k with the per-row scale applied to the MoE branch by hand, through the
Trunk interface (block by block, the FFN branch apart)."""

from __future__ import annotations

import numpy as np
import pytest

import archrun
from archrun.contracts import OpCapabilities
from archrun.errors import InvalidRequest, PluginError
from archrun.hookspecs import hookimpl
from archrun.plugins import make_plugin_manager
from archrun.vocab import Op

IDS = np.array([5, 17, 3, 42, 8, 60, 11, 2, 29, 4])


def _scale(ids):
    return (1.0 + (np.asarray(ids) % 3) / 4.0).astype(np.float32)[:, None]


class ByToken:
    calls: list = []
    bound: list = []

    def __init__(self, spec, gating, act):
        from archrun_blocks import reference

        self.topk = reference.moe_topk(spec, gating, act)

    def bind(self, binder, layer):
        ByToken.bound.append((layer, binder.vector("exp_probs_b", layer).shape if binder.d.layers[layer].ffn
                              .router_bias else None))

    def __call__(self, x, weights, ids):
        ByToken.calls.append(np.array(ids))
        return self.topk(x, weights) * _scale(ids)


class Plugin:
    @hookimpl
    def archrun_register_vocabulary(self, register):
        register(Op("moe", "by_token", ByToken, None, "top-k scaled by token id (test)",
                    capabilities=OpCapabilities(token_ids=True, binds=True)))


@pytest.fixture
def moe_file(synth_model):
    return synth_model(arch="qwen3moe", n_expert=4, n_expert_used=2, n_layer=2)


def _load(path, backend="reference", **kw):
    pm = make_plugin_manager(extra=[Plugin()])
    return archrun.load(path, backend=backend, plugins=pm, hints={"moe": "by_token"}, **kw)


def _oracle(path, ids):
    """The file under top-k, block by block, its MoE branch scaled per row by hand."""
    m = archrun.load(path, backend="reference")
    x = m.embed(np.asarray(ids), 0)
    angles = m.rope_angles(np.arange(len(ids)))
    cache = m.init_cache(len(ids))
    for i, lp in enumerate(m.plan.layers):
        g = x + m.run_block(lp, x, cache.slots[i], 0, angles, "attention")
        x = g + m.run_block(lp, g, cache.slots[i], 0, angles, "ffn") * _scale(ids)
    return m.head(m.norm(x, m.output_norm))


@pytest.mark.parametrize("backend", ["reference", "fast"])
def test_the_op_gets_the_rows_token_ids_on_every_path(moe_file, backend):
    want = _oracle(moe_file, IDS)
    m = _load(moe_file, backend)
    ByToken.calls.clear()
    np.testing.assert_allclose(m.logits(IDS), want, rtol=0, atol=1e-4 * np.abs(want).max())
    assert [c.tolist() for c in ByToken.calls] == [IDS.tolist()] * 2  # each layer, the prompt's ids
    # prompt in chunks, then one token at a time
    m.prefill_chunk = 4
    cache = m.init_cache(len(IDS))
    got = m.forward_step(IDS[:7], cache, all_logits=True)
    for t in IDS[7:]:
        got = np.concatenate([got, m.forward_step([t], cache, all_logits=True)])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())
    # two sequences in one batch: each row its own id
    ByToken.calls.clear()
    caches = [m.init_cache(8), m.init_cache(8)]
    spans = m.forward_step_batch_spans([IDS[:4], IDS[4:9]], caches, all_logits=True)
    np.testing.assert_allclose(spans[0], want[:4], rtol=0, atol=1e-4 * np.abs(want).max())
    np.testing.assert_allclose(spans[1], _oracle(moe_file, IDS[4:9]), rtol=0, atol=1e-4 * np.abs(want).max())
    assert ByToken.calls[0].tolist() == IDS[:9].tolist()


def test_the_op_binds_its_own_tensors_per_layer(moe_file):
    ByToken.bound.clear()
    _load(moe_file)
    assert [layer for layer, _ in ByToken.bound] == [0, 1]


def test_a_mixture_called_without_ids_is_refused(moe_file):
    m = _load(moe_file)
    lp = m.plan.layers[0]
    assert lp.ffn.token_ids
    with pytest.raises(InvalidRequest, match="routes by token id"):
        lp.ffn(np.zeros((2, m.descriptor.n_embd), np.float32))


def test_token_ids_with_a_layer_kernel_is_refused():
    class Bad:
        @hookimpl
        def archrun_register_vocabulary(self, register):
            register(Op("moe", "bad", ByToken, ByToken, "", capabilities=OpCapabilities(token_ids=True,
                                                                                         fused_layer=True)))

    from archrun.vocab import build_vocabulary

    with pytest.raises(PluginError, match="token_ids and fused_layer"):
        build_vocabulary(make_plugin_manager(extra=[Bad()]))


def test_a_model_without_such_an_op_is_unchanged(moe_file):
    m = archrun.load(moe_file, backend="reference")
    assert not m.plan.layers[0].ffn.token_ids
