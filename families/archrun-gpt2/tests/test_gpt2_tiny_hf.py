"""archrun-gpt2's tiny HF fixtures through the standard battery (archrun.conformance.tiny_hf)."""

from archrun.conformance.tiny_hf import TinyHfBattery


class TestGpt2(TinyHfBattery):
    entry_point = "gpt2"
