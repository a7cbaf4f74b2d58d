"""``draft_target``: a smaller draft model that shares the target's tokenizer drafts every step.

The classic pairing (Leviathan et al. 2023): the draft engine proposes K tokens, keeping the
distributions it drew them from, and the target verifies them in one call. On TensorRT-LLM's engine
path the target is built with ``--speculative_decoding_mode draft_tokens_external --max_draft_len K``
and the drafts arrive as ``draft_input_ids`` (with ``draft_logits`` for probabilistic acceptance).
The context gives no drafts of its own: every step asks the draft model.
"""

from __future__ import annotations

from collections.abc import Sequence

from trt_spec.runtime.methods import LookupParams, Method, Proposal


def _ask_the_draft_model(sequence: Sequence[int], num_draft_tokens: int, lookup: LookupParams) -> Proposal | None:
    return None


METHOD = Method(
    name="draft_target",
    summary="a draft model with the target's tokenizer drafts K tokens per step",
    uses_draft_model=True,
    uses_lookup=False,
    llmapi_decoding_type="Draft_Target",
    context_drafts=_ask_the_draft_model,
)
