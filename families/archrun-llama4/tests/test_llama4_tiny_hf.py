"""archrun-llama4's tiny HF fixtures through the standard battery (archrun.conformance.tiny_hf)."""

from archrun.conformance.tiny_hf import TinyHfBattery


class TestLlama4(TinyHfBattery):
    entry_point = "llama4"
