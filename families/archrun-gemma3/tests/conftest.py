"""archrun-gemma3's tests: archrun's conformance kit (docs/conformance.md) on synthetic gemma3 variants
(sliding/global layers, sandwich and q/k norms, final softcap) and, through hf_arch.py and goldens/, on
the tiny HF fixtures."""

from archrun.conformance import Conformance, Synthetic

archrun_conformance = Conformance("gemma3", synthetic=[
    Synthetic("gemma3_swa_period6", "gemma3", seed=1, n_layer=7, qk_norm=True, post_norms=True, tied=True,
              keys={"attention.sliding_window": 4, "rope.freq_base_swa": 1000.0}),
    Synthetic("gemma3_softcap_mqa", "gemma3", seed=2, n_layer=2, n_head_kv=1, qk_norm=True, post_norms=True,
              keys={"attention.sliding_window": 3, "final_logit_softcapping": 5.0}),
])
