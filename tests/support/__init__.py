"""What the core's tests share: synthetic GGUF writers, the real models' paths, a live server, fresh venvs.

Importable as `support.*` from every test (pytest's `pythonpath` names tests/)."""
