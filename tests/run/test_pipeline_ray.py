"""Pipeline stages on a loopback Ray cluster: a 24-block synthetic model (Q8_0, written with the real gguf writer,
big enough that its weights dominate a stage's memory) on 3 stage actors gives one process's logits bit for bit
(prompt, decode steps, a batch of 8 sequences in micro-batches), each stage holds about its share of the weights,
and the OpenAI server on the pipeline answers 8 concurrent greedy requests as one process decodes them.
Bounded: the cluster is torn down, and the module fails past DEADLINE_S."""

from __future__ import annotations

import concurrent.futures
import os

import numpy as np
import pytest
from support.big_synth import write_big
from support.ray_cluster import loopback_cluster

import archrun
from archrun.errors import InvalidRequest

DEADLINE_S = 420
if os.environ.get("CI"):
    import ray  # noqa: F401 - CI installs the ray extra: a missing one is a failure, not a skip
ray = pytest.importorskip("ray")
STAGES = 3
N_LAYER = 48


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("pipeline")
    return (write_big(d / "big.gguf", n_layer=N_LAYER, n_embd=512, n_ff=1408, n_head=8, n_head_kv=8),
            write_big(d / "tiny.gguf", n_layer=2, n_embd=64, n_ff=64, n_head=2, n_head_kv=2))


@pytest.fixture(scope="module")
def cluster(files):
    from archrun import pipeline

    with loopback_cluster(DEADLINE_S, "the Ray pipeline test"):
        model = pipeline.load(files[0], STAGES, {"threads": 1}, num_cpus=0.5)
        # the runtime alone (Python, numba's kernels of these types): a stage process holding a tiny model
        runtime = ray.remote(num_cpus=0.5)(pipeline.StageWorker).remote(str(files[1]), (0, 2), {"threads": 1})
        yield model, runtime


@pytest.fixture(scope="module")
def whole(files):
    return archrun.load(files[0], threads=1)


def test_stages_split_the_blocks_evenly(cluster):
    model, _ = cluster
    assert model.bounds == [(0, 16), (16, 32), (32, 48)]


def test_each_stage_holds_about_its_share_of_the_weights(cluster, files):
    from archrun.io.ggufset import open_gguf

    model, runtime = cluster  # measured before any sequence's KV cache is made (this test runs first)
    base = ray.get(runtime.memory.remote())
    with open_gguf(files[0]) as g:
        total = sum(t.nbytes for t in g.tensors.values())
        for mem, (a, b) in zip(model.memory(), model.bounds, strict=True):
            own = tuple(f"blk.{i}." for i in range(a, b))
            share = sum(t.nbytes for n, t in g.tensors.items() if n.startswith(own))
            share += g.tensors["token_embd.weight"].nbytes * (a == 0)
            share += g.tensors["output.weight"].nbytes * (b == N_LAYER)
            held, peak = mem["rss"] - base["rss"], mem["peak"] - base["peak"]
            print(f"stage {a}..{b}: share {share / 1e6:.1f} MB, held {held / 1e6:.1f} MB, peak {peak / 1e6:.1f} MB")
            assert 0.5 * share < held < 1.3 * share, (a, b, held, share)
            assert peak < 1.3 * share < 0.5 * total, (a, b, peak, share)


def test_three_stages_equal_one_process_bitwise(cluster, whole):
    model, _ = cluster
    prompt = [(7 * i) % 250 + 4 for i in range(20)]
    pc, wc = model.init_cache(64), whole.init_cache(64)
    a, b = model.forward_step(prompt, pc, all_logits=True), whole.forward_step(prompt, wc, all_logits=True)
    assert a.shape == (20, 256) and np.array_equal(a, b)
    for _ in range(4):
        t = int(b[-1].argmax())
        a, b = model.forward_step([t], pc)[None], whole.forward_step([t], wc)[None]
        assert np.array_equal(a, b)
    assert len(pc) == len(wc) == 24  # 20 + 4
    pc.rewind(3)
    wc.rewind(3)
    assert np.array_equal(model.forward_step([9, 10], pc), whole.forward_step([9, 10], wc))


def test_a_batch_of_eight_goes_through_in_micro_batches_bitwise(cluster, whole):
    model, _ = cluster
    pcs, wcs = [model.init_cache(32) for _ in range(8)], [whole.init_cache(32) for _ in range(8)]
    prompts = [[4 + i, 5 + i, 6 + 2 * i] for i in range(8)]
    for got, want in zip(model.forward_step_batch_spans(prompts, pcs), whole.forward_step_batch_spans(prompts, wcs),
                         strict=True):
        assert np.array_equal(got, want)
    steps = [[20 + i] for i in range(8)]
    for got, want in zip(model.forward_step_batch(steps, pcs), whole.forward_step_batch(steps, wcs), strict=True):
        assert np.array_equal(got, want)


def test_the_server_on_stages_answers_eight_streams_as_one_process(cluster, whole):
    from support.live_server import live_server

    model, _ = cluster
    prompts = [[10 + i, 40 + 3 * i, 90 + i] for i in range(8)]

    def greedy(prompt):
        cache = whole.init_cache(32)
        ids, logits = [], whole.forward_step(prompt, cache)
        for _ in range(6):
            ids.append(int(logits.argmax()))
            if ids[-1] in whole.tokenizer.eog_ids:  # the server stops there too
                return whole.tokenizer.decode(ids[:-1])
            logits = whole.forward_step(ids[-1:], cache)
        return whole.tokenizer.decode(ids)

    with live_server(model, parallel=8, ctx=64) as (url, _):
        import httpx

        def ask(prompt):
            r = httpx.post(url + "/v1/completions", timeout=120,
                           json={"prompt": prompt, "max_tokens": 6, "temperature": 0})
            r.raise_for_status()
            return r.json()["choices"][0]["text"]

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(ask, prompts))
    assert answers == [greedy(p) for p in prompts]


def test_bad_pipelines_are_refused(files):
    from archrun import pipeline
    from archrun.cli import main

    for bad in (0, N_LAYER + 1, 1.5, True):
        with pytest.raises(InvalidRequest, match="stages must be"):
            pipeline.load(files[0], bad)
    with pytest.raises(InvalidRequest, match="cannot hold 'layers'"):
        pipeline.load(files[0], 2, {"layers": (0, 2)})
    assert main(["serve", str(files[0]), "--stages", "2"]) == 1  # --stages needs --ray
    assert main(["serve", str(files[0]), "--ray", "--stages", "2", "--replicas", "2"]) == 1
