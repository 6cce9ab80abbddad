"""Gemma 4's assistant: the math of its draft steps (speculative decoding's drafting head).

HF transformers ``Gemma4AssistantForCausalLM`` as ``SinglePositionMultiTokenCandidateGenerator`` drives it,
llama.cpp src/models/gemma4-assistant.cpp. The assistant is a small Gemma 4 text model every layer of
which reuses the target's keys and values: a sliding layer those of the target's last sliding layer that
computes its own, a full layer those of its last such full layer (HF ``shared_kv_states``). The target has
seen tokens 0..T-1 (its cache holds their rows) and its last step left the final hidden state h (after
its output norm) at T-1; x is the token at T it has not seen yet. Every draft step runs at position T:

    x0     = pre_projection(concat(target_embed(x), h))       [2 B] -> [d]   (target_embed: scaled by sqrt(B))
    layer  : a = attn_output(attend(rope(rms(attn_q rms(x, attn_norm)) * q_norm, T)))   queries only
             x = x + rms(a) * post_attention_norm
             x = (x + rms(ffn_down(gelu_tanh(ffn_gate u) * ffn_up u)) * post_ffw_norm) * layer_output_scale,
                 u = rms(x) * ffn_norm
    y      = rms(x) * output_norm
    logits = token_embd y                                       (the assistant's own tied head, no softcap)
    h'     = post_projection(y)                                 [d] -> [B]: the next draft step's h

and the next step feeds argmax(logits) with h'. Attention is unscaled (the q norm fixes the magnitude),
grouped over the target's KV heads; a full layer attends the target's rows 0..T-1, a sliding layer its rows
T-1-window..T-1: window + 1 rows, as HF's assistant masks them (a bidirectional window of |i - j| <= window
over the target's rows, read from the last), one more than the target's own query at T-1 sees. Rope is the
assistant file's (NEOX; the full layers' proportional rope through the ``rope_freqs`` divisors).

These are HF's drafts after the target's prefill and after rounds whose drafts were all kept. After a
round that rejected drafts, HF's candidate generator also hands the assistant the rejected drafts' rows (the
full layers' row at T, the sliding layers' latest rows); archrun's target cache has rewound them, so the
assistant reads the rows of the tokens kept, as after a prefill of the same history.

HF's assistant applies no logit softcap (the file may state the target's); ``use_ordered_embeddings``
checkpoints mask the head to the tokens of the best centroids in HF, but llama.cpp's converter drops those
tensors and llama.cpp drafts with the full head, as this module does.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import numpy as np

from archrun.descriptor import RopeSpec
from archrun.errors import InvalidRequest, ShapeMismatch
from archrun_blocks import reference

F32 = np.float32


@attrs.frozen
class AssistantLayer:
    """One assistant layer's weights (Matrix products, float32 vectors) and geometry."""

    sliding: bool
    n_head: int
    head_dim: int
    attn_norm: np.ndarray
    q: object                 # Matrix [d] -> [H hd]
    q_norm: np.ndarray        # [hd]
    o: object                 # Matrix [H hd] -> [d]
    post_attn_norm: np.ndarray
    ffn_norm: np.ndarray
    gate: object              # Matrix [d] -> [f]
    up: object                # Matrix [d] -> [f]
    down: object              # Matrix [f] -> [d]
    post_ffn_norm: np.ndarray
    scale: float              # layer_output_scale
    rope: reference.Rope


@attrs.frozen
class AssistantWeights:
    """The assistant's weights: pre/post projections, layers, output norm and tied head."""

    n_embd: int               # d
    n_backbone: int           # B: the target's width
    n_vocab: int
    window: int               # the sliding layers' window
    eps: float
    pre: object               # Matrix [2 B] -> [d]
    post: object              # Matrix [d] -> [B]
    head: object              # Matrix [d] -> [vocab] (token_embd)
    output_norm: np.ndarray
    layers: tuple[AssistantLayer, ...]


def make_rope(n_rot: int, freq_base: float, freq_factors: np.ndarray | None) -> reference.Rope:
    """A NEOX rope over the first n_rot dims (theta_i = pos * base^(-2i/n_rot) / factor_i)."""
    return reference.rope_neox(RopeSpec("neox", n_rot, freq_base), freq_factors)


def sliding_rows(n_seen: int, window: int) -> int:
    """The first target position a sliding layer attends from position n_seen (module docstring)."""
    return max(0, n_seen - 1 - window)


def draft_step(w: AssistantWeights, embedded: np.ndarray, hidden: np.ndarray,
               kv: Mapping[bool, tuple[np.ndarray, np.ndarray, np.ndarray]], position: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """One draft step: (logits [vocab], next hidden [B]).

    embedded [B]: the target's scaled embedding of the token at `position`; hidden [B]: the target's
    final hidden state before it (or the previous step's next hidden); kv[sliding] = (k [T, KV, hd],
    v [T, KV, hd], pos [T]): the target rows a layer of that kind attends (already windowed).
    """
    if embedded.shape != (w.n_backbone,) or hidden.shape != (w.n_backbone,):
        raise ShapeMismatch(f"the assistant takes the target's embedding and hidden state of width {w.n_backbone}, "
                            f"got {embedded.shape} and {hidden.shape}")
    norm = reference.rms_norm(w.eps)
    act = reference.gelu_tanh()
    x = w.pre(np.concatenate([embedded, hidden]).astype(F32)[None])          # [1, d]
    q_pos = np.array([position])
    for layer in w.layers:
        k, v, k_pos = kv[layer.sliding]
        if len(k_pos) == 0:
            raise InvalidRequest("the assistant drafts after the target has seen at least one token")
        u = norm(x, layer.attn_norm)
        q = norm(layer.q(u).reshape(1, layer.n_head, layer.head_dim), layer.q_norm)
        cos, sin = layer.rope.cos_sin(q_pos)
        q = layer.rope(q, cos, sin)
        a = reference.attend(q, k, v, q_pos, k_pos, 1.0, 0).reshape(1, -1)
        x = x + norm(layer.o(a), layer.post_attn_norm)
        u = norm(x, layer.ffn_norm)
        f = layer.down(act(layer.gate(u), layer.up(u)))
        x = (x + norm(f, layer.post_ffn_norm)) * F32(layer.scale)
    y = norm(x, w.output_norm)
    return w.head(y)[0], w.post(y)[0]


def draft_chain(w: AssistantWeights, embed, token: int, hidden: np.ndarray,
                kv: Mapping[bool, tuple[np.ndarray, np.ndarray, np.ndarray]], position: int, n: int
                ) -> tuple[np.ndarray, list[int]]:
    """n draft steps at `position`, each feeding the previous one's argmax and next hidden state (HF's
    argmax chain): (logits [n, vocab], tokens [n]). embed(ids) -> [len(ids), B] is the target's scaled
    embedding."""
    out, tokens = [], []
    for _ in range(n):
        logits, hidden = draft_step(w, embed(np.array([token]))[0], hidden, kv, position)
        token = int(np.argmax(logits))
        out.append(logits)
        tokens.append(token)
    return np.stack(out), tokens
