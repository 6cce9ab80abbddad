"""Run llama.cpp's own ``convert_hf_to_gguf.py`` on a saved tiny HF model, with the tiny vocabulary.

Started by ``archrun.conformance.llamacpp.convert`` as a separate process (llama.cpp's converter
puts its own copy of gguf-py first on ``sys.path``, which must not replace the installed one in
the caller)::

    python llamacpp_driver.py LLAMA_CPP_SRC VOCAB_JSON -- <convert_hf_to_gguf.py arguments>

Tiny random models come without a tokenizer, and the converter's ``set_vocab`` needs one (and a
known pre-tokenizer hash). This driver replaces only ``set_vocab`` of the model class the
converter picks: it writes the vocabulary given in VOCAB_JSON (tokens, token types, merges,
bos/eos ids, as ``archrun.conformance.hf.vocabulary`` builds them). Everything else — the
hyperparameter keys, tensor names, tensor transforms and types — is the converter's own code.
Imports nothing from archrun.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _tiny_set_vocab(vocab: dict):
    def set_vocab(self) -> None:
        w = self.gguf_writer
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(vocab["pre"])
        w.add_token_list(vocab["tokens"])
        w.add_token_types(vocab["types"])
        w.add_token_merges(vocab["merges"])
        w.add_bos_token_id(vocab["bos"])
        w.add_eos_token_id(vocab["eos"])
        w.add_add_bos_token(False)

    return set_vocab


def _checkpoint_fields(config: dict, extra: dict) -> None:
    """`config` as released checkpoints have it: `extra`'s fields set, those given as None removed."""
    config.update({k: v for k, v in extra.items() if v is not None})
    for key in [k for k, v in extra.items() if v is None]:
        config.pop(key, None)


def _add_checkpoint_fields(model_base, extra: dict) -> None:
    """Give the converter the config fields released checkpoints carry (`extra`): it reads the
    config through transformers' AutoConfig, whose newer versions drop or rename some of them
    (GPT-NeoX's `rotary_pct`; MPT checkpoints name their remote-code class `MPTForCausalLM`), or
    save fields those checkpoints do not have (given as None: removed)."""
    load = model_base.load_hparams

    def load_hparams(dir_model, is_mistral_format):
        config = load(dir_model, is_mistral_format)
        if isinstance(config, dict):
            _checkpoint_fields(config, extra)
        return config

    model_base.load_hparams = staticmethod(load_hparams)
    init = model_base.__init__

    def __init__(self, *args, **kwargs):  # models that read config.json themselves (Mamba2 and its hybrids)
        init(self, *args, **kwargs)
        if isinstance(getattr(self, "hparams", None), dict):
            _checkpoint_fields(self.hparams, extra)

    model_base.__init__ = __init__


def _write_tokenizer_json(model_dir: Path, vocab: dict) -> None:
    """A tokenizer.json holding the tiny vocabulary, for converters that read its size from there
    (Gemma's trims token_embd to it); the tokenizer itself is still written by `set_vocab`."""
    path = model_dir / "tokenizer.json"
    if not path.exists():
        tokens = {t: i for i, t in enumerate(vocab["tokens"])}
        path.write_text(json.dumps({"model": {"vocab": tokens}, "added_tokens": []}))


def main(argv: list[str]) -> None:
    src, vocab_json, sep, *convert_args = argv
    if sep != "--":
        raise SystemExit("usage: llamacpp_driver.py LLAMA_CPP_SRC VOCAB_JSON -- ARGS")
    src = Path(src)
    sys.path.insert(0, str(src))
    vocab = json.loads(Path(vocab_json).read_text())
    import convert_hf_to_gguf as converter  # noqa: E402 (after the path is set)

    pick = converter.get_model_class

    def get_model_class(name, mmproj=False):
        cls = pick(name, mmproj=mmproj)
        cls.set_vocab = _tiny_set_vocab(vocab)
        if getattr(cls, "supports_mtp_export", False):  # tiny models carry no MTP weights (`--no-mtp`):
            cls.no_mtp = True                            # Qwen3-Next's converter otherwise requires them
        return cls

    converter.get_model_class = get_model_class
    _write_tokenizer_json(Path(convert_args[0]), vocab)
    _add_checkpoint_fields(converter.ModelBase, vocab.get("config_extra") or {})
    sys.argv = ["convert_hf_to_gguf.py", *convert_args]
    converter.main()


if __name__ == "__main__":
    main(sys.argv[1:])
