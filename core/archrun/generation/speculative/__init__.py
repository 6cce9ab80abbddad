"""Speculative decoding over any Decoder whose cache rewinds: draft k tokens, verify them in one step.

    from archrun.generation import speculative
    gen = speculative.generate(model, prompt, "lookup", max_tokens=128, temperature=0)
    gen.complete().timings["spec_acceptance"]   # accepted / drafted

Each round a drafter guesses the next k tokens cheaply; one multi-token target step over
[last token, *drafts] yields the target's logits at every drafted position; the longest prefix
the target agrees with is kept, the target's own token follows it, and the cache is rewound
past the rejected tail (O(1)). Greedy decoding keeps a draft iff it equals the target's choice,
so the text equals plain greedy decoding token for token: a verification step goes through the
model's span entry (`forward_step_batch_spans`), where a fused model computes every row exactly as
its one-token step does (the same bits, quantized weights included: kernels.decode.layer.decode_rows).
Where a target has no such exact span path (layers run op by op: a mixture-of-experts FFN with its
own kernel, token mixers, ops without kernel parts, a cache of another kv type than float32) the
span's logits round like a prefill's, and a near-tie may resolve the other way. Sampled decoding
uses the standard rejection rule
(accept x with probability min(1, p(x)/q(x)), else draw from max(p - q, 0)), so each token
follows the target's distribution p whatever the drafter proposes.

Drafters are plugins (hook `archrun_register_drafters`): "lookup" (n-gram match in the prompt
and output) and "draft:PATH" (a smaller model with the same vocabulary) are built in; family
plugins add drafters that need their own heads (e.g. a multi-token-prediction head, "mtp").
The draft length adapts to the acceptance measured per draft depth and the measured cost of
each round length (`AdaptiveLength`). `Speculation` is the per-sequence state the server's batch engine uses.
"""

from archrun.generation.speculative.drafters import (
    BUILTIN,
    LookupDrafter,
    ModelDrafter,
    best_match,
    check_vocabulary,
    drafters,
    make_drafter,
)
from archrun.generation.speculative.drafting import (
    MAX_DRAFT,
    Draft,
    Drafter,
    DraftSampler,
    propose,
)
from archrun.generation.speculative.lengths import (
    AdaptiveLength,
    Stats,
)
from archrun.generation.speculative.loop import (
    Speculation,
    chat,
    check_target,
    decide,
    draft_room,
    generate,
    rewind,
    run,
    settle,
)

__all__ = ['AdaptiveLength', 'BUILTIN', 'Draft', 'DraftSampler', 'Drafter', 'LookupDrafter', 'MAX_DRAFT',
    'ModelDrafter', 'Speculation', 'Stats', 'best_match', 'chat', 'check_target', 'check_vocabulary', 'decide',
    'draft_room', 'drafters', 'generate', 'make_drafter', 'propose', 'rewind', 'run', 'settle']
