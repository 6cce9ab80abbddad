"""archrun-gemma4's tests: archrun's conformance kit (docs/conformance.md) on the tiny HF fixtures
(hf_arch.py, goldens/). No synthetic variants: the kit's writer writes one head width and no layer
kinds, and gemma4 attends through archrun-gemma4-ops' layout, which reads both.

No op_by_op declaration: one-stream files (gemma4_dense, gemma4_k_eq_v, gemma4_kv_shared) decode fused on
the fast backend (attention gemma4's layer kernel); files with per-layer inputs (stream gemma4_ple: more than
one array carried between blocks) or mixture blocks (gemma4_moe: it applies its own FFN norms) decode op by op.
test_fused_gemma4.py asserts both and checks the fused bits against the op-by-op path."""

from archrun.conformance import Conformance

archrun_conformance = Conformance("gemma4", synthetic=())
