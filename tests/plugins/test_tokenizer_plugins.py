"""Pre-tokenizers and vocabulary kinds are plugin data: a plugin adds a `tokenizer.ggml.pre` value or a
`tokenizer.ggml.model` kind without touching archrun; a name registered twice is a PluginError."""

from __future__ import annotations

import pytest
from support.tokenizers import BPE_TOKENS, bpe_meta

from archrun.errors import PluginError, TokenizerError
from archrun.hookspecs import hookimpl
from archrun.plugins import make_plugin_manager
from archrun.text.tokenizer import PreTokenizer, Tokenizer, TokenizerParts, TokenizerSource, pre_tokenizers


def _before_h(text: str) -> list[tuple[int, int]]:
    """A hand-written splitter: a cut before every 'h'."""
    cuts = [0, *(i for i, c in enumerate(text) if c == "h" and i), len(text)]
    return [(a, b) for a, b in zip(cuts, cuts[1:], strict=False) if b > a]


class CharsEngine:
    """A vocabulary kind of one token per character (unknown characters dropped)."""

    def __init__(self, index: dict[str, int]) -> None:
        self.index = index

    def bind(self, ids, attrs) -> None:
        pass

    def encode(self, fragments: list[str]) -> list[list[int]]:
        return [[self.index[c] for c in text if c in self.index] for text in fragments]


def build_chars(src: TokenizerSource) -> TokenizerParts:
    flags = {"add_bos": False, "force_bos": False, "clean_spaces": False, "unescape_spaces": True,
             "add_space_prefix": False}
    return TokenizerParts(None, CharsEngine(src.index), {}, flags)


class TextData:
    @hookimpl
    def archrun_register_pre_tokenizers(self, register):
        register("test-chars", PreTokenizer((".",)))
        register("test-before-h", PreTokenizer((_before_h,)))

    @hookimpl
    def archrun_register_tokenizer_models(self, register):
        register("test-chars", build_chars)


@pytest.fixture(scope="module")
def pm():
    return make_plugin_manager(extra=[TextData()])


def ids(*texts: str) -> list[int]:
    return [BPE_TOKENS.index(t) for t in texts]


def test_a_plugin_adds_a_pre_tokenizer(pm):
    assert Tokenizer.from_metadata(bpe_meta()).encode(" the", add_special=False) == ids("Ġthe")
    chars = Tokenizer.from_metadata(bpe_meta(**{"tokenizer.ggml.pre": "test-chars"}), plugins=pm)
    assert chars.pre == "test-chars"
    assert chars.encode(" the", add_special=False) == ids("Ġ", "t", "h", "e")  # no merge across pieces
    split = Tokenizer.from_metadata(bpe_meta(**{"tokenizer.ggml.pre": "test-before-h"}), plugins=pm)
    assert split.encode(" the", add_special=False) == ids("Ġt", "he")
    assert split.decode(split.encode(" the the", add_special=False)) == " the the"


def test_without_the_plugin_the_pre_tokenizer_is_unknown():
    with pytest.raises(TokenizerError, match="unknown pre-tokenizer.*'test-chars'.*supported: .*gpt-2"):
        Tokenizer.from_metadata(bpe_meta(**{"tokenizer.ggml.pre": "test-chars"}))


def test_a_plugin_adds_a_vocabulary_kind(pm):
    meta = {"tokenizer.ggml.model": "test-chars", "tokenizer.ggml.tokens": ["a", "b", "c"]}
    tok = Tokenizer.from_metadata(meta, plugins=pm)
    assert tok.encode("cab?", add_special=False) == [2, 0, 1]
    assert tok.decode([2, 0, 1]) == "cab"
    with pytest.raises(TokenizerError, match="unsupported tokenizer model 'test-chars'"):
        Tokenizer.from_metadata(meta)


def test_no_plugin_no_pre_tokenizers():
    bare = make_plugin_manager(names=[])
    assert dict(pre_tokenizers(bare)) == {}
    with pytest.raises(TokenizerError, match="no installed plugin registers vocabulary kinds"):
        Tokenizer.from_metadata(bpe_meta(), plugins=bare)


def test_a_name_registered_twice_names_both_plugins():
    class Again:
        @hookimpl
        def archrun_register_pre_tokenizers(self, register):
            register("gpt-2", PreTokenizer((".",)))

    with pytest.raises(PluginError, match="pre-tokenizer 'gpt-2' is registered by both 'blocks' and"):
        pre_tokenizers(make_plugin_manager(names=["blocks"], extra=[Again()]))


def test_a_pre_tokenizer_must_be_a_pre_tokenizer():
    class Wrong:
        @hookimpl
        def archrun_register_pre_tokenizers(self, register):
            register("test-wrong", ("\\s+",))

    with pytest.raises(PluginError, match="'test-wrong' as a tuple, not a archrun.text.tokenizer.kinds.PreTokenizer"):
        pre_tokenizers(make_plugin_manager(names=[], extra=[Wrong()]))
