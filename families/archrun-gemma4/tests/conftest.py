"""archrun-gemma4's tests: archrun's conformance kit (docs/conformance.md) on the tiny HF fixtures
(hf_arch.py, goldens/). No synthetic variants: the kit's writer writes one head width and no layer
kinds, and gemma4 attends through archrun-gemma4-ops' layout, which reads both."""

from archrun.conformance import Conformance

archrun_conformance = Conformance(
    "gemma4", synthetic=(),
    op_by_op="attention=gemma4 (its own projection layout) and residual=gemma4_scaled have no kernel part")
