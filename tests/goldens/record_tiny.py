"""Record HF transformers logits goldens for tiny random models, and their GGUF conversions.

Nothing here imports archrun: the logits come from HF transformers (float32, eager attention,
eager experts), the GGUF files from tests/hf_convert.py (llama.cpp's converter conventions).

Usage:
    .venv/bin/python tests/goldens/record_tiny.py [--only NAME ...]
    /work/refvenv/bin/python tests/goldens/record_tiny.py --llamacpp-check [--only NAME ...]

``FIXTURES`` (name, arch, seed, overrides) is the single source of truth: a fixture's model is
``hf_convert.build_tiny(arch, seed, **overrides)``, which is fully deterministic, so tests may
rebuild it instead of reading the stored GGUF. Outputs in tests/goldens/tiny/:
    <name>.gguf   the converted model, all tensors F32 (llama.cpp's convert_hf_to_gguf layout)
    <name>.npz    ids int32 [n]; logits float32 [n, n_vocab] (HF, every position);
                  for glm4moe with an MTP layer, mtp_logits float32 [n-1, n_vocab];
                  config_json (HF config dict), fixture_json (name/arch/seed/overrides,
                  gguf file name and sha256), versions_json (python, torch, transformers, gguf, numpy)
    llamacpp_check.json   (--llamacpp-check) max |llama.cpp - HF| logits per fixture, F32 KV cache.
                  Last run (llama-cpp-python 0.3.36): <= 1e-5 for every fixture but gemma3
                  (~5e-3: ggml's CPU GELU rounds through an f16 lookup table, GGML_GELU_FP16),
                  argmax agreement 1.0 everywhere. It validates the converter's conventions
                  (Q/K permutation, +1 norms, expert stacking, SWA pattern key) against llama.cpp.

MTP golden (glm4moe): row j of ``mtp_logits`` is HF ``MtpModel`` layer 0 fed the embedding of
``ids[j+1]`` at position ``j+1`` and the trunk's final hidden state at position ``j`` (after the
output norm, as transformers' MTPCandidateGenerator and llama.cpp's ``h_nextn`` both use it); it
predicts ``ids[j+2]``. Attention inside the MTP block sees MTP rows 0..j only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
import zlib
from pathlib import Path

import numpy as np

TESTS_DIR = Path(__file__).resolve().parents[1]
OUT_DIR = Path(__file__).resolve().parent / "tiny"
N_TOKENS = 40
MAX_GGUF_BYTES = 1_000_000
MAX_TOTAL_BYTES = 10_000_000

_S, _F = "sliding_attention", "full_attention"

# (name, arch, seed, overrides for hf_convert.build_tiny)
FIXTURES: list[tuple[str, str, int, dict]] = [
    # qwen3: head_dim != n_embd/n_head, random q/k norms; tied and untied; GQA, MQA, MHA
    ("qwen3_untied_hd32", "qwen3", 1, {}),
    ("qwen3_tied_kv1", "qwen3", 2, {"tie_word_embeddings": True, "num_key_value_heads": 1, "head_dim": 16}),
    ("qwen3_tied_mha_hd24", "qwen3", 3,
     {"tie_word_embeddings": True, "num_key_value_heads": 4, "head_dim": 24,
      "num_hidden_layers": 2, "rope_theta": 1_000_000.0}),
    # qwen3moe: softmax router, norm_topk_prob=True as released models use
    ("qwen3moe_untied", "qwen3moe", 1, {}),
    ("qwen3moe_tied_top3", "qwen3moe", 2,
     {"tie_word_embeddings": True, "num_experts_per_tok": 3, "num_key_value_heads": 1,
      "moe_intermediate_size": 16, "num_hidden_layers": 3}),
    # llama: Q/K permutation with GQA; qwen2: q/k/v biases (llama.cpp's qwen3 loads no attention
    # biases, so attention_bias stays False there)
    ("llama_gqa", "llama", 1, {}),
    ("qwen2_gqa", "qwen2", 1, {}),
    # glm4moe: sigmoid router + bias, shared experts, leading dense layers, partial rope, MTP
    ("glm4moe_base", "glm4moe", 1, {"routed_scaling_factor": 2.5}),
    ("glm4moe_qknorm_groups_tied", "glm4moe", 2,
     {"use_qk_norm": True, "n_group": 4, "topk_group": 2, "norm_topk_prob": False,
      "first_k_dense_replace": 2, "tie_word_embeddings": True}),
    ("glm4moe_hd24_shared2_nomtp", "glm4moe", 3,
     {"use_qk_norm": True, "n_group": 2, "topk_group": 1, "num_experts_per_tok": 3,
      "routed_scaling_factor": 1.8, "head_dim": 24, "n_shared_experts": 2, "attention_bias": False,
      "num_nextn_predict_layers": 0}),
    ("glm4moe_prf025_nonorm_tied", "glm4moe", 4,
     {"norm_topk_prob": False, "routed_scaling_factor": 0.7, "partial_rotary_factor": 0.25,
      "tie_word_embeddings": True, "num_key_value_heads": 1}),
    # gemma3: SWA/global interleave, local rope base, +1 norms, GeGLU, softcap
    ("gemma3_period6_tied", "gemma3", 1, {}),
    ("gemma3_custom_pattern_softcap", "gemma3", 2,
     {"num_hidden_layers": 8, "sliding_window": 4, "layer_types": [_S, _S, _F, _S, _S, _F, _S, _F],
      "final_logit_softcapping": 3.0, "tie_word_embeddings": False, "num_key_value_heads": 1,
      "rope_theta": 20000.0, "rope_local_base_freq": 1000.0}),
]


def fixture(name: str) -> tuple[str, str, int, dict]:
    """The FIXTURES entry called ``name``."""
    for entry in FIXTURES:
        if entry[0] == name:
            return entry
    raise KeyError(f"no tiny fixture {name!r}")


def fixture_ids(name: str, n_vocab: int) -> np.ndarray:
    """The fixed random token sequence (N_TOKENS ids, specials excluded) of fixture ``name``."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    return rng.integers(0, n_vocab - 2, size=N_TOKENS).astype(np.int32)


def versions() -> dict[str, str]:
    import gguf
    import torch
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "gguf": _dist_version("gguf", gguf),
        "numpy": np.__version__,
    }


def _dist_version(dist: str, module) -> str:
    from importlib.metadata import version

    return getattr(module, "__version__", None) or version(dist)


def hf_logits(model, ids: np.ndarray):
    """(logits [n, vocab], final hidden states [n, n_embd]) of the HF model, float32."""
    import torch

    with torch.no_grad():
        out = model(torch.from_numpy(ids.astype(np.int64))[None], output_hidden_states=True)
    return out.logits[0].float().numpy(), out.hidden_states[-1]


def hf_mtp_logits(model, ids: np.ndarray, hidden) -> np.ndarray:
    """MTP layer-0 logits [n-1, vocab] (see the module docstring for the row convention)."""
    import torch

    mtp = model.archrun_mtp
    ids_t = torch.from_numpy(ids.astype(np.int64))[None]
    positions = torch.arange(1, len(ids))[None]
    with torch.no_grad():
        h = mtp.forward_layer(0, hidden[:, :-1], positions, None, input_ids=ids_t[:, 1:])
        return mtp._project_to_logits(h)[0].float().numpy()


def record(entry: tuple[str, str, int, dict], vers: dict[str, str]) -> Path:
    """Build, run and convert one fixture; write its .gguf and .npz; return the .npz path."""
    import hf_convert

    name, arch, seed, overrides = entry
    model, config = hf_convert.build_tiny(arch, seed, **overrides)
    ids = fixture_ids(name, config.vocab_size)
    logits, hidden = hf_logits(model, ids)
    arrays = {"ids": ids, "logits": logits}
    if getattr(model, "archrun_mtp", None) is not None:
        arrays["mtp_logits"] = hf_mtp_logits(model, ids, hidden)
    gguf_path = hf_convert.convert(model, OUT_DIR / f"{name}.gguf", arch, name=f"tiny-{name}")
    size = gguf_path.stat().st_size
    if size > MAX_GGUF_BYTES:
        raise SystemExit(f"{gguf_path.name} is {size} bytes (> {MAX_GGUF_BYTES}): shrink the fixture")
    meta = {"name": name, "arch": arch, "seed": seed, "overrides": overrides, "n_tokens": N_TOKENS,
            "gguf": gguf_path.name, "gguf_sha256": _sha256(gguf_path)}
    out = OUT_DIR / f"{name}.npz"
    np.savez_compressed(out, **arrays, config_json=np.array(hf_convert.config_json(config)),
                        fixture_json=np.array(json.dumps(meta, sort_keys=True)),
                        versions_json=np.array(json.dumps(vers, sort_keys=True)))
    return out


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def llamacpp_check(entries) -> dict[str, dict]:
    """Run each stored GGUF through llama.cpp and compare its logits with the stored HF ones."""
    import llama_cpp

    report = {}
    for name, *_ in entries:
        golden = np.load(OUT_DIR / f"{name}.npz")
        ids = golden["ids"].tolist()
        llm = llama_cpp.Llama(str(OUT_DIR / f"{name}.gguf"), logits_all=True, n_ctx=64, n_threads=2,
                              n_batch=64, type_k=0, type_v=0, verbose=False)  # F32 KV cache
        llm.eval(ids)
        scores = np.asarray(llm.scores[: len(ids)], dtype=np.float32)
        diff = float(np.abs(scores - golden["logits"]).max())
        argmax = float((scores.argmax(-1) == golden["logits"].argmax(-1)).mean())
        report[name] = {"max_abs_diff": diff, "argmax_agreement": argmax}
        print(f"{name:32s} max|llama.cpp-HF| = {diff:.3e}  argmax agreement {argmax:.3f}")
        del llm
    report["_versions"] = {"llama_cpp_python": llama_cpp.__version__}
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="*", help="fixture names (default: all)")
    parser.add_argument("--llamacpp-check", action="store_true", help="compare stored GGUFs in llama.cpp")
    args = parser.parse_args(argv)
    entries = [fixture(n) for n in args.only] if args.only else FIXTURES
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    if args.llamacpp_check:
        report = llamacpp_check(entries)
        (OUT_DIR / "llamacpp_check.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
        return
    import torch

    torch.set_num_threads(2)
    vers = versions()
    for entry in entries:
        print("recorded", record(entry, vers).name)
    total = sum(p.stat().st_size for p in OUT_DIR.iterdir())
    if total > MAX_TOTAL_BYTES:
        raise SystemExit(f"tests/goldens/tiny holds {total} bytes (> {MAX_TOTAL_BYTES})")
    print(f"total {total} bytes")


if __name__ == "__main__":
    sys.path.insert(0, str(TESTS_DIR))  # hf_convert lives in tests/
    main()
