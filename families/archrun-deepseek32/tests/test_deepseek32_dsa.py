"""deepseek32 beyond the standard battery: the indexer really drops keys on the fixtures and their selection
is well defined (a margin at the k-th place, here and on HF's side), prompts shorter than the top-k (every
key read), the indexer keys counted in the cache, and files without the indexer's tensors refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import archrun
from archrun.conformance.gguf_edit import rewrite_gguf
from archrun.describe.inspect import inspect_model
from archrun.errors import MissingTensor
from archrun_blocks.reference import rope_norm
from archrun_mla import dsa

GOLDENS = Path(__file__).parent / "goldens"
FIXTURES = ("deepseek32_top16", "deepseek32_top24_16heads")
TOLERANCE = 1e-4  # of the logit range, as the battery
MARGIN = 1e-4     # least gap at the k-th place, relative to the row's largest |score|


def _relative(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def _margins(scores: np.ndarray, q_pos: np.ndarray, k: int) -> list[float]:
    """Per query past the first k positions: (k-th best - (k+1)-th best) / max |visible score|."""
    out = []
    for row, p in zip(scores, q_pos, strict=True):
        ranked = np.sort(row[:p + 1])[::-1]
        out.append(float((ranked[k - 1] - ranked[k]) / np.abs(ranked).max()))
    return out


@pytest.fixture(scope="module", params=FIXTURES)
def fixture(request):
    return request.param, np.load(GOLDENS / f"{request.param}.npz")


def test_selection_is_needed_and_well_defined(fixture, monkeypatch):
    """Every layer's indexer drops keys (top-k < 40 positions) with a margin at the k-th place; reading every
    key instead is far from HF."""
    name, golden = fixture
    seen = []

    def recording(q, w, keys, q_pos):
        scores = dsa.indexer.index_scores(q, w, keys, q_pos)
        seen.append((scores.copy(), q_pos))
        return scores

    model = archrun.load(GOLDENS / f"{name}.gguf", backend="reference")
    layers = model.plan.layers
    for lp in layers:
        monkeypatch.setattr(lp.attention, "scores", recording)
    assert _relative(model.logits(golden["ids"]), golden["logits"]) <= TOLERANCE
    top_k = layers[0].attention.top_k
    assert len(seen) == len(layers) and top_k < len(golden["ids"])
    assert min(min(_margins(s, p, top_k)) for s, p in seen) > MARGIN
    for lp in layers:
        lp.attention.top_k = len(golden["ids"])
    assert _relative(model.logits(golden["ids"]), golden["logits"]) > 0.05


def test_indexer_rope_pairing_is_seen(fixture):
    """The indexer's NEOX rope (HF's rotate_half; the MLA dims rotate NORM) matters: NORM pairing there is far
    from HF."""
    name, golden = fixture
    model = archrun.load(GOLDENS / f"{name}.gguf", backend="reference")
    for lp in model.plan.layers:
        lp.attention.index_rope = rope_norm(model.descriptor.rope_tables[lp.spec.attention.rope])
    assert _relative(model.logits(golden["ids"]), golden["logits"]) > 0.05


@pytest.mark.parametrize("backend", ["reference", "fast"])
def test_prompt_shorter_than_top_k_reads_every_key(fixture, backend):
    name, golden = fixture
    model = archrun.load(GOLDENS / f"{name}.gguf", backend=backend)
    n = model.plan.layers[0].attention.top_k - 3
    assert _relative(model.logits(golden["ids"][:n]), golden["logits"][:n]) <= TOLERANCE


@pytest.mark.parametrize("backend", ["reference", "fast"])
def test_batch_of_sequences_selects_per_sequence(backend):
    """Two sequences in one batch, at different positions across the top-k boundary: each reads its own
    cache's keys (the indexer's side inputs are sliced per sequence) and matches HF."""
    golden = np.load(GOLDENS / "deepseek32_top16.npz")
    ids, want = golden["ids"], golden["logits"]
    model = archrun.load(GOLDENS / "deepseek32_top16.gguf", backend=backend)
    caches = [model.init_cache(40), model.init_cache(40)]
    model.forward_step(ids[:10], caches[0])
    model.forward_step(ids[:20], caches[1])
    got = model.forward_step_batch_spans([ids[10:22], ids[20:30]], caches, all_logits=True)
    assert _relative(got[0], want[10:22]) <= TOLERANCE and _relative(got[1], want[20:30]) <= TOLERANCE


def test_cache_counts_the_indexer_keys(fixture):
    """bytes per token per layer = (kv_lora_rank + rope dims + indexer key width) x 4, as inspect reports."""
    name, _ = fixture
    model = archrun.load(GOLDENS / f"{name}.gguf")
    meta = model.gguf.metadata
    row = (meta["deepseek32.attention.kv_lora_rank"] + meta["deepseek32.rope.dimension_count"]
           + meta["deepseek32.attention.indexer.key_length"]) * 4
    assert model.init_cache(40).nbytes == 40 * meta["deepseek32.block_count"] * row
    memory = inspect_model(GOLDENS / f"{name}.gguf")["memory"]
    assert [m["bytes_per_token"] for m in memory] == [row] * meta["deepseek32.block_count"]


def test_without_the_indexer_the_load_names_its_tensor(tmp_path):
    path = rewrite_gguf(GOLDENS / "deepseek32_top16.gguf", tmp_path / "no_indexer.gguf",
                        drop_tensors=("indexer.attn_k",))
    with pytest.raises(MissingTensor, match="indexer.attn_k"):
        archrun.load(path)


@pytest.mark.live
def test_hf_selection_has_the_margin(fixture):
    """HF's own indexer scores (torch) keep the margin at the k-th place: no tie torch.topk might break."""
    torch = pytest.importorskip("torch")
    from transformers.models.deepseek_v32 import modeling_deepseek_v32 as hf

    from archrun.conformance.hf import build_tiny, load_module

    name, golden = fixture
    spec = load_module(Path(__file__).parent / "hf_arch.py")
    entry = next(f for f in spec.FIXTURES if f.name == name)
    model, config = build_tiny(spec.DEEPSEEK_V32, entry.seed, **entry.overrides)
    seen = []
    original = torch.Tensor.topk

    def recording_topk(scores, k, *args, **kwargs):
        if scores.dim() == 3 and scores.shape[-2:] == (len(golden["ids"]),) * 2:  # [1, queries, keys]
            seen.append(scores[0].float().numpy().copy())
        return original(scores, k, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp, torch.no_grad():
        mp.setattr(hf.torch.Tensor, "topk", recording_topk)
        model(torch.from_numpy(golden["ids"].astype(np.int64))[None])
    assert len(seen) == config.num_hidden_layers
    pos = np.arange(config.index_topk, len(golden["ids"]))
    assert min(min(_margins(s[pos], pos, config.index_topk)) for s in seen) > MARGIN
