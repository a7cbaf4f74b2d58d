"""``hybrid``: prompt lookup where the context has a match, the draft model where it has none.

Copy-heavy stretches (an edit that repeats the code it was given, an answer quoting its document)
draft for free from the request's own tokens; elsewhere the draft model drafts as ``draft_target``
does. A step's drafts come from one source, so verification is unchanged (the draft model's steps
carry their distributions, the lookup's are point masses): each step is exact, and so is the
sequence of steps, since which source drafts depends only on tokens already emitted.
"""

from __future__ import annotations

from collections.abc import Sequence

from trt_spec.runtime.methods import PROMPT_LOOKUP, LookupParams, Method, Proposal
from trt_spec.runtime.methods.prompt_lookup import ngram_proposal


def _lookup_else_draft_model(sequence: Sequence[int], num_draft_tokens: int, lookup: LookupParams) -> Proposal | None:
    tokens = ngram_proposal(sequence, num_draft_tokens, lookup.min_ngram, lookup.max_ngram)
    return Proposal(tokens, PROMPT_LOOKUP) if tokens else None


METHOD = Method(
    name="hybrid",
    summary="prompt lookup where the request's tokens match, else the draft model",
    uses_draft_model=True,
    uses_lookup=True,
    llmapi_decoding_type=None,  # TensorRT-LLM's PyTorch backend has no drafter that combines the two
    context_drafts=_lookup_else_draft_model,
)
