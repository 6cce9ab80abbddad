"""`hash_topk` against HF's DeepseekV4SparseMoeBlock: a hash layer (experts by tid2eid[token
id], weighted by the sqrt-softplus scores) and a top-k layer (a selection bias), both backends; bad token ids
and tables are refused with a typed error."""

from __future__ import annotations

import numpy as np
import pytest
from hash_moe_case import D, E, K, V, binder, hf_block, op, weights

from archrun.errors import ShapeMismatch
from archrun_deepseek4_ops.hash_moe import hash_topk, hash_topk_fast

torch = pytest.importorskip("torch")

FACTORIES = {"reference": hash_topk, "fast": hash_topk_fast}


@pytest.mark.parametrize("backend", ["reference", "fast"])
@pytest.mark.parametrize("hash_layer", [True, False], ids=["hash", "topk"])
def test_matches_hf_block(hash_layer, backend):
    b = hf_block(hash_layer)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((11, D)).astype(np.float32)
    ids = rng.integers(0, V, 11)
    want = b(torch.from_numpy(x)[None], input_ids=torch.from_numpy(ids)[None])[0].detach().numpy()
    got = op(FACTORIES[backend], b, backend)(x, weights(b, backend), ids)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    if hash_layer:  # the routing is the table's: other ids, other experts
        other = b(torch.from_numpy(x)[None], input_ids=torch.from_numpy((ids + 1) % V)[None])[0].detach().numpy()
        assert np.abs(other - want).max() > 1e-2 * np.abs(want).max()


def test_hash_rows_are_independent():
    b = hf_block(True)
    m, w = op(hash_topk, b, "reference"), weights(b, "reference")
    x = np.random.default_rng(4).standard_normal((6, D)).astype(np.float32)
    ids = np.array([3, 9, 3, 60, 0, 17])
    whole = m(x, w, ids)
    for r in range(6):
        np.testing.assert_allclose(m(x[r:r + 1], w, ids[r:r + 1])[0], whole[r], rtol=0, atol=1e-6)


def test_bad_ids_and_tables_are_refused():
    b = hf_block(True)
    m, w = op(hash_topk, b, "reference"), weights(b, "reference")
    with pytest.raises(ShapeMismatch, match="token ids outside"):
        m(np.zeros((1, D), np.float32), w, np.array([V]))
    bad = binder(b)
    bad.integers = lambda role, layer: np.full((V, K), E, np.int64)
    with pytest.raises(ShapeMismatch, match="outside"):
        hash_topk(*(op(hash_topk, b, "reference").spec, None, None)).bind(bad, 0)
