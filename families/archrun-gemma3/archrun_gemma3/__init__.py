"""archrun family plugin for Gemma 3 (descriptions only, no math).

What gemma3 files do not say (llama.cpp src/models/gemma3.cpp, HF modeling_gemma3.py):
- rope pairing NEOX; sliding (local) layers rotate plain: rope.freq_base_swa (default 10000) and
  no scaling (`swa_rope="plain"`; llama.cpp: freq_scale_swa 1; HF: the local layers' default rope);
- unless attention.sliding_window_pattern is present, layer i is sliding iff i % 6 < 5;
- token embeddings are scaled by sqrt(n_embd); the FFN is GeGLU with tanh-GELU;
- sandwich norms (post_attention_norm, post_ffw_norm) are found by tensor presence, and the
  converter already added 1 to every norm weight, so plain RMSNorm applies;
- the file carries no chat template: the default below is Gemma's turn format.
"""

from __future__ import annotations

from archrun.family import TRANSFORMER, FamilyHints, FamilyPlugin

# Gemma's turn format (system text is prepended to the first user turn, as Gemma's own template does).
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)

HINTS = {
    "gemma3": FamilyHints(
        name="gemma3",
        rope_pairing="neox",
        activation="gelu_tanh",
        embed_scale="sqrt_n_embd",
        swa_period=6,
        swa_rope="plain",
        defaults={"rope.freq_base_swa": 10000.0},
        chat_template=CHAT_TEMPLATE,
        **TRANSFORMER,
    ),
}


plugin = FamilyPlugin(HINTS)
