"""The batching engine without HTTP, on a tiny gemma3 fixture (sliding-window ring layers): any Decoder
(also one without a batch entry), prefix reuse counted in prefilled tokens, chunked prefill beside
running streams, cancellation and the queue bound."""

from __future__ import annotations

import queue
import time

import pytest
from support.tiny import TINY, fixtures, golden

import archrun
from archrun.generation.generate import make_request
from archrun.serve.engine import AUTO_MAX_CHUNK, AUTO_MIN_CHUNK, Engine, QueueFull, StepCosts

NAME = fixtures("gemma3")[0]


@pytest.fixture(scope="module", params=["fused", "host_reference"])
def model(request):  # host_reference has no forward_step_batch: the engine steps sequences one by one
    return archrun.load(TINY[NAME], block_style=request.param)


@pytest.fixture
def engine(model):
    eng = Engine(model, parallel=2, ctx=96, queue=1, prefill_chunk=8)  # rings: window + 64 rows
    eng.start()
    yield eng
    eng.stop()


@pytest.fixture(scope="module")
def ids():
    return [int(t) for t in golden(NAME)[0]] * 2


class Sink:
    """Records (name, event) in the order the engine sends them; wait() returns the result."""

    def __init__(self, name: str, log: list):
        self.name, self.log, self.done = name, log, queue.Queue()

    def __call__(self, event) -> None:
        self.log.append((self.name, event))
        if event.result is not None or event.error is not None:
            self.done.put(event)

    def wait(self):
        event = self.done.get(timeout=60)
        assert event.error is None, event.error
        return event.result


def submit(engine, model, name, prompt, log, max_tokens=6, **kw):
    no_end = {t: -100.0 for t in model.tokenizer.eog_ids}  # streams run to max_tokens
    req = make_request(model, prompt, max_tokens=max_tokens, temperature=0.0, context=engine.ctx,
                       logit_bias=no_end, **kw)
    sink = Sink(name, log)
    return engine.submit(req, sink), sink


def greedy(model, prompt, n):
    no_end = {t: -100.0 for t in model.tokenizer.eog_ids}
    return archrun.generate(model, prompt, max_tokens=n, temperature=0.0, logit_bias=no_end).complete().token_ids


def until(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def test_results_equal_generate_and_a_shared_prefix_is_not_recomputed(model, engine, ids):
    _, a = submit(engine, model, "a", ids[:20], [])
    first = a.wait()
    assert first.cached_tokens == 0 and first.token_ids == greedy(model, ids[:20], 6)
    _, b = submit(engine, model, "b", ids[:24], [])          # the slot holds 20 + 5 ids: 5 rewound
    again = b.wait()
    assert (again.cached_tokens, again.prompt_tokens) == (20, 24)
    assert engine.metrics.prefilled_tokens == 20 + 4
    assert again.token_ids == greedy(model, ids[:24], 6)


def test_reuse_stops_where_the_ring_cannot_rewind(model, engine, ids):
    _, a = submit(engine, model, "a", ids[:80], [], max_tokens=1)
    a.wait()
    near = [*ids[:70], 7]                                       # 10 back: within the ring's 64 spare rows
    _, b = submit(engine, model, "b", near, [], max_tokens=4)
    got = b.wait()
    assert got.cached_tokens == 70 and got.token_ids == greedy(model, near, 4)
    far = [*ids[:5], 7, 7]                                      # 66 back: rows the ring overwrote
    _, c = submit(engine, model, "c", far, [], max_tokens=4)
    got = c.wait()
    assert got.cached_tokens == 0 and got.token_ids == greedy(model, far, 4)


def test_prefill_is_chunked_while_other_streams_keep_decoding(model, engine, ids):
    log: list = []
    _, a = submit(engine, model, "a", ids[:4], log, max_tokens=60, logprobs=0)  # one event per token
    until(lambda: len(log) >= 2)
    mark = len(log)
    _, b = submit(engine, model, "b", ids[:80], log, max_tokens=2, logprobs=0)  # 80 prompt tokens: 10 chunks
    a.wait()
    b.wait()
    names = [name for name, _ in log[mark:]]
    assert names[:names.index("b")].count("a") >= 8            # a streamed while b's prompt was computed


def test_the_automatic_chunk_prefills_a_lone_prompt_in_one_step_and_chunks_beside_decoding(model, ids):
    eng = Engine(model, parallel=2, ctx=96, queue=1)  # prefill_chunk None: automatic
    eng.start()
    try:
        _, a = submit(eng, model, "a", ids[:60], [], max_tokens=3)
        assert a.wait().token_ids == greedy(model, ids[:60], 3)
        assert eng.metrics.steps == 3  # the whole prompt in the first step (a fixed 8: 8 + 2 steps)
        log: list = []
        _, b = submit(eng, model, "b", ids[:4], log, max_tokens=60, logprobs=0)
        until(lambda: len(log) >= 4)  # b decodes: its steps are measured
        mark = len(log)
        _, c = submit(eng, model, "c", ids[10:90], log, max_tokens=2, logprobs=0)
        b.wait()
        c.wait()
        names = [name for name, _ in log[mark:]]
        assert names[:names.index("c")].count("b") >= 80 // AUTO_MAX_CHUNK + 1  # b kept streaming
        assert eng.costs.row_s is not None and eng.costs.token_s is not None
    finally:
        eng.stop()


def test_step_costs_size_the_chunk_to_one_decode_step():
    costs = StepCosts(weight=1.0)  # the last step only
    assert costs.chunk(0) == AUTO_MAX_CHUNK and costs.chunk(2) == 16  # nothing measured yet
    costs.record(0.010, decoding=2, prompt_tokens=0)             # 5 ms per decoding sequence
    costs.record(0.010 + 16 * 0.001, decoding=2, prompt_tokens=16)  # + 1 ms per prompt token
    assert costs.row_s == pytest.approx(0.005) and costs.token_s == pytest.approx(0.001)
    assert costs.chunk(2) == 10 and costs.chunk(8) == 40 and costs.chunk(0) == AUTO_MAX_CHUNK
    costs.record(1.0, decoding=0, prompt_tokens=10)             # a slow prefill: at least the minimum
    assert costs.chunk(1) == AUTO_MIN_CHUNK
    costs.record(0.004, decoding=1, prompt_tokens=10)          # nothing left after the decode rows: kept
    assert costs.token_s == pytest.approx(0.1)


def test_cancel_frees_the_slot_and_a_full_queue_refuses(model, engine, ids):
    t1, _ = submit(engine, model, "a", ids[:4], [], max_tokens=80)
    t2, _ = submit(engine, model, "b", ids[4:8], [], max_tokens=80)
    until(lambda: engine.running == 2)
    t3, _ = submit(engine, model, "c", ids[8:12], [], max_tokens=80)   # waits: one queue place
    with pytest.raises(QueueFull):
        submit(engine, model, "d", ids[:4], [])
    for t in (t1, t2, t3):
        t.cancel()
    until(lambda: engine.running == 0 and engine.metrics.queue_depth == 0)
    _, e = submit(engine, model, "e", ids[:6], [], max_tokens=2)
    assert e.wait().completion_tokens == 2


def test_every_event_is_flushed_also_a_refused_request_while_nothing_runs(model, ids, monkeypatch):
    """A server's sinks may hold events until the engine's `flushed()` (one wake-up of its event loop per
    step), so no event may stay unflushed: not a step's, not an admission's error while the engine then
    sleeps. The throwaway warm-up step at start leaves results equal to generate's."""
    from archrun.errors import InvalidRequest
    from archrun.serve import engine as engine_module

    log: list = []
    flushed: list = []  # events sent so far, at each flush
    eng = Engine(model, parallel=2, ctx=96, queue=1, flushed=lambda: flushed.append(len(log)))
    eng.start()
    try:
        _, a = submit(eng, model, "a", ids[:10], log, max_tokens=4, logprobs=0)
        _, b = submit(eng, model, "b", ids[3:12], log, max_tokens=4, logprobs=0)
        assert a.wait().token_ids == greedy(model, ids[:10], 4)
        assert b.wait().token_ids == greedy(model, ids[3:12], 4)
        until(lambda: flushed and flushed[-1] == len(log))
        until(lambda: eng.running == 0)

        def refused(*args, **kwargs):
            raise InvalidRequest("refused at admission")

        monkeypatch.setattr(engine_module, "Decoding", refused)
        _, c = submit(eng, model, "c", ids[:4], log)
        error = c.done.get(timeout=60).error
        assert isinstance(error, InvalidRequest)
        until(lambda: flushed[-1] == len(log))  # flushed before the engine went back to sleep
    finally:
        eng.stop()


class Switching:
    """A model that, like a tiered start, replaces its active tier between steps: attributes are the
    active tier's at the moment they are read."""

    def __init__(self, first, second):
        self.active, self.second, self.batches = first, second, []

    def __getattr__(self, name):
        return getattr(self.active, name)

    def switch(self):
        self.active = self.second


def test_batched_steps_follow_a_model_that_switches_tiers(ids):
    reference = archrun.load(TINY[NAME], block_style="fused", backend="reference")
    fast = archrun.load(TINY[NAME], block_style="fused")
    model = Switching(reference, fast)
    calls = []
    for tier in (reference, fast):
        real = tier.forward_step_batch
        tier.forward_step_batch = lambda a, c, _t=tier, _r=real: calls.append(_t) or _r(a, c)
    eng = Engine(model, parallel=2, ctx=96, queue=1, prefill_chunk=8)
    eng.start()
    try:
        for step in range(2):
            pair = [submit(eng, model, n, ids[i:i + 8], [], max_tokens=3)[1] for i, n in ((0, "a"), (8, "b"))]
            for sink in pair:
                assert sink.wait().token_ids == greedy(model.active, ids[:8] if sink is pair[0] else ids[8:16], 3)
            if step == 0:
                assert calls and set(calls) == {reference}
                model.switch()
        assert calls[-1] is fast  # after the switch the engine's steps run on the new tier
    finally:
        eng.stop()
