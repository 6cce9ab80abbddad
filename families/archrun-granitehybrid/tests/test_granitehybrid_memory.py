"""granitehybrid beyond the standard battery: Mamba2 and attention layers in one cache (the layer kinds), and a
server slot's prefix reuse through the prompt-end checkpoint. The memory battery (rewinds, checkpoints, a chat's
prefix reuse, speculative decoding's rejected drafts, chunked prefill, a batch keeping each state) is the
conformance kit's (``archrun.conformance.memory``), run on every fixture here whose layers keep state."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import archrun
from archrun.conformance import hf

GOLDENS = Path(__file__).parent / "goldens"


def _golden(name: str) -> tuple[np.ndarray, np.ndarray]:
    g = hf.load_golden(GOLDENS / f"{name}.npz")
    return g["ids"].astype(np.int64), g["logits"]


@pytest.fixture(scope="module", params=["granitehybrid_mmam_dense", "granitehybrid_amm_moe"])
def loaded(request):
    return request.param, archrun.load(GOLDENS / f"{request.param}.gguf", backend="reference")


def test_layers_choose_their_kind(loaded):
    name, model = loaded
    pattern = name.split("_")[1]
    assert [ly.attention.kind for ly in model.descriptor.layers] == \
        ["causal" if k == "a" else "mamba2" for k in pattern]


def test_the_server_reuses_a_prefix_through_the_prompt_end_checkpoint():
    """A server slot holds a prompt and a 29-token reply; the next request shares only the prompt. The
    Mamba2 layers keep 16 recent states, so the slot returns to the checkpoint where the prompt ended:
    the prompt is reused, only the new tokens are computed, and the output is plain greedy decoding's."""
    import queue

    from archrun.generation.generate import make_request
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
