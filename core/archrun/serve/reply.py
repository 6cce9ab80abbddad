"""A reply's text as the parts every API shows: reasoning, answer text and tool calls.

The reasoning split comes first (thinking may mention a tool-call syntax without calling), the
answer then goes through the tool-call split. Each API turns the parts into its own objects or
stream events (the chat completion's deltas, Anthropic's content blocks, Responses' items).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from archrun.generation.generate import GenerationResult
from archrun.generation.tools import ToolCall, ToolCallFormat, ToolCallStream
from archrun.text.reasoning import ReasoningFormat, ReasoningStream

PROMPT_TAIL = 16  # prompt tokens decoded to see whether the template opened the thinking


@attrs.frozen
class Part:
    """One piece of a reply: kind "reasoning" or "text" with its text, or kind "tool" with its call."""

    kind: str
    text: str = ""
    call: ToolCall | None = None


class ReplyParts:
    """Splits a streamed reply into Parts (`push(piece)`, then `finish()`); None formats split nothing."""

    def __init__(self, tools: ToolCallFormat | None = None, reasoning: ReasoningStream | None = None):
        self.tools = ToolCallStream(tools) if tools is not None else None
        self.reasoning = reasoning
        self.calls: list[ToolCall] = []

    @property
    def splits(self) -> bool:
        """Whether anything is split off the text (else every piece is text as it comes)."""
        return self.tools is not None or self.reasoning is not None

    def push(self, piece: str) -> list[Part]:
        thought, text = self.reasoning.push(piece) if self.reasoning is not None else ("", piece)
        return self._parts(thought, *self._answer(text))

    def finish(self) -> list[Part]:
        thought, text = self.reasoning.finish() if self.reasoning is not None else ("", "")
        text, calls = self._answer(text)
        if self.tools is not None:
            more, last = self.tools.finish()
            text, calls = text + more, calls + last
        return self._parts(thought, text, calls)

    def _answer(self, text: str) -> tuple[str, list[ToolCall]]:
        if self.tools is None or not text:
            return text, []
        return self.tools.push(text)

    def _parts(self, thought: str, text: str, calls: list[ToolCall]) -> list[Part]:
        self.calls += calls
        out = [Part("reasoning", thought)] if thought else []
        out += [Part("text", text)] if text else []
        return out + [Part("tool", call=c) for c in calls]


class Blocks:
    """Parts grouped as APIs show them: a run of reasoning, a run of text, one block per tool call.

    `feed(parts)` returns what happened, in order: ("start", i), ("delta", i, text), ("stop", i);
    `close()` stops the open block. `blocks[i]` is the Part of block i with all its text.
    """

    def __init__(self) -> None:
        self.blocks: list[Part] = []
        self.open = False

    def feed(self, parts: Sequence[Part]) -> list[tuple]:
        out: list[tuple] = []
        for part in parts:
            last = self.blocks[-1] if self.open else None
            if last is None or last.kind != part.kind or part.kind == "tool":
                out += self.close()
                self.blocks.append(Part(part.kind, "", part.call))
                self.open = True
                out.append(("start", len(self.blocks) - 1))
            i = len(self.blocks) - 1
            text = part.text if part.kind != "tool" else part.call.arguments
            self.blocks[i] = attrs.evolve(self.blocks[i], text=self.blocks[i].text + text)
            out.append(("delta", i, text))
        return out

    def close(self) -> list[tuple]:
        if not self.open:
            return []
        self.open = False
        return [("stop", len(self.blocks) - 1)]


def split_reply(parts: ReplyParts, text: str) -> tuple[str, str, list[ToolCall]]:
    """(reasoning, text, calls) of a whole reply."""
    found = parts.push(text) + parts.finish()
    return ("".join(p.text for p in found if p.kind == "reasoning"), "".join(p.text for p in found if p.kind == "text"),
            [p.call for p in found if p.kind == "tool"])


def reasoning_stream(fmt: ReasoningFormat | None, tokenizer: Any, prompt: Sequence[int]) -> ReasoningStream | None:
    """The reasoning splitter of a reply to `prompt` (None without a format)."""
    if fmt is None:
        return None
    tail = tokenizer.decode(list(prompt[-PROMPT_TAIL:]))
    return ReasoningStream(fmt, inside=fmt.opened_by(tail))


def stop_sequence(tokenizer: Any, result: GenerationResult, stops: Sequence[str]) -> str | None:
    """The stop string that ended `result`, or None (the end of generation or the token budget)."""
    if result.finish_reason != "stop" or not stops:
        return None
    rest = tokenizer.decode(list(result.token_ids))[len(result.text):]
    return next((s for s in stops if rest.startswith(s)), None)
