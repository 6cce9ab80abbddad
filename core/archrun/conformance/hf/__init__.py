"""Tiny random HF transformers models, their GGUF conversion and their goldens, for any family.

A family package describes each architecture it converts as an ``HfArch`` (HF classes, tiny
defaults, metadata writer, tensor fix-ups, MTP mapping) and its fixtures as ``TinyFixture``
entries, both in ``<package>/tests/hf_arch.py``; this module does the rest:

- ``build_tiny(arch, seed, **overrides)``: a deterministic random float32 HF model;
- ``convert(model, path, arch)``: the GGUF file llama.cpp's ``convert_hf_to_gguf.py`` writes for
  it (``TextModel.set_gguf_parameters`` plus the arch's own keys, tensor names from gguf-py's
  ``TensorNameMap``, experts stacked into 3-D tensors, no ``output.weight`` when the embeddings
  are tied, llama.cpp's tensor type rules: 1-D tensors, norms and routers stay F32);
- ``record_main(arches, fixtures, out_dir)``: the family's ``tests/goldens/record.py``: HF
  float32 logits for every fixture (and MTP logits when the arch has an MTP head), the
  converted GGUF, optionally llama.cpp's logits on it (``llamacpp_check.json``);
- ``check_fixture`` / ``check_golden_files`` / ``check_gguf_layout`` / ``check_live``: what the
  family's tests assert on those files.

Deliberate additions, each needed for a complete file llama.cpp can load: a small byte-level
BPE vocabulary (256 byte tokens, real two-byte merges, ``<|bos|>`` and ``<|eos|>``), since tiny
models come without a tokenizer and llama.cpp's gpt2 vocab loader requires a non-empty merges
list. HF builds no MTP layers (a checkpoint's ``model.layers.<n_layer>.*`` are ignored on load),
so for an arch with an ``HfMtp`` ``build_tiny`` attaches a random
``transformers.modeling_layers.MtpModel`` and ``convert`` writes it under the checkpoint names the
arch's ``HfMtp.checkpoint_tensors`` gives.

torch and transformers are imported only by the functions that need them. Nothing here runs an
archrun model except the ``check_*`` helpers that compare one with the goldens.
"""

from archrun.conformance.hf.checks import (
    BACKENDS,
    check_gguf_layout,
    check_golden_files,
    check_live,
    gguf_kv,
    gguf_tensors,
    head_dim,
    llama_cpp_keys,
    llama_cpp_tensors,
)
from archrun.conformance.hf.convert import (
    _write_tokenizer,
    config_json,
    convert,
    metadata,
    permute_qk,
    tensor_type,
    vocabulary,
)
from archrun.conformance.hf.goldens import (
    check_fixture,
    load_golden,
    rel_err,
)
from archrun.conformance.hf.models import (
    BOS_TOKEN,
    EOS_TOKEN,
    N_VOCAB,
    TINY_DEFAULTS,
    HfArch,
    HfMtp,
    TinyFixture,
    build_tiny,
    default_rope_parameters,
    load_module,
    tiny_config,
)
from archrun.conformance.hf.record import (
    MAX_GGUF_BYTES,
    MAX_TOTAL_BYTES,
    _sha256,
    arch_of,
    fixture_ids,
    hf_logits,
    hf_mtp_logits,
    llamacpp_check,
    package_fixture_specs,
    package_root,
    record,
    record_chains,
    record_here,
    record_main,
    record_package,
    versions,
)
from archrun.conformance.limits import N_TOKENS, TOLERANCE  # the kit's shared sizes, as hf.TOLERANCE

__all__ = [
    'N_TOKENS', 'TOLERANCE', 'BACKENDS', 'BOS_TOKEN', 'EOS_TOKEN', 'HfArch', 'HfMtp', 'MAX_GGUF_BYTES',
    'MAX_TOTAL_BYTES', 'N_VOCAB',
    'TINY_DEFAULTS', 'TinyFixture', '_sha256', '_write_tokenizer', 'arch_of', 'build_tiny', 'check_fixture',
    'check_gguf_layout', 'check_golden_files', 'check_live', 'config_json', 'convert', 'default_rope_parameters',
    'fixture_ids', 'gguf_kv', 'gguf_tensors', 'head_dim', 'hf_logits', 'hf_mtp_logits', 'llama_cpp_keys',
    'llama_cpp_tensors', 'llamacpp_check', 'load_golden', 'load_module', 'metadata', 'package_fixture_specs',
    'package_root', 'permute_qk', 'record', 'record_chains', 'record_here', 'record_main', 'record_package',
    'rel_err', 'tensor_type', 'tiny_config', 'versions', 'vocabulary']
