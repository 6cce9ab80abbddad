"""Hash routing against HF's DeepseekV4HashRouter (random table and router), and its bad tables."""

from __future__ import annotations

import numpy as np
import pytest

from archrun.descriptor import MoeSpec
from archrun.errors import ShapeMismatch
from archrun_deepseek4_ops.gating import sqrtsoftplus
from archrun_deepseek4_ops.hash_route import HashTable, route_by_token

torch = pytest.importorskip("torch")
hf = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")
DeepseekV4Config = pytest.importorskip("transformers").DeepseekV4Config

F32 = np.float32
V, D, E, K = 50, 16, 8, 3
SPEC = MoeSpec(kind="topk", activation="silu", n_expert=E, n_expert_used=K, n_ff=8, gating="sqrtsoftplus",
               weights_norm=True, weights_scale=1.5)


def test_matches_hf_hash_router():
    torch.manual_seed(2)
    cfg = DeepseekV4Config(vocab_size=V, hidden_size=D, n_routed_experts=E, num_experts_per_tok=K,
                           routed_scaling_factor=1.5, num_hidden_layers=2)
    router = hf.DeepseekV4HashRouter(cfg).float()
    with torch.no_grad():
        router.weight.normal_(0, 0.5)
        router.tid2eid.copy_(torch.stack([torch.randperm(E)[:K] for _ in range(V)]))
    rng = np.random.default_rng(0)
    x, tokens = rng.standard_normal((9, D)).astype(F32), rng.integers(0, V, 9)
    _, want_w, want_ids = router(torch.from_numpy(x), torch.from_numpy(tokens))
    probs = sqrtsoftplus()(x @ router.weight.detach().numpy().T)
    ids, w = route_by_token(probs, tokens, HashTable(router.tid2eid.numpy().astype(np.int32), E, K), SPEC)
    np.testing.assert_array_equal(ids, want_ids.numpy())
    np.testing.assert_allclose(w, want_w.detach().numpy(), rtol=1e-6)
    table = router.tid2eid.numpy()
    other = next(t for t in range(V) if set(table[t]) != set(table[0]))
    same_hidden = route_by_token(probs[:1].repeat(2, 0), np.array([0, other]), HashTable(table, E, K), SPEC)[0]
    assert set(same_hidden[0]) != set(same_hidden[1])  # the token decides, not the hidden state


@pytest.mark.parametrize("table, match", [(np.full((V, K), E), "outside"), (np.zeros((V, K + 1), int), r"\[vocab"),
                                          (np.zeros((V, K), F32), "integers")])
def test_bad_tables_are_typed_errors(table, match):
    with pytest.raises(ShapeMismatch, match=match):
        HashTable(table, E, K)
    with pytest.raises(ShapeMismatch, match="token ids"):
        HashTable(np.zeros((V, K), int), E, K).experts(np.array([V]))
