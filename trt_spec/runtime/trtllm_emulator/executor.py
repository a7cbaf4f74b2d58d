"""Stages 3 and 4, executor and schedule: what the executor does with an enqueued request before
it runs: its validation (``LlmRequest::validate``, ``Executor::Impl::fetchNewRequests``), the
scheduling of one batch's requests (:mod:`trt_spec.runtime.trtllm_scheduler`), and the decoder's
setup (the draft logits' copy).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from trt_spec.runtime.prefix_cache import PrefixCachePool
from trt_spec.runtime.trtllm_emulator.errors import _check, _CppError
from trt_spec.runtime.trtllm_emulator.load import LOGITS_DTYPES, BackendConfig, EngineFacts
from trt_spec.runtime.trtllm_emulator.request import BackendRequest
from trt_spec.runtime.trtllm_scheduler import SchedulerLimits, StepRequest, schedule

# What BufferManager::copy names a tensor's data type in "Incompatible data types: %s != %s".
_DTYPE_NAMES = {"float32": "float", "float16": "half", "int32": "int32", "int64": "int64", "int8": "int8"}
_DTYPE_NAMES.update({"uint8": "uint8", "bool": "bool", "float64": "double", "uint64": "uint64"})


@dataclass
class _Admitted:
    """A request the executor took: its id, what validate left of it, where its answer goes."""

    id: int
    request: BackendRequest
    draft_tokens: list[int]
    max_new_tokens: int
    requested_outputs: tuple[str, ...]
    index: int  # its place in the batch
    draft_logits: np.ndarray | None = None  # as the request holds them (reshaped when drafts are discarded)

    def __post_init__(self) -> None:
        self.draft_logits = self.request.draft_logits

    def discard_drafts(self, kept: int) -> None:
        """``LlmRequest::discardDraftTokens``: the drafts resized, the draft logits reshaped to as many rows."""
        # Source: NVIDIA/TensorRT-LLM@00e9b8a773a690c1182ba23717e6c660a2246b70:cpp/include/tensorrt_llm/batch_manager/llmRequest.h LlmRequest::discardDraftTokens
        self.draft_tokens = self.draft_tokens[:kept]
        if self.draft_logits is not None:
            logits = np.asarray(self.draft_logits)
            self.draft_logits = logits[:kept] if logits.ndim == 2 else logits  # other shapes fail the copy anyway


def validate_request(
    request: BackendRequest, engine: EngineFacts, warn: Callable[[str], None]
) -> tuple[list[int], int]:
    """The executor's checks of a new request: returns the drafts to verify (possibly
    truncated) and the clamped max_new_tokens; ``warn`` gets what upstream logs as a warning.

    Raises: _CppError: the check that failed (the caller wraps it)."""
    prompt_len = len(request.input_tokens)
    # Source: NVIDIA/TensorRT-LLM@119c6e60e65e5ecec4e97afdb6ea584f674aed24:cpp/tensorrt_llm/batch_manager/llmRequest.cpp LlmRequest::validate
    if request.end_id is not None:
        _check(
            -1 <= request.end_id < engine.vocab_size,
            f"EndId ({request.end_id}) is not within acceptable range [-1, {engine.vocab_size}).",
        )
    if prompt_len > engine.max_input_len:
        raise _CppError(
            f"Prompt length ({prompt_len}) exceeds maximum input length ({engine.max_input_len}). Set log level "
            "to info and check TRTGptModel logs for how maximum input length is set"
        )
    drafts = list(request.draft_tokens or ())
    draft_len_per_step = engine.max_draft_len  # also subtracted when a target request sends no drafts
    if drafts:
        if len(drafts) > engine.max_draft_len:
            raise _CppError(
                f"Draft tokens length ({len(drafts)}) exceeds maximum draft tokens length ({engine.max_draft_len})."
            )
        draft_len_per_step = len(drafts)
        if prompt_len + draft_len_per_step > engine.max_input_len:
            fitting = engine.max_input_len - prompt_len
            warn(
                f"Prompt length + number of draft tokens ({prompt_len} + {draft_len_per_step}) exceeds maximum "
                f"input length ({engine.max_input_len}).Number of draft tokens is changed to ({fitting})"
            )
            draft_len_per_step = fitting
            drafts = drafts[:fitting]
    max_new_tokens = request.max_new_tokens
    if prompt_len + max_new_tokens + draft_len_per_step > engine.max_seq_len:
        clamped = engine.max_seq_len - prompt_len - draft_len_per_step
        warn(
            "Prompt length + number of requested output tokens + draft tokens per step "
            f"({prompt_len} + {max_new_tokens} + {draft_len_per_step}) exceeds maximum sequence length "
            f"({engine.max_seq_len}). Number of requested output tokens is changed to ({clamped})."
        )
        max_new_tokens = clamped
    # Source: NVIDIA/TensorRT-LLM@b35ac1b64368513d215c57d2ed01d62d910df8da:cpp/tensorrt_llm/executor/executorImpl.cpp Executor::Impl::fetchNewRequests
    if request.return_context_logits:  # the emulated engines never gather context logits
        _check(False, "Return context logit need to build engine with gather_context_logits")
    if request.return_generation_logits:
        _check(
            engine.gather_generation_logits,
            "To return generation logits, gather_generation_logits must be enabled in ExecutorConfig",
        )
    return drafts, max_new_tokens


def schedule_batch(
    admitted: list[_Admitted],
    engine: EngineFacts,
    config: BackendConfig,
    pool: PrefixCachePool,
    note: Callable[[str], None],
) -> None:
    """The executor's steps over the admitted requests: discards the drafts its scheduler
    discards (and their draft logits' rows, as ``discardDraftTokens`` reshapes them); ``note``
    gets what upstream logs at debug level. ``pool``: the KV caches a request may reuse.

    Raises: SchedulingError: a step's check failed (every admitted request fails with it)."""
    limits = SchedulerLimits(
        max_batch_size=engine.max_batch_size,
        max_num_tokens=engine.max_num_tokens,
        tokens_per_block=engine.tokens_per_block,
        chunked_context=bool(config.parameters["enable_chunked_context"]),
    )
    steps = [
        StepRequest(
            prompt_len=len(entry.request.input_tokens),
            num_draft_tokens=len(entry.draft_tokens),
            reused_len=pool.longest_cached_prefix(entry.request.input_tokens),
            max_new_tokens=max(1, entry.max_new_tokens),
        )
        for entry in admitted
    ]
    outcome = schedule(steps, limits)
    for entry, kept in zip(admitted, outcome.kept_drafts):
        if kept < len(entry.draft_tokens):
            # Source: NVIDIA/TensorRT-LLM@b8b7b782622c5dc57307f42ea96628f66b34f922:cpp/tensorrt_llm/batch_manager/microBatchScheduler.cpp MicroBatchScheduler::fitDraftTokens (TLLM_LOG_DEBUG)
            note(f"Discarding {len(entry.draft_tokens) - kept} draft tokens (request {entry.id})")
            entry.discard_drafts(kept)


def draft_probabilities(drafts: list[int], logits: np.ndarray | None, engine: EngineFacts) -> torch.Tensor | None:
    """q = softmax(draft_logits) [k, V], after the decoder's copy of the logits sent (``logits``:
    as the request holds them) into its [k, vocabSizePadded] buffer of the engine's logits
    dtype (no temperature, top-k or top-p)."""
    if not drafts or logits is None:
        return None
    engine_dtype = np.dtype(LOGITS_DTYPES[engine.logits_dtype])
    # Source: NVIDIA/TensorRT-LLM@b35ac1b64368513d215c57d2ed01d62d910df8da:cpp/tensorrt_llm/batch_manager/createNewDecoderRequests.cpp newRequestDraftTokensExternal, retrieveDraftLogits
    # Source: NVIDIA/TensorRT-LLM@1a43c7d62d008ca9d1efdfd50f9180390598d314:cpp/tensorrt_llm/runtime/bufferManager.cpp BufferManager::copy
    _check(
        logits.dtype == engine_dtype,
        f"Incompatible data types: {_dtype_name(logits.dtype)} != {_dtype_name(engine_dtype)}",
    )
    expected_bytes = len(drafts) * engine.vocab_size * engine_dtype.itemsize
    _check(logits.nbytes == expected_bytes, f"Incompatible buffer sizes: {logits.nbytes} != {expected_bytes}")
    rows = torch.from_numpy(np.ascontiguousarray(logits).reshape(len(drafts), -1).astype(np.float32))
    # Source: NVIDIA/TensorRT-LLM@1d263f15a979ef2902c60de3f6238bcc0952bb29:cpp/tensorrt_llm/layers/externalDraftTokensLayer.cpp ExternalDraftTokensLayer::acceptDraftTokens (invokeAddBiasSoftMax over the draft logits as given)
    return rows.softmax(dim=-1)


def _dtype_name(dtype: np.dtype) -> str:
    return _DTYPE_NAMES.get(np.dtype(dtype).name, np.dtype(dtype).name)
