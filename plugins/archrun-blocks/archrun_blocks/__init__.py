"""archrun-blocks: the core vocabulary of archrun (math only; no GGUF key names)."""
