"""archrun-afmoe's tests: archrun's conformance kit (docs/conformance.md) on the tiny HF fixtures
(hf_arch.py, goldens/). No synthetic variants: the kit's writer writes no attention gate projection."""

from archrun.conformance import Conformance

archrun_conformance = Conformance("afmoe", synthetic=())
