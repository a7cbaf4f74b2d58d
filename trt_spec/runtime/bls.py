"""The loop model's logic: :class:`~trt_spec.runtime.loop.LoopState` driven by async calls to
the two engine models, by TensorRT-LLM's tensor names, with the streaming window protocol.

Library code without Triton: ``models/spec_loop/model.py`` supplies an
:class:`EngineClient` (``pb_utils.InferenceRequest(...).async_exec()``), a response sender and the
cancellation check; tests drive the same code against in-process engines.

A request may carry N prompts (TensorRT-LLM's ensemble takes a batch): :func:`read_loop_requests`
makes one :class:`LoopRequest` per row, each run on its own (so each prompt's greedy output is a
lone request's) and answered with its own responses (:func:`response_arrays`, ``batch_index``).

Per iteration: the draft engine is asked for K tokens (``request_output_len`` = K; it may return
fewer, e.g. after ``end_id``), the target for ``request_output_len`` = len(drafts) + 1 with
``draft_input_ids`` (and ``draft_logits`` when the loop's ``use_draft_logits`` parameter is set and
the request samples); the target's answer is committed to the state. K follows load: a request
that sends no ``num_draft_tokens`` drafts at most the loop's K schedule at the number of requests
in flight (``LoopParameters.k_schedule``; 0 = a plain target call); one that sends it keeps its
K. A plain call asks for several tokens when nothing needs them one by one (:func:`plain_call_len`:
not streamed, no log probabilities), one BLS round trip for many tokens. Both engines get the request's ``end_id``, ``pad_id`` and stop words, as TensorRT-LLM's own
BLS model sends them (``triton_backend/all_models/inflight_batcher_llm/tensorrt_llm_bls/1/lib/triton_decoder.py``,
``_get_llm_tensors_from_request``), so the target stops where the draft does; and the same
penalties, bad words and embedding bias, with ``min_tokens`` = what is left of the request's
minimum, always sent (TensorRT-LLM's default is 1 per request, which would forbid ``end_id`` as
the first token of every call: :mod:`trt_spec.runtime.penalties`). Each engine applies them per
position, drafts included, so the draft's q and the target's p are the distributions of the
request as one call would see them. ``return_log_probs``: the target's generation logits of each
call give the log probability of every emitted token under the target's adjusted scores, before
top-k and top-p (:func:`emitted_log_probs`).

What TensorRT-LLM 1.2.x's backend and its external-draft-tokens layer do, and what follows here
(each rule is also enforced by ``trtllm_emulator.py``):

- a target call with drafts runs ONE verification step and returns the accepted drafts plus one
  token, whatever ``request_output_len`` says (``cpp/tensorrt_llm/batch_manager/
  trtGptModelInflightBatching.cpp``, ``updateRequests``: a draft_tokens_external request with
  draft tokens is terminated after its step), so len(drafts) + 1 costs nothing extra;
- every response must request ``output_ids`` AND ``sequence_length`` or it is an error
  (``triton_backend/inflight_batcher_llm/src/model_instance_state.cc``, ``fillTritonResponse``);
- with ``draft_logits`` the target takes the draft's distribution as softmax(draft_logits), with
  no temperature, top-k or top-p (``cpp/tensorrt_llm/layers/externalDraftTokensLayer.cpp``,
  ``acceptDraftTokens``), while the draft engine's ``generation_logits`` are its raw logits
  (``cpp/tensorrt_llm/batch_manager/handleGenerationLogits.cpp``): the loop therefore sends the
  log of the distribution the draft actually sampled from (:func:`draft_distribution_logits`);
- without ``draft_logits`` the target accepts a draft when its own sample equals it, but after a
  rejection draws a fresh token from its distribution instead of keeping that sample
  (``externalDraftTokensKernels.cu``, ``acceptDraftTokensKernel`` and the layer's
  ``multinomialSampling``), which biases sampled output toward the draft token: a sampled
  request on engines without generation logits is decoded plainly (K = 0); greedy requests
  (exact token matching) speculate as usual. Unless ``sampled_token_match`` is set: the target
  engine keeps its own sample (the torch flavor's twin, serving an llmapi route whose TensorRT-LLM
  1.3+ verifies sampled drafts by exact match), so sampled requests speculate too. The loop model's config
parameters are :class:`~trt_spec.runtime.parameters.LoopParameters` (``settings`` below). We never send
``draft_acceptance_threshold``: a threshold makes acceptance inexact. Each engine call gets its
own seed derived from the request's (:func:`~trt_spec.runtime.loop.call_seed`); a request
without a seed gets a fresh random one.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from trt_spec.runtime import tensors as T
from trt_spec.runtime.errors import GenerationParamsError
from trt_spec.runtime.loop import PLAIN_DECODING, GenerationParams, LoopState, call_seed
from trt_spec.runtime.methods import DRAFT_MODEL, PROMPT_LOOKUP
from trt_spec.runtime.parameters import LoopParameters
from trt_spec.runtime.penalties import NEUTRAL_TEMPERATURE, Penalties, adjusted_scores
from trt_spec.runtime.sampling import GREEDY_TEMPERATURE, filtered_softmax

_SEED_BITS = 63
MASKED_LOGIT = -1e30  # a softmax weight of exactly 0 in float32, the draft_logits dtype


class EngineCallError(RuntimeError):
    """An engine model failed or refused a call; the message names the model and says why."""


class EngineClient(Protocol):
    async def infer(
        self, model: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        """Run one request on ``model``; the requested outputs by name (absent ones missing).

        Raises:
            EngineCallError: the model answered with an error.
        """


@dataclass(frozen=True)
class LoopRequest:
    """One prompt of a loop-model request, from preprocessing's tensors (defaults already resolved)."""

    prompt: list[int]
    params: GenerationParams
    end_id: int
    pad_id: int
    stop_words_list: np.ndarray  # [1, 2, L]: TensorRT-LLM's format, sent to both engines as it came
    seed: int
    stream: bool
    exclude_input_in_output: bool = True  # false: a non-streamed text_output starts with the prompt
    return_num_input_tokens: bool = False  # fill num_input_tokens
    return_num_output_tokens: bool = False  # num_output_tokens as TensorRT-LLM counts it (tensors.py)
    batch_index: int = 0  # this prompt's row in its request
    batch_size: int = 1  # the prompts of its request
    penalties: Penalties = Penalties()  # min_tokens: the request's
    bad_words_list: np.ndarray | None = None  # [1, 2, L]: TensorRT-LLM's format; None = no bad words
    embedding_bias: np.ndarray | None = None  # [1, V] float32; None = no bias
    return_log_probs: bool = False
    # The request sent no num_draft_tokens (its K is the spec's): the loop's K schedule caps it.
    follows_schedule: bool = False

    def temperature_for_scores(self) -> float:
        """The temperature the engines scale by: greedy requests send none (1)."""
        sampling = self.params.sampling
        return NEUTRAL_TEMPERATURE if sampling.greedy else sampling.temperature


def _value(inputs: Mapping[str, np.ndarray], name: str) -> bool | int | float | None:
    array = inputs.get(name)
    return None if array is None else array.reshape(-1)[0].item()


def _required_value(inputs: Mapping[str, np.ndarray], name: str) -> bool | int | float:
    """The value of an input :func:`read_loop_requests` checked is present (a preprocessing output)."""
    return inputs[name].reshape(-1)[0].item()


def read_loop_requests(inputs: Mapping[str, np.ndarray], settings: LoopParameters) -> list[LoopRequest]:
    """The loop model's inputs (each ``[N, ...]``: one row per prompt) -> one :class:`LoopRequest`
    per prompt; ``settings``: the loop model's config parameters.

    Raises:
        GenerationParamsError: a value the loop cannot run with (preprocessing checks the rest).
    """
    # num_draft_tokens_is_default may be absent (a caller of the loop model that is not our
    # preprocessing): the request then keeps its num_draft_tokens, the K schedule left aside.
    optional = {T.NUM_DRAFT_TOKENS_IS_DEFAULT.name}
    missing = [t.name for t in T.PREPROCESSING_OUTPUTS if t.name not in inputs and t.name not in optional]
    if missing:
        raise GenerationParamsError(f"the loop model needs {', '.join(missing)} (preprocessing's outputs)")
    size = inputs[T.INPUT_IDS.name].shape[0]
    for name, array in inputs.items():
        if array.ndim == 0 or array.shape[0] != size:
            raise GenerationParamsError(f"{name} has {list(array.shape)} rows; input_ids has {size} (one per prompt)")
    return [
        _read_prompt({name: array[row : row + 1] for name, array in inputs.items()}, settings, row, size)
        for row in range(size)
    ]


def read_loop_request(inputs: Mapping[str, np.ndarray], settings: LoopParameters) -> LoopRequest:
    """:func:`read_loop_requests` for a request of one prompt.

    Raises:
        GenerationParamsError: as there, or the request holds several prompts.
    """
    requests = read_loop_requests(inputs, settings)
    if len(requests) != 1:
        raise GenerationParamsError(f"expected one prompt; got {len(requests)}")
    return requests[0]


def _read_prompt(inputs: Mapping[str, np.ndarray], settings: LoopParameters, row: int, size: int) -> LoopRequest:
    input_ids = inputs[T.INPUT_IDS.name].reshape(-1)
    length = int(_required_value(inputs, T.INPUT_LENGTHS.name))
    end_id = int(_required_value(inputs, T.END_ID.name))
    num_draft_tokens = int(_required_value(inputs, T.NUM_DRAFT_TOKENS.name))
    if num_draft_tokens > settings.max_draft_len:
        raise GenerationParamsError(
            f"num_draft_tokens must be at most the target engine's max_draft_len {settings.max_draft_len}; "
            f"got {num_draft_tokens}"
        )
    temperature = float(_required_value(inputs, T.ENGINE_TEMPERATURE.name))
    if temperature != GREEDY_TEMPERATURE and not settings.use_draft_logits and not settings.sampled_token_match:
        num_draft_tokens = PLAIN_DECODING  # token matching is not exact on the engines (docstring)
    adaptive = _value(inputs, T.ADAPTIVE_DRAFT.name)
    adaptive = settings.adaptive_draft if adaptive is None else bool(adaptive)
    stop_words = inputs[T.STOP_WORDS_LIST.name]
    params = GenerationParams(
        max_new_tokens=int(_required_value(inputs, T.REQUEST_OUTPUT_LEN.name)),
        temperature=temperature,
        top_k=int(_required_value(inputs, T.RUNTIME_TOP_K.name)),
        top_p=float(_required_value(inputs, T.RUNTIME_TOP_P.name)),
        num_draft_tokens=num_draft_tokens,
        adaptive_draft=adaptive and num_draft_tokens > 0,
        eos_token_ids=frozenset({end_id}),
        stop_sequences=T.stop_words_from_list(stop_words[0].tolist()),
        step_costs=settings.step_costs(),
    )
    seed, alias = _value(inputs, T.SEED.name), _value(inputs, T.RANDOM_SEED.name)
    if seed is not None and alias is not None and seed != alias:
        raise GenerationParamsError(
            f"{T.RANDOM_SEED.name} is an alias of {T.SEED.name}: send one, or the same value in both; "
            f"got {seed} and {alias}"
        )
    seed = seed if seed is not None else alias
    bad_words = inputs[T.BAD_WORDS_LIST.name]
    bias = inputs[T.EMBEDDING_BIAS.name].reshape(-1).astype(np.float32)
    has_bias = bool(bias.size and np.any(bias))
    penalties = Penalties(  # raises GenerationParamsError on a bad value
        repetition_penalty=float(_required_value(inputs, T.ENGINE_REPETITION_PENALTY.name)),
        presence_penalty=float(_required_value(inputs, T.ENGINE_PRESENCE_PENALTY.name)),
        frequency_penalty=float(_required_value(inputs, T.ENGINE_FREQUENCY_PENALTY.name)),
        min_tokens=int(_required_value(inputs, T.ENGINE_MIN_TOKENS.name)),
        bad_words=T.stop_words_from_list(bad_words[0].tolist()),
        embedding_bias=tuple((int(i), float(bias[i])) for i in np.flatnonzero(bias)) if has_bias else (),
    )
    return_log_probs = bool(_value(inputs, T.RESOLVED_RETURN_LOG_PROBS.name))
    if return_log_probs and not settings.engines_return_logits:
        # The target's generation logits give the log probabilities; an engine built without them
        # makes the executor refuse the call ("To return generation logits, ...").
        raise GenerationParamsError(
            "return_log_probs needs the target engine's generation logits, and this deployment's engines are built "
            "without them (speculative.acceptance: greedy); set speculative.acceptance: probabilistic in the spec, "
            "rebuild the engines (`trt-spec build --spec F --force`) and rewrite the repository, or send "
            "return_log_probs false"
        )
    return LoopRequest(
        prompt=[int(token) for token in input_ids[:length]],
        params=params,
        end_id=end_id,
        pad_id=int(_required_value(inputs, T.PAD_ID.name)),
        stop_words_list=np.ascontiguousarray(stop_words.reshape(1, 2, -1), dtype=np.int32),
        seed=random.SystemRandom().getrandbits(_SEED_BITS) if seed is None else int(seed),
        stream=bool(_value(inputs, T.STREAMING.name)),
        exclude_input_in_output=bool(_value(inputs, T.EXCLUDE_INPUT_IN_OUTPUT.name)),
        return_num_input_tokens=bool(_value(inputs, T.RESOLVED_RETURN_NUM_INPUT_TOKENS.name)),
        return_num_output_tokens=bool(_value(inputs, T.RESOLVED_RETURN_NUM_OUTPUT_TOKENS.name)),
        batch_index=row,
        batch_size=size,
        penalties=penalties,
        bad_words_list=(
            np.ascontiguousarray(bad_words.reshape(1, 2, -1), dtype=np.int32) if penalties.bad_words else None
        ),
        embedding_bias=bias.reshape(1, -1) if has_bias else None,
        return_log_probs=return_log_probs,
        follows_schedule=bool(_value(inputs, T.NUM_DRAFT_TOKENS_IS_DEFAULT.name)),
    )


# --- TensorRT-LLM engine requests --------------------------------------------------------------


def _scalar(value, dtype) -> np.ndarray:
    return np.array([[value]], dtype=dtype)  # [batch 1, 1]


def engine_inputs(
    request: LoopRequest,
    sequence: Sequence[int],
    request_output_len: int,
    seed: int,
    *,
    draft_tokens: Sequence[int] = (),
    draft_logits: np.ndarray | None = None,
    return_logits: bool = False,
    return_perf_metrics: bool = False,
    min_tokens: int = 0,
) -> dict[str, np.ndarray]:
    """One engine call's inputs by TensorRT-LLM name: only what the call needs, since every
    tensor costs a shared-memory copy on each hop of a BLS call (~40 us each on a CPU).

    Greedy sends no sampling inputs (TensorRT-LLM decodes greedily when neither runtime_top_k nor
    runtime_top_p is sent, whatever the temperature; the twin likewise); sampling sends
    temperature, top-k, top-p and the call's seed. ``end_id``, ``pad_id`` and the stop words go to
    both engines, as TensorRT-LLM's own BLS model sends them: without ``end_id`` TensorRT-LLM
    never stops at EOS. ``exclude_input_in_output`` is sent true (the engine models' default keeps
    the prompt, for TensorRT-LLM's engine-level clients). Penalties, bad words and the
    embedding bias are sent only when they change something; ``min_tokens`` (the call's share of
    the request's minimum) always, since absent means 1 to TensorRT-LLM."""
    inputs = {
        T.INPUT_IDS.name: np.array([sequence], dtype=np.int32),  # [1, L]
        T.INPUT_LENGTHS.name: _scalar(len(sequence), np.int32),
        T.REQUEST_OUTPUT_LEN.name: _scalar(request_output_len, np.int32),
        T.END_ID.name: _scalar(request.end_id, np.int32),
        T.PAD_ID.name: _scalar(request.pad_id, np.int32),
        T.STOP_WORDS_LIST.name: request.stop_words_list,  # [1, 2, L]
        T.ENGINE_MIN_TOKENS.name: _scalar(min_tokens, np.int32),
        T.EXCLUDE_INPUT_IN_OUTPUT.name: _scalar(True, bool),
    }
    penalties = request.penalties
    if penalties.repetition_penalty != 1.0:
        inputs[T.ENGINE_REPETITION_PENALTY.name] = _scalar(penalties.repetition_penalty, np.float32)
    if penalties.presence_penalty != 0.0:
        inputs[T.ENGINE_PRESENCE_PENALTY.name] = _scalar(penalties.presence_penalty, np.float32)
    if penalties.frequency_penalty != 0.0:
        inputs[T.ENGINE_FREQUENCY_PENALTY.name] = _scalar(penalties.frequency_penalty, np.float32)
    if request.bad_words_list is not None:
        inputs[T.BAD_WORDS_LIST.name] = request.bad_words_list  # [1, 2, L]
    if request.embedding_bias is not None:
        inputs[T.EMBEDDING_BIAS.name] = request.embedding_bias  # [1, V]
    sampling = request.params.sampling
    if not sampling.greedy:
        inputs[T.ENGINE_TEMPERATURE.name] = _scalar(sampling.temperature, np.float32)
        inputs[T.RUNTIME_TOP_K.name] = _scalar(sampling.top_k, np.int32)
        inputs[T.RUNTIME_TOP_P.name] = _scalar(sampling.top_p, np.float32)
        inputs[T.ENGINE_SEED.name] = _scalar(seed, np.uint64)
    if draft_tokens:
        inputs[T.DRAFT_INPUT_IDS.name] = np.array([list(draft_tokens)], dtype=np.int32)  # [1, k]
        if draft_logits is not None:
            inputs[T.DRAFT_LOGITS.name] = draft_logits[np.newaxis]  # [1, k, V]
    if return_logits:
        inputs[T.RETURN_GENERATION_LOGITS.name] = _scalar(True, bool)
    if return_perf_metrics:
        inputs[T.RETURN_PERF_METRICS.name] = _scalar(True, bool)
    return inputs


def verified_drafts(outputs: Mapping[str, np.ndarray], num_sent: int) -> int | None:
    """How many of the ``num_sent`` drafts the target verified, from its ``total_draft_tokens``
    (the request's drafts after the executor discarded any: ``LlmRequest::updateNumTokensPerIteration``
    adds ``getNumDraftTokens()`` once the step ran); ``None`` when the engine did not report it.

    Raises:
        EngineCallError: a count outside 0..num_sent.
    """
    # Source: NVIDIA/TensorRT-LLM@d879430b040ea30c65220c9171a8a70607398748:cpp/include/tensorrt_llm/batch_manager/llmRequest.h LlmRequest::discardDraftTokens, LlmRequest::updateNumTokensPerIteration
    # Source: NVIDIA/TensorRT-LLM@c8c6df08bd0ead54cd47f7973e1e425c28a174cd:triton_backend/inflight_batcher_llm/src/model_instance_state.cc ModelInstanceState::fillTritonResponse (returnPerfMetrics)
    reported = outputs.get(T.ENGINE_TOTAL_DRAFT_TOKENS.name)
    if reported is None or reported.size == 0:
        return None
    count = int(reported.reshape(-1)[0])
    if not 0 <= count <= num_sent:
        raise EngineCallError(f"the target reported {count} verified drafts of the {num_sent} sent")
    return count


def output_tokens(outputs: Mapping[str, np.ndarray], model: str) -> list[int]:
    """The generated tokens of an engine answer: ``output_ids[0, 0, :sequence_length]``."""
    ids = outputs.get(T.OUTPUT_IDS.name)
    if ids is None:
        raise EngineCallError(f"{model} returned no output_ids")
    ids = ids.reshape(-1) if ids.ndim < 3 else ids[0, 0]
    lengths = outputs.get(T.SEQUENCE_LENGTH.name)
    length = ids.shape[0] if lengths is None else min(int(lengths.reshape(-1)[0]), ids.shape[0])
    return ids[:length].tolist()


# --- the driver --------------------------------------------------------------------------------


@dataclass
class LoopTimes:
    """Where one request's time went, in seconds, for the loop's overhead metrics."""

    iterations: int = 0
    loop_seconds: float = 0.0  # whole iterations: engine calls, bookkeeping, sending the response
    engine_wait_seconds: float = 0.0  # awaiting the engine models
    # (requests in flight seen, K used) -> iterations, when the caller counts requests in flight
    steps_by_load: dict[tuple[int, int], int] = field(default_factory=dict)


class Cancelled(Exception):
    """The client cancelled the request (e.g. it disconnected)."""


def new_state(request: LoopRequest) -> LoopState:
    return LoopState(request.prompt, request.params)


async def run_loop(
    request: LoopRequest,
    settings: LoopParameters,
    engines: EngineClient,
    *,
    state: LoopState | None = None,
    on_tokens: Callable[[LoopState, list[int]], Awaitable[None] | None] | None = None,
    is_cancelled: Callable[[], bool] = lambda: False,
    times: LoopTimes | None = None,
    log_probs: list[float] | None = None,
    in_flight: Callable[[], int] | None = None,
) -> LoopState:
    """Run one request to the end; returns its finished :class:`LoopState` (``state``, when
    given: :func:`new_state` made by the caller, who then sees its statistics even on failure).

    ``in_flight()``: the requests in flight in the loop model now (this one included), asked
    before every step. Each step of a request that follows the schedule
    (``request.follows_schedule``: it sent no ``num_draft_tokens``) then drafts at most
    ``settings.scheduled_k(in_flight())`` tokens (0: a plain target call), and ``times`` counts
    the step by requests in flight and K (``steps_by_load``). ``None``: requests in flight are
    not counted and no schedule applies.

    ``on_tokens(state, new_tokens)`` is called after every step that emitted tokens (it may be
    a coroutine function). ``is_cancelled`` is checked before every step. With
    ``request.return_log_probs``, ``log_probs`` (when given) gets each emitted token's log
    probability under the target (:func:`emitted_log_probs`) before ``on_tokens`` runs.

    Raises:
        Cancelled: ``is_cancelled()`` became true; no engine is called after that.
        EngineCallError: an engine model failed.
    """
    state = state if state is not None else new_state(request)
    times = times if times is not None else LoopTimes()
    greedy = request.params.sampling.greedy
    proposer = StepProposer(request, settings, engines)

    def seed_of(call_index: int) -> int:
        return 0 if greedy else call_seed(request.seed, call_index)  # greedy calls send no seed

    clock = time.perf_counter
    call_index = 0
    while not state.finished:
        if is_cancelled():
            raise Cancelled()
        started = clock()
        sequence = list(state.sequence)  # a copy: commit() extends the state's list
        min_tokens = request.penalties.after(len(state.output)).min_tokens
        load = in_flight() if in_flight is not None else None
        cap = settings.scheduled_k(load) if load is not None and request.follows_schedule else None
        num_draft_tokens = state.next_num_draft_tokens(cap)
        if load is not None:
            times.steps_by_load[(load, num_draft_tokens)] = times.steps_by_load.get((load, num_draft_tokens), 0) + 1
        draft = await proposer.propose(sequence, num_draft_tokens, seed_of(call_index), min_tokens)
        call_index += 1
        drafted = clock()
        output_len = len(draft.tokens) + 1 if num_draft_tokens else plain_call_len(request, state, cap)
        outputs = await engines.infer(
            settings.target_model,
            engine_inputs(
                request,
                sequence,
                output_len,
                seed_of(call_index),
                draft_tokens=draft.tokens,
                draft_logits=draft.logits,
                return_logits=request.return_log_probs,
                return_perf_metrics=bool(draft.tokens),
                min_tokens=min_tokens,
            ),
            _requested(request.return_log_probs, drafts=bool(draft.tokens)),
        )
        call_index += 1
        verified = clock()
        new_tokens = state.commit(
            draft.tokens,
            output_tokens(outputs, settings.target_model),
            drafted - started,
            verified - drafted,
            num_verified=verified_drafts(outputs, len(draft.tokens)) if draft.tokens else None,
            source=draft.source,
            plain_len=output_len,
        )
        if request.return_log_probs and log_probs is not None and new_tokens:
            rows = _generation_logits(outputs, len(new_tokens), settings.target_model)
            log_probs.extend(emitted_log_probs(rows, request, sequence, new_tokens))
        if new_tokens and on_tokens is not None:
            sent = on_tokens(state, new_tokens)
            if sent is not None:
                await sent
        finished = clock()
        times.iterations += 1
        times.loop_seconds += finished - started
        times.engine_wait_seconds += verified - started
    return state


# Plain tokens one target call decodes for a request the K schedule holds at 0 under load: the
# load is looked at again after them, so speculation resumes within this many tokens of it easing.
# Each new call costs the request about one batch step out of the engine's batch (its BLS round
# trip): with 16, 4 concurrent 64-token requests ran 6% slower than one call each (2026-12-07).
PLAIN_CHUNK_UNDER_LOAD = 64


def plain_call_len(request: LoopRequest, state: LoopState, cap: int | None) -> int:
    """``request_output_len`` of a step without drafts: 1 for a request that needs each token as
    it comes (streamed, or with log probabilities to gather per step), else several in one call,
    which the engine decodes exactly as it would one call at a time (TensorRT-LLM's own plain
    requests ask for all their tokens at once), minus a BLS round trip per token: the rest of
    the request when it asked for plain decoding (``num_draft_tokens`` 0),
    :data:`PLAIN_CHUNK_UNDER_LOAD` when the K schedule says 0 for the load, and 1 for a K 0
    that adaptive K chose (it counts its plain steps)."""
    if request.stream or request.return_log_probs:
        return 1
    remaining = request.params.max_new_tokens - len(state.output)
    if request.params.num_draft_tokens == PLAIN_DECODING:
        return max(1, remaining)
    if cap == 0:
        return max(1, min(remaining, PLAIN_CHUNK_UNDER_LOAD))
    return 1


@dataclass(frozen=True)
class StepDraft:
    """One step's drafts as the target gets them: ``tokens`` ``[k]``, ``logits`` ``[k, V]`` (the
    ``draft_logits`` to send, or ``None``) and their ``source`` (``methods.SOURCES``; "" for none)."""

    tokens: list[int]
    logits: np.ndarray | None = None
    source: str = ""


class StepProposer:
    """Where a step's drafts come from: the spec's method first (``methods.Method.propose``: the
    request's own tokens, for prompt lookup), else one call to the draft engine for K tokens (it may
    return fewer, e.g. after ``end_id``). With ``use_draft_logits`` a sampled request's drafts carry
    the distribution they were drawn from: the draft engine's (:func:`draft_distribution_logits`),
    or a lookup's point mass (:func:`point_mass_logits`)."""

    def __init__(self, request: LoopRequest, settings: LoopParameters, engines: EngineClient):
        self.request, self.settings, self.engines = request, settings, engines
        self.method, self.lookup = settings.speculation, settings.lookup
        self.want_logits = settings.use_draft_logits and not request.params.sampling.greedy

    async def propose(self, sequence: Sequence[int], num_draft_tokens: int, seed: int, min_tokens: int) -> StepDraft:
        if num_draft_tokens == PLAIN_DECODING:
            return StepDraft([])
        proposal = self.method.propose(sequence, num_draft_tokens, self.lookup)
        if proposal is not None:
            with_logits = self.want_logits and bool(proposal.tokens)
            logits = point_mass_logits(proposal.tokens, self.settings.vocab_size) if with_logits else None
            return StepDraft(proposal.tokens, logits, proposal.source)
        model = self.settings.draft_model
        outputs = await self.engines.infer(
            model,
            engine_inputs(
                self.request, sequence, num_draft_tokens, seed, return_logits=self.want_logits, min_tokens=min_tokens
            ),
            _requested(self.want_logits),
        )
        tokens = output_tokens(outputs, model)[:num_draft_tokens]
        logits = None
        if self.want_logits and tokens:
            raw = _generation_logits(outputs, len(tokens), model)
            logits = draft_distribution_logits(raw, self.request, sequence, tokens)
        return StepDraft(tokens, logits, DRAFT_MODEL)


def point_mass_logits(tokens: Sequence[int], vocab_size: int) -> np.ndarray:
    """``[k, V]`` float32 ``draft_logits`` whose softmax is one-hot at each token: a lookup draft's
    distribution, a point mass, against which the target's rejection sampling is exact
    (``methods/prompt_lookup.py`` derives it). Off-token logits are :data:`MASKED_LOGIT`, finite (no
    inf - inf in the softmax kernel); float32, the logits dtype the engines of probabilistic acceptance
    are checked to have (``flavors/tensorrtllm.check_built_engines``)."""
    # Source: NVIDIA/TensorRT-LLM@1d263f15a979ef2902c60de3f6238bcc0952bb29:cpp/tensorrt_llm/layers/externalDraftTokensLayer.cpp ExternalDraftTokensLayer::acceptDraftTokens (q = softmax of the draft_logits as given)
    # Source: NVIDIA/TensorRT-LLM@2931b93fa41bf8b6d23a6e266ffc17810a5966ef:cpp/tensorrt_llm/kernels/speculativeDecoding/externalDraftTokensKernels.cu acceptDraftTokensKernel (accept when p > u q; else resample from the normalised max(p - q, 0))
    logits = np.full((len(tokens), vocab_size), MASKED_LOGIT, dtype=np.float32)  # [k, V]
    logits[np.arange(len(tokens)), list(tokens)] = 0.0
    return logits


def _requested(logits: bool, *, drafts: bool = False) -> list[str]:
    # TensorRT-LLM's backend answers with an error unless both output_ids and sequence_length are
    # requested (model_instance_state.cc, fillTritonResponse). A verification also asks how many
    # drafts the target verified (verified_drafts).
    names = [T.OUTPUT_IDS.name, T.SEQUENCE_LENGTH.name]
    if logits:
        names.append(T.GENERATION_LOGITS.name)
    if drafts:
        names.append(T.ENGINE_TOTAL_DRAFT_TOKENS.name)
    return names


def draft_distribution_logits(
    raw_logits: np.ndarray, request: LoopRequest, sequence: Sequence[int], draft_tokens: Sequence[int]
) -> np.ndarray:
    """``draft_logits`` for the target: logits whose plain softmax is the distribution the draft
    sampled its tokens from, since TensorRT-LLM's target applies nothing to what it is sent (module
    docstring): the draft engine's adjustments (:func:`_engine_scores`), then top-k and top-p, to
    its raw logits ``[k, V]``. Tokens the draft could not draw get a large negative logit, not
    -inf (no inf - inf in a softmax kernel)."""
    scores = _engine_scores(raw_logits, request, sequence, draft_tokens)
    probs = filtered_softmax(scores, request.params.sampling)  # [k, V]
    logits = torch.where(probs > 0, probs.log(), torch.full_like(probs, MASKED_LOGIT))
    return np.ascontiguousarray(logits.numpy(), dtype=np.float32)  # [k, V]


def emitted_log_probs(
    raw_logits: np.ndarray, request: LoopRequest, sequence: Sequence[int], tokens: Sequence[int]
) -> list[float]:
    """The log probability of each emitted token under the target: log softmax of the target's
    adjusted scores at its position (:func:`_engine_scores`; greedy at temperature 1), before top-k
    and top-p, as TensorRT-LLM's sampling layers see them. ``raw_logits`` ``[n, V]``: the target's
    raw logits at the tokens' positions after ``sequence``."""
    log_probs = _engine_scores(raw_logits, request, sequence, tokens).log_softmax(dim=-1)  # [n, V]
    return [float(log_probs[row, token]) for row, token in enumerate(tokens)]


def _engine_scores(
    raw_logits: np.ndarray, request: LoopRequest, sequence: Sequence[int], tokens: Sequence[int]
) -> torch.Tensor:
    """What an engine call over ``sequence`` computes from its raw logits ``[n, V]`` before top-k
    and top-p: embedding bias, temperature, penalties, what is left of min_tokens and bad words,
    row i after ``tokens[:i]`` (penalties.py)."""
    return adjusted_scores(
        torch.from_numpy(raw_logits),
        request.temperature_for_scores(),
        request.penalties.after(len(sequence) - len(request.prompt)),
        sequence,
        tokens,
        request.end_id,
    )


def _generation_logits(outputs: Mapping[str, np.ndarray], num_tokens: int, model: str) -> np.ndarray:
    """The first ``num_tokens`` rows of an engine's ``generation_logits`` as float32 ``[n, V]``."""
    logits = outputs.get(T.GENERATION_LOGITS.name)
    if logits is None:
        raise EngineCallError(
            f"{model} returned no generation_logits; probabilistic acceptance and return_log_probs need engines "
            "built with --gather_generation_logits"
        )
    rows = logits.reshape(-1, logits.shape[-1])  # [beam x tokens, V]
    if rows.shape[0] < num_tokens:
        raise EngineCallError(f"{model} returned {rows.shape[0]} generation_logits rows for {num_tokens} tokens")
    return np.ascontiguousarray(rows[:num_tokens], dtype=np.float32)  # [k, V]


# --- responses: the streaming window protocol (tensors.py) -------------------------------------


class ResponseWindows:
    """The loop's side of the streaming-safe detokenization protocol documented in
    :mod:`trt_spec.runtime.tensors`: each response's ``output_ids`` window and ``num_context_tokens``."""

    def __init__(self) -> None:
        self.sent = 0  # tokens covered by earlier responses

    def next(self, output: Sequence[int]) -> tuple[list[int], int]:
        start = T.window_start(self.sent)
        window, context = list(output[start:]), self.sent - start
        self.sent = len(output)
        return window, context


def new_request_key() -> int:
    """A key naming one running request of the loop model (see ``tensors.py`` on cancellation)."""
    return random.SystemRandom().getrandbits(_SEED_BITS)


def final_window(request: LoopRequest, state: LoopState, windows: ResponseWindows) -> tuple[list[int], int]:
    """The window of a request's last response when no earlier response covered its end:
    streaming, the next window; otherwise the whole completion, after the prompt when
    ``exclude_input_in_output`` is false (TensorRT-LLM's non-streaming output then holds the
    prompt; streamed responses never do)."""
    if request.stream:
        return windows.next(state.output)
    if request.exclude_input_in_output:
        return list(state.output), 0
    return [*request.prompt, *state.output], 0


def probe_arrays(request_key: int) -> dict[str, np.ndarray]:
    """A liveness probe of a non-streaming request (``tensors.py``): an empty, non-final window
    and the request's key, and nothing that goes to the client."""
    return {
        T.LOOP_OUTPUT_IDS.name: np.zeros((1, 0), dtype=np.int32),
        T.NUM_CONTEXT_TOKENS.name: _scalar(0, np.int32),
        T.IS_FINAL.name: _scalar(False, bool),
        T.REQUEST_KEY.name: _scalar(request_key, np.uint64),
    }


def response_arrays(
    state: LoopState,
    window: Sequence[int],
    num_context_tokens: int,
    is_final: bool,
    request_key: int = 0,
    request: LoopRequest | None = None,
    log_probs: Sequence[float] | None = None,
) -> dict[str, np.ndarray]:
    """The loop model's output tensors for one response (batch dimension 1). With ``request``,
    TensorRT-LLM's outputs too: ``batch_index`` when the request holds several prompts,
    ``sequence_index`` 0, ``num_input_tokens`` when asked for, and ``num_output_tokens`` counted as
    TensorRT-LLM does when asked for (the tokens this response carries), else the running total;
    with ``return_log_probs``, ``output_log_probs`` ``[1, 1, n]`` for the generated tokens this
    response adds (``log_probs``: one per token of ``state.output``) and ``cum_log_probs``
    ``[1, 1]``, their running sum, as TensorRT-LLM shapes them ``[batch, beams, ...]``."""
    stats = state.stats
    arrays = {
        T.LOOP_OUTPUT_IDS.name: np.array([list(window)], dtype=np.int32).reshape(1, len(window)),
        T.NUM_CONTEXT_TOKENS.name: _scalar(num_context_tokens, np.int32),
        T.IS_FINAL.name: _scalar(is_final, bool),
        T.REQUEST_KEY.name: _scalar(request_key, np.uint64),
        T.TOTAL_DRAFT_TOKENS.name: _scalar(stats.drafted_tokens, np.int32),
        T.TOTAL_ACCEPTED_DRAFT_TOKENS.name: _scalar(stats.accepted_tokens, np.int32),
        T.ACCEPTANCE_RATE.name: _scalar(stats.acceptance_rate, np.float32),
        T.NUM_TARGET_CALLS.name: _scalar(stats.target_calls, np.int32),
        T.NUM_OUTPUT_TOKENS.name: _scalar(len(state.output), np.int32),
        T.TOTAL_LOOKUP_DRAFT_TOKENS.name: _scalar(stats.drafted_by_source.get(PROMPT_LOOKUP, 0), np.int32),
        T.TOTAL_ACCEPTED_LOOKUP_DRAFT_TOKENS.name: _scalar(stats.accepted_by_source.get(PROMPT_LOOKUP, 0), np.int32),
    }
    if request is not None:
        if request.batch_size > 1:
            arrays[T.BATCH_INDEX.name] = _scalar(request.batch_index, np.int32)
        arrays[T.SEQUENCE_INDEX.name] = _scalar(0, np.int32)
        if request.return_num_input_tokens:
            arrays[T.NUM_INPUT_TOKENS.name] = _scalar(len(request.prompt), np.int32)
        if request.return_num_output_tokens:
            arrays[T.NUM_OUTPUT_TOKENS.name] = _scalar(len(window) - num_context_tokens, np.int32)
        if request.return_log_probs and log_probs is not None:
            total = len(state.output)
            new = len(window) - num_context_tokens if request.stream else total
            added = np.array(log_probs[total - new : total], dtype=np.float32)
            arrays[T.OUTPUT_LOG_PROBS.name] = added.reshape(1, 1, -1)
            arrays[T.CUM_LOG_PROBS.name] = _scalar(float(np.sum(log_probs[:total], dtype=np.float64)), np.float32)
    return arrays
