"""archrun-glm4's tests: archrun's conformance kit (docs/conformance.md) on a synthetic model of each architecture
the family describes and, through hf_arch.py and goldens/, on the tiny HF fixtures."""

archrun_conformance = "glm4"  # the package's archrun entry-point name
