"""Exact speculative decoding: the verification maths, the loop, and the PyTorch twin runtime.

- :mod:`.sampling`: pure maths (logits processing, :func:`rejection_sample`, :func:`greedy_verify`);
- :mod:`.loop`: the draft -> verify loop over a small protocol (:class:`Drafter`, :class:`Verifier`);
- :mod:`.torch_engine`: a Hugging Face causal LM with a reused, cropped KV cache;
- :mod:`.twin`: the loop in-process on a spec's checkpoints (:class:`TwinPair`).

Only the pure parts are imported here; ``twin`` and ``torch_engine`` load transformers on use.
"""

from trt_spec.speculative.loop import (
    Draft,
    Drafter,
    Generation,
    GenerationParams,
    LoopState,
    RequestStats,
    Verifier,
    call_seed,
    expected_tokens_per_call,
)
from trt_spec.speculative.sampling import SamplingParams, greedy_verify, probabilities, rejection_sample

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
]
