"""Record archrun-bert's tiny-encoder goldens into this folder: ``python record.py``.

Two tiny random float32 HF encoders (transformers' BertModel and NomicBertModel), as GGUF files, and
what HF computes on them (<name>.npz):

- ``bert_tiny.gguf``: converted by llama.cpp's own ``convert_hf_to_gguf.py`` (BertModel;
  ``archrun.conformance.llamacpp``, with the tiny byte-level vocabulary). It states no pooling (the
  converter writes ``pooling_type`` only from a sentence-transformers ``modules.json``).
- ``nomic_bert_tiny.gguf``: llama.cpp's converter handles only nomic-ai's remote-code checkpoints
  (``Wqkv``, ``fc11``/``fc12``, a ``tokenizer.json``), not transformers' NomicBertModel, so this file
  is written here by the same rules: ``attn_qkv`` = q|k|v rows, ``ffn_gate`` = gate_proj and
  ``ffn_up`` = up_proj (llama.cpp computes silu(gate) * up), the converter's keys, and
  ``pooling_type`` 1 (mean), as nomic-embed-text's files state.

Each npz holds, for two token sequences of different lengths run as one padded batch with an
attention mask: ``ids_<i>``, HF's ``last_hidden_state`` ``hidden_<i>`` [n_i, d] and the
sentence-transformers mean pooling computed by hand ``mean_<i>`` = sum(mask * h) / sum(mask).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gguf
import numpy as np

HERE = Path(__file__).parent
N_VOCAB = 288
LENGTHS = (7, 12)
SHAPE = dict(vocab_size=N_VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
             max_position_embeddings=128)


def _randomize(model, seed: int) -> None:
    """Every parameter random (norm weights around 1, biases small), so swapped or missing tensors show."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if "LayerNorm.weight" in name or "layernorm.weight" in name:
                p.copy_(1.0 + 0.25 * noise)
            elif name.endswith("bias"):
                p.copy_(0.1 * noise)
            else:
                p.copy_(0.15 * noise)


def build(kind: str, seed: int):
    from transformers import BertConfig, BertModel, NomicBertConfig, NomicBertModel

    if kind == "bert":
        model = BertModel(BertConfig(**SHAPE, layer_norm_eps=1e-12), add_pooling_layer=False)
    else:
        model = NomicBertModel(NomicBertConfig(**SHAPE, head_dim=16, layer_norm_eps=1e-12,
                                               rope_parameters={"rope_theta": 1000.0, "rope_type": "default"}),
                               add_pooling_layer=False)
    _randomize(model, seed)
    return model.eval()


def sequences(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, N_VOCAB - 2, n).astype(np.int64) for n in LENGTHS]


def hf_outputs(model, seqs: list[np.ndarray]) -> dict[str, np.ndarray]:
    """HF's hidden states of the padded batch, and the masked mean pooling (sentence-transformers')."""
    import torch

    n = max(len(s) for s in seqs)
    ids = torch.zeros((len(seqs), n), dtype=torch.long)
    mask = torch.zeros((len(seqs), n), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.from_numpy(s)
        mask[i, :len(s)] = 1
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state  # [B, n, d]
    m = mask.unsqueeze(-1).float()
    mean = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
    out = {}
    for i, s in enumerate(seqs):
        out[f"ids_{i}"] = s
        out[f"hidden_{i}"] = hidden[i, :len(s)].numpy().astype(np.float32)
        out[f"mean_{i}"] = mean[i].numpy().astype(np.float32)
    return out


def convert_bert(model, path: Path) -> None:
    from archrun.conformance import hf, llamacpp

    tokens, merges, types = hf.vocabulary(N_VOCAB)
    llamacpp.convert(model, path, {"tokens": tokens, "merges": merges, "types": types, "pre": "qwen2",
                                   "bos": N_VOCAB - 2, "eos": N_VOCAB - 1}, name="bert-tiny")


def write_nomic(model, path: Path) -> None:
    """The GGUF llama.cpp's NomicBertModel converter writes, from transformers' NomicBertModel."""
    from archrun.conformance import hf

    cfg = model.config
    sd = {k: v.numpy().astype(np.float32) for k, v in model.state_dict().items()}
    w = gguf.GGUFWriter(str(path), "nomic-bert")
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name("nomic-bert-tiny")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_head_count(cfg.num_attention_heads)
    w.add_layer_norm_eps(cfg.layer_norm_eps)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType.MEAN)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    hf._write_tokenizer(w, {"vocab_size": N_VOCAB, "bos_token_id": N_VOCAB - 2, "eos_token_id": N_VOCAB - 1})
    w.add_tensor("token_embd.weight", sd["embeddings.word_embeddings.weight"])
    w.add_tensor("token_types.weight", sd["embeddings.token_type_embeddings.weight"])
    w.add_tensor("token_embd_norm.weight", sd["embeddings.LayerNorm.weight"])
    w.add_tensor("token_embd_norm.bias", sd["embeddings.LayerNorm.bias"])
    for i in range(cfg.num_hidden_layers):
        p = f"layers.{i}."
        qkv = np.concatenate([sd[p + f"self_attn.{x}_proj.weight"] for x in "qkv"])
        names = {"attn_qkv.weight": qkv, "attn_output.weight": sd[p + "self_attn.o_proj.weight"],
                 "attn_output_norm.weight": sd[p + "post_attention_layernorm.weight"],
                 "attn_output_norm.bias": sd[p + "post_attention_layernorm.bias"],
                 "ffn_gate.weight": sd[p + "mlp.gate_proj.weight"], "ffn_up.weight": sd[p + "mlp.up_proj.weight"],
                 "ffn_down.weight": sd[p + "mlp.down_proj.weight"],
                 "layer_output_norm.weight": sd[p + "post_mlp_layernorm.weight"],
                 "layer_output_norm.bias": sd[p + "post_mlp_layernorm.bias"]}
        for name, data in names.items():
            w.add_tensor(f"blk.{i}.{name}", np.ascontiguousarray(data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


FIXTURES = {"bert_tiny": ("bert", 1, convert_bert), "nomic_bert_tiny": ("nomic", 2, write_nomic)}


def main() -> None:
    from archrun.conformance import hf, llamacpp

    versions = {**hf.versions(), "llama-cpp-python (converter)": llamacpp.LLAMA_CPP_PYTHON}
    for name, (kind, seed, write) in FIXTURES.items():
        model = build(kind, seed)
        write(model, HERE / f"{name}.gguf")
        np.savez(HERE / f"{name}.npz", **hf_outputs(model, sequences(seed)))
        print(name, (HERE / f"{name}.gguf").stat().st_size, file=sys.stderr)
    (HERE / "versions.json").write_text(json.dumps(versions, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
