"""A family's declared contract for what the installed gguf-py does not name (FamilyHints.metadata_keys and
tensor_roles): the compiler and op layouts read declared keys and roles as gguf-py's own, refuse any other
name, and still only warn about keys nobody reads."""

import warnings

import numpy as np
import pytest

from archrun.describe.compile import compile_gguf
from archrun.errors import ArchrunWarning, MissingTensor, ShapeMismatch
from archrun.family import TRANSFORMER, FamilyHints
from archrun.hookspecs import hookimpl
from archrun.plugins import make_plugin_manager
from archrun.vocab import Op

KEY = "{arch}.hyper_connection.count"  # llama.cpp's DeepSeek-V4 key, which gguf-py 0.19 does not spell
ROLE_TEMPLATE = "blk.{i}.hc_attn_fn.weight"


def _act(**params):
    def act(x, up=None):
        return x if up is None else x * up
    return act


class _ReadsDeclared:
    """An activation layout reading one declared key and, when `role`, checking one declared tensor."""

    def __init__(self, role: bool = False):
        self.role = role

    def describe(self, ctx):
        n = ctx.meta.get("hyper_connection.count", int)
        if self.role:
            ctx.tensors.expect("hc_attn_fn", ctx.layer, (ctx.n_embd * n, 3))
        return {"params": {"streams": n, "width": ctx.meta.per_layer_floats(KEY, 2)[ctx.layer]}}


def _plugins(declare_keys=(KEY,), roles=None, role_check=False):
    class Family:
        @hookimpl
        def archrun_describe_family(self, architecture):
            if architecture != "qwen3":
                return None
            return FamilyHints(name="declared", rope_pairing="neox", activation="declared_act", embed_scale=1.0,
                               metadata_keys=declare_keys, tensor_roles=roles or {}, **TRANSFORMER)

        @hookimpl
        def archrun_register_vocabulary(self, register):
            register(Op("activation", "declared_act", _act, doc="test", layout=_ReadsDeclared(role_check)))

    return make_plugin_manager(extra=[Family()])


def test_a_declared_key_reaches_the_op_layout(synth_model):
    path = synth_model(key_overrides={"hyper_connection.count": 4})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # read, so not reported unused
        d = compile_gguf(path, plugins=_plugins()).descriptor
    assert d.layers[0].ffn.activation_params == (("streams", 4.0), ("width", 4.0))
    assert d.layers[1].ffn.activation_params == (("streams", 4.0), ("width", 4.0))


def test_an_undeclared_key_is_refused_by_name(synth_model):
    path = synth_model(key_overrides={"hyper_connection.count": 4})
    with pytest.raises(KeyError, match="hyper_connection.count.*FamilyHints.metadata_keys"):
        compile_gguf(path, plugins=_plugins(declare_keys=()))


def test_declared_keys_nobody_reads_and_unknown_keys_still_warn(synth_model):
    path = synth_model(key_overrides={"hyper_connection.count": 4, "hyper_connection.epsilon": 1e-6,
                                      "mystery_key": 3})
    pm = _plugins(declare_keys=(KEY, "{arch}.hyper_connection.epsilon"))
    with pytest.warns(ArchrunWarning, match="metadata keys not used"):
        result = compile_gguf(path, plugins=pm)
    assert set(result.unused_keys) == {"qwen3.hyper_connection.epsilon", "qwen3.mystery_key"}


def test_a_declared_tensor_role_is_checked_and_kept_in_the_descriptor(synth_model):
    roles = {"hc_attn_fn": ROLE_TEMPLATE}
    fn = {f"blk.{i}.hc_attn_fn.weight": np.zeros((3, 32 * 4), np.float32) for i in range(2)}
    path = synth_model(key_overrides={"hyper_connection.count": 4}, tensor_overrides=fn)
    d = compile_gguf(path, plugins=_plugins(roles=roles, role_check=True)).descriptor
    assert d.tensor_names["hc_attn_fn"] == ROLE_TEMPLATE
    assert d.tensor_name("hc_attn_fn", 1) == "blk.1.hc_attn_fn.weight"
    wrong = {k: np.zeros((3, 32 * 2), np.float32) for k in fn}
    with pytest.raises(ShapeMismatch, match="blk.0.hc_attn_fn.weight"):
        compile_gguf(synth_model(key_overrides={"hyper_connection.count": 4}, tensor_overrides=wrong),
                     plugins=_plugins(roles=roles, role_check=True))
    with pytest.raises(MissingTensor, match="blk.0.hc_attn_fn.weight"):
        compile_gguf(synth_model(key_overrides={"hyper_connection.count": 4}),
                     plugins=_plugins(roles=roles, role_check=True))


def test_an_undeclared_role_is_not_a_tensor_name(synth_model):
    path = synth_model(key_overrides={"hyper_connection.count": 4})
    with pytest.raises(KeyError, match="hc_attn_fn"):
        compile_gguf(path, plugins=_plugins(role_check=True))


@pytest.mark.parametrize("bad", [("",), ("{arch}.{x}.count",), (3,)])
def test_bad_key_declarations_are_refused(bad):
    with pytest.raises((ValueError, TypeError)):
        FamilyHints(name="x", metadata_keys=bad)


@pytest.mark.parametrize("bad", [{"r": ""}, {"r": "blk.{bid}.x.weight"}, {"": "x.weight"}, {"r": 3}])
def test_bad_role_declarations_are_refused(bad):
    with pytest.raises((ValueError, TypeError)):
        FamilyHints(name="x", tensor_roles=bad)
