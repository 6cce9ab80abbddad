"""archrun.reasoning: a reply split into thinking and answer, whole or piece by piece (every split of the
text into pieces gives the same parts), with the prompt opening the thinking or not; and the server's
ReplyParts, which splits reasoning first and tool calls from the answer."""

from __future__ import annotations

import pytest

from archrun.reasoning import THINK_TAGS, ReasoningFormat, ReasoningStream
from archrun.serve.reply import Blocks, ReplyParts, split_reply

REPLY = "<think>\nThe user wants a colour.\n</think>\n\nBlue."


def run(text: str, cuts: list[int], inside: bool = False) -> tuple[str, str]:
    stream = ReasoningStream(THINK_TAGS, inside)
    reasoning = content = ""
    for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True):
        r, c = stream.push(text[a:b])
        reasoning, content = reasoning + r, content + c
    r, c = stream.finish()
    return reasoning + r, content + c


@pytest.mark.parametrize("text, inside, expected", [
    (REPLY, False, ("The user wants a colour.", "Blue.")),
    ("  <think>a</think>b", False, ("a", "b")),
    ("Blue.", False, ("", "Blue.")),
    ("<thin", False, ("", "<thin")),                      # never became the open tag: answer
    ("I think <think> is a tag", False, ("", "I think <think> is a tag")),  # not at the start: answer
    ("The user wants\n</think>\nBlue.", True, ("The user wants", "Blue.")),  # the prompt opened it
    ("cut short wh", True, ("cut short wh", "")),          # never closed: all reasoning
    ("<think>\n\n</think>\n\nBlue.", False, ("", "Blue.")),
])
def test_every_split_of_a_reply_gives_the_same_parts(text, inside, expected):
    assert run(text, [], inside) == expected
    for cut in range(1, len(text)):
        assert run(text, [cut], inside) == expected, cut
    assert run(text, list(range(1, len(text))), inside) == expected


def test_the_format_applies_to_templates_that_name_it_and_sees_an_opened_prompt():
    fmt = ReasoningFormat("<think>", "</think>")
    assert fmt.applies("{{ '<think>' }}") and not fmt.applies("{{ x }}") and not fmt.applies(None)
    assert fmt.opened_by("<|assistant|><think>\n") and not fmt.opened_by("<think>\n\n</think>\n\n")
    assert not fmt.opened_by("<|im_start|>assistant\n")


def test_reply_parts_split_reasoning_then_tool_calls():
    from archrun_qwen.tools import QwenToolCalls

    text = '<think>I should call it.</think>\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    thought, answer, calls = split_reply(ReplyParts(QwenToolCalls(), ReasoningStream(THINK_TAGS)), text)
    assert (thought, answer, [(c.name, c.arguments) for c in calls]) == ("I should call it.", "", [("f", '{"x": 1}')])
    parts = ReplyParts(None, ReasoningStream(THINK_TAGS))
    blocks = Blocks()
    happened = blocks.feed(parts.push("<think>a")) + blocks.feed(parts.push("b</think>c")) + \
        blocks.feed(parts.finish()) + blocks.close()
    assert [(b.kind, b.text) for b in blocks.blocks] == [("reasoning", "ab"), ("text", "c")]
    assert [h[0] for h in happened] == ["start", "delta", "delta", "stop", "start", "delta", "stop"]
    assert not ReplyParts().splits and ReplyParts().push("x")[0].text == "x"
