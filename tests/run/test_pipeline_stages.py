"""Pipeline stages in one process: `archrun.load(path, layers=(start, end))` binds blocks start..end-1 only, and
chaining the stages' steps (hidden states from one to the next) gives the whole model's logits bit for bit on
every path (prompt, one-token decode, a batch of sequences through the multi-row kernel). The reference is the
same file loaded whole. The Ray pipeline over these stages is tests/run/test_pipeline_ray.py."""

from __future__ import annotations

from types import SimpleNamespace

import gguf
import numpy as np
import pytest
from support.synth import quantize, write_model

import archrun
from archrun.errors import InvalidRequest
from archrun.pipeline import split_layers

N_LAYER = 6
BOUNDS = [(0, 2), (2, 5), (5, 6)]


@pytest.fixture(scope="module", params=["fast", "reference"])
def models(request, tmp_path_factory):
    path = write_model(tmp_path_factory.mktemp("stages") / "m.gguf", n_layer=N_LAYER, n_embd=64, n_ff=64,
                       n_vocab=128, transform=quantize(gguf.GGMLQuantizationType.Q8_0))
    whole = archrun.load(path, backend=request.param)
    return whole, [archrun.load(path, backend=request.param, layers=b) for b in BOUNDS]


def _chain(stages, inputs, caches, all_logits=False):
    x = inputs
    for st, c in zip(stages, caches, strict=True):
        x = st.forward_step(x, c, all_logits=all_logits or st.gives_hidden)
    return x


def _chain_batch(stages, spans, caches):
    x = [np.asarray(s) for s in spans]
    for j, st in enumerate(stages):
        x = st.forward_step_batch_spans(x, [c[j] for c in caches], all_logits=st.gives_hidden)
    return x


def test_a_stage_binds_only_its_blocks(models):
    _, stages = models
    for st, (a, b) in zip(stages, BOUNDS, strict=True):
        blocks = {int(n.split(".")[1]) for n in st.plan.binder.bound if n.startswith("blk.")}
        assert blocks == set(range(a, b))
        assert (st.plan.embed is not None) == (a == 0) and (st.plan.output is not None) == (b == N_LAYER)
        assert len(st.init_cache(8).slots) == b - a


def test_chained_stages_equal_the_whole_model_bitwise(models):
    whole, stages = models
    if whole.backend == "fast":  # one-token steps fused, short spans on the multi-row kernel, in every stage
        assert whole.step_paths()[1:4] == (True, True, True)
        assert all(st.step_paths() == whole.step_paths() for st in stages)
    for prompt in ([3, 9, 27, 81, 5], list(range(1, 41)), [7]):
        wc, sc = whole.init_cache(96), [s.init_cache(96) for s in stages]
        assert np.array_equal(whole.forward_step(prompt, wc, all_logits=True),
                              _chain(stages, np.array(prompt), sc, all_logits=True))
        for t in (4, 8, 15, 16):
            assert np.array_equal(whole.forward_step([t], wc), _chain(stages, np.array([t]), sc))


def test_a_batch_through_the_stages_equals_the_whole_model_bitwise(models):
    whole, stages = models
    if not whole.caps.batch:
        pytest.skip("this block style has no batched entries")
    wcs = [whole.init_cache(64) for _ in range(4)]
    scs = [[s.init_cache(64) for s in stages] for _ in range(4)]
    for i in range(4):
        whole.forward_step([i + 1, i + 2, i + 3], wcs[i])
        _chain(stages, np.array([i + 1, i + 2, i + 3]), scs[i])
    for spans in ([[7], [8], [9, 10], [11]], [[12], [13], [14], [15]]):
        for u, v in zip(whole.forward_step_batch_spans(spans, wcs), _chain_batch(stages, spans, scs), strict=True):
            assert np.array_equal(u, v)


def test_bad_layer_ranges_and_inputs_are_refused(models, tmp_path):
    whole, stages = models
    path = whole.gguf.path
    for bad in [(0, 0), (2, 1), (-1, 3), (0, N_LAYER + 1), (0.5, 2), "0:2", (1,), (True, 2)]:
        with pytest.raises(InvalidRequest, match="layers must be"):
            archrun.load(path, layers=bad)
    later = stages[1]
    with pytest.raises(InvalidRequest, match="takes hidden states"):
        later.forward_step([1, 2], later.init_cache(8))
    with pytest.raises(InvalidRequest, match="takes hidden states"):
        later.forward_step(np.zeros((2, 63), np.float32), later.init_cache(8))


def test_split_layers_balances_weight_bytes():
    d = SimpleNamespace(n_layer=4)  # split_layers reads the block count only
    sizes = {"blk.0.w": 10, "blk.1.w": 10, "blk.2.w": 10, "blk.3.w": 30, "token_embd.weight": 999}
    assert split_layers(d, sizes, 2) == [(0, 3), (3, 4)]
    assert split_layers(d, sizes, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    for bad in (0, 5, 1.5, True):
        with pytest.raises(InvalidRequest, match="stages must be"):
            split_layers(d, sizes, bad)
