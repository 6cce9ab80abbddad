"""archrun-mpt's tiny HF fixtures through the standard battery (archrun.conformance.tiny_hf)."""

from archrun.conformance.tiny_hf import TinyHfBattery


class TestMpt(TinyHfBattery):
    entry_point = "mpt"
