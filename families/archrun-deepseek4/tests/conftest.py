"""archrun-deepseek4's tests: archrun's conformance kit (docs/conformance.md) on the tiny HF fixtures
(hf_arch.py, goldens/). No synthetic variants: the kit's writer writes the standard attention
projections and one residual stream; deepseek4 attends through its own layout and carries four."""

from archrun.conformance import Conformance

archrun_conformance = Conformance("deepseek4", synthetic=())
