"""What the kit cannot know about deepseek4's fixtures: which layers are which (sliding, CSA, HCA by the
file's compress_ratios; hash-routed by the presence of their tid2eid table), and that the fixtures see the
hash routing (a shifted token -> experts table, or top-k in its place, puts archrun far from HF) and the
compressed layers (HCA entries within the prompt, CSA's indexer choosing among more entries than its top-k),
each from the first position where it applies and not before."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

import archrun
from archrun.conformance.gguf_edit import rewrite_gguf
from archrun.errors import MissingTensor, UnexpectedTensor

GOLDENS = Path(__file__).parent / "goldens"
LAYERS = {"deepseek4_csa_hca8": ((0, 4, 8), 1), "deepseek4_csa_hca128": ((0, 4, 128), 2)}


def _golden(name):
    g = np.load(GOLDENS / f"{name}.npz")
    return g["ids"].astype(np.int64), g["logits"]


def _rel(got, want) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layer_kinds(name):
    ratios, n_hash = LAYERS[name]
    m = archrun.load(GOLDENS / f"{name}.gguf", backend="reference")
    params = [dict(lay.attention.params) for lay in m.descriptor.layers]
    assert [int(p["ratio"]) for p in params] == list(ratios)
    assert [bool(p["overlap"]) for p in params] == [r == 4 for r in ratios]  # CSA: overlapping windows
    assert all(p["window"] == 8 for p in params)
    assert [lp.ffn.moe.table is not None for lp in m.plan.layers] == [i < n_hash for i in range(len(ratios))]
    assert [dict(lay.ffn.params)["hash"] for lay in m.descriptor.layers] == [i < n_hash for i in range(len(ratios))]
    assert m.descriptor.stream == "mhc" and dict(m.descriptor.stream_params)["n_stream"] == 4


@pytest.mark.parametrize("count, error", [(2, MissingTensor), (0, UnexpectedTensor)])
def test_hash_layer_count_and_tables_agree(count, error, tmp_path):
    """The file's hash_layer_count says which layers route by token id: a hash layer without its table, or a
    table in a layer the count calls top-k, is refused at load (deepseek4_csa_hca8: one hash layer)."""
    path = rewrite_gguf(GOLDENS / "deepseek4_csa_hca8.gguf", tmp_path / "count.gguf",
                        add_keys={"deepseek4.hash_layer_count": count})
    with pytest.raises(error, match="ffn_gate_tid2eid"):
        archrun.load(path, backend="reference")


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_fixture_sees_the_hash_table(name, tmp_path):
    ids, want = _golden(name)
    src = GOLDENS / f"{name}.gguf"
    tables = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(str(src)).tensors if "tid2eid" in t.name}
    shifted = {k: ((v + 1) % 4).astype(np.int32) for k, v in tables.items()}  # every token, other experts
    path = rewrite_gguf(src, tmp_path / "shifted.gguf", drop_tensors=tuple(tables), add_tensors=shifted)
    assert _rel(archrun.load(path, backend="reference").logits(ids), want) > 1e-2


def _per_position(path, ids, want):
    got = archrun.load(path, backend="reference").logits(ids)
    return np.abs(got - want).max(axis=1) / np.abs(want).max()


def test_fixture_sees_the_hca_entries(tmp_path):
    """HCA ratio 8: query t sees (t + 1) // 8 entries, the first at t = 7. Another gate bias of the HCA layer's
    compressor (its ape zeroed) leaves every logit before position 7 and moves those after."""
    ids, want = _golden("deepseek4_csa_hca8")
    src = GOLDENS / "deepseek4_csa_hca8.gguf"
    ape = next(t for t in gguf.GGUFReader(str(src)).tensors if t.name == "blk.2.attn_compressor_ape.weight")
    path = rewrite_gguf(src, tmp_path / "ape.gguf", drop_tensors=(ape.name,),
                        add_tensors={ape.name: np.zeros_like(np.asarray(ape.data))})
    per_pos = _per_position(path, ids, want)
    assert per_pos[:7].max() <= 1e-5 and per_pos[7:].max() > 1e-3


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_fixture_sees_the_indexer_selection(name, tmp_path):
    """CSA ratio 4, top 4: query t sees (t + 1) // 4 entries, more than the top 4 from t = 19. Keeping every
    entry (top_k 40) leaves every logit before position 19 and moves those after."""
    ids, want = _golden(name)
    path = rewrite_gguf(GOLDENS / f"{name}.gguf", tmp_path / "all.gguf",
                        add_keys={"deepseek4.attention.indexer.top_k": 40})
    per_pos = _per_position(path, ids, want)
    assert per_pos[:19].max() <= 1e-5 and per_pos[19:].max() > 1e-3


MARGIN = 1e-4  # least gap at the indexer's k-th place, relative to the query's largest |visible score|


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_hf_indexer_selection_has_a_margin(name):
    """HF's own indexer scores (torch) keep a gap at the k-th place for every query that sees more compressed
    entries than its top-k: no tie torch.topk might break in another order than archrun or llama.cpp."""
    torch = pytest.importorskip("torch")

    from archrun.conformance.hf import build_tiny, load_module

    spec = load_module(Path(__file__).parent / "hf_arch.py")
    entry = next(f for f in spec.FIXTURES if f.name == name)
    model, config = build_tiny(spec.DEEPSEEK_V4, entry.seed, **entry.overrides)
    ids, _ = _golden(name)
    seen, original = [], torch.Tensor.topk

    def recording_topk(scores, k, *args, **kwargs):
        if scores.dim() == 3 and scores.shape[1] == len(ids):  # the indexer's [1, queries, entries]
            seen.append(scores[0].float().numpy().copy())
        return original(scores, k, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp, torch.no_grad():
        mp.setattr(torch.Tensor, "topk", recording_topk)
        model(torch.from_numpy(ids)[None])
    k, csa = config.index_topk, LAYERS[name][0].count(4)
    assert len(seen) == csa
    margins = []
    for scores in seen:
        for row in scores:
            visible = np.sort(row[np.isfinite(row)])[::-1]
            if len(visible) > k:
                margins.append((visible[k - 1] - visible[k]) / np.abs(visible).max())
    assert len(margins) == csa * (len(ids) - 19) and min(margins) > MARGIN
