"""TensorRT-LLM 1.2.x's executor scheduling, step by step, for the backend emulator.

The executor runs every request in flight through iterations ("steps"). Each step the capacity
scheduler admits requests (at most ``max_batch_size``; ``guaranteed_no_evict`` never pauses one),
and the micro-batch scheduler picks what runs within ``max_num_tokens``: a generation request
costs one token plus its drafts, a context request its remaining prompt plus its drafts when this
is its last chunk. When the contexts do not all fit and chunked context is on, they are cut into
chunks (first come, first served, truncated chunks floored to a KV-cache block), and then
``fitDraftTokens`` **discards the drafts of a last chunk that do not fit** in the rest of its
block, the step's token capacity, or the context limit. That is the one scheduling outcome that
changes what a request returns: a draft-tokens target request then verifies fewer drafts than
it was sent (and reports so in ``total_draft_tokens``), and one left with none is no longer a
draft-tokens request: it decodes up to its ``request_output_len`` like any other. With chunked
context off, a context that passes the limit fails the step, and with it every request in flight.

What the scheduler sees of a new request is its whole prompt: KV-cache reuse is found when the
request's blocks are allocated, after it was scheduled, so it shortens later chunks only
(``LlmRequest::setPrepopulatedPromptLen``); this module takes the reused length as given.

Pure and deterministic: :func:`schedule` runs the steps of one batch of requests that arrived
together and returns, per request, the drafts it keeps. Sources (commit ``b35ac1b`` is
1.2.0rc2; ``b8b7b78`` is 0.21.0rc0, whose scheduling core is the one 1.2.0rc2 calls, unchanged
in later stored copies):

- ``cpp/tensorrt_llm/batch_manager/microBatchScheduler.cpp`` @ b8b7b782622c5dc57307f42ea96628f66b34f922
  ``MicroBatchScheduler::operator()``, ``setCtxRequestsChunkSize``, ``fitDraftTokens``;
- ``cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.cpp`` @ b35ac1b64368513d215c57d2ed01d62d910df8da
  the constructor (chunk unit = tokens per KV block; the context limit is ``max_num_tokens`` when
  chunked context or context FMHA is on), ``forwardAsync`` (a scheduling error terminates every
  active request);
- ``cpp/tensorrt_llm/batch_manager/capacityScheduler.cpp`` @ cf6abc45df6e3470d8c378366896882e1f43e60c
  ``GuaranteedNoEvictScheduler`` (admission in order, up to the number of sequences);
- ``cpp/include/tensorrt_llm/batch_manager/llmRequest.h`` @ 00e9b8a773a690c1182ba23717e6c660a2246b70
  ``setPrepopulatedPromptLen``, ``discardDraftTokens``.

Not modelled: the KV-cache block budget of the capacity scheduler (the plan sizes the cache for
``max_batch_size`` full sequences), ``max_utilization`` pausing, the equal-progress chunking
policy (the backend's default is first come, first served), requests that arrive while a batch
runs (they form the next batch), and a generation request that ends early at ``end_id`` (it keeps
its place until its ``max_new_tokens``; only a draft engine's requests generate, and they carry
no drafts to discard).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

CONTEXT_LIMIT_MESSAGE = "The number of context tokens ({}) exceeds the limit value ({})"


class SchedulingError(Exception):
    """A ``TLLM_CHECK`` that fails inside a step: upstream terminates every active request with
    ``Encountered an error in forwardAsync function: <message>``."""


@dataclass(frozen=True)
class SchedulerLimits:
    """The executor's limits for one engine."""

    max_batch_size: int
    max_num_tokens: int
    tokens_per_block: int  # the KV cache's; the chunk unit
    chunked_context: bool  # enable_chunked_context, after the executor's fix-up

    def __post_init__(self) -> None:
        if min(self.max_batch_size, self.max_num_tokens, self.tokens_per_block) < 1:
            raise ValueError(f"scheduler limits must be >= 1: {self}")

    @property
    def max_context_length(self) -> int:
        # Source: NVIDIA/TensorRT-LLM@b35ac1b64368513d215c57d2ed01d62d910df8da:cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.cpp TrtGptModelInflightBatching::TrtGptModelInflightBatching (maxContextLength)
        # Our engines are built with paged context FMHA, so context FMHA is on: max_num_tokens.
        return self.max_num_tokens

    @property
    def chunk_unit(self) -> int:
        return min(self.tokens_per_block, self.max_context_length)


@dataclass(frozen=True)
class StepRequest:
    """What the scheduler knows of one executor request.

    ``prompt_len``: its input tokens; ``num_draft_tokens``: the drafts it carries (after
    ``validate``); ``reused_len``: prompt tokens found in the KV cache when it is first allocated;
    ``max_new_tokens``: after ``validate``'s clamp. A request that still carries drafts when its
    context ends is a draft-tokens target request and ends after that step (``updateRequests``);
    one without (never had any, or all discarded) generates up to ``max_new_tokens``.
    """

    prompt_len: int
    num_draft_tokens: int = 0
    reused_len: int = 0
    max_new_tokens: int = 1


@dataclass
class _Active:
    request: StepRequest
    drafts: int
    position: int = 0  # context tokens done
    allocated: bool = False  # blocks allocated (reuse known)
    generated: int = 0  # generation steps done
    generation_steps: int = 0  # decided when the context ends
    chunk: int = 0

    @property
    def in_context(self) -> bool:
        return self.position < self.request.prompt_len

    @property
    def remaining(self) -> int:
        return self.request.prompt_len - self.position

    @property
    def done(self) -> bool:
        return not self.in_context and self.generated >= self.generation_steps

    def last_chunk(self) -> bool:
        return self.position + self.chunk == self.request.prompt_len


@dataclass
class Schedule:
    """The outcome of :func:`schedule`: per request, the drafts kept and the steps it ran in."""

    kept_drafts: list[int]
    steps: int = 0
    discarded: list[int] = field(default_factory=list)  # drafts discarded per request


def schedule(requests: Sequence[StepRequest], limits: SchedulerLimits) -> Schedule:
    """Run the executor's steps over ``requests`` (in arrival order) until all are done.

    Raises:
        SchedulingError: a step's ``TLLM_CHECK`` failed (chunked context off and a context longer
            than the limit): every request of the batch fails with it.
    """
    active = [_Active(request, request.num_draft_tokens) for request in requests]
    steps = 0
    while any(not entry.done for entry in active):
        running = [entry for entry in active if not entry.done][: limits.max_batch_size]  # capacity scheduler
        _step(running, limits)
        steps += 1
    kept = [entry.drafts for entry in active]
    return Schedule(kept, steps, [r.num_draft_tokens - k for r, k in zip(requests, kept)])


def _step(running: list[_Active], limits: SchedulerLimits) -> None:
    """One ``MicroBatchScheduler::operator()`` and the step it schedules."""
    # Source: NVIDIA/TensorRT-LLM@b8b7b782622c5dc57307f42ea96628f66b34f922:cpp/tensorrt_llm/batch_manager/microBatchScheduler.cpp MicroBatchScheduler::operator()
    capacity = limits.max_num_tokens
    max_context = limits.max_context_length
    batch_tokens = 0
    scheduled = 0
    contexts: list[_Active] = []  # scheduled whole (chunking off) or to be chunked
    generations: list[_Active] = []
    chunked_tokens = 0
    all_fit = True
    for entry in running:
        if entry.in_context and not limits.chunked_context:
            tokens = entry.request.prompt_len + entry.drafts  # getNumTokens: the whole prompt
            if tokens > max_context:
                raise SchedulingError(
                    "[TensorRT-LLM][ERROR] Assertion failed: " + CONTEXT_LIMIT_MESSAGE.format(tokens, max_context)
                )
            if batch_tokens + tokens > capacity:
                break
            entry.chunk = entry.remaining
            contexts.append(entry)
            batch_tokens += tokens
        elif entry.in_context:
            entry.chunk = entry.remaining
            tokens = entry.chunk + (entry.drafts if entry.last_chunk() else 0)
            if tokens > max_context:
                tokens = max_context  # chunked below
                all_fit = False
            contexts.append(entry)
            chunked_tokens += tokens
        else:
            tokens = 1 + entry.drafts  # beam width 1
            if batch_tokens + tokens > capacity:
                break
            generations.append(entry)
            batch_tokens += tokens
        scheduled += 1
        if scheduled >= limits.max_batch_size:
            break
    if limits.chunked_context:
        if chunked_tokens > capacity - batch_tokens:
            all_fit = False
        if not all_fit:
            _chunk_first_come_first_served(contexts, capacity - batch_tokens, limits)
            _fit_draft_tokens(contexts, capacity - batch_tokens, limits)
    for entry in contexts:
        _run_context_chunk(entry, limits)
    for entry in generations:
        entry.generated += 1


def _chunk_first_come_first_served(contexts: list[_Active], capacity: int, limits: SchedulerLimits) -> None:
    # Source: NVIDIA/TensorRT-LLM@b8b7b782622c5dc57307f42ea96628f66b34f922:cpp/tensorrt_llm/batch_manager/microBatchScheduler.cpp MicroBatchScheduler::setCtxRequestsChunkSize<kFIRST_COME_FIRST_SERVED>
    for entry in contexts:
        suggested = entry.remaining
        actual = min(capacity, suggested, limits.max_context_length)
        if actual != suggested:
            actual = actual // limits.chunk_unit * limits.chunk_unit
        entry.chunk = actual
        capacity -= actual


def _fit_draft_tokens(contexts: list[_Active], capacity: int, limits: SchedulerLimits) -> None:
    """Drafts of a last chunk may fill the rest of its KV block, within the context limit and the
    step's capacity; the rest are discarded for good (``LlmRequest::discardDraftTokens``)."""
    # Source: NVIDIA/TensorRT-LLM@b8b7b782622c5dc57307f42ea96628f66b34f922:cpp/tensorrt_llm/batch_manager/microBatchScheduler.cpp MicroBatchScheduler::fitDraftTokens
    unit = limits.chunk_unit
    context_tokens = sum(entry.chunk for entry in contexts)
    for entry in contexts:
        if entry.chunk == 0 or not entry.last_chunk() or entry.drafts == 0:
            continue  # a chunk of 0 is not scheduled this step; isLastContextChunk is false for it
        remainder = entry.chunk % unit
        space = 0 if remainder == 0 else unit - remainder
        space = min(space, limits.max_context_length - entry.chunk)
        space = min(space, capacity - context_tokens)
        context_tokens += space
        if entry.drafts - space > 0:
            entry.drafts = max(0, space)


def _run_context_chunk(entry: _Active, limits: SchedulerLimits) -> None:
    """The step runs the chunk; on its first allocation the reused prefix moves the position
    (``LlmRequest::setPrepopulatedPromptLen``: a chunk that would not reach the prompt's end is
    floored to a block boundary)."""
    # Source: NVIDIA/TensorRT-LLM@00e9b8a773a690c1182ba23717e6c660a2246b70:cpp/include/tensorrt_llm/batch_manager/llmRequest.h LlmRequest::setPrepopulatedPromptLen
    if entry.chunk == 0:
        return
    chunk = entry.chunk
    if not entry.allocated:
        entry.allocated = True
        reused = min(entry.request.reused_len, entry.request.prompt_len - 1)
        if reused > 0:
            if reused + chunk < entry.request.prompt_len:
                end = (reused + chunk) // limits.tokens_per_block * limits.tokens_per_block
                chunk = max(0, end - reused)
            entry.position = reused
            chunk = min(chunk, entry.remaining)
    entry.position += chunk
    entry.chunk = 0
    if not entry.in_context:
        # Source: NVIDIA/TensorRT-LLM@b35ac1b64368513d215c57d2ed01d62d910df8da:cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.cpp TrtGptModelInflightBatching::updateRequests (a draft-tokens request is terminated after its step)
        entry.generation_steps = 0 if entry.drafts else entry.request.max_new_tokens - 1
