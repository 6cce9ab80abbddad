"""The `gemma4-assistant` drafter against HF's Gemma 4 assistant (tests/assistant: the tiny assistant paired
with three target fixtures and HF's drafts on each), speculative decoding with it, and its refusals."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest

import archrun
from archrun.conformance import hf
from archrun.conformance.gguf_edit import rewrite_gguf
from archrun.errors import (
    ArchrunError,
    InvalidRequest,
    ModelLoadError,
    ModelMismatch,
    UnsupportedArchitecture,
    VocabularyMismatch,
)
from archrun.generation import speculative
from archrun_gemma4 import assistant as family
from archrun_gemma4_ops import assistant as ops

HERE = Path(__file__).resolve().parent
FIXTURE = hf.load_module(HERE / "assistant" / "assistant_fixture.py")
ASSISTANT = FIXTURE.GOLDENS / f"{FIXTURE.NAME}.gguf"
GOLDENS = {name: hf.load_golden(FIXTURE.golden_path(name)) for name in FIXTURE.TARGETS}
DENSE = "gemma4_dense"
TARGET = HERE / "goldens" / f"{DENSE}.gguf"
GOLDEN = GOLDENS[DENSE]
BACKENDS = ("reference", "fast")


@functools.cache
def _load(name: str, backend: str):
    return archrun.load(HERE / "goldens" / f"{name}.gguf", backend=backend)


@pytest.fixture(scope="module", params=BACKENDS)
def target(request):
    return _load(DENSE, request.param)


def _drafts_after_prefill(model, drafter, n_prefix: int, cache=None, golden=GOLDEN):
    """The drafter's round right after the target's prefill of the golden ids' first n_prefix tokens:
    (the target's greedy token, its hidden state, draft logits [k, vocab], draft tokens [k])."""
    cache = model.init_cache(48) if cache is None else cache
    drafter.start(model, cache.capacity)
    logits = drafter.step(model, cache, golden["ids"][:n_prefix].astype(np.int64), all_logits=False)
    token = int(np.argmax(logits[-1]))
    hidden = drafter._hist[(drafter._n - 1) % len(drafter._hist)].copy()
    draft_logits, tokens = drafter.draft(token, FIXTURE.N_DRAFT)
    return token, hidden, draft_logits, tokens


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def test_golden_files_are_the_recorded_ones():
    assert sorted(p.name for p in FIXTURE.GOLDENS.iterdir()) == sorted(
        [ASSISTANT.name, *(FIXTURE.golden_path(t).name for t in FIXTURE.TARGETS)])
    assert ASSISTANT.stat().st_size < hf.MAX_GGUF_BYTES
    n, k, vocab = len(FIXTURE.PREFIXES), FIXTURE.N_DRAFT, hf.N_VOCAB
    for name, golden in GOLDENS.items():
        meta, target = golden["fixture"], HERE / "goldens" / f"{name}.gguf"
        assert meta["target"] == name and hf._sha256(ASSISTANT) == meta["gguf_sha256"]
        assert hf._sha256(target) == meta["target_gguf_sha256"]  # the drafts were made on this target file
        assert golden["prefixes"].tolist() == list(FIXTURE.PREFIXES) == meta["prefixes"]
        assert golden["draft_logits"].shape == (n, k, vocab) and golden["draft_logits"].dtype == np.float32
        assert golden["draft_tokens"].shape == (n, k)
        assert (golden["draft_tokens"] == golden["draft_logits"].argmax(-1)).all()  # HF's argmax chain
        assert golden["draft_logits"].std() > 0.5
        assert (golden["ids"] == hf.load_golden(target.with_suffix(".npz"))["ids"]).all()
        assert {"torch", "transformers", "gguf"} <= set(golden["versions"])


def test_the_assistant_reads_each_targets_last_layers_computing_keys():
    """HF's "store" layers: the last sliding and last full layer computing their own keys and values."""
    want = {"gemma4_dense": {True: 4, False: 5}, "gemma4_kv_shared": {True: 3, False: 4},
            "gemma4_ple": {True: 2, False: 3}}
    for name in FIXTURE.TARGETS:
        assert family.AssistantDrafter(_load(name, "reference"), ASSISTANT).sources == want[name], name


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", FIXTURE.TARGETS)
@pytest.mark.parametrize("row", range(len(FIXTURE.PREFIXES)))
def test_draft_logits_match_hf(name, backend, row):
    """Every draft step's logits within 1e-4 of max |logit| of HF's, the chains equal, at prefixes on both
    sides of the sliding windows; the hidden state the first step reads is HF's hidden_states[-1]."""
    model, golden = _load(name, backend), GOLDENS[name]
    drafter = family.AssistantDrafter(model, ASSISTANT)
    token, hidden, logits, tokens = _drafts_after_prefill(model, drafter, FIXTURE.PREFIXES[row], golden=golden)
    assert token == golden["first_tokens"][row]
    assert _rel(hidden, golden["hidden"][row]) < hf.TOLERANCE
    assert _rel(logits, golden["draft_logits"][row]) < hf.TOLERANCE
    assert tokens == golden["draft_tokens"][row].tolist()


def test_draft_reads_a_sliding_ring(target):
    """A cache whose sliding layers keep a ring of window + 2 rows (the positions wrap) drafts HF's logits."""
    cache = target.init_cache(48, max_rewind=2)
    row = FIXTURE.PREFIXES.index(24)
    drafter = family.AssistantDrafter(target, ASSISTANT)
    assert hasattr(cache.slots[drafter.sources[True]], "gather")  # a ring indeed
    _, _, logits, _ = _drafts_after_prefill(target, drafter, 24, cache)
    assert _rel(logits, GOLDEN["draft_logits"][row]) < hf.TOLERANCE


def test_refuses_a_ring_that_lost_the_rows():
    """gemma4_kv_shared's window is 4: a ring of 4 + 2 rows cannot hold the 7 rows the assistant's window (6)
    reads, which is said (InvalidRequest) rather than drafted from fewer rows."""
    model = _load("gemma4_kv_shared", "reference")
    with pytest.raises(InvalidRequest, match="no longer holds"):
        _drafts_after_prefill(model, family.AssistantDrafter(model, ASSISTANT), 24, model.init_cache(48, max_rewind=2),
                              golden=GOLDENS["gemma4_kv_shared"])


def test_sliding_layers_attend_window_plus_one_rows(monkeypatch):
    """HF's assistant reads window + 1 of the target's sliding rows: with the target's own window (one row
    fewer) the logits leave the tolerance where the prefix is longer than the window."""
    model = archrun.load(TARGET, backend="reference")
    row = FIXTURE.PREFIXES.index(13)
    monkeypatch.setattr(ops, "sliding_rows", lambda n, window: max(0, n - window))
    _, _, logits, _ = _drafts_after_prefill(model, family.AssistantDrafter(model, ASSISTANT), 13)
    assert _rel(logits, GOLDEN["draft_logits"][row]) > 10 * hf.TOLERANCE


@pytest.mark.parametrize(("draft_max", "kv_type"), [(2, "f32"), (5, "f32"), (3, "f16")])
def test_speculative_greedy_is_plain_greedy(target, draft_max, kv_type):
    """Greedy speculative decoding with the assistant gives plain greedy decoding's tokens; the generation
    crosses the sliding rings' reach (capacity > window + max_rewind), so rings are read and rewound; an f16
    cache hands the drafter its decoded rows."""
    prompt = GOLDEN["ids"][:30].tolist()
    plain = archrun.generate(target, prompt, max_tokens=60, temperature=0, kv_type=kv_type).complete()
    spec = speculative.generate(target, prompt, f"gemma4-assistant:{ASSISTANT}", draft_max=draft_max,
                                max_tokens=60, temperature=0, kv_type=kv_type).complete()
    assert spec.token_ids == plain.token_ids
    assert spec.timings["spec_drafted"] > 0


def test_seeded_sampling_is_plain_seeded_sampling():
    """Argmax chains are deterministic drafts: a seeded sampled run decides plain seeded sampling's tokens."""
    model, prompt = _load(DENSE, "reference"), GOLDEN["ids"][:16].tolist()
    options = {"max_tokens": 40, "temperature": 0.9, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 7}
    plain = archrun.generate(model, prompt, **options).complete()
    spec = speculative.generate(model, prompt, f"gemma4-assistant:{ASSISTANT}", draft_max=3, **options).complete()
    assert spec.token_ids == plain.token_ids
    assert spec.timings["spec_drafted"] > 0


def test_drafts_follow_the_target_through_rewinds():
    """Each round's drafts equal those of a fresh drafter after a prefill of the same history: the drafter's
    hidden states and the cache rows it reads follow the target's verify steps and rewinds."""
    model = archrun.load(TARGET, backend="reference")
    seen = []

    class Recording(family.AssistantDrafter):
        def propose(self, history, k, sampler):
            draft = super().propose(history, k, sampler)
            if draft.tokens:
                seen.append((list(history), list(draft.tokens)))
            return draft

    drafter = Recording(model, ASSISTANT)
    speculative.generate(model, GOLDEN["ids"][:12].tolist(), drafter, max_tokens=24, temperature=0).complete()
    assert len(seen) >= 3
    for history, tokens in seen:
        fresh = family.AssistantDrafter(model, ASSISTANT)
        cache = model.init_cache(64)
        fresh.start(model, 64)
        fresh.step(model, cache, np.asarray(history[:-1], np.int64), all_logits=False)
        assert fresh.draft(history[-1], len(tokens))[1] == tokens


def test_drafter_is_registered():
    assert "gemma4-assistant" in speculative.drafters()


# -- refusals: typed errors at construction ------------------------------------------------------


def test_refuses_a_target_that_is_not_gemma4():
    other = next((HERE.parent.parent / "archrun-gemma3" / "tests" / "goldens").glob("*.gguf"))
    with pytest.raises(ModelMismatch, match="gemma4"):
        family.AssistantDrafter(archrun.load(other), ASSISTANT)


def test_refuses_a_target_of_another_width(tmp_path):
    """An assistant made for a 48-wide target (consistent projections) on the 64-wide gemma4_dense."""
    rng = np.random.default_rng(0)
    path = rewrite_gguf(ASSISTANT, tmp_path / "wide.gguf", drop_tensors=["nextn."],
                        add_keys={"gemma4-assistant.embedding_length_out": 48},
                        add_tensors={"nextn.pre_projection.weight": rng.standard_normal((32, 96), np.float32),
                                     "nextn.post_projection.weight": rng.standard_normal((48, 32), np.float32)})
    with pytest.raises(ModelMismatch, match="width 48"):
        family.AssistantDrafter(archrun.load(TARGET), path)


def test_refuses_another_vocabulary(tmp_path):
    embd = family.GGUFFile(ASSISTANT).dequantize("token_embd.weight")
    path = rewrite_gguf(ASSISTANT, tmp_path / "vocab.gguf", drop_tensors=["token_embd"],
                        add_tensors={"token_embd.weight": np.ascontiguousarray(embd[:-1])})
    with pytest.raises(VocabularyMismatch, match="287"):
        family.AssistantDrafter(archrun.load(TARGET), path)


def test_refuses_a_file_that_is_not_an_assistant():
    with pytest.raises(UnsupportedArchitecture):
        family.AssistantDrafter(archrun.load(TARGET), TARGET)


def test_refuses_an_incomplete_assistant(tmp_path):
    path = rewrite_gguf(ASSISTANT, tmp_path / "cut.gguf", drop_tensors=["blk.1.attn_q_norm"])
    with pytest.raises(ModelLoadError, match="attn_q_norm"):
        family.AssistantDrafter(archrun.load(TARGET), path)


@pytest.mark.parametrize("spec", ["gemma4-assistant", "gemma4-assistant:/no/such/file.gguf"])
def test_refuses_a_missing_file(spec):
    with pytest.raises((InvalidRequest, ModelLoadError)):
        speculative.generate(archrun.load(TARGET), [1, 2, 3], spec, max_tokens=4, temperature=0).complete()


def test_refuses_bad_tokens():
    model = archrun.load(TARGET)
    drafter = family.AssistantDrafter(model, ASSISTANT)
    with pytest.raises(InvalidRequest):
        drafter.draft(1, 2)  # before any target step
    drafter.start(model, 16)
    drafter.step(model, model.init_cache(16), np.array([1, 2, 3]), all_logits=False)
    for bad in (-1, hf.N_VOCAB, True, 1.5):
        with pytest.raises(ArchrunError):
            drafter.draft(bad, 2)


@pytest.mark.live
def test_live_rerecord(tmp_path):
    """Rebuilding the HF assistant and target (torch) reproduces the GGUF byte for byte and HF's drafts."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    FIXTURE.record(tmp_path)
    assert hf._sha256(tmp_path / ASSISTANT.name) == GOLDEN["fixture"]["gguf_sha256"]
    for name, golden in GOLDENS.items():
        again = hf.load_golden(FIXTURE.golden_path(name, tmp_path))
        assert (again["draft_tokens"] == golden["draft_tokens"]).all()
        assert _rel(again["draft_logits"], golden["draft_logits"]) < 1e-6


def test_no_kernel_prepares_before_the_target_is_checked():
    """The fast backend's matrices are prepared on their first product, after the refusals had their say."""
    w = family.AssistantDrafter(_load(DENSE, "fast"), ASSISTANT).weights
    matrices = [w.pre, w.post, w.head, *(m for layer in w.layers for m in (layer.q, layer.o, layer.gate, layer.up,
                                                                             layer.down))]
    assert all(m.prepared is None for m in matrices)
