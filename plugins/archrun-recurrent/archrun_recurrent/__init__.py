"""archrun-recurrent: token mixers whose per-sequence memory is a state, not a list of keys.

Ops (slot "attention", each a whole token mixer: `layout.mixer`): `shortconv` (LFM2's gated
short convolution). Their per-sequence state lives in a `StateSlot` (archrun_recurrent.state),
which rewinds by restoring kept copies of the state (archrun.cache describes the protocol).
"""
