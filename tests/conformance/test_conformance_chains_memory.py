"""The conformance kit's greedy chains (archrun.conformance.chains) and memory battery
(archrun.conformance.memory): what they accept, what they refuse, and that every family carries its chains."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import archrun
from archrun.conformance import chains, hf, memory

ROOT = Path(__file__).resolve().parents[2]
LFM2 = ROOT / "families" / "archrun-lfm2" / "tests" / "goldens" / "lfm2_ccac.gguf"


def _chain(tokens, gaps, peak=10.0, prompt=(1, 2, 3)):
    return {"prompt": list(prompt), "tokens": list(tokens), "top2_gaps": list(gaps), "max_abs_logit": peak,
            "reference": "test", "input_sha256": hf._sha256(LFM2)}


def test_a_near_tie_ends_the_compared_chain():
    n, why = chains.compared_length(_chain([5, 6, 7, 8], [1.0, 0.5, 1e-4, 2.0]))
    assert n == 2 and "step 2" in why and "near tie" in why
    assert chains.compared_length(_chain([5, 6], [1.0, 0.5])) == (2, "")


def test_a_chain_that_differs_before_a_near_tie_fails_naming_the_step():
    model = archrun.load(LFM2, backend="reference")
    prompt = [int(t) for t in hf.load_golden(LFM2.with_suffix(".npz"))["ids"][:12]]
    real = chains.archrun_chain(model, prompt, 6)
    wrong = real[:3] + [(real[3] + 1) % 288] + real[4:]
    with pytest.raises(AssertionError, match=r"at step 3 \(position 15\).*compared 5 of 6 tokens"):
        chains.check_chain(model, _chain(wrong, [1.0] * 5 + [1e-5], prompt=prompt), LFM2, "lfm2_ccac")
    # the same difference after a near tie: the compared chain ends before it
    chains.check_chain(model, _chain(wrong, [1.0] * 3 + [1e-5] * 3, prompt=prompt), LFM2, "lfm2_ccac")


def test_a_chain_recorded_on_another_file_is_named_as_such():
    model = archrun.load(LFM2, backend="reference")
    entry = {**_chain([1], [1.0]), "input_sha256": "0" * 64}
    with pytest.raises(AssertionError, match="recorded on another file"):
        chains.check_chain(model, entry, LFM2, "lfm2_ccac")


@pytest.mark.parametrize("spec", sorted(ROOT.glob("families/*/tests/**/hf_arch.py")),
                         ids=lambda p: p.parent.parent.name)
def test_every_fixture_of_the_repository_has_a_recorded_chain(spec):
    goldens = spec.parent / "goldens"
    recorded = chains.read(goldens).get("chains", {})
    names = [f.name for f in hf.load_module(spec).FIXTURES]
    missing = [n for n in names if chains.key("hf", n) not in recorded]
    assert not missing, f"{goldens}: no greedy chain for {missing} (archrun conformance record PACKAGE --chains)"
    for n in names:
        entry = recorded[chains.key("hf", n)]
        assert entry["reference"] == "HF" and {"torch", "transformers"} <= set(entry["versions"])
        assert len(entry["tokens"]) == chains.N_CHAIN == len(entry["top2_gaps"])


class _ForgetfulRewind:
    """The model, but its stateful slots restore the state one token later than asked on a rewind
    (a broken mixer slot: it then continues from the wrong state)."""

    def __init__(self, model, keep_checkpoints: bool = True):
        self._model, self._keep = model, keep_checkpoints

    def __getattr__(self, name):
        return getattr(self._model, name)

    def init_cache(self, *args, **kw):
        cache = self._model.init_cache(*args, **kw)
        for slot in cache.slots:
            if callable(getattr(slot, "can_restore", None)):
                slot.rewind_to = self._late(slot, slot.rewind_to)
                if not self._keep:
                    slot.checkpoint = lambda length: None
        return cache

    @staticmethod
    def _late(slot, rewind_to):
        def late(length: int) -> None:
            rewind_to(length + 1 if slot.can_restore(length + 1) else length)
            slot.n = length

        return late


def test_the_memory_battery_sees_a_slot_that_does_not_restore():
    model = archrun.load(LFM2, backend="reference")
    ids, ref = memory.golden(LFM2)
    assert memory.is_stateful(LFM2)
    memory.check_decode_rewind(model, ids, ref, "lfm2_ccac", 4)  # as it is: passes
    with pytest.raises(AssertionError, match=r"rewind 3, decode 6 vs HF: first diverging position 21"):
        memory.check_decode_rewind(_ForgetfulRewind(model), ids, ref, "lfm2_ccac", 4)
    memory.check_checkpoint(model, ids, ref, "lfm2_ccac")
    with pytest.raises(AssertionError, match="restore point of 20 is 0, not the checkpoint at 12"):
        memory.check_checkpoint(_ForgetfulRewind(model, keep_checkpoints=False), ids, ref, "lfm2_ccac")
    with pytest.raises(AssertionError, match="turn 2 recomputes 40 tokens"):
        memory.check_chat_reuse(_ForgetfulRewind(model, keep_checkpoints=False), ids, ref, "lfm2_ccac")


def test_a_model_without_state_is_not_given_the_memory_battery():
    llama = ROOT / "families" / "archrun-llama" / "tests" / "goldens" / "llama_gqa.gguf"
    assert not memory.is_stateful(llama)
    assert np.all(memory.golden(llama)[0] >= 0)
