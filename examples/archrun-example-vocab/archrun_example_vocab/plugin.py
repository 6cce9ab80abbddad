"""The plugin object of entry point `example_vocab`: one vocabulary op and one family.

    [project.entry-points.archrun]
    example_vocab = "archrun_example_vocab.plugin:plugin"

`FamilyPlugin` implements the family hooks (archrun_describe_family, archrun_families) from a
dict of FamilyHints; the subclass adds the vocabulary hook. A package that only adds math
would instead be a module with just `archrun_register_vocabulary` (see archrun-blocks).
"""

from __future__ import annotations

from archrun.contracts import OpCapabilities
from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin
from archrun.hookspecs import hookimpl
from archrun.vocab import Lazy, Op
from archrun_example_vocab import reference

ARCHITECTURE = "quickgelu-llama"  # a made-up `general.architecture`: llama with a QuickGELU FFN

# What a quickgelu-llama file does not say: llama's conventions (NORM rope pairs, sequential
# pre-norm blocks, unscaled embeddings), the FFN activation, which names this plugin's op, and for
# its mixture-of-experts layers a softmax router whose chosen weights are renormalised. Its logits
# are softcapped (30 tanh(x / 30)) unless a file states another cap.
HINTS = {
    ARCHITECTURE: FamilyHints(name=ARCHITECTURE, rope_pairing="norm", activation="gelu_quick", embed_scale=1.0,
                              gating="softmax", moe_weights_norm=True,
                              defaults={"final_logit_softcapping": 30.0}, **TRANSFORMER),
}


class ExamplePlugin(FamilyPlugin):
    """FamilyPlugin (the family hooks) plus this package's vocabulary."""

    @hookimpl
    def archrun_register_vocabulary(self, register) -> None:
        # the fast factory by name: imported (its kernels compiled) only when a model binds it
        register(Op("activation", "gelu_quick", reference.gelu_quick, Lazy("archrun_example_vocab.fast:gelu_quick"),
                    "x * sigmoid(1.702 x) (QuickGELU; gated: x * sigmoid(1.702 x) * up)",
                    capabilities=OpCapabilities(fused=True)))  # its fast op carries a kernel part


plugin = ExamplePlugin(HINTS)
