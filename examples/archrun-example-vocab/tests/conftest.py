"""archrun's conformance kit (docs/conformance.md) on this package: its op and its family, on the synthetic
quickgelu-llama variants, checked against the independent float64 forward pass of quickgelu_model.py."""

from quickgelu_model import VARIANTS, forward

from archrun.conformance import Conformance

archrun_conformance = Conformance("example_vocab", synthetic=VARIANTS, reference=forward)
