"""archrun-llama's llama.cpp-converted fixtures (mistral) through the standard battery (archrun.conformance.tiny_hf)."""

from archrun.conformance.tiny_hf import TinyHfBattery


class TestMistral(TinyHfBattery):
    entry_point = "llama"
