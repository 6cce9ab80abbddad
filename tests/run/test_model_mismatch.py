"""Objects made by one model and given to another, and caches whose internals were replaced.

A cache carries the identity (file and descriptor) and geometry of the model that made it; every
entry point checks it, and that its slots still hold the very arrays made then (shape, dtype,
strides, writability), before any kernel runs: ModelMismatch names what differs. Requests, grammar
states, samplers and draft-model drafters check the vocabulary or the model they were made for.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import archrun
from archrun.errors import ArchrunError, InvalidRequest, ModelMismatch
from archrun.generation import speculative
from archrun.generation.generate import Decoding, make_request
from archrun.generation.grammar import Constraint, Grammar
from archrun.generation.sampling import Sampler, SamplingParams
from archrun.run.cache import PrefixCache

ROOT = Path(__file__).resolve().parents[2]
GOLDENS = ROOT / "families"
LLAMA = GOLDENS / "archrun-llama/tests/goldens/llama_gqa.gguf"          # 2 layers, 2 KV heads of 16
QWEN = GOLDENS / "archrun-qwen/tests/goldens/qwen3_tied_kv1.gguf"       # 3 layers, 1 KV head
GEMMA3 = GOLDENS / "archrun-gemma3/tests/goldens/gemma3_period6_tied.gguf"  # sliding-window rings
BACKENDS = ("reference", "fast")


@pytest.fixture(scope="module")
def models():
    return {(p.stem, b): archrun.load(p, backend=b) for p in (LLAMA, QWEN, GEMMA3) for b in BACKENDS}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_cache_of_another_geometry_is_refused_by_every_entry(models, backend) -> None:
    llama, qwen = models["llama_gqa", backend], models["qwen3_tied_kv1", backend]
    foreign = llama.init_cache(16)
    llama.forward_step([1, 2, 3], foreign)
    entries = [
        lambda: qwen.forward_step([1], foreign),
        lambda: qwen.forward_step_hidden([1], foreign),
        lambda: qwen.forward_step_batch([[1], [2]], [qwen.init_cache(8), foreign]),
        lambda: qwen.forward_step_batch_spans([[1, 2]], [foreign], all_logits=True),
        lambda: archrun.generate(qwen, [1, 2], max_tokens=2, cache=PrefixCache(foreign)).complete(),
        lambda: speculative.generate(qwen, [1, 2, 1, 2], "lookup", max_tokens=3, cache=PrefixCache(foreign)).complete(),
    ]
    for entry in entries:
        with pytest.raises(ModelMismatch, match=r"made by model 'llama_gqa.gguf' \(2 layers.*qwen3_tied_kv1.gguf"):
            entry()


def test_same_geometry_other_weights_is_refused_but_the_same_file_on_either_backend_is_accepted(models,
                                                                                                 tmp_path) -> None:
    copy = tmp_path / "llama_copy.gguf"
    shutil.copyfile(LLAMA, copy)
    other = archrun.load(copy, backend="reference")  # the same geometry, another file
    ref, fast = models["llama_gqa", "reference"], models["llama_gqa", "fast"]
    cache = ref.init_cache(16)
    ref.forward_step([1, 2], cache)
    with pytest.raises(ModelMismatch, match="same geometry, other weights"):
        other.forward_step([3], cache)
    # the tiered start's switch: the same file on the fast backend continues the reference backend's cache
    want = ref.forward_step([3], _fresh(ref, [1, 2]))
    got = fast.forward_step([3], cache)
    np.testing.assert_allclose(got, want, atol=5e-2)


def _fresh(model, ids):
    cache = model.init_cache(16)
    model.forward_step(ids, cache)
    return cache


def _first_array(cache):
    slot = cache.slots[0]
    return vars(slot), "k", slot.k


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("how", ["bigger", "smaller", "dtype", "strided", "readonly", "reshaped", "slots",
                                 "capacity", "length", "kv_type", "swapped"])
def test_a_cache_whose_internals_were_replaced_is_refused(models, backend, how) -> None:
    model = models["llama_gqa", backend]
    cache, other = _fresh(model, [1, 2, 3]), _fresh(model, [4])
    holder, name, a = _first_array(cache)
    if how == "bigger":  # larger arrays: kernels that do not bounds-check would write past the cache's rows
        holder[name] = np.zeros((a.shape[0] * 4, *a.shape[1:]), a.dtype)
    elif how == "smaller":
        holder[name] = np.zeros((2, *a.shape[1:]), a.dtype)
    elif how == "dtype":
        holder[name] = a.astype(np.float64)
    elif how == "strided":
        holder[name] = np.repeat(a, 2, axis=0)[::2]
    elif how == "readonly":
        a.flags.writeable = False
    elif how == "reshaped":
        a.shape = (a.shape[0], -1)
    elif how == "slots":
        cache.slots = cache.slots[:1]
    elif how == "capacity":
        cache.capacity *= 8
    elif how == "length":
        cache._n = -2
    elif how == "kv_type":
        cache.kv_type = "f16"
    else:
        cache.slots[0], other.slots[0] = other.slots[0], cache.slots[0]
    for entry in (lambda: model.forward_step([5], cache), lambda: model.forward_step_batch_spans([[5]], [cache]),
                  lambda: cache.rewind(1), lambda: PrefixCache(cache).prepare([1, 2, 3, 5]),
                  lambda: archrun.generate(model, [1, 2, 3, 5], max_tokens=2, cache=PrefixCache(cache)).complete()):
        with pytest.raises(ModelMismatch, match="replaced"):
            entry()


def test_a_recurrent_state_replaced_in_its_dict_is_refused() -> None:
    model = archrun.load(GOLDENS / "archrun-lfm2/tests/goldens/lfm2_ccac.gguf", backend="reference")
    cache = _fresh(model, [1, 2])
    state = next(s for s in cache.slots if hasattr(s, "state") or hasattr(s, "mixer"))
    state = getattr(state, "mixer", state)
    key = next(iter(state.state))
    state.state[key] = state.state[key].copy()
    with pytest.raises(ModelMismatch, match=f"{key!r} was replaced"):
        model.forward_step([3], cache)


def test_the_check_costs_microseconds(models) -> None:
    """Once per step, a few comparisons an array: well under a millisecond for these layers."""
    import time

    model = models["gemma3_period6_tied", "fast"]
    cache = model.init_cache(64)
    t0 = time.perf_counter()
    for _ in range(1000):
        cache.verify(model.cache_owner)
    assert (time.perf_counter() - t0) / 1000 < 1e-3


def test_requests_samplers_grammar_states_and_drafters_of_another_model(models) -> None:
    """The tiny fixtures share one vocabulary size, so `nq` plays a model with a larger one (its logits, its
    ids); qwen is the other model."""
    llama, qwen = models["llama_gqa", "reference"], models["qwen3_tied_kv1", "reference"]
    nl = llama.descriptor.n_vocab
    nq = nl + 7
    req = make_request(llama, [1, 2], max_tokens=2)
    with pytest.raises(ModelMismatch, match=f"vocabulary of {nl} tokens, not {nq}"):
        Decoding(llama.tokenizer, req, nq)
    with pytest.raises(InvalidRequest, match=f"logits have {nq} entries"):
        Decoding(llama.tokenizer, req, nl).accept(np.zeros(nq, np.float32))
    with pytest.raises(ModelMismatch, match="made for model 'llama_gqa.gguf'"):
        speculative.Speculation(qwen, speculative.LookupDrafter(), Decoding(llama.tokenizer, req, nl), 3, 16)
    sampler = Sampler(SamplingParams(repetition_penalty=1.2), nl)
    with pytest.raises(InvalidRequest, match="history must hold token ids"):
        sampler(np.zeros(nl, np.float32), [nl + 5])
    con = Constraint(Grammar.regex("[a-z]+"), llama.tokenizer, nl)
    with pytest.raises(ModelMismatch, match="another model"):
        con.choose(1, np.zeros(nq, np.float32), lambda x: 0)
    with pytest.raises(ModelMismatch, match="outside the vocabulary"):
        con.consume(nl + 1)
    drafter = speculative.ModelDrafter(llama, llama)
    with pytest.raises(ModelMismatch, match="made for target 'llama_gqa.gguf'"):
        speculative.generate(qwen, [1, 2, 1, 2], drafter, max_tokens=3).complete()


def test_a_prefix_cache_whose_cache_was_replaced(models) -> None:
    llama = models["llama_gqa", "reference"]
    prefix = PrefixCache(llama.init_cache(16))
    prefix.cache = None
    with pytest.raises(InvalidRequest, match="replaced"):
        archrun.generate(llama, [1, 2], max_tokens=2, cache=prefix)


def test_a_host_step_on_a_foreign_cache(models) -> None:
    host = archrun.load(QWEN, backend="reference", block_style="host_reference")
    with pytest.raises(ModelMismatch):
        host.host_step([1], models["llama_gqa", "reference"].init_cache(8))
    with pytest.raises(ArchrunError):
        host.host_step([1], host.init_cache(8), mtp_cache=object())
