"""The plugin registers its op and its family; the fast op and its kernel part equal the reference."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from archrun.conformance import check_family_plugin, check_vocabulary_plugin
from archrun.kernels.decode.parts import compiled_for, usable
from archrun_example_vocab import fast, parts, reference
from archrun_example_vocab.plugin import ARCHITECTURE

F32 = np.float32


def test_plugin_registers_its_op_and_family():
    entries = check_vocabulary_plugin("example_vocab")
    assert [(e.op.slot, e.op.name) for e in entries] == [("activation", "gelu_quick")]
    assert entries[0].op.fast.target == "archrun_example_vocab.fast:gelu_quick"  # a Lazy factory
    assert check_family_plugin("example_vocab") == [ARCHITECTURE]


def test_fast_op_carries_a_part_the_layer_kernel_can_call():
    act = fast.gelu_quick()
    p = usable(act.fused, "activation")
    assert p is act.fused and p.fn is parts.gelu_quick and p.params.tolist() == [reference.ALPHA]
    assert compiled_for(parts.gelu_quick, "activation")


def _ref(x, up=None):
    return reference.gelu_quick()(x, up)


# fast op = reference on random, ragged, strided and extreme inputs: the conformance kit's
# test_fast_op_equals_reference (conftest.py); below, what only this op promises


def test_the_sigmoid_saturates_exactly():
    x = np.array([3e38, -3e38, np.finfo(F32).max, -np.finfo(F32).max], F32)
    got = fast.gelu_quick()(x)
    np.testing.assert_array_equal(got, _ref(x))
    assert got[-1] == 0.0 and got[-2] == np.finfo(F32).max  # exactly 0 / x, no overflow


def test_part_runs_in_place_as_the_layer_kernel_calls_it():
    x = np.linspace(-6, 6, 97, dtype=F32)
    want = _ref(x)
    p = fast.gelu_quick().fused
    p.fn(p.params, x, x)  # out may be x
    np.testing.assert_allclose(x, want, rtol=2e-6, atol=1e-30)


@pytest.mark.skipif(numba.config.DISABLE_JIT, reason="signatures exist only when numba compiles")
def test_part_is_compiled_with_the_slot_signature_only():
    assert len(parts.gelu_quick.signatures) == 1
