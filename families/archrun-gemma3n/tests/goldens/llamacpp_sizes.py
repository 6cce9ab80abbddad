"""Cross-check archrun-gemma3n with llama.cpp at the sizes llama.cpp's gemma3n loader hard-codes.

llama.cpp 0.3.36 runs gemma3n files only with a per-layer input width of 256, KV computed by the first 20
layers (the others reuse it) and, as released checkpoints have them, k/v projections on the KV-sharing
layers; such a tiny model is ~10 MB, too big for a fixture. This script builds two (22 layers, seeds 7
and 8, one tied), converts them with llama.cpp's converter into a temporary folder, adds the unused k/v
projections for llama.cpp, and prints each max |Δlogit| / max |logit| between HF, llama.cpp and archrun
(both backends), and archrun with llama.cpp's Gaussian cut (its std divides by f - 1, HF's by f).
Run it where llama-cpp-python is importable (``--llama-cpp-site DIR`` adds a venv's site-packages):

    .venv/bin/python families/archrun-gemma3n/tests/goldens/llamacpp_sizes.py --llama-cpp-site \\
        /tmp/llcpp-venv/lib/python3.11/site-packages
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
F32 = np.float32


def _unbiased_cut(g, z):
    """llama.cpp's gaussian_topk: relu(g - (mean + z std)), std over f - 1."""
    g = np.asarray(g, dtype=F32)
    mean = g.mean(axis=-1, keepdims=True, dtype=np.float64)
    std = np.sqrt(np.sum((g - mean) ** 2, axis=-1, keepdims=True) / max(g.shape[-1] - 1, 1))
    return np.maximum(g - (mean + std * z).astype(F32), F32(0.0)).astype(F32)


def check(seed: int, out: Path) -> dict[str, float]:
    import llama_cpp

    import archrun
    import archrun_gemma3n_ops.sparsity as sparsity
    from archrun.conformance.gguf_edit import rewrite_gguf
    from archrun.conformance.hf.convert import convert
    from archrun.conformance.hf.models import build_tiny
    from archrun.conformance.hf.record import fixture_ids, hf_logits

    sys.path.insert(0, str(HERE.parent))
    import hf_arch

    n_layer, n_kv = 22, 20
    model, config = build_tiny(hf_arch.GEMMA3N, seed, num_hidden_layers=n_layer, num_kv_shared_layers=n_layer - n_kv,
                               layer_types=hf_arch._pattern(n_layer), hidden_size_per_layer_input=256,
                               activation_sparsity_pattern=[0.95] * 10 + [0.0] * (n_layer - 10), laurel_rank=64,
                               intermediate_size=64, tie_word_embeddings=seed % 2 == 1)
    ids = fixture_ids(f"gemma3n_llamacpp_sizes_{seed}", config.vocab_size)
    want, _ = hf_logits(model, ids)
    path = convert(model, out / f"gemma3n_{seed}.gguf", hf_arch.GEMMA3N, name=f"gemma3n-llamacpp-sizes-{seed}")
    kvw, d = config.num_key_value_heads * config.head_dim, config.hidden_size
    unused = {}
    for i in range(n_kv, n_layer):
        unused.update({f"blk.{i}.attn_k.weight": np.zeros((kvw, d), F32),
                       f"blk.{i}.attn_v.weight": np.zeros((kvw, d), F32),
                       f"blk.{i}.attn_k_norm.weight": np.ones(config.head_dim, F32)})
    llpath = rewrite_gguf(path, out / f"gemma3n_{seed}_llama_cpp.gguf", add_tensors=unused)
    llm = llama_cpp.Llama(str(llpath), logits_all=True, n_ctx=64, n_threads=1, n_batch=64, type_k=0, type_v=0,
                          verbose=False)
    llm.eval(ids.tolist())
    ll = np.asarray(llm.scores[: len(ids)], dtype=F32)
    del llm
    scale = float(np.abs(want).max())
    res = {"llama.cpp vs HF": float(np.abs(ll - want).max()) / scale,
           "llama.cpp argmax agreement": float((ll.argmax(-1) == want.argmax(-1)).mean())}
    for backend in ("reference", "fast"):
        got = archrun.load(path, backend=backend).logits(ids.astype(np.int64))
        res[f"archrun {backend} vs HF"] = float(np.abs(got - want).max()) / scale
        res[f"archrun {backend} vs llama.cpp"] = float(np.abs(got - ll).max()) / scale
    own = sparsity.gaussian_cut
    sparsity.gaussian_cut = _unbiased_cut
    try:
        got = archrun.load(path, backend="reference").logits(ids.astype(np.int64))
    finally:
        sparsity.gaussian_cut = own
    res["archrun reference with llama.cpp's cut vs llama.cpp"] = float(np.abs(got - ll).max()) / scale
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-cpp-site", help="a site-packages folder holding llama_cpp, appended to sys.path")
    args = ap.parse_args()
    if args.llama_cpp_site:
        sys.path.append(args.llama_cpp_site)
    with tempfile.TemporaryDirectory() as tmp:
        for seed in (7, 8):
            for key, value in check(seed, Path(tmp)).items():
                print(f"seed {seed}  {key:55s} {value:.2e}")


if __name__ == "__main__":
    main()
