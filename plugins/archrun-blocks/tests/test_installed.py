from archrun.conformance import check_vocabulary_plugin


def test_plugin_is_installed_and_registers_its_vocabulary():
    names = {(e.op.slot, e.op.name) for e in check_vocabulary_plugin("blocks")}
    assert {("norm", "rms"), ("norm", "layer"), ("rope", "neox"), ("rope", "norm"), ("attention", "causal"),
            ("activation", "silu"), ("activation", "gelu_tanh"), ("activation", "gelu"), ("activation", "relu2"),
            ("residual", "sequential"), ("residual", "parallel"), ("gating", "softmax"), ("gating", "sigmoid"),
            ("moe", "topk"), ("softcap", "tanh")} <= names
