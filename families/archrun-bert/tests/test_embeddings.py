"""The tiny BERT and nomic-bert encoders (goldens/record.py) against HF transformers, on both backends:
hidden states, mean pooling (sentence-transformers' masked mean, by hand), cls pooling, normalisation;
and what an encoder refuses."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import archrun
from archrun.errors import ContextOverflow, InvalidRequest, MetadataError, NotGenerative
from archrun.generation.embedding import embed_ids

GOLDENS = Path(__file__).parent / "goldens"
FIXTURES = ("bert_tiny", "nomic_bert_tiny")
TOLERANCE = 1e-4  # max |archrun - HF| / max |HF|


@pytest.fixture(scope="module", params=[(f, b) for f in FIXTURES for b in ("reference", "fast")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def case(request):
    name, backend = request.param
    return archrun.load(GOLDENS / f"{name}.gguf", backend=backend), dict(np.load(GOLDENS / f"{name}.npz"))


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def test_hidden_states_match_hf(case):
    model, g = case
    for i in range(2):
        assert _rel(model.hidden_states(g[f"ids_{i}"]), g[f"hidden_{i}"]) <= TOLERANCE


def test_pooling_matches_hf(case):
    model, g = case
    seqs = [g["ids_0"], g["ids_1"]]
    mean = embed_ids(model, seqs, pooling="mean", normalize=False)
    cls = embed_ids(model, seqs, pooling="cls", normalize=False)
    last = embed_ids(model, seqs, pooling="last", normalize=False)
    unit = embed_ids(model, seqs, pooling="mean")
    assert mean.dtype == np.float32 and mean.shape == (2, 64)
    for i in range(2):
        assert _rel(mean[i], g[f"mean_{i}"]) <= TOLERANCE
        assert _rel(cls[i], g[f"hidden_{i}"][0]) <= TOLERANCE
        assert _rel(last[i], g[f"hidden_{i}"][-1]) <= TOLERANCE
        want = g[f"mean_{i}"] / np.linalg.norm(g[f"mean_{i}"])
        assert _rel(unit[i], want) <= TOLERANCE


def test_the_file_states_the_pooling(case):
    model, g = case
    if model.descriptor.architecture == "nomic-bert":  # the fixture states pooling_type 1 (mean)
        assert model.descriptor.pooling == "mean"
        got = archrun.embed(model, [g["ids_0"].tolist()], normalize=False)
        assert _rel(got[0], g["mean_0"]) <= TOLERANCE
    else:  # llama.cpp's converter wrote no pooling_type: the caller must name one
        assert model.descriptor.pooling == "none"
        with pytest.raises(InvalidRequest, match="states no pooling"):
            archrun.embed(model, [g["ids_0"].tolist()])


def test_texts_are_tokenized(case):
    model, _ = case
    got = archrun.embed(model, ["hello there", "hello"], pooling="mean")
    assert got.shape == (2, 64) and np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    one = archrun.embed(model, "hello", pooling="mean")
    np.testing.assert_array_equal(one[0], got[1])


def test_an_encoder_refuses_to_generate(case):
    model, g = case
    assert not model.causal
    with pytest.raises(NotGenerative):
        model.init_cache(8)
    with pytest.raises(NotGenerative):
        model.logits(g["ids_0"])
    with pytest.raises(NotGenerative):
        archrun.generate(model, [1, 2, 3], max_tokens=2)


@pytest.mark.parametrize("texts, error", [
    ([], InvalidRequest), ([[]], InvalidRequest), ([[1, 2], "x", 3.5], InvalidRequest), (b"abc", InvalidRequest),
    ([[0, 10**6]], InvalidRequest), ([[-1]], InvalidRequest), ([[1] * 200], ContextOverflow), (None, InvalidRequest),
])
def test_bad_inputs_are_refused(case, texts, error):
    model, _ = case
    with pytest.raises(error):
        archrun.embed(model, texts, pooling="mean")


@pytest.mark.parametrize("pooling", ["none", "rank", "max", 3])
def test_bad_poolings_are_refused(case, pooling):
    model, g = case
    with pytest.raises(InvalidRequest):
        archrun.embed(model, [g["ids_0"].tolist()], pooling=pooling)


def test_a_causal_op_on_an_encoder_file_is_refused():
    with pytest.raises(MetadataError, match="attention.causal"):
        archrun.load(GOLDENS / "bert_tiny.gguf", backend="reference", hints={"attention": "causal"})
