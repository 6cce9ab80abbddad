"""MoE layers on the fast backend: the numba MoE op and its fused MoE decode layer (archrun_blocks.moe_kernels)
run by the core's fusion.

The oracle is the op path as it was before the kernel: Interpreter.run_block with
archrun_blocks.reference.moe_topk (a Python loop over the selected experts, each a
kernels.matmul product), itself checked against HF transformers (test_tiny_hf.py). HF is the
oracle of the fused decode of the glm4moe fixtures (sigmoid gating, selection bias, group
limit, shared experts), which load with block style host_reference by default.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T
from support.fused import _compare_blocks as compare_blocks
from support.fused import decode_paths_agree
from support.gguf_fixtures import random_quant_tensor
from support.pool_check import assert_pool_matches_one_thread
from support.tiny import GLM, TINY, fixtures, golden

import archrun
from archrun.conformance.hf import rel_err
from archrun.kernels.decode import pool
from archrun.kernels.matmul import qmatrix
from archrun.run.plan import MoeFfn
from archrun_blocks import moe_kernels as mk
from archrun_blocks import reference

D, HEADS, KV, HD, E, K, FF = 256, 4, 2, 64, 6, 2, 256  # K-quant blocks: every n_in a multiple of 256
EXPERT_TYPES = [(T.Q4_K, T.Q6_K), (T.Q8_0, T.Q8_0), (T.Q2_K, T.Q3_K), (T.Q5_K, T.Q4_0), (T.Q4_1, T.Q5_1),
                (T.BF16, T.F16)]


def _moe_model(synth_model, gate_up: int, down: int, **kw):
    """A 2-layer qwen3moe model with quantized expert stacks (gate/up in one type, down in another)."""
    rng = np.random.default_rng(int(gate_up) * 31 + int(down))
    overrides, types = {}, {}
    for layer in range(2):
        for role, t, shape in (("ffn_gate_exps", gate_up, (E, FF, D)), ("ffn_up_exps", gate_up, (E, FF, D)),
                               ("ffn_down_exps", down, (E, D, FF))):
            name = f"blk.{layer}.{role}.weight"
            if t == T.F16:
                overrides[name] = (rng.standard_normal(shape) * 0.05).astype(np.float16)
            else:
                overrides[name] = random_quant_tensor(rng, t, shape).data.reshape(*shape[:2], -1)
                types[name] = int(t)
    return archrun.load(synth_model(arch="qwen3moe", n_embd=D, n_head=HEADS, n_head_kv=KV, head_dim=HD,
                                    n_expert=E, n_expert_used=K, n_ff_exp=FF, tensor_overrides=overrides,
                                    quant_types=types, **kw))


def _reference_moe(lp):
    """lp's MoE FFN with reference.moe_topk as its op (same weights, gating and activation kinds)."""
    s = lp.spec.ffn
    op = reference.moe_topk(s, getattr(reference, f"gating_{s.gating}")(), getattr(reference, s.activation)())
    return MoeFfn(op, lp.ffn.weights)


def _op_ffn(lp):
    """The op path's FFN: reference.moe_topk for MoE layers (the oracle), the layer's own otherwise."""
    return _reference_moe(lp) if lp.spec.is_moe else lp.ffn


def _compare_blocks(m) -> float:
    """max |fused - op path with reference.moe_topk| / max |op path| over the layers."""
    return compare_blocks(m, op_ffn=_op_ffn)


@pytest.mark.parametrize("types", EXPERT_TYPES, ids=lambda ts: "-".join(T(t).name for t in ts))
def test_fused_moe_block_matches_the_op_path(synth_model, types):
    m = _moe_model(synth_model, *types)
    assert m.fused_blocks is not None
    assert all(fb._kernel is mk.decode_moe_layer for fb in m.fused_blocks)
    assert _compare_blocks(m) <= 1e-5


@pytest.mark.parametrize("n", [1, 3, 30])
def test_moe_op_matches_the_reference_mixture(synth_model, n):
    """The fast moe op on K-quant experts, any token count, against reference.moe_topk on the same weights
    (up to INT_MAX_TOKENS rows per expert both quantize activations: tight; beyond, the reference
    multiplies float32 tiles: quantization-level tolerance)."""
    m = _moe_model(synth_model, T.Q4_K, T.Q6_K)
    x = np.random.default_rng(n).standard_normal((n, D)).astype(np.float32)
    for lp in m.plan.layers:
        assert lp.ffn.moe.arrays(lp.ffn.weights) is not None  # the kernel runs, not the reference mixture
        got = lp.ffn(x)
        want = _reference_moe(lp)(x)
        assert rel_err(got, want) <= (1e-5 if n <= 3 else 2e-2)


def test_moe_fixtures_decode_one_call_per_layer():
    for name in fixtures("qwen3moe"):
        m = archrun.load(TINY[name])
        assert m.fused_blocks is not None and len(m.fused_blocks) == m.descriptor.n_layer
        assert any(fb._kernel is mk.decode_moe_layer for fb in m.fused_blocks)


@pytest.mark.parametrize("name", fixtures(*GLM))
def test_glm4moe_fused_decode_matches_hf(name):
    """Sigmoid gating, selection bias, group limit, shared experts and leading dense layers, fused."""
    ids, ref = golden(name)
    m = archrun.load(TINY[name], block_style="fused")
    assert m.fused_blocks is not None
    cache = m.init_cache(len(ids))
    steps = np.stack([m.forward_step([t], cache) for t in ids])
    assert rel_err(steps, ref) <= 1e-4
    assert _compare_blocks(m) <= 1e-5


def test_fused_and_op_path_moe_decode_agree_through_a_sequence(synth_model):
    decode_paths_agree(_moe_model(synth_model, T.Q4_K, T.Q8_0), 16)


@pytest.fixture
def two_threads():
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs two numba threads (NUMBA_NUM_THREADS=1 here)")
    before = qmatrix.current_threads()
    yield
    qmatrix.set_threads(before)


@pytest.mark.skipif(not pool.enabled(), reason="the pool needs the JIT (its atomics are intrinsics)")
def test_moe_decode_on_the_pool_equals_one_thread(synth_model, two_threads):
    """The MoE layers' products (router, experts: 72 KB gate/up and 54 KB down groups, above the pool's
    minimum) go to the decode pool on two threads; every row is still computed whole by one thread with
    the same kernels, so the logits are the same bits as on one thread."""
    m = _moe_model(synth_model, T.Q4_K, T.Q6_K)
    assert all(fb.pooled for fb in m.fused_blocks)
    ids = [3, 1, 4, 1, 5, 9, 2, 6]

    def decode(threads):
        qmatrix.set_threads(threads)
        cache = m.init_cache(16)
        return [m.forward_step([t], cache) for t in ids]

    assert_pool_matches_one_thread(decode, lambda: m._decode._pool.worker_chunks)
    n_groups = len(m._decode._groups)
    per_layer = 2 + 1 + 2 * E  # qkv, o, router, each expert's gate/up and down
    assert n_groups == 2 * per_layer + 1  # and the output head
