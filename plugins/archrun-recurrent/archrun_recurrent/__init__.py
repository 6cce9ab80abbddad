"""archrun-recurrent: token mixers whose per-sequence memory is a state, not a list of keys.

Token mixers (slot "mixer", each a layer's whole mixer with its own layout): `shortconv` (LFM2's
gated short convolution), `mamba`, `mamba2`, `gated_deltanet` (and `_tiled`), `kda` (Kimi Delta
Attention); and `gated_causal`, an attention op with its own projections (slot "attention"). The
mixers' per-sequence state lives in a `StateSlot` (archrun_recurrent.state), which rewinds by restoring
kept copies of the state (archrun.run.cache describes the protocol).
"""
