"""archrun-falcon-h1's tests: archrun's conformance kit (docs/conformance.md) on the tiny HF fixtures
(hf_arch.py, goldens/). No synthetic variants: the kit's writer writes attention layers only, and the
Mamba2 mixer beside each attention brings its own tensors (archrun-recurrent's mamba2)."""

from archrun.conformance import Conformance

archrun_conformance = Conformance("falcon-h1", synthetic=())
