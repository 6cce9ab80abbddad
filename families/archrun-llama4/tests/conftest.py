"""archrun-llama4's tests: archrun's conformance kit (docs/conformance.md) on a synthetic llama4 model and,
through hf_arch.py and goldens/, on the tiny HF fixtures."""

from archrun.conformance import Conformance

archrun_conformance = Conformance("llama4")
