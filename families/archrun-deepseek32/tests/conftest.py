"""archrun-deepseek32's tests: archrun's conformance kit (docs/conformance.md) on the tiny HF fixtures
(hf_arch.py, goldens/). No synthetic variants: the kit's writer writes the standard attention
projections, and deepseek32 attends through MLA's own (archrun-mla's layout)."""

from archrun.conformance import Conformance

archrun_conformance = Conformance("deepseek32", synthetic=())
