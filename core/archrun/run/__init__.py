"""Running a Descriptor: the bound plan, the interpreter and its decoders, per-sequence caches, the tiered start."""
