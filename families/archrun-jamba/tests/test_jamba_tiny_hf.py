"""archrun-jamba's tiny HF fixtures through the standard battery (archrun.conformance.tiny_hf)."""

from archrun.conformance.tiny_hf import TinyHfBattery


class TestJamba(TinyHfBattery):
    entry_point = "jamba"
