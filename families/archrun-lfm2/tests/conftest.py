"""archrun-lfm2's tests: archrun's conformance kit (docs/conformance.md) on the tiny HF fixtures
(hf_arch.py, goldens/). No synthetic variants: the kit's writer writes attention layers only, and
lfm2's short-convolution layers bring their own tensors (archrun-recurrent's `shortconv`)."""

from archrun.conformance import Conformance

archrun_conformance = Conformance("lfm2", synthetic=())
