from archrun.conformance import check_vocabulary_plugin


def test_plugin_is_installed_and_registers_its_vocabulary():
    names = {(e.op.slot, e.op.name) for e in check_vocabulary_plugin("blocks")}
    assert {("norm", "rms"), ("rope", "neox"), ("rope", "norm"), ("attention", "causal"), ("ffn", "swiglu"),
            ("ffn", "geglu_tanh"), ("gating", "softmax"), ("gating", "sigmoid"), ("moe", "topk")} <= names
