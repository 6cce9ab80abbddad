"""One chat turn: render the model's chat template around a user message and stream the reply.

usage: python examples/chat.py MODEL.gguf [-m MESSAGE] [-s SYSTEM] [-n MAX_TOKENS] [--temp T] [--seed S]

The template is the file's own (tokenizer.chat_template), else its family's default; archrun
raises ChatTemplateError when there is neither.
"""

from __future__ import annotations

import argparse
import sys

import archrun


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="One chat turn with a GGUF model.")
    ap.add_argument("model", help="path of a .gguf file")
    ap.add_argument("-m", "--message", default="What is a GGUF file? Answer in one sentence.")
    ap.add_argument("-s", "--system", default=None, help="an optional system message")
    ap.add_argument("-n", "--max-tokens", type=int, default=128)
    ap.add_argument("--temp", type=float, default=0.7, help="sampling temperature (0: greedy)")
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args(argv)

    model = archrun.load(args.model)
    messages = ([{"role": "system", "content": args.system}] if args.system else [])
    messages.append({"role": "user", "content": args.message})
    gen = archrun.chat(model, messages, max_tokens=args.max_tokens, temperature=args.temp, seed=args.seed)
    for piece in gen:
        print(piece, end="", flush=True)
    print()
    r = gen.result
    print(f"[{r.prompt_tokens} prompt tokens, {r.completion_tokens} generated, finish: {r.finish_reason}]",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
