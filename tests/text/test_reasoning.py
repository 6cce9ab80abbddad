"""archrun.text.reasoning: a reply split into thinking and answer, whole or piece by piece (every split of the
text into pieces gives the same parts), with the prompt opening the thinking or not; and the server's
ReplyParts, which splits reasoning first and tool calls from the answer."""

from __future__ import annotations

import pytest

from archrun.serve.reply import Blocks, ReplyParts, split_reply
from archrun.text.reasoning import THINK_TAGS, ReasoningBudget, ReasoningFormat, ReasoningStream

REPLY = "<think>\nThe user wants a colour.\n</think>\n\nBlue."


def run(text: str, cuts: list[int], inside: bool = False, fmt=THINK_TAGS) -> tuple[str, str]:
    """(reasoning, content) of text pushed in pieces cut at `cuts` through a ReasoningStream of fmt."""
    stream = ReasoningStream(fmt, inside)
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


# --- gpt-oss's harmony channels (the family states the format) ---

HARMONY_REPLY = ("<|channel|>analysis<|message|>User wants a colour.<|end|>"
                 "<|start|>assistant<|channel|>final<|message|>Blue.")


def harmony_run(text: str, cuts: list[int]) -> tuple[str, str]:
    from archrun_gpt_oss import HARMONY

    return run(text, cuts, fmt=HARMONY)


@pytest.mark.parametrize("text, expected", [
    (HARMONY_REPLY, ("User wants a colour.", "Blue.")),
    ("<|channel|>final<|message|>Blue.", ("", "Blue.")),               # no analysis: the final channel at once
    ("<|channel|>analysis<|message|>cut sho", ("cut sho", "")),        # never closed: all reasoning
    ("Blue.", ("", "Blue.")),
])
def test_harmony_channels_split_at_every_cut(text, expected):
    assert harmony_run(text, []) == expected
    for cut in range(1, len(text)):
        assert harmony_run(text, [cut]) == expected, cut


def test_the_gpt_oss_family_answers_the_reasoning_hook_for_its_template():
    from archrun.text.reasoning import reasoning_format
    from archrun_gpt_oss import HARMONY

    gpt_oss = type("M", (), {"descriptor": type("D", (), {"architecture": "gpt-oss"})()})()
    template = '{{- "<|start|>assistant<|channel|>analysis<|message|>" + message.thinking + "<|end|>" }}'
    assert reasoning_format(gpt_oss, template=template) == HARMONY
    assert reasoning_format(gpt_oss, template="{{ messages }}") is None
    assert not HARMONY.opened_by("<|start|>user<|message|>Hi<|end|><|start|>assistant")


# --- the reasoning budget: a hand-written token stream, the budget's forced close ---

CLOSE_ID = 99
VOCAB = {1: "<think>", 2: "a", 3: " b", 4: "</think>", 5: "Blue", CLOSE_ID: "</think>"}


def steer(budget: ReasoningBudget, ids: list[int]) -> list[int]:
    """The tokens a generation takes: `ids` as sampled, except where the budget forces its own."""
    out, forced, sampled = [], [], iter(ids)
    while True:
        text = "".join(VOCAB[t] for t in out)
        forced = forced or budget.forced(text, len(out))
        nxt = forced.pop(0) if forced else next(sampled, None)
        if nxt is None:
            return out
        out.append(nxt)


@pytest.mark.parametrize("ids, budget, inside, expected", [
    ([1, 2, 3, 3, 3, 4, 5], 2, False, [1, 2, 3, CLOSE_ID, 3, 3, 4, 5]),  # cut after 2 tokens of thinking
    ([1, 2, 4, 5], 2, False, [1, 2, 4, 5]),                          # closed itself within the budget
    ([1, 2, 3], 0, False, [1, CLOSE_ID, 2, 3]),                       # 0: closed as soon as it opens
    ([2, 3, 3, 5], 1, True, [2, CLOSE_ID, 3, 3, 5]),                  # the prompt opened the thinking
    ([5, 2, 3, 3], 1, False, [5, 2, 3, 3]),                           # an answer without thinking: never cut
])
def test_a_reasoning_budget_forces_the_close_once_spent(ids, budget, inside, expected):
    assert steer(ReasoningBudget(THINK_TAGS, [CLOSE_ID], budget, inside), ids) == expected


@pytest.mark.parametrize("budget", [-1, 1.5, True, "3"])
def test_a_bad_reasoning_budget_is_refused(budget):
    from archrun.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="reasoning budget"):
        ReasoningBudget(THINK_TAGS, [CLOSE_ID], budget)
