"""archrun-gemma3n's tests: archrun's conformance kit (docs/conformance.md) on the tiny HF fixtures
(hf_arch.py, goldens/). No synthetic variants: the kit's writer writes no AltUp streams, per-layer inputs
or LAuReL tensors, which every gemma3n file has."""

from archrun.conformance import Conformance

archrun_conformance = Conformance(
    "gemma3n", synthetic=(),
    op_by_op="stream=altup carries four residual streams the fused layer kernel does not; attention=gemma3n "
             "and residual=gemma3n_laurel have no kernel part")
