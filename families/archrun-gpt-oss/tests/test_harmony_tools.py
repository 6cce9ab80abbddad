"""gpt-oss's tool calls in harmony, on hand-written replies (no gpt-oss checkpoint needed): the
analysis channel is reasoning, a commentary-channel message to `functions.NAME` is a call, the final
channel is the answer, however the reply is cut into streamed pieces; a forced call's grammar admits
gpt-oss's markup tokens."""

from __future__ import annotations

import json
import re

import pytest

from archrun.generation.grammar import Constraint
from archrun.generation.tools import Tool
from archrun.serve.reply import ReplyParts
from archrun.text.reasoning import ReasoningBudget, ReasoningStream
from archrun_gpt_oss import HARMONY, HarmonyToolCalls

THINK = "<|channel|>analysis<|message|>Need the weather.<|end|>"
ARGS = {"city": "Paris", "unit": "celsius"}
CALL = ("<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        + json.dumps(ARGS))
CALL_IN_HEADER = "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>" + json.dumps(ARGS)


def split(text: str, cuts: list[int]) -> tuple[str, str, list[tuple[str, dict]]]:
    """(reasoning, content, calls) of `text` streamed in pieces cut at `cuts`."""
    parts = ReplyParts(HarmonyToolCalls(), ReasoningStream(HARMONY))
    found = []
    for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True):
        found += parts.push(text[a:b])
    found += parts.finish()
    return ("".join(p.text for p in found if p.kind == "reasoning"), "".join(p.text for p in found if p.kind == "text"),
            [(p.call.name, json.loads(p.call.arguments)) for p in found if p.kind == "tool"])


@pytest.mark.parametrize("text, expected", [
    (THINK + CALL + "<|call|>", ("Need the weather.", "", [("get_weather", ARGS)])),
    (THINK + CALL, ("Need the weather.", "", [("get_weather", ARGS)])),         # <|call|> ended generation
    (THINK + CALL_IN_HEADER, ("Need the weather.", "", [("get_weather", ARGS)])),
    (CALL.removeprefix("<|start|>assistant") + "<|call|>", ("", "", [("get_weather", ARGS)])),  # no analysis
    (THINK + "<|start|>assistant<|channel|>final<|message|>Sunny.", ("Need the weather.", "Sunny.", [])),
    (THINK + CALL + "<|call|>" + CALL_IN_HEADER.replace("Paris", "Rome"),                # two calls in a row
     ("Need the weather.", "", [("get_weather", ARGS), ("get_weather", {**ARGS, "city": "Rome"})])),
    ("<|channel|>final<|message|>to be or not", ("", "to be or not", [])),       # 'to' in an answer is text
])
def test_harmony_replies_split_at_every_cut(text, expected):
    assert split(text, []) == expected
    for cut in range(1, len(text)):
        assert split(text, [cut]) == expected, cut


def test_a_budget_closes_the_analysis_and_the_model_may_still_call():
    budget, text, n = ReasoningBudget(HARMONY, [99], 2), "", 0
    for piece in ["<|channel|>analysis<|message|>", "a", " b", " c", " d"]:
        if budget.forced(text, n):
            break
        text, n = text + piece, n + 1
    assert text == "<|channel|>analysis<|message|>a b" and budget.forced(text, n) == []  # forced once
    reply = text + HARMONY.close + "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{}"
    assert split(reply, []) == ("a b", "", [("get_weather", {})])


def test_a_call_that_does_not_parse_is_given_back_as_text():
    broken = THINK + "<|start|>assistant<|channel|>commentary to=functions.get_weather json<|message|>{\"city\": "
    reasoning, content, calls = split(broken, [])
    assert reasoning == "Need the weather." and calls == []
    assert content.startswith("<|channel|>commentary to=functions.get_weather")


def test_the_family_declares_the_format():
    from archrun.generation.tools import tool_format

    gpt_oss = type("M", (), {"descriptor": type("D", (), {"architecture": "gpt-oss"})(), "chat_template": None})()
    assert isinstance(tool_format(gpt_oss), HarmonyToolCalls)


class Vocab:
    """Bytes as tokens 0-255, then harmony's markup as user-defined tokens (as archrun's tokenizer makes
    gpt-oss's: text, one token each), and an end token."""

    MARKUP = ("<|channel|>", "<|constrain|>", "<|message|>")

    def __init__(self):
        self.n_vocab = 256 + len(self.MARKUP) + 1
        self.eos_id = self.n_vocab - 1
        self.bos_id = None
        self.eog_ids = {self.eos_id}

    def is_control(self, i: int) -> bool:
        return i == self.eos_id

    def token_to_piece(self, i: int) -> bytes:
        return bytes([i]) if i < 256 else (*self.MARKUP, "<|call|>")[i - 256].encode()

    def encode(self, text: str, add_special: bool = False) -> list[int]:
        """User-defined tokens first (as llama.cpp's tokenizers match them), bytes between."""
        out = []
        for piece in re.split("(" + "|".join(map(re.escape, self.MARKUP)) + ")", text):
            out += [256 + self.MARKUP.index(piece)] if piece in self.MARKUP else list(piece.encode())
        return out


def test_a_forced_call_admits_the_markup_tokens():
    vocab = Vocab()
    tool = Tool("get_weather", "", {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
    constraint = Constraint(HarmonyToolCalls().grammar([tool]), vocab, vocab.n_vocab)
    channel, constrain, message = range(256, 259)
    assert constraint.allowed()[channel]  # the markup's own token
    script = [channel, *b"commentary to=functions.get_weather ", constrain, *b"json", message, *b'{"city":"Paris"}']
    for token in script:
        assert constraint.allowed()[token], vocab.token_to_piece(token)
        constraint.consume(token)
    assert constraint.finished
    text = b"".join(vocab.token_to_piece(t) for t in script).decode()
    assert HarmonyToolCalls().parse(text, final=True) == [("get_weather", {"city": "Paris"})]
