"""The public API of exact speculative decoding: ``from trt_spec.speculative import rejection_sample``.

The maths and the loop live in the runtime package, the code a model repository carries:

- :mod:`trt_spec.runtime.sampling`: pure maths (logits processing, :func:`rejection_sample`,
  :func:`greedy_verify`, and :func:`verify_drafts`, which picks the verification of a step);
- :mod:`trt_spec.runtime.loop`: the draft -> verify loop over a small protocol (:class:`Drafter`,
  :class:`Verifier`);
- :mod:`trt_spec.twin`: the loop in-process on a spec's two checkpoints (:class:`TwinPair`),
  through the engine models the torch flavor serves.
"""

from trt_spec.runtime.costs import expected_tokens_per_call
from trt_spec.runtime.loop import (
    Draft,
    Drafter,
    Generation,
    GenerationParams,
    LoopState,
    RequestStats,
    Verifier,
    call_seed,
)
from trt_spec.runtime.sampling import SamplingParams, greedy_verify, probabilities, rejection_sample, verify_drafts

__all__ = [
    "Draft",
    "Drafter",
    "Generation",
    "GenerationParams",
    "LoopState",
    "RequestStats",
    "SamplingParams",
    "Verifier",
    "call_seed",
    "expected_tokens_per_call",
    "greedy_verify",
    "probabilities",
    "rejection_sample",
    "verify_drafts",
]
