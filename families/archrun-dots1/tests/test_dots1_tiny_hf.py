"""archrun-dots1's tiny HF fixtures through the standard battery (archrun.conformance.tiny_hf)."""

from archrun.conformance.tiny_hf import TinyHfBattery


class TestDots1(TinyHfBattery):
    entry_point = "dots1"
