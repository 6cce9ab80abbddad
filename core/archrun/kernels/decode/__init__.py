"""The fused decode runtime: product groups over the matmul engine, the decode worker pool, the one-token
layer kernel composed of the ops' kernel parts, and the fused blocks a model's steps run (fusion)."""
