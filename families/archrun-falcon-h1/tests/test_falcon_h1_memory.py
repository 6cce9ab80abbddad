"""falcon-h1 beyond the standard battery: attention and Mamba2 side by side in every block (a PairSlot
per layer) — decode, rewind 3, decode = a fresh run; a chat's next turn returns to the checkpoint where
the previous prompt ended; speculative decoding rewinds rejected drafts."""

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
FIXTURES = ("falcon_h1_g1", "falcon_h1_g2_norm")


def _golden(name: str) -> tuple[np.ndarray, np.ndarray]:
    g = hf.load_golden(GOLDENS / f"{name}.npz")
    return g["ids"].astype(np.int64), g["logits"]


@pytest.fixture(scope="module", params=[(n, b) for n in FIXTURES for b in hf.BACKENDS],
                ids=lambda p: f"{p[0]}-{p[1]}")
def loaded(request):
    name, backend = request.param
    return name, archrun.load(GOLDENS / f"{name}.gguf", backend=backend)


def test_every_block_runs_mamba2_beside_its_attention(loaded):
    _, model = loaded
    assert all(ly.attention.kind == "causal" and ly.parallel.kind == "mamba2" for ly in model.descriptor.layers)


def test_inspect_shows_rows_and_state():
    from archrun.inspect import inspect_model

    memory = inspect_model(GOLDENS / "falcon_h1_g1.gguf")["memory"]
    conv, ssm = 3 * (128 + 2 * 16), 8 * 16 * 16
    assert memory == [{"kind": "causal+mamba2", "bytes_per_token": 2 * 2 * 16 * 4, "state_bytes": 4 * (conv + ssm)}] * 3


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
    ids, ref = _golden("falcon_h1_g1")
    model = archrun.load(GOLDENS / "falcon_h1_g1.gguf", backend="fast")
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
    model = archrun.load(GOLDENS / "falcon_h1_g2_norm.gguf", backend="reference")
    ids, _ = _golden("falcon_h1_g2_norm")
    prompt = [int(t) for t in ids[:10]]
    want = "".join(archrun.generate(model, prompt, max_tokens=14, temperature=0.0))
    gen = speculative.generate(model, prompt, _Guess(), draft_max=4, max_tokens=14, temperature=0.0)
    assert "".join(gen) == want
    assert gen.result.timings["spec_drafted"] > 0 and gen.result.timings["spec_acceptance"] < 1.0


def test_a_mixer_beside_sliding_window_attention_is_refused(tmp_path):
    """Its slot rewinds as the mixer's state does, which a ring of K/V rows could not follow: refused at load."""
    from archrun.conformance.gguf_edit import rewrite_gguf
    from archrun.errors import MetadataError

    edited = rewrite_gguf(GOLDENS / "falcon_h1_g1.gguf", tmp_path / "sliding.gguf",
                          add_keys={"falcon-h1.attention.sliding_window": 8,
                                    "falcon-h1.attention.sliding_window_pattern": [True, True, True]})
    with pytest.raises(MetadataError, match="sliding-window"):
        archrun.load(edited, backend="reference")
