"""granitehybrid beyond the standard battery: Mamba2 and attention layers in one cache — decode,
rewind 3, decode = a fresh run; a chat's next turn returns to the checkpoint where the previous
prompt ended; speculative decoding rewinds rejected drafts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import archrun
from archrun import speculative
from archrun.cache import PrefixCache
from archrun.conformance import hf
from archrun.speculative import Draft, Drafter

GOLDENS = Path(__file__).parent / "goldens"
FIXTURES = ("granitehybrid_mmam_dense", "granitehybrid_amm_moe")


def _golden(name: str) -> tuple[np.ndarray, np.ndarray]:
    g = hf.load_golden(GOLDENS / f"{name}.npz")
    return g["ids"].astype(np.int64), g["logits"]


@pytest.fixture(scope="module", params=[(n, b) for n in FIXTURES for b in hf.BACKENDS],
                ids=lambda p: f"{p[0]}-{p[1]}")
def loaded(request):
    name, backend = request.param
    return name, archrun.load(GOLDENS / f"{name}.gguf", backend=backend)


def test_layers_choose_their_kind(loaded):
    name, model = loaded
    pattern = name.split("_")[1]
    assert [ly.attention.kind for ly in model.descriptor.layers] == \
        ["causal" if k == "a" else "mamba2" for k in pattern]


@pytest.mark.parametrize("k", [1, 4])
def test_decode_rewind_three_decode_again_equals_fresh(loaded, k):
    name, model = loaded
    ids, ref = _golden(name)
    cache = model.init_cache(len(ids), max_rewind=4)
    model.forward_step(ids[:20], cache)
    for t in ids[20:20 + k]:
        model.forward_step([t], cache)
    cache.rewind(3)
    keep = 20 + k - 3
    again = np.stack([model.forward_step([t], cache) for t in ids[keep:keep + 6]])
    assert hf.rel_err(again, ref[keep:keep + 6]) <= hf.TOLERANCE


def test_chat_prefix_reuse_recomputes_only_from_the_checkpoint():
    ids, ref = _golden("granitehybrid_mmam_dense")
    model = archrun.load(GOLDENS / "granitehybrid_mmam_dense.gguf", backend="fast")
    cache = PrefixCache(model.init_cache(len(ids), max_rewind=2))
    prompt1 = [int(t) for t in ids[:18]]
    model.forward_step(cache.prepare(prompt1), cache.cache)
    cache.fed(prompt1)
    for t in [(t + 7) % model.descriptor.n_vocab for t in ids[18:26]]:   # a reply the next prompt re-renders
        model.forward_step([t], cache.cache)
        cache.fed([t])
    feed = cache.prepare([int(t) for t in ids])
    assert cache.recomputed == len(feed) == len(ids) - 18
    assert hf.rel_err(model.forward_step(feed, cache.cache, all_logits=True), ref[18:]) <= hf.TOLERANCE


class _Guess(Drafter):
    def propose(self, history, k, sampler):
        return Draft(tuple([int(history[-1])] * k))


def test_speculative_decoding_equals_greedy():
    model = archrun.load(GOLDENS / "granitehybrid_amm_moe.gguf", backend="reference")
    ids, _ = _golden("granitehybrid_amm_moe")
    prompt = [int(t) for t in ids[:10]]
    want = "".join(archrun.generate(model, prompt, max_tokens=14, temperature=0.0))
    gen = speculative.generate(model, prompt, _Guess(), draft_max=4, max_tokens=14, temperature=0.0)
    assert "".join(gen) == want
    assert gen.result.timings["spec_drafted"] > 0 and gen.result.timings["spec_acceptance"] < 1.0


def test_the_server_reuses_a_prefix_through_the_prompt_end_checkpoint():
    """A server slot holds a prompt and a 29-token reply; the next request shares only the prompt. The
    Mamba2 layers keep 16 recent states, so the slot returns to the checkpoint where the prompt ended:
    the prompt is reused, only the new tokens are computed, and the output is plain greedy decoding's."""
    import queue

    from archrun.generation import make_request
    from archrun.serve.engine import Engine

    model = archrun.load(GOLDENS / "granitehybrid_mmam_dense.gguf", backend="fast")
    ids, _ = _golden("granitehybrid_mmam_dense")
    no_end = {t: -100.0 for t in model.tokenizer.eog_ids}
    engine = Engine(model, parallel=1, ctx=96, queue=1, prefill_chunk=8)
    engine.start()

    def run(prompt, n):
        done: queue.Queue = queue.Queue()
        req = make_request(model, prompt, max_tokens=n, temperature=0.0, context=96, logit_bias=no_end)
        engine.submit(req, lambda e: done.put(e) if e.result is not None or e.error is not None else None)
        event = done.get(timeout=60)
        assert event.error is None, event.error
        return event.result

    try:
        prompt = [int(t) for t in ids[:20]]
        assert run(prompt, 30).cached_tokens == 0
        before = engine.metrics.prefilled_tokens
        second = run([*prompt, 7, 7], 4)
        assert (second.cached_tokens, engine.metrics.prefilled_tokens - before) == (20, 2)
        want = archrun.generate(model, [*prompt, 7, 7], max_tokens=4, temperature=0.0, logit_bias=no_end)
        assert second.token_ids == want.complete().token_ids
    finally:
        engine.stop()
