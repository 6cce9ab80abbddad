"""Constrained generation (archrun.generation.grammar): grammars, the per-step token mask over the real SmolLM2
vocabulary, EOS only where the grammar accepts, and outputs the mask leaves unchanged."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
from support.models import real_model

import archrun
from archrun.cli import main
from archrun.errors import InvalidRequest
from archrun.generation.grammar import Constraint, Grammar

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pets": {"type": "array", "maxItems": 3, "items": {
            "type": "object", "additionalProperties": False, "required": ["kind", "legs"],
            "properties": {"kind": {"enum": ["cat", "dog", "bird"]}, "legs": {"type": "integer"}}}},
    },
    "required": ["name", "age", "pets"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def model():
    return archrun.load(real_model("smollm2"))


@pytest.mark.parametrize("schema", [{"type": "nonsense"}, {"type": "object", "properties": {"a": {"$ref": "#/x"}}},
                                    "{not json", [1, 2], ""])
def test_invalid_schemas_are_invalid_requests(schema):
    with pytest.raises(InvalidRequest):
        Grammar.json_schema(schema)


def test_grammar_kinds_and_bad_arguments():
    assert Grammar.json_schema('{"type": "integer"}').source == "json_schema"
    assert Grammar.json_object().source == "json_object"
    assert Grammar.lark('start: "yes" | "no"').source == "lark"
    assert Grammar.regex("[0-9]+").source == "regex"
    with pytest.raises(InvalidRequest):
        Grammar.lark("start: undefined_rule")
    with pytest.raises(InvalidRequest):
        Grammar.regex("(")
    with pytest.raises(InvalidRequest):
        archrun.generate(object(), "x", grammar="start: x")  # not a Grammar


def test_eos_only_in_an_accepting_state(model):
    tok, n_vocab = model.tokenizer, model.descriptor.n_vocab
    c = Constraint(Grammar.json_schema({"type": "object", "properties": {"a": {"type": "integer"}},
                                        "required": ["a"]}), tok, n_vocab)
    eog = sorted(tok.eog_ids)
    ids = tok.encode('{"a": 12}', add_special=False)
    for t in ids:
        mask = c.allowed()
        assert mask.shape == (n_vocab,) and mask[t] and not mask[eog].any()
        c.consume(t)
    assert c.finished and set(np.flatnonzero(c.allowed())) == set(eog)


def test_a_refused_draw_is_redrawn_among_allowed_tokens(model):
    tok = model.tokenizer
    c = Constraint(Grammar.regex("(yes|no)"), tok, model.descriptor.n_vocab)
    logits = np.zeros(model.descriptor.n_vocab, dtype=np.float32)
    bad = tok.encode("maybe", add_special=False)[0]
    picked = c.choose(bad, logits, lambda masked: int(np.argmax(masked)))
    assert tok.decode([picked]) in ("y", "ye", "yes", "n", "no")


def test_json_schema_outputs_validate_with_sampling(model):
    msgs = [{"role": "user", "content": "Describe a person and their pets as JSON."}]
    for seed in range(3):
        r = archrun.chat(model, msgs, json_schema=PERSON, max_tokens=160, temperature=0.9, seed=seed).complete()
        assert r.finish_reason == "stop"
        jsonschema.validate(json.loads(r.text), PERSON)


@pytest.mark.parametrize("sampling", [dict(temperature=0), dict(temperature=0.8, seed=5)])
def test_the_mask_never_changes_an_output_that_satisfies_the_grammar(model, sampling):
    msgs = [{"role": "user", "content": "Give me a JSON object with your name."}]
    free = archrun.chat(model, msgs, max_tokens=40, **sampling).complete()
    # a grammar that admits exactly the free output (or one unrelated string): each step's mask
    # excludes nearly the whole vocabulary, yet the chosen tokens are the same
    grammar = Grammar.lark(f'start: {json.dumps(free.text)} | "unrelated"')
    bound = archrun.chat(model, msgs, max_tokens=40, grammar=grammar, **sampling).complete()
    assert bound.text == free.text and bound.token_ids == free.token_ids


def test_cli_json_schema(tmp_path, capsys):
    path = real_model("smollm2")
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                                  "required": ["city"], "additionalProperties": False}))
    argv = ["run", str(path), "--chat", "-p", "Where is the Eiffel tower? Answer in JSON.", "--json-schema",
            str(schema), "--temp", "0", "-n", "40", "--backend", "fast"]
    assert main(argv) == 0
    assert set(json.loads(capsys.readouterr().out)) == {"city"}
    schema.write_text('{"type": "bogus"}')
    assert main(argv) == 1
    assert "invalid json schema" in capsys.readouterr().err


def test_speculative_decoding_refuses_a_grammar(model):
    from archrun.generation import speculative

    with pytest.raises(InvalidRequest):
        speculative.generate(model, "Hi", "lookup", grammar=Grammar.json_object())
