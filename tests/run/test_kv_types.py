"""KV cache types (init_cache(kv_type=...)): f16 / q8_0 caches against the f32 cache, typed errors, the CLI.

The row formats themselves are tested bit for bit against numpy and gguf-py, and the fused attention
part against the op over the same stored rows, in plugins/archrun-blocks/tests/run/test_kv_types.py; here
the whole model: logits within a measured distance of the f32 cache's on a real model, rewinds,
prefix reuse and ring slots in every type, typed errors and the CLI.
"""

from __future__ import annotations

import numpy as np
import pytest
from support.models import real_model

import archrun
from archrun.cli import main
from archrun.errors import KvTypeUnsupported
from archrun.run.cache import PrefixCache

KV = ["f16", "q8_0"]


def _greedy(model, ids, cache, steps: int) -> np.ndarray:
    out = [model.forward_step(ids, cache)]
    for _ in range(steps):
        out.append(model.forward_step([int(np.argmax(out[-1]))], cache))
    return np.array(out)


def _forced(model, ids, cache, chain: np.ndarray) -> np.ndarray:
    """Logits of the prompt's last position and of each step fed chain's argmax tokens (another cache's
    greedy choices): a near tie that one cache resolves the other way does not fork the inputs."""
    out = [model.forward_step(ids, cache)]
    out += [model.forward_step([int(t)], cache) for t in chain.argmax(-1)[:-1]]
    return np.array(out)


@pytest.fixture(scope="module")
def smol():
    return archrun.load(real_model("smollm2"))


@pytest.fixture(scope="module")
def smol_ref():
    return archrun.load(real_model("smollm2"), backend="reference")


PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time, in a land far away,"


@pytest.mark.parametrize(("kv_type", "bound"), [("f16", 0.03), ("q8_0", 0.8)])
def test_real_model_close_to_the_f32_cache(smol, smol_ref, kv_type, bound):
    """SmolLM2 on the reference backend (numpy codec): prompt + 8 steps within `bound` logits of the f32
    cache's (measured max: f16 0.011, q8_0 0.51; logits span ~30); the fast backend with the same kv type
    within its usual distance of the reference (its decode quantizes activations to 8 bits: llama.cpp-style
    bounds, as tests/run/test_real_models.py), argmax equal away from near ties."""
    ids = smol.tokenizer.encode(PROMPT)
    ref32 = _greedy(smol_ref, ids, smol_ref.init_cache(64), 8)
    ref = _forced(smol_ref, ids, smol_ref.init_cache(64, kv_type=kv_type), ref32)
    assert np.abs(ref - ref32).max() < bound
    fast = _forced(smol, ids, smol.init_cache(64, kv_type=kv_type), ref)
    span = ref.max(axis=1) - ref.min(axis=1)
    assert (np.abs(fast - ref).max(axis=1) / span).max() <= 0.1
    top2 = np.sort(ref, axis=-1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 1.0
    assert np.array_equal(fast.argmax(-1)[clear], ref.argmax(-1)[clear])


@pytest.mark.parametrize("kv_type", KV)
def test_rewind_and_prefix_cache(smol, kv_type):
    """A PrefixCache of f16 / q8_0 rows rewinds exactly: a second prompt sharing a prefix gives what a fresh
    cache gives (the rewound rows are overwritten, never read)."""
    ids = smol.tokenizer.encode("Alpha beta gamma delta epsilon zeta eta theta")
    other = ids[:5] + smol.tokenizer.encode(" iota kappa lambda")
    pc = PrefixCache(smol.init_cache(64, kv_type=kv_type))
    first = archrun.generate(smol, ids, cache=pc, max_tokens=4, temperature=0).complete().text
    again = archrun.generate(smol, other, cache=pc, max_tokens=6, temperature=0).complete()
    fresh = archrun.generate(smol, other, max_tokens=6, temperature=0, kv_type=kv_type).complete()
    assert first and again.text == fresh.text
    assert pc.recomputed < len(other)


def test_ring_slots_in_every_type():
    """Gemma 3's sliding-window layers keep rings: with f16 / q8_0 rings wrapped past the window, the logits
    stay within the fast backend's usual distance of the f32 cache's (its int8 activations amplify any
    change of the stored rows to llama.cpp-style differences: relative to the logits' span, argmax equal
    away from near ties), and the cache rewinds within the rings' reach."""
    model = archrun.load(real_model("gemma3"))
    rng = np.random.default_rng(0)
    ids = rng.integers(10, 5000, 600).tolist()  # past the 512 window: rings wrap
    ref = _greedy(model, ids, model.init_cache(640), 3)
    span = ref.max(axis=1) - ref.min(axis=1)
    top2 = np.sort(ref, axis=-1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 1.0
    for kv_type in KV:
        cache = model.init_cache(640, kv_type=kv_type)
        got = _forced(model, ids, cache, ref)
        assert (np.abs(got - ref).max(axis=1) / span).max() <= 0.1, kv_type
        assert np.array_equal(got.argmax(-1)[clear], ref.argmax(-1)[clear])
        cache.rewind(2)  # within the rings' rewind reach
        assert len(cache) == 600 + 3 - 2
        model.forward_step([int(got[-1].argmax())], cache)


def test_bad_kv_types_are_typed_errors(synth_model):
    model = archrun.load(synth_model(head_dim=16), backend="reference")  # 16-wide heads: no q8_0 blocks
    with pytest.raises(KvTypeUnsupported, match="one of f32, f16, q8_0"):
        model.init_cache(8, kv_type="bf16")
    with pytest.raises(KvTypeUnsupported, match="one of"):
        model.init_cache(8, kv_type=None)
    no_q8 = r"layer 0's op 'causal' .* cannot store a q8_0 cache; it stores f32, f16$"
    with pytest.raises(KvTypeUnsupported, match=no_q8):
        model.init_cache(8, kv_type="q8_0")
    with pytest.raises(KvTypeUnsupported):
        archrun.generate(model, [1, 2, 3], kv_type="int4")
    assert len(model.init_cache(8, kv_type="f16").slots) == 2


def test_op_without_kv_types_stores_f32_only(synth_model):
    model = archrun.load(synth_model(head_dim=32), backend="reference")
    model.plan.layers[1].attention = _NoKvTypes(model.plan.layers[1].attention)
    assert model.init_cache(8).kv_type == "f32"
    with pytest.raises(KvTypeUnsupported, match="layer 1's op .*_NoKvTypes.* stores f32$"):
        model.init_cache(8, kv_type="f16")


class _NoKvTypes:
    """An attention op of a plugin that predates kv types: new_slot(capacity, max_rewind) only."""

    def __init__(self, op):
        self._op = op

    def new_slot(self, capacity, max_rewind=64):
        return self._op.new_slot(capacity, max_rewind)


def test_cli_kv_type_errors_are_one_line(synth_model, capsys):
    path = str(synth_model(head_dim=16))
    assert main(["run", path, "-p", "<t5><t6>", "-n", "1", "--backend", "reference", "--kv-type", "q8_0"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("archrun: error:") and "q8_0" in err
    with pytest.raises(SystemExit):
        main(["run", path, "-p", "<t5>", "--kv-type", "q4"])
    assert "invalid choice: 'q4'" in capsys.readouterr().err


def test_cli_run_with_q8_0_cache(synth_model, capsys):
    path = str(synth_model(head_dim=32))
    assert main(["run", path, "-p", "<t5><t6>", "-n", "3", "--temp", "0", "--backend", "reference",
                 "--kv-type", "q8_0"]) == 0
