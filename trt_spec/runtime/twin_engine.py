"""The torch flavor's engine models: TensorRT-LLM's tensor interface over the PyTorch twin.

``tensorrt_llm`` (target) and ``tensorrt_llm_draft`` take and return what TensorRT-LLM 1.2.x's
C++ backend does (names and shapes in :mod:`trt_spec.runtime.tensors`), so one loop model serves
both flavors:

- the **draft** generates up to ``request_output_len`` tokens (stopping after ``end_id``) and,
  with ``return_generation_logits``, returns the raw logits each token was drawn from;
- the **target**, given ``draft_input_ids``, scores the sequence plus all drafts in ONE forward
  pass and returns the accepted drafts plus one token, as TensorRT-LLM's external-draft-tokens
  mode does: with ``draft_logits`` by rejection sampling (probabilistic acceptance), without them
  by token matching (greedy at temperature 0). As there, the draft's distribution is the plain
  softmax of the ``draft_logits`` it is sent (TensorRT-LLM's ``externalDraftTokensLayer.cpp``
  applies no temperature, top-k or top-p to them: the loop sends processed logits). Without
  drafts it decodes up to ``request_output_len`` tokens.

Sampling follows TensorRT-LLM's inputs: greedy when ``runtime_top_k`` is 1, ``temperature`` is 0,
or none of ``temperature``/``runtime_top_k``/``runtime_top_p`` is sent (its default); otherwise
temperature (default 1), top-k (0 = off) and top-p (0 or 1 = off). Before the argmax or top-k/top-p,
the raw logits get TensorRT-LLM's adjustments (:mod:`trt_spec.runtime.penalties`): ``embedding_bias``,
temperature, ``repetition_penalty``/``presence_penalty``/``frequency_penalty``, ``min_tokens``
(absent = 1, TensorRT-LLM's default: no ``end_id`` as the call's first token) and
``bad_words_list``, each row of a verification for its own position.
``seed`` seeds one ``torch.Generator`` per call; without it each call draws fresh randomness.

Beyond decoding, both engines answer upstream's other inputs as :mod:`~trt_spec.runtime.engine_interface`
says, the same as the tensorrtllm flavor: ``return_log_probs`` (``output_log_probs`` and
``cum_log_probs`` of the generated tokens under the scores they were drawn from, at the temperature
sent; ``normalize_log_probs`` as the config sets it; refused with ``draft_input_ids``),
``return_num_input_tokens`` / ``return_num_output_tokens``, ``num_return_sequences`` 1,
``return_context_logits`` refused (the twin gathers none, as an engine built without
``gather_context_logits``), a ``stop`` request answered with an empty response (the request it names
runs to its end), and the inputs declared but not supported refused unless
neutral.

There is no session key: KV caches are reused by token prefix (:class:`PrefixCachePool`).
Library code, without Triton: the model file (``models/torch_engine/model.py``) only moves
tensors in and out, and the in-process loop (``trt_spec.twin``) calls :meth:`TwinEngine.run` with
:class:`EngineRequest` values built as the loop model builds its tensors, so both run this code.
Which verification a call runs (greedy, rejection sampling, token matching) is decided by
:func:`~trt_spec.runtime.sampling.verify_drafts`. Each request is one sequence (batch size 1 per
request); the engine model runs the requests in flight together (:meth:`TwinEngine.steps`,
:mod:`~trt_spec.runtime.inflight_batcher`).
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from trt_spec.runtime import engine_interface
from trt_spec.runtime import tensors as T
from trt_spec.runtime.errors import GenerationParamsError
from trt_spec.runtime.penalties import (
    ENGINE_DEFAULT_PENALTIES,
    ENGINE_MIN_TOKENS,
    NEUTRAL_TEMPERATURE,
    Penalties,
    adjusted_scores,
)
from trt_spec.runtime.prefix_cache import PrefixCachePool
from trt_spec.runtime.sampling import (
    SamplingParams,
    filtered_softmax,
    first_outside_vocabulary,
    sample,
    verify_drafts,
)
from trt_spec.runtime.tensors import ROLES
from trt_spec.runtime.torch_engine import TorchCausalLM


@dataclass(frozen=True)
class ForwardCall:
    """One forward pass a request needs: the logits of ``sequence``'s last ``num_positions``
    positions, on ``engine`` (the request's own KV cache)."""

    engine: TorchCausalLM
    sequence: list[int]
    num_positions: int


class EngineRequestError(ValueError):
    """A request the engine model refuses; the message goes to the caller as it is (one line)."""


@dataclass(frozen=True)
class EngineRequest:
    """One request to an engine model: read from TensorRT-LLM's tensors (:func:`read_request`), or
    built by an in-process caller (``trt_spec.twin``) with the values the loop model would send."""

    sequence: list[int]
    request_output_len: int
    draft_tokens: list[int]
    draft_logits: torch.Tensor | None  # [k, V]: softmax(draft_logits) is the draft's distribution
    end_id: int | None
    sampling: SamplingParams
    seed: int | None
    return_generation_logits: bool
    exclude_input_in_output: bool
    stop_sequences: tuple[tuple[int, ...], ...]
    penalties: Penalties = ENGINE_DEFAULT_PENALTIES  # min_tokens: this call's
    return_perf_metrics: bool = False  # the speculative-decoding counts (the twin discards no draft)
    return_log_probs: bool = False
    return_num_input_tokens: bool = False
    return_num_output_tokens: bool = False
    score_temperature: float = NEUTRAL_TEMPERATURE  # the temperature sent (1 when none): the log probs' scale
    log_prob_top_k: int = 1  # the top-k kernel's k, or 0 for the top-p kernel (engine_interface.log_prob_top_k)
    draft_probs: torch.Tensor | None = None  # [k, V]: the draft's distribution itself (in-process; no tensor has it)

    def draft_distribution(self) -> torch.Tensor | None:
        """``[k, V]`` the distributions the drafts were drawn from: ``draft_probs``, else the softmax of
        ``draft_logits`` (module docstring); ``None`` when neither was sent (verification by token matching)."""
        if self.draft_probs is not None:
            return self.draft_probs
        return None if self.draft_logits is None else self.draft_logits.softmax(dim=-1)


@dataclass(frozen=True)
class EngineAnswer:
    """What one call computed: its tokens, the raw logits kept for the outputs (generation logits,
    log probs; when the request asks for them) and, for a sampled decode, the distribution each
    token was drawn from (``[1, V]`` each: what a draft's rejection sampling needs; else empty)."""

    tokens: list[int]
    logits: list[torch.Tensor]
    probs: list[torch.Tensor]


def request_generator(request: EngineRequest) -> torch.Generator | None:
    """The randomness of one served call: ``seed``'s, else fresh; ``None`` for greedy (it draws nothing)."""
    if request.sampling.greedy:
        return None
    generator = torch.Generator()
    if request.seed is None:
        generator.seed()  # fresh, non-deterministic randomness
    else:
        generator.manual_seed(request.seed)
    return generator


def _value(inputs: Mapping[str, np.ndarray], name: str):
    """A scalar input's value (any shape holding one element), or None when absent."""
    array = inputs.get(name)
    if array is None:
        return None
    if array.size != 1:
        raise EngineRequestError(f"{name} must hold one value; got shape {list(array.shape)}")
    return array.reshape(-1)[0].item()


def is_stop_request(inputs: Mapping[str, np.ndarray]) -> bool:
    """Whether the request is TensorRT-LLM's ``stop`` (cancel the request it names)."""
    return bool(_value(inputs, T.STOP.name))


def _row(inputs: Mapping[str, np.ndarray], name: str) -> np.ndarray | None:
    """The one request's row of a ``[1, ...]`` batched input, or None when absent."""
    array = inputs.get(name)
    if array is None:
        return None
    if array.ndim == 0 or array.shape[0] != 1:
        raise EngineRequestError(
            f"send one sequence per request ({name} of shape [1, ...]); got shape {list(array.shape)}"
        )
    return array[0]


def stop_sequences_from_list(stop_words_list: np.ndarray | None) -> tuple[tuple[int, ...], ...]:
    """TensorRT-LLM's ``[2, L]`` stop-word format -> token tuples (``tensors.stop_words_from_list``)."""
    return () if stop_words_list is None else T.stop_words_from_list(stop_words_list.reshape(2, -1).tolist())


def sampling_from_inputs(inputs: Mapping[str, np.ndarray]) -> SamplingParams:
    """TensorRT-LLM's sampling inputs -> :class:`SamplingParams` (greedy = temperature 0), which
    checks the values as it does for every other caller.

    Raises:
        EngineRequestError: a value out of range (:class:`SamplingParams`' message).
    """
    temperature = _value(inputs, T.ENGINE_TEMPERATURE.name)
    top_k = _value(inputs, T.RUNTIME_TOP_K.name)
    top_p = _value(inputs, T.RUNTIME_TOP_P.name)
    # TensorRT-LLM turns top-k 0 and top-p 0 (also what absent means) into top-k 1, whatever the
    # temperature (kernels/samplingTopKKernels.h regularizeTopKTopP, as the emulator reads it).
    if (not top_k and not top_p) or top_k == 1 or temperature == 0:
        return SamplingParams()
    temperature = 1.0 if temperature is None else float(temperature)
    top_k = 0 if top_k is None else int(top_k)
    top_p = 1.0 if top_p is None or top_p == 0 else float(top_p)
    try:
        return SamplingParams(temperature, top_k, top_p)
    except GenerationParamsError as exc:
        raise EngineRequestError(str(exc)) from None


def penalties_from_inputs(inputs: Mapping[str, np.ndarray], vocab_size: int) -> Penalties:
    """TensorRT-LLM's penalty inputs -> :class:`Penalties` (absent = its defaults; ``min_tokens`` 1).

    Raises:
        EngineRequestError: a value out of range, or an ``embedding_bias`` that is not ``[V]``.
    """
    values = {
        name: _value(inputs, name)
        for name in (T.ENGINE_REPETITION_PENALTY.name, T.ENGINE_PRESENCE_PENALTY.name, T.ENGINE_FREQUENCY_PENALTY.name)
    }
    min_tokens = _value(inputs, T.ENGINE_MIN_TOKENS.name)
    bad_words = _row(inputs, T.BAD_WORDS_LIST.name)
    bias = _row(inputs, T.EMBEDDING_BIAS.name)
    if bias is not None and bias.size not in (0, vocab_size):
        raise EngineRequestError(
            f"embedding_bias must hold one weight per vocabulary entry ({vocab_size}); got {bias.size}"
        )
    try:
        return Penalties(
            repetition_penalty=float(values[T.ENGINE_REPETITION_PENALTY.name] or 1.0),
            presence_penalty=float(values[T.ENGINE_PRESENCE_PENALTY.name] or 0.0),
            frequency_penalty=float(values[T.ENGINE_FREQUENCY_PENALTY.name] or 0.0),
            min_tokens=ENGINE_MIN_TOKENS if min_tokens is None else int(min_tokens),
            bad_words=stop_sequences_from_list(bad_words),
            embedding_bias=()
            if bias is None
            else tuple((int(i), float(bias.reshape(-1)[i])) for i in np.flatnonzero(bias)),
        )
    except GenerationParamsError as exc:
        raise EngineRequestError(str(exc)) from None


def read_request(inputs: Mapping[str, np.ndarray], role: str, vocab_size: int | None = None) -> EngineRequest:
    """Parse one request's tensors (each with its batch dimension of 1).

    Raises:
        EngineRequestError: a missing or malformed input, or one the role does not take.
    """
    check_interface(inputs)
    input_ids = _row(inputs, T.INPUT_IDS.name)
    if input_ids is None:
        raise EngineRequestError("input_ids is required")
    length = _value(inputs, T.INPUT_LENGTHS.name)
    length = input_ids.shape[-1] if length is None else int(length)
    if not 1 <= length <= input_ids.shape[-1]:
        raise EngineRequestError(
            f"input_lengths must be in 1..{input_ids.shape[-1]} (the input_ids given); got {length}"
        )
    output_len = _value(inputs, T.REQUEST_OUTPUT_LEN.name)
    if output_len is None or output_len < 1:
        raise EngineRequestError(f"request_output_len must be >= 1; got {output_len}")
    beam_width = _value(inputs, T.BEAM_WIDTH.name)
    if beam_width not in (None, 1):
        raise EngineRequestError(f"beam_width must be 1 (speculative decoding does not beam-search); got {beam_width}")
    if _value(inputs, T.STREAMING.name):
        raise EngineRequestError("streaming is not supported by the engine models; the loop model streams")
    draft_ids = _row(inputs, T.DRAFT_INPUT_IDS.name)
    draft_logits = _row(inputs, T.DRAFT_LOGITS.name)
    if role == "draft" and (draft_ids is not None or draft_logits is not None):
        raise EngineRequestError("the draft engine takes no draft_input_ids or draft_logits")
    draft_tokens = [] if draft_ids is None else [int(token) for token in draft_ids.reshape(-1)]
    return_log_probs = bool(_value(inputs, T.ENGINE_RETURN_LOG_PROBS.name))
    if return_log_probs and draft_tokens:
        raise EngineRequestError(engine_interface.LOG_PROBS_WITH_DRAFTS)
    logits = None
    if draft_logits is not None and draft_tokens:
        if draft_logits.ndim != 2 or draft_logits.shape[0] != len(draft_tokens):
            raise EngineRequestError(
                f"draft_logits must be [{len(draft_tokens)}, vocab] for {len(draft_tokens)} draft_input_ids; "
                f"got {list(draft_logits.shape)}"
            )
        logits = torch.from_numpy(np.ascontiguousarray(draft_logits, dtype=np.float32))
    end_id = _value(inputs, T.END_ID.name)
    seed = _value(inputs, T.ENGINE_SEED.name)
    exclude = _value(inputs, T.EXCLUDE_INPUT_IN_OUTPUT.name)
    temperature = _value(inputs, T.ENGINE_TEMPERATURE.name)
    score_temperature = NEUTRAL_TEMPERATURE if temperature is None else float(temperature)
    if return_log_probs and not 0 <= score_temperature < float("inf"):
        raise EngineRequestError(f"temperature must be a finite number >= 0; got {temperature}")
    return EngineRequest(
        sequence=[int(token) for token in input_ids[:length]],
        request_output_len=int(output_len),
        draft_tokens=draft_tokens,
        draft_logits=logits,
        end_id=None if end_id is None else int(end_id),
        sampling=sampling_from_inputs(inputs),
        seed=None if seed is None else int(seed),
        return_generation_logits=bool(_value(inputs, T.RETURN_GENERATION_LOGITS.name)),
        # Absent: the prompt stays in output_ids, as the tensorrtllm flavor's engine configs say.
        exclude_input_in_output=False if exclude is None else bool(exclude),
        stop_sequences=stop_sequences_from_list(_row(inputs, T.STOP_WORDS_LIST.name)),
        penalties=penalties_from_inputs(inputs, vocab_size if vocab_size is not None else 0),
        return_perf_metrics=bool(_value(inputs, T.RETURN_PERF_METRICS.name)),
        return_log_probs=return_log_probs,
        return_num_input_tokens=bool(_value(inputs, T.ENGINE_RETURN_NUM_INPUT_TOKENS.name)),
        return_num_output_tokens=bool(_value(inputs, T.ENGINE_RETURN_NUM_OUTPUT_TOKENS.name)),
        score_temperature=score_temperature,
        log_prob_top_k=engine_interface.log_prob_top_k(
            _value(inputs, T.RUNTIME_TOP_K.name), _value(inputs, T.RUNTIME_TOP_P.name)
        ),
    )


def check_interface(inputs: Mapping[str, np.ndarray]) -> None:
    """Upstream's inputs the twin does not support: one sequence, no context logits, the rest
    neutral (:mod:`~trt_spec.runtime.engine_interface`).

    Raises:
        EngineRequestError: the first one sent with a value that is not supported.
    """
    message = engine_interface.num_return_sequences_error(inputs) or engine_interface.unsupported_input(inputs)
    if message:
        raise EngineRequestError(message)
    if _value(inputs, T.ENGINE_RETURN_CONTEXT_LOGITS.name):
        raise EngineRequestError(
            "return_context_logits needs an engine built with gather_context_logits, and this repository's engines "
            "gather none: send false or omit it"
        )


RequestSteps = Generator[ForwardCall, torch.Tensor, "EngineAnswer"]  # TwinEngine.steps


class TwinEngine:
    """One engine model (``role`` target or draft) over a :class:`TorchCausalLM`.

    ``cache_slots``: sequences whose KV caches are kept (the repository's max_batch_size);
    ``max_draft_len``: the longest draft a target verifies; ``max_seq_len``: prompt + output limit.
    """

    def __init__(
        self,
        engine: TorchCausalLM,
        role: str,
        *,
        max_draft_len: int,
        max_seq_len: int,
        cache_slots: int,
        normalize_log_probs: bool = True,
    ):
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}; got {role!r}")
        self.role = role
        self.normalize_log_probs = normalize_log_probs
        self.max_draft_len = max_draft_len
        self.max_seq_len = max_seq_len
        self.vocab_size = engine.vocab_size
        self.pool = PrefixCachePool(engine, cache_slots, max_divergence=max_draft_len + 1)
        # One slot: the pool always answers its one cache, so the lookup is skipped (in-process, every call).
        self._only_cache = engine if cache_slots == 1 else None
        self._busy: set[TorchCausalLM] = set()  # caches held by requests in flight (steps())

    @property
    def cache_slots(self) -> int:
        """Sequences whose KV caches are kept: at most this many requests in flight."""
        return self.pool.capacity

    def execute(self, inputs: Mapping[str, np.ndarray], request_id: str | None = None) -> dict[str, np.ndarray]:
        """One request's outputs (with the batch dimension), by TensorRT-LLM output name; none for
        a ``stop`` request. ``request_id``: Triton's id of the request (None: unknown).

        Raises:
            EngineRequestError: a malformed request, or one over the engine's limits.
        """
        if is_stop_request(inputs):
            # Source: NVIDIA/TensorRT-LLM@0c8de69a1ca6213eebb20a51873890ff128666c2:triton_backend/inflight_batcher_llm/src/model_instance_state.cc ModelInstanceState::handleStopRequest
            if request_id == "":
                raise EngineRequestError("Trying to stop a request but request ID is not provided")
            return {}  # upstream answers a stop with an empty response; the twin lets the named request finish
        request = read_request(inputs, self.role, self.vocab_size)
        return self.outputs(request, self.run(request, request_generator(request)))

    def outputs(self, request: EngineRequest, answer: EngineAnswer) -> dict[str, np.ndarray]:
        """The output tensors (with the batch dimension) of a request's answer, by TensorRT-LLM name."""
        return self._outputs(request, answer.tokens, answer.logits)

    def run(self, request: EngineRequest, generator: torch.Generator | None) -> EngineAnswer:
        """One call of a request already read (or built in-process), run alone: verification when it
        carries drafts, else decoding. ``generator``: the randomness of a sampled call (``None``:
        torch's global generator); served calls use :func:`request_generator`.

        Raises:
            EngineRequestError: drafts past ``max_draft_len`` or outside the vocabulary, or a
                sequence past ``max_seq_len``.
        """
        steps = self.steps(request, generator)
        try:
            call = next(steps)
            while True:
                call = steps.send(call.engine.logits(call.sequence, call.num_positions))
        except StopIteration as finished:
            return finished.value

    def steps(self, request: EngineRequest, generator: torch.Generator | None) -> RequestSteps:
        """The request as the forward passes it needs, one at a time: each ``yield`` hands out a
        :class:`ForwardCall` and takes back its logits; the return value is the answer. :meth:`run`
        drives one alone; the in-flight batcher (``runtime/inflight_batcher.py``) drives many
        together, one forward pass for all of them per step, so a request computes exactly what
        it computes alone. The request holds its KV cache from the first ``next()`` to its end.

        Raises (from the first ``next()``): as :meth:`run`.
        """
        if len(request.draft_tokens) > self.max_draft_len:
            raise EngineRequestError(
                f"{len(request.draft_tokens)} draft_input_ids exceed the engine's max_draft_len {self.max_draft_len}"
            )
        outside = first_outside_vocabulary(request.draft_tokens, self.vocab_size)
        if outside is not None:
            position, token = outside
            raise EngineRequestError(
                f"draft_input_ids[{position}] = {token} is outside the engine's vocabulary [0, {self.vocab_size})"
            )
        if len(request.sequence) + request.request_output_len > self.max_seq_len:
            raise EngineRequestError(
                f"input ({len(request.sequence)} tokens) + request_output_len ({request.request_output_len}) "
                f"exceeds the engine's max_seq_len {self.max_seq_len}"
            )
        sequence = request.sequence + request.draft_tokens
        engine = self._only_cache if self._only_cache is not None else self.pool.engine_for(sequence, self._busy)
        self._busy.add(engine)
        try:
            if request.draft_tokens:
                return (yield from self._verify(request, engine, generator))
            return (yield from self._decode(request, engine, generator))
        finally:
            self._busy.discard(engine)

    # --- the two kinds of call ---------------------------------------------------------------

    def _decode(self, request: EngineRequest, engine: TorchCausalLM, generator: torch.Generator | None) -> RequestSteps:
        """Up to request_output_len tokens one at a time (a draft, or plain target decoding)."""
        context = list(request.sequence)
        tokens: list[int] = []
        kept_logits: list[torch.Tensor] = []
        kept_probs: list[torch.Tensor] = []
        keep_logits = request.return_generation_logits or request.return_log_probs
        for step in range(request.request_output_len):
            logits = yield ForwardCall(engine, context, 1)  # [1, V]
            scores = self._scores(logits, request, context, step)
            if request.sampling.greedy:
                token = int(scores.argmax())
            else:
                probs = filtered_softmax(scores, request.sampling)  # [1, V]
                token = int(sample(probs, generator))
                kept_probs.append(probs)
            if keep_logits:
                kept_logits.append(logits)
            tokens.append(token)
            context.append(token)
            if self._ends(tokens, request):
                break
        return EngineAnswer(tokens, kept_logits, kept_probs)

    def _verify(self, request: EngineRequest, engine: TorchCausalLM, generator: torch.Generator | None) -> RequestSteps:
        """One forward pass over the sequence plus all drafts; accepted drafts plus one token."""
        drafts = request.draft_tokens
        # Row i scores draft i's position; row k is the bonus position.
        target_logits = yield ForwardCall(engine, request.sequence + drafts, len(drafts) + 1)  # [k + 1, V]
        scores = self._scores(target_logits, request, request.sequence, 0, drafts)  # row i after drafts[:i]
        emitted = verify_drafts(request.sampling, drafts, scores, request.draft_distribution(), generator)
        emitted = emitted[: request.request_output_len]
        for index in range(1, len(emitted) + 1):
            if self._ends(emitted[:index], request):
                emitted = emitted[:index]
                break
        kept_logits = list(target_logits[: len(emitted)]) if request.return_generation_logits else []
        return EngineAnswer(emitted, kept_logits, [])

    @staticmethod
    def _scores(
        logits: torch.Tensor, request: EngineRequest, context: list[int], generated: int, row_tokens: Sequence[int] = ()
    ) -> torch.Tensor:
        """Raw logits -> the scores this call draws from (penalties.py), ``generated`` tokens into the call."""
        temperature = NEUTRAL_TEMPERATURE if request.sampling.greedy else request.sampling.temperature
        penalties = request.penalties.after(generated)
        return adjusted_scores(logits, temperature, penalties, context, row_tokens, request.end_id)

    def _ends(self, tokens: list[int], request: EngineRequest) -> bool:
        if request.end_id is not None and tokens[-1] == request.end_id:
            return True
        return any(len(tokens) >= len(stop) and tuple(tokens[-len(stop) :]) == stop for stop in request.stop_sequences)

    def _outputs(self, request: EngineRequest, tokens: list[int], logits: list[torch.Tensor]) -> dict[str, np.ndarray]:
        ids = tokens if request.exclude_input_in_output else request.sequence + tokens
        outputs = {
            T.OUTPUT_IDS.name: np.array([[ids]], dtype=np.int32),  # [batch 1, beam 1, n]
            T.SEQUENCE_LENGTH.name: np.array([[len(ids)]], dtype=np.int32),  # [batch 1, beam 1]
        }
        if request.return_log_probs:
            outputs.update(
                engine_interface.log_prob_outputs(
                    logits,
                    request.sequence,
                    tokens,
                    temperature=request.score_temperature,
                    penalties=request.penalties,
                    end_id=request.end_id,
                    top_k=request.log_prob_top_k,
                    normalize=self.normalize_log_probs,
                )
            )
        outputs.update(
            engine_interface.token_count_outputs(
                len(request.sequence),
                len(ids),
                input_count=request.return_num_input_tokens,
                output_count=request.return_num_output_tokens,
            )
        )
        if request.return_generation_logits:
            rows = torch.stack(logits) if logits else torch.zeros(0, self.vocab_size)
            outputs[T.GENERATION_LOGITS.name] = (
                rows.reshape(1, 1, len(logits), self.vocab_size).numpy().astype(np.float32)
            )
        if request.return_perf_metrics:
            # As TensorRT-LLM counts them per executor request (verified_drafts in bls.py):
            # the drafts verified, and the tokens added past the first.
            drafted = len(request.draft_tokens)
            accepted = max(0, len(tokens) - 1) if drafted else 0
            outputs[T.ENGINE_TOTAL_DRAFT_TOKENS.name] = np.array([[drafted]], dtype=np.int32)
            outputs[T.ENGINE_TOTAL_ACCEPTED_DRAFT_TOKENS.name] = np.array([[accepted]], dtype=np.int32)
            outputs[T.ENGINE_ACCEPTANCE_RATE.name] = np.array(
                [[accepted / drafted if drafted else 0.0]], dtype=np.float32
            )
        return outputs
