"""archrun-example-vocab: an out-of-tree vocabulary plugin and a family that uses it.

- vocabulary: activation "gelu_quick", x * sigmoid(1.702 x) (CLIP's QuickGELU), as a numpy
  reference (reference.py), a fast op (fast.py) and a numba kernel part (parts.py) that the
  core's fused decode kernel calls for one token;
- family: the made-up architecture "quickgelu-llama" (a llama whose FFN uses gelu_quick).

One entry point (`example_vocab`, see pyproject.toml) registers both: plugin.py.
"""

from archrun.kernels import kernel_cache

# first: the kernel part's compiled code is cached under a digest of this package's and the core's kernel sources
kernel_cache(__file__)
