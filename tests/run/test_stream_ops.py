"""The stream slot: a family's stream op carries the residual stream through the blocks.

A test plugin registers a two-stream op ("mirror": the blocks run on a mix of both streams, the second
accumulates their outputs) whose layout reads its gain from the file; a family "streamed" names it. The
oracle is the same weights under qwen3 (the same conventions, one stream) driven block by block through
the Trunk interface with the op's arithmetic written out. Whole prompts, one-token steps, batched
sequences, the descriptor's parameters and the refusal of pipeline stages."""

from __future__ import annotations

import numpy as np
import pytest

import archrun
from archrun.errors import InvalidRequest
from archrun.family import TRANSFORMER, FamilyHints
from archrun.hookspecs import hookimpl
from archrun.plugins import make_plugin_manager
from archrun.vocab import Op

IDS = np.array([5, 17, 3, 42, 8, 60, 11, 2, 29])


class MirrorLayout:
    def describe(self, ctx):
        return {"params": {"gain": 1.0 / ctx.meta.get("block_count", int)}}


class Mirror:
    """Streams (a, b): block i runs on a + gain b; a becomes its output, b accumulates it; leave: a - gain b."""

    def __init__(self, descriptor, gain=0.0):
        self.gain = np.float32(gain)

    bound = False

    def bind(self, binder):
        self.bound = binder.d.architecture == "streamed"

    def enter(self, x, ids):
        return x, -x

    def layer(self, i, state, block):
        a, b = state
        out = block(a + self.gain * b)
        return out, b + out

    def leave(self, state):
        return state[0] - self.gain * state[1]


class Split:
    """Streams (a, b) mixed between a block's branches: o = attention(a), g = a + o, f = ffn(g + gain b);
    a becomes g + f (the sequential block when gain is 0), b accumulates f; leave: a."""

    def __init__(self, descriptor, gain=0.0):
        self.gain = np.float32(gain)

    def bind(self, binder):
        pass

    def enter(self, x, ids):
        return x, x * np.float32(0.5)

    def layer(self, i, state, block):
        a, b = state
        g = a + block.attention(a)
        f = block.ffn(g + self.gain * b)
        return g + f, b + f

    def leave(self, state):
        return state[0]


class StreamPlugin:
    @hookimpl
    def archrun_register_vocabulary(self, register):
        register(Op("stream", "mirror", Mirror, None, "two streams (test)", layout=MirrorLayout()))
        register(Op("stream", "split", Split, None, "two streams mixed between the branches (test)",
                    layout=SplitLayout()))

    @hookimpl
    def archrun_describe_family(self, architecture):
        stream = {"streamed": "mirror", "branched": "split", "unmixed": "split"}.get(architecture)
        if stream is None:
            return None
        return FamilyHints(name=architecture, **TRANSFORMER, rope_pairing="neox", activation="silu",
                           embed_scale=1.0, stream=stream)

    @hookimpl
    def archrun_families(self):
        return ["streamed", "branched", "unmixed"]


class SplitLayout:
    def describe(self, ctx):
        return {"params": {"gain": 0.0 if ctx.meta.arch == "unmixed" else 0.5}}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from support.synth import write_model

    d = tmp_path_factory.mktemp("stream")
    return (write_model(d / "streamed.gguf", arch="streamed", n_layer=3, seed=4),
            write_model(d / "plain.gguf", arch="qwen3", n_layer=3, seed=4),
            write_model(d / "branched.gguf", arch="branched", n_layer=3, seed=4),
            write_model(d / "unmixed.gguf", arch="unmixed", n_layer=3, seed=4))


def _oracle(plain, ids):
    """The mirror op's arithmetic over the one-stream model's blocks (Trunk interface)."""
    gain = np.float32(1.0 / plain.descriptor.n_layer)
    cache = plain.init_cache(len(ids))
    angles = plain.rope_angles(np.arange(len(ids)))
    x = plain.embed(ids, 0)
    a, b = x, -x
    for lp, slot in zip(plain.plan.layers, cache.slots, strict=True):
        out = plain.run_block(lp, a + gain * b, slot, 0, angles)
        a, b = out, b + out
    return plain.head(plain.norm(a - gain * b, plain.output_norm))


@pytest.mark.parametrize("backend", ["reference", "fast"])
def test_stream_op_carries_the_blocks(files, backend):
    pm = make_plugin_manager(extra=[StreamPlugin()])
    model = archrun.load(files[0], backend=backend, plugins=pm)
    plain = archrun.load(files[1], backend=backend)
    assert model.descriptor.stream == "mirror"
    assert dict(model.descriptor.stream_params) == {"gain": 1.0 / 3}
    assert model.plan.stream.bound and getattr(model, "fused_blocks", None) is None  # one stream per kernel
    want = _oracle(plain, IDS)
    scale = np.abs(want).max()
    assert np.abs(model.logits(IDS) - want).max() <= 1e-5 * scale
    assert np.abs(model.logits(IDS) - plain.logits(IDS)).max() > 1e-2 * scale  # the streams matter
    cache = model.init_cache(len(IDS))
    steps = np.stack([model.forward_step([t], cache) for t in IDS])  # one-token steps: op by op
    assert np.abs(steps - want).max() <= 1e-4 * scale
    if model.caps.batch:
        caches = [model.init_cache(16), model.init_cache(16)]
        spans = model.forward_step_batch_spans([IDS[:4], IDS[4:]], caches, all_logits=True)
        for got, seq in zip(spans, (IDS[:4], IDS[4:]), strict=True):
            assert np.abs(got - _oracle(plain, seq)).max() <= 1e-4 * scale


def test_pipeline_stages_are_refused(files):
    pm = make_plugin_manager(extra=[StreamPlugin()])
    with pytest.raises(InvalidRequest, match="stream op 'mirror'"):
        archrun.load(files[0], backend="reference", plugins=pm, layers=(0, 2))


@pytest.mark.parametrize("backend", ["reference", "fast"])
def test_stream_op_runs_a_blocks_branches(files, backend):
    """block.attention and block.ffn compose to the whole block (gain 0: the one-stream model); the FFN
    branch reads what the op gives it (gain 0.5: another model), in whole prompts and one-token steps."""
    pm = make_plugin_manager(extra=[StreamPlugin()])
    plain = archrun.load(files[1], backend=backend)
    unmixed, branched = (archrun.load(f, backend=backend, plugins=pm) for f in files[3:1:-1])
    want = plain.logits(IDS)
    scale = np.abs(want).max()
    assert np.abs(unmixed.logits(IDS) - want).max() <= 1e-5 * scale
    mixed = branched.logits(IDS)
    assert np.abs(mixed - want).max() > 1e-2 * scale
    cache = branched.init_cache(len(IDS))
    steps = np.stack([branched.forward_step([t], cache) for t in IDS])  # each branch writes the cache once
    assert np.abs(steps - mixed).max() <= 1e-4 * scale
