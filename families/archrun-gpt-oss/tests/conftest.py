"""archrun-gpt-oss's tests: archrun's conformance kit (docs/conformance.md) on a synthetic gpt-oss model and,
through hf_arch.py and goldens/, on the tiny HF fixtures."""

from archrun.conformance import Conformance

archrun_conformance = Conformance("gpt-oss")
