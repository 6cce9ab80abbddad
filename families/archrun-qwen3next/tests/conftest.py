"""archrun-qwen3next's tests: archrun's conformance kit (docs/conformance.md) on the tiny HF fixtures
(hf_arch.py, goldens/). No synthetic variants: the kit's writer writes attention layers only, and
the DeltaNet and gated-attention layers bring their own tensors (archrun-recurrent's
gated_deltanet, gated_causal)."""

from archrun.conformance import Conformance

archrun_conformance = Conformance("qwen3next", synthetic=())
