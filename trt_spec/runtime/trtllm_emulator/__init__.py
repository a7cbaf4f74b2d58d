"""An emulator of TensorRT-LLM 1.2.x's C++ Triton backend (``backend: "tensorrtllm"``) on CPU.

The tensorrtllm flavor's engine models ``tensorrt_llm`` (target) and ``tensorrt_llm_draft`` run in
TensorRT-LLM's C++ backend, which needs a GPU and compiled engines. This package does on a CPU
what that backend does with the same ``config.pbtxt`` and the same request tensors, with a
PyTorch model (:class:`~trt_spec.runtime.torch_engine.TorchCausalLM`) computing the logits the
engine would. It was written from TensorRT-LLM's source, and every rule it enforces names its
origin in a ``# Source: NVIDIA/TensorRT-LLM@<commit>:<path> <function>`` comment. Commit
``0c8de69`` is 1.2.0rc8 and ``b35ac1b`` is 1.2.0rc2 (their ``tensorrt_llm/version.py``); the other
commits are the stored copies read, whose release was not pinned.

What a request goes through, stage by stage (each with its module), and how each stage's errors
reach a client (:mod:`.errors`: the message texts are upstream's):

1. **load** (:mod:`.load`: :meth:`TrtllmBackendEmulator.load`, :class:`BackendConfig`): the model
   config's parameters, read as ``ModelInstanceState``'s constructor reads them, in its order. A
   failure is ``unexpected error when creating modelInstanceState: <what>``. Parameters that have
   a default fall back to it, as upstream does, when they are absent or do not parse; one given
   but unusable adds a line to :attr:`TrtllmBackendEmulator.warnings`.
2. **enqueue** (:mod:`.request`: :class:`BackendRequest`): the request's tensors into an executor
   request (``utils.cc createRequestsFromInputTensors``). A failure is the exception text itself.
3. **executor** (:mod:`.executor`): the executor's validation of a new request
   (``LlmRequest::validate`` and ``Executor::Impl::fetchNewRequests``), then the decoder's setup
   (the draft logits' copy). A failure is ``Executor failed process requestId <n> due to the
   following error: <where>: <what>``.
4. **schedule** (:mod:`.executor`): the requests that reached the executor together (one Triton
   batch) go through its steps as :mod:`trt_spec.runtime.trtllm_scheduler` models them: within
   ``max_batch_size`` and ``max_num_tokens``, chunked context as configured, and a target
   request's drafts discarded where ``fitDraftTokens`` discards them. A failed scheduling check
   fails every request of the batch, as it fails every active request upstream.
5. **run** (:mod:`.verify`): decoding (:func:`decode_tokens`), or one external-draft-tokens
   verification step (:func:`verify_drafts`) over the model's logits, with KV caches reused by
   token prefix (:class:`~trt_spec.runtime.prefix_cache.PrefixCachePool`).
6. **response** (:mod:`.backend`, ``fillTritonResponse``): the output tensors, and with
   ``return_perf_metrics`` the speculative-decoding counts (``total_draft_tokens``: the drafts
   verified, after any discarded); with ``return_log_probs`` ``output_log_probs`` and
   ``cum_log_probs``, with ``return_num_input_tokens`` / ``return_num_output_tokens`` the counts,
   as :mod:`~trt_spec.runtime.engine_interface` computes them for both flavors. A failure is
   ``Error encountered while populating response: <what>``.

:class:`TrtllmBackendEmulator` (:mod:`.backend`) runs the stages for one engine model.

Not emulated: the engine directory (``gpt_model_path`` is not checked to exist: there is no
engine on a CPU), beam search, streaming and batched requests in decoupled mode, the inputs
declared but not supported (``len_penalty``, guided decoding, LoRA, ...: refused unless neutral),
log probs of a draft-tokens request (refused), perf metrics other than the speculative counts (the
``kv_cache_*`` and timing outputs are never sent), context logits, orchestrator mode,
FP16 arithmetic (probabilities are float32 whatever the engine dtype), and what the scheduler
module lists.

One batch at a time (the caller serialises ``execute_batch``). Standard library, numpy and torch
only: this package is copied into model repositories with the rest of :mod:`trt_spec.runtime`.
"""

from trt_spec.runtime.trtllm_emulator.backend import BatchItem, TrtllmBackendEmulator
from trt_spec.runtime.trtllm_emulator.errors import BackendError
from trt_spec.runtime.trtllm_emulator.load import (
    DECODING_MODES,
    LOGITS_DTYPES,
    LOOKAHEAD_PARAMETERS,
    ROLES,
    SCHEDULER_POLICIES,
    BackendConfig,
    EngineFacts,
)
from trt_spec.runtime.trtllm_emulator.request import NOT_EMULATED_INPUTS, BackendRequest, convert_word_list
from trt_spec.runtime.trtllm_emulator.verify import (
    accept_by_probability,
    accept_by_token_match,
    decode_tokens,
    ends_with_stop_word,
    truncate_at_stop,
    verify_drafts,
)

__all__ = [
    "DECODING_MODES",
    "LOGITS_DTYPES",
    "LOOKAHEAD_PARAMETERS",
    "NOT_EMULATED_INPUTS",
    "ROLES",
    "SCHEDULER_POLICIES",
    "BackendConfig",
    "BackendError",
    "BackendRequest",
    "BatchItem",
    "EngineFacts",
    "TrtllmBackendEmulator",
    "accept_by_probability",
    "accept_by_token_match",
    "convert_word_list",
    "decode_tokens",
    "ends_with_stop_word",
    "truncate_at_stop",
    "verify_drafts",
]
