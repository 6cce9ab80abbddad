from archrun.plugins import installed_plugins, make_plugin_manager
from archrun.vocab import build_vocabulary


def test_plugin_is_installed_and_registers_its_vocabulary():
    assert installed_plugins()["blocks"] == "archrun_blocks.plugin"
    vocab = build_vocabulary(make_plugin_manager(names=["blocks"]))
    names = {(e.op.slot, e.op.name) for e in vocab if e.plugin == "blocks"}
    assert {("norm", "rms"), ("rope", "neox"), ("rope", "norm"), ("attention", "causal"), ("ffn", "swiglu"),
            ("ffn", "geglu_tanh"), ("gating", "softmax"), ("gating", "sigmoid"), ("moe", "topk")} <= names
