"""archrun-cohere's tiny HF fixtures through the standard battery (archrun.conformance.tiny_hf)."""

from archrun.conformance.tiny_hf import TinyHfBattery


class TestCohere(TinyHfBattery):
    entry_point = "command-r"
