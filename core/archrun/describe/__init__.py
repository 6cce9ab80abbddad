"""Metadata to a Descriptor: the compiler, layer patterns, and the `inspect` report of what a file compiles to."""
