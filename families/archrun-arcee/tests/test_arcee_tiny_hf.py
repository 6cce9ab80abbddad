"""archrun-arcee's tiny HF fixtures through the standard battery (archrun.conformance.tiny_hf)."""

from archrun.conformance.tiny_hf import TinyHfBattery


class TestArcee(TinyHfBattery):
    entry_point = "arcee"
