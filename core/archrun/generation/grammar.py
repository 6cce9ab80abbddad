"""Constrained generation: grammars compiled by llguidance into token masks over the model's vocabulary.

    g = Grammar.json_schema({"type": "object", "properties": {"name": {"type": "string"}}})
    archrun.generate(model, prompt, grammar=g)          # or json_schema={...}

A `Grammar` is validated text in llguidance's grammar format (from a JSON Schema, a Lark grammar
or a regex), immutable and shared by requests. A `Constraint` follows one sequence: each step it
computes the set of tokens that keep the output inside the grammar (a mask over archrun's own
tokenizer pieces, built once per vocabulary) and picks the token as follows: the sampler draws
from the unconstrained logits first; a token the grammar allows is kept, otherwise the draw is
repeated on the masked logits. So an output that already satisfies the grammar is never changed
(greedy or seeded), and the tokens that end generation are allowed only in an accepting state.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np

from archrun.errors import ArchrunError, InvalidRequest, ModelMismatch, shown

MAX_GRAMMAR_CHARS = 1 << 20  # a schema or grammar larger than this is refused before compiling


def _llg() -> Any:
    try:
        import llguidance
    except ImportError as exc:  # a core dependency; missing only in a broken install
        raise ArchrunError(f"constrained generation needs llguidance (pip install llguidance): {exc}") from None
    return llguidance


@attrs.frozen
class Grammar:
    """A validated grammar in llguidance's format; build it with a named constructor."""

    text: str    # llguidance's grammar (JSON of its grammar list)
    source: str  # what it was made from: "json_schema", "json_object", "lark", "regex"

    @classmethod
    def json_schema(cls, schema: dict | str) -> Grammar:
        """Outputs that are JSON documents valid under `schema` (a dict, or its JSON text)."""
        schema = _schema_dict(schema)
        matcher = _llg().LLMatcher
        return cls._checked(matcher.grammar_from_json_schema(schema, defaults=_JSON_OPTIONS), "json_schema")

    @classmethod
    def json_object(cls) -> Grammar:
        """Any JSON object (OpenAI's response_format {"type": "json_object"})."""
        return cls._from(cls.json_schema({"type": "object"}), "json_object")

    @classmethod
    def lark(cls, text: str) -> Grammar:
        """A Lark grammar in llguidance's dialect (`%json{...}` embeds a JSON Schema)."""
        _check_text(text, "grammar")
        return cls._checked(_llg().LLMatcher.grammar_from_lark(text), "lark")

    @classmethod
    def regex(cls, pattern: str) -> Grammar:
        """Outputs matching the regular expression `pattern` (whole output)."""
        _check_text(pattern, "regex")
        return cls._checked(_llg().LLMatcher.grammar_from_regex(pattern), "regex")

    @classmethod
    def _checked(cls, text: str, source: str) -> Grammar:
        is_error, messages = _llg().LLMatcher.validate_grammar_with_warnings(text)
        if is_error:
            raise InvalidRequest(f"invalid {source.replace('_', ' ')}: {messages[0]}"[:500])
        return cls(text=text, source=source)

    @classmethod
    def _from(cls, grammar: Grammar, source: str) -> Grammar:
        return cls(text=grammar.text, source=source)


# Whitespace between JSON tokens: a space, or one line break and an indent (compact and pretty-printed
# JSON, as models write it). Unbounded whitespace lets a sampled model wander in blank lines.
_JSON_OPTIONS = {"whitespace_flexible": True, "whitespace_pattern": r"(\x20|\r?\n[\x20\x09]{0,32})"}


def _schema_dict(schema: Any) -> dict:
    if isinstance(schema, str):
        _check_text(schema, "JSON schema")
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise InvalidRequest(f"the JSON schema is not valid JSON: {exc}"[:300]) from None
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    if not isinstance(schema, dict):
        raise InvalidRequest(f"a JSON schema must be an object, got {type(schema).__name__}")
    try:
        size = len(json.dumps(schema))
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidRequest(f"the JSON schema is not JSON data: {exc}"[:300]) from None
    if size > MAX_GRAMMAR_CHARS:
        raise InvalidRequest(f"the JSON schema is larger than {MAX_GRAMMAR_CHARS} characters")
    return schema


def _check_text(text: Any, what: str) -> None:
    if not isinstance(text, str) or not text:
        raise InvalidRequest(f"a {what} must be a non-empty string")
    if len(text) > MAX_GRAMMAR_CHARS:
        raise InvalidRequest(f"the {what} is longer than {MAX_GRAMMAR_CHARS} characters")


def make_grammar(grammar: Grammar | None = None, json_schema: Any = None) -> Grammar | None:
    """The Grammar of generate's `grammar=` / `json_schema=` options (at most one of them)."""
    if grammar is not None and json_schema is not None:
        raise InvalidRequest("pass grammar= or json_schema=, not both")
    if json_schema is not None:
        return Grammar.json_schema(json_schema)
    if grammar is not None and not isinstance(grammar, Grammar):
        raise InvalidRequest(f"grammar must be an archrun.generation.grammar.Grammar, got {type(grammar).__name__}")
    return grammar


# --- the vocabulary as llguidance sees it ---


class _Pieces:
    """archrun's Tokenizer in the shape llguidance's TokenizerWrapper reads (bytes per token)."""

    def __init__(self, tokenizer: Any, n_vocab: int):
        self._tok = tokenizer
        self.eos_token_id = tokenizer.eos_id if tokenizer.eos_id is not None else min(tokenizer.eog_ids, default=0)
        self.bos_token_id = tokenizer.bos_id
        self.special_token_ids = [i for i in range(tokenizer.n_vocab) if tokenizer.is_control(i)]
        # control tokens are marked with a 0xff prefix: llguidance never matches them as text
        self.tokens = [b"\xff" + tokenizer.token_to_piece(i) if tokenizer.is_control(i)
                       else tokenizer.token_to_piece(i) for i in range(tokenizer.n_vocab)]
        self.tokens += [b""] * (n_vocab - tokenizer.n_vocab)  # padded embedding rows: never text

    def __call__(self, text: str) -> list[int]:
        if not isinstance(text, str):  # llguidance then passes text, not bytes
            raise TypeError("text only")
        return self._tok.encode(text, add_special=False)


_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def vocabulary(tokenizer: Any, n_vocab: int) -> Any:
    """llguidance's LLTokenizer of a vocabulary (built once per Tokenizer: ~0.2 s for 50k tokens)."""
    cached = _TABLES.get(tokenizer)
    if cached is None or cached.vocab_size != n_vocab:
        llg = _llg()
        eog = sorted(tokenizer.eog_ids) or [_Pieces(tokenizer, n_vocab).eos_token_id]
        cached = llg.LLTokenizer(llg.TokenizerWrapper(_Pieces(tokenizer, n_vocab)), n_vocab=n_vocab, eos_token=eog)
        _TABLES[tokenizer] = cached
    return cached


# --- one constrained sequence ---


class Constraint:
    """One sequence's position in a grammar: which tokens may come next, and the choice among them."""

    def __init__(self, grammar: Grammar, tokenizer: Any, n_vocab: int):
        if not isinstance(grammar, Grammar):
            raise InvalidRequest(f"grammar must be an archrun.generation.grammar.Grammar, got {type(grammar).__name__}")
        if isinstance(n_vocab, bool) or not isinstance(n_vocab, int | np.integer) or not 1 <= n_vocab < 1 << 31:
            raise InvalidRequest(f"n_vocab must be a positive integer, got {shown(n_vocab)}")
        needed = ("eos_id", "bos_id", "eog_ids", "n_vocab", "is_control", "token_to_piece", "encode")
        if not all(hasattr(tokenizer, name) for name in needed):
            raise InvalidRequest(f"tokenizer must be an archrun.Tokenizer, got {type(tokenizer).__name__}")
        if tokenizer.n_vocab > n_vocab:
            raise ModelMismatch(f"the tokenizer has {tokenizer.n_vocab} tokens, more than the model's {int(n_vocab)}")
        n_vocab = int(n_vocab)
        self.n_vocab = n_vocab
        self.matcher = _llg().LLMatcher(vocabulary(tokenizer, n_vocab), grammar.text, log_level=0)
        self._raise_on_error()

    def allowed(self) -> np.ndarray:
        """bool [n_vocab]: the tokens the grammar admits next (end-of-generation only when accepting)."""
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        mask = np.unpackbits(bits, bitorder="little")[: self.n_vocab].view(bool)
        if not mask.any():
            self._raise_on_error()
            raise ArchrunError("the grammar admits no next token")
        return mask

    def choose(self, token: int, logits: np.ndarray, draw: Callable[[np.ndarray], int]) -> int:
        """`token` (drawn from the unconstrained logits) if the grammar admits it, else `draw` on the
        logits with every other token masked out."""
        if np.shape(logits) != (self.n_vocab,):
            raise ModelMismatch(f"logits of shape {np.shape(logits)} given to a grammar state made for a vocabulary "
                                f"of {self.n_vocab} tokens (another model's?)")
        mask = self.allowed()
        if token < len(mask) and mask[token]:
            return token
        masked = np.full(len(logits), -np.inf, dtype=np.float32)
        masked[: len(mask)][mask] = np.asarray(logits, dtype=np.float32)[: len(mask)][mask]
        return draw(masked)

    def consume(self, token: int) -> None:
        """Advance past `token` (one the grammar admits)."""
        if isinstance(token, bool) or not isinstance(token, int | np.integer) or not 0 <= token < self.n_vocab:
            raise ModelMismatch(f"token {shown(token)} is outside the vocabulary of {self.n_vocab} tokens this grammar "
                                "state was made for")
        if not self.matcher.consume_token(int(token)):
            self._raise_on_error()

    @property
    def finished(self) -> bool:
        """True when the grammar is complete and admits nothing but the end of generation."""
        return self.matcher.is_stopped()

    def _raise_on_error(self) -> None:
        if self.matcher.is_error():
            raise InvalidRequest(f"the grammar failed: {self.matcher.get_error()}"[:500])
