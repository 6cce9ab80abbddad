"""archrun-llama4-ops's tests: archrun's conformance kit (docs/conformance.md) on its ops (registration,
every fast op = its reference); the models using them are archrun-llama4's."""

archrun_conformance = "llama4-ops"  # the package's archrun entry-point name
