"""archrun-bitnet's tests: archrun's conformance kit (docs/conformance.md) on the tiny HF fixtures
(hf_arch.py, goldens/)."""

from archrun.conformance import Conformance

archrun_conformance = Conformance("bitnet")
