"""archrun-kimi-linear's tests: archrun's conformance kit (docs/conformance.md) on the tiny HF fixtures
(hf_arch.py, goldens/). No synthetic variants: the kit's writer writes attention layers only, and the KDA
layers bring their own tensors (archrun-recurrent's kda)."""

from archrun.conformance import Conformance

archrun_conformance = Conformance("kimi-linear", synthetic=())
