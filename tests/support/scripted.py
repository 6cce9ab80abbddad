"""A Decoder that writes a fixed reply, for the tool-call and API tests."""

from __future__ import annotations

import numpy as np


class Scripted:
    """A Decoder that writes a fixed reply, with SmolLM2's vocabulary, descriptor and template: what the llama
    family's parser does with a call the model chose to write (auto), which the 135M model itself does not."""

    def __init__(self, model, reply: str):
        self.descriptor, self.tokenizer, self.chat_template = model.descriptor, model.tokenizer, model.chat_template
        self.caps = model.caps.__class__(rewind=True, batch=False, all_logits=False)
        self.script = model.tokenizer.encode(reply, add_special=False) + [model.tokenizer.eos_id]
        self.init_cache = model.init_cache
        self.fed: list[int] = []

    def forward_step(self, tokens, cache):
        self.fed += [int(t) for t in tokens]
        done = max((k for k in range(len(self.script)) if k == 0 or self.fed[-k:] == self.script[:k]), default=0)
        logits = np.zeros(self.descriptor.n_vocab, dtype=np.float32)
        logits[self.script[done]] = 10.0
        return logits
