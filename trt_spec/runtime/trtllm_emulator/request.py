"""Stage 2, enqueue: one request's tensors as the backend reads them into an executor request.

:class:`BackendRequest` is what ``utils.cc createRequestsFromInputTensors`` builds from a batch-1
Triton request, refusing it as that function does (the exception text is the client's message).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trt_spec.runtime import engine_interface
from trt_spec.runtime import tensors as T
from trt_spec.runtime.engine_interface import TOP_K_MAX
from trt_spec.runtime.errors import GenerationParamsError
from trt_spec.runtime.penalties import ENGINE_DEFAULT_PENALTIES, ENGINE_MIN_TOKENS, NEUTRAL_TEMPERATURE, Penalties
from trt_spec.runtime.sampling import SamplingParams
from trt_spec.runtime.trtllm_emulator.errors import BackendError, _check, _CppError, _not_emulated, _unsupported
from trt_spec.runtime.trtllm_emulator.load import _FLT_MAX, BackendConfig

# Inputs the backend reads that change decoding in ways the emulator does not reproduce, and that
# our configs do not declare: refused. The declared ones are engine_interface.UNSUPPORTED_INPUTS.
NOT_EMULATED_INPUTS = frozenset({"no_repeat_ngram_size"})


# --- per request: the tensors as the backend reads them ----------------------------------------


def _scalar(inputs: Mapping[str, np.ndarray], name: str, ctype: type) -> Any:
    """``extractSingleton<ctype>``: None when absent; exactly one element; the buffer read as
    ``ctype`` without conversion (a same-size dtype is reinterpreted, as the C++ cast does)."""
    # Source: NVIDIA/TensorRT-LLM@89fd9b74ab7ae753b4c6b3db25a400dca7ea54a0:triton_backend/inflight_batcher_llm/src/utils.h extractSingleton
    if name not in inputs:
        return None
    array = np.asarray(inputs[name])
    _check(array.size == 1, f"Invalid size for tensor {name}")
    return _as_ctype(array, name, ctype).reshape(-1)[0].item()


def _vector(inputs: Mapping[str, np.ndarray], name: str) -> list[int] | None:
    """``extractVector<int32_t>``: the whole (flattened) tensor, or None when absent."""
    if name not in inputs:
        return None
    return _as_ctype(np.asarray(inputs[name]), name, np.int32).reshape(-1).tolist()


def _as_ctype(array: np.ndarray, name: str, ctype: type) -> np.ndarray:
    if array.dtype == ctype:
        return array
    if array.dtype.itemsize == np.dtype(ctype).itemsize:
        return np.ascontiguousarray(array).view(ctype)
    raise BackendError(
        f"TensorRT-LLM backend emulator: input {name} is {array.dtype}, but the backend reads its buffer as "
        f"{np.dtype(ctype)} without conversion (undefined); declare it as {np.dtype(ctype)} in config.pbtxt",
        stage="emulator",
    )


def _penalties(**values: Any) -> Penalties:
    """The penalty layer's parameters; values TensorRT-LLM takes but trt-spec refuses as unsafe
    (``penalties.py``' ranges) are not emulated."""
    try:
        return Penalties(**values)
    except GenerationParamsError as exc:
        raise _not_emulated(f"{exc} (outside trt-spec's ranges)") from None


def _bool_input(inputs: Mapping[str, np.ndarray], name: str) -> bool:
    """``getRequestBooleanInputTensor``: the first element, false when absent."""
    array = inputs.get(name)
    return bool(np.asarray(array).reshape(-1)[0]) if array is not None and np.asarray(array).size else False


def convert_word_list(sparse: Sequence[int]) -> list[list[int]]:
    """``stop_words_list``/``bad_words_list`` flattened (``[ids..., end offsets..., -1 padding]``) ->
    one token list per word, as the backend converts (and refuses) it.

    Raises: _CppError: upstream's message for an odd length, extra -1s, or bad offsets.
    """
    # Source: NVIDIA/TensorRT-LLM@192908136e53ddfc2f282e81e6ecdb76af06eb50:triton_backend/inflight_batcher_llm/src/utils.cc convertWordList
    text = "".join(f"{value} " for value in sparse)
    n = len(sparse)
    _check(n % 2 == 0, f"Sparse list must not have odd length: {text}")
    num_tokens = n // 2
    words, current = [], 0
    for i in range(num_tokens, n):
        if sparse[i] == -1:
            for j in range(i + 1, n):
                _check(sparse[j] == -1, f"Sparse list must not have additional -1s: {text}")
            break
        _check(sparse[i] <= num_tokens, f"Sparse list must not have out-of-bound offsets: {text}")
        if i != num_tokens:
            _check(sparse[i] > sparse[i - 1], f"Sparse list must not have non-increasing offsets: {text}")
        word = []
        while current < sparse[i]:
            word.append(sparse[current])
            current += 1
        words.append(word)
    return words


@dataclass(frozen=True)
class BackendRequest:
    """One executor request as the backend builds it from a batch-1 Triton request's tensors."""

    input_tokens: tuple[int, ...]
    max_new_tokens: int  # request_output_len
    end_id: int | None
    exclude_input_from_output: bool
    return_generation_logits: bool
    return_context_logits: bool
    stop_words: tuple[tuple[int, ...], ...]
    # Sampling as sent (None = absent; runtime_top_p <= 0 is absent).
    beam_width: int
    top_k: int | None
    top_p: float | None
    temperature: float | None
    seed: int  # absent = 0 (DefaultDecodingParams::getSeed)
    # External draft tokens (draft_input_ids present).
    draft_tokens: tuple[int, ...] | None
    draft_logits: np.ndarray | None  # as sent, batch dimension squeezed
    draft_acceptance_threshold: float | None
    penalties: Penalties = ENGINE_DEFAULT_PENALTIES
    embedding_bias_size: int = 0  # entries of the embedding_bias sent (0: none)
    return_perf_metrics: bool = False
    return_log_probs: bool = False
    return_num_input_tokens: bool = False
    return_num_output_tokens: bool = False

    @classmethod
    def from_tensors(cls, inputs: Mapping[str, np.ndarray], config: BackendConfig) -> BackendRequest:
        """Raises: _CppError: what ``createRequestsFromInputTensors`` throws;
        BackendError: an input the emulator does not reproduce (stage ``emulator``)."""
        # Source: NVIDIA/TensorRT-LLM@192908136e53ddfc2f282e81e6ecdb76af06eb50:triton_backend/inflight_batcher_llm/src/utils.cc splitBatchInputsTensors
        if T.INPUT_IDS.name not in inputs:
            raise _CppError("inputTokens or encoderInputFeatures tensor not provided")
        input_ids = np.asarray(inputs[T.INPUT_IDS.name])
        _check(input_ids.ndim == 2, "Expected inputTokens tensors to have 2 dimensions")
        batch_size = input_ids.shape[0]
        if batch_size > 1:
            _check(T.INPUT_LENGTHS.name in inputs, "input lengths tensor not provided")

        # Source: NVIDIA/TensorRT-LLM@192908136e53ddfc2f282e81e6ecdb76af06eb50:triton_backend/inflight_batcher_llm/src/utils.cc createRequestsFromInputTensors
        if batch_size > 1 and not config.decoupled:
            raise _CppError("Batch size > 1 requires the tensorrt_llm backend to be using decoupled transaction policy")
        streaming = _bool_input(inputs, T.STREAMING.name)
        if streaming and not config.decoupled:
            raise _CppError("Streaming is only supported if model is deployed using decoupled mode.")
        if batch_size > 1 or streaming:
            raise _not_emulated("a decoupled model's batched or streaming request")
        refused = sorted(NOT_EMULATED_INPUTS & set(inputs))
        if refused:
            raise _not_emulated(f"the input {', '.join(refused)}")
        unsupported = engine_interface.num_return_sequences_error(inputs) or engine_interface.unsupported_input(inputs)
        if unsupported:
            raise _unsupported(unsupported)

        # Source: NVIDIA/TensorRT-LLM@192908136e53ddfc2f282e81e6ecdb76af06eb50:triton_backend/inflight_batcher_llm/src/utils.cc getOutputConfigFromTensors
        return_log_probs = bool(_scalar(inputs, T.ENGINE_RETURN_LOG_PROBS.name, np.bool_))
        return_generation_logits = bool(_scalar(inputs, T.RETURN_GENERATION_LOGITS.name, np.bool_))
        return_context_logits = bool(_scalar(inputs, T.ENGINE_RETURN_CONTEXT_LOGITS.name, np.bool_))
        return_perf_metrics = bool(_scalar(inputs, T.RETURN_PERF_METRICS.name, np.bool_))
        exclude = _scalar(inputs, T.EXCLUDE_INPUT_IN_OUTPUT.name, np.bool_)  # the request's wins over the config's

        input_tokens = _vector(inputs, T.INPUT_IDS.name) or []  # batch 1: all of input_ids (input_lengths unread)
        max_new_tokens = _scalar(inputs, T.REQUEST_OUTPUT_LEN.name, np.int32)
        if max_new_tokens is None:
            raise _CppError("request_output_len is not present in the request")
        end_id = _scalar(inputs, T.END_ID.name, np.int32)
        _scalar(inputs, T.PAD_ID.name, np.int32)

        # Source: NVIDIA/TensorRT-LLM@192908136e53ddfc2f282e81e6ecdb76af06eb50:triton_backend/inflight_batcher_llm/src/utils.cc getSamplingConfigFromTensors
        beam_width = _scalar(inputs, T.BEAM_WIDTH.name, np.int32)
        beam_width = 1 if beam_width is None else beam_width
        top_k = _scalar(inputs, T.RUNTIME_TOP_K.name, np.int32)
        top_p = _scalar(inputs, T.RUNTIME_TOP_P.name, np.float32)
        if top_p is not None and top_p <= 0:
            top_p = None
        temperature = _scalar(inputs, T.ENGINE_TEMPERATURE.name, np.float32)
        seed = _scalar(inputs, T.ENGINE_SEED.name, np.uint64)
        # Source: NVIDIA/TensorRT-LLM@3585984b32cded5cc002d3087d3da4b0fd9fb8a5:cpp/tensorrt_llm/executor/samplingConfig.cpp SamplingConfig::SamplingConfig
        _check(
            0 < beam_width <= 1024,
            "beamWidth > 0 && beamWidth <= static_cast<SizeType32 const>(tensorrt_llm::kernels::kMaxBeamWidth)",
        )
        if top_k is not None:
            _check(top_k >= 0, "topK.value() >= 0")
        if top_p is not None:
            _check(top_p > 0, "topP.value() > 0.f")  # NaN: anything <= 0 was dropped above
            _check(top_p <= 1, "topP.value() <= 1.f")
        if temperature is not None:
            _check(temperature >= 0, "temperature.value() >= 0.f")
        repetition = _scalar(inputs, T.ENGINE_REPETITION_PENALTY.name, np.float32)
        if repetition is not None:
            _check(repetition > 0, "repetitionpenalty.value() > 0.f")
        min_tokens = _scalar(inputs, T.ENGINE_MIN_TOKENS.name, np.int32)
        if min_tokens is not None:
            _check(min_tokens >= 0, "minTokens.value() >= 0")
        presence = _scalar(inputs, T.ENGINE_PRESENCE_PENALTY.name, np.float32)  # not checked upstream
        frequency = _scalar(inputs, T.ENGINE_FREQUENCY_PENALTY.name, np.float32)
        if beam_width != 1:
            raise _not_emulated(f"beam search (beam_width {beam_width})")

        stop_words: list[list[int]] = []
        stop_words_raw = _vector(inputs, T.STOP_WORDS_LIST.name)
        if stop_words_raw is not None:
            stop_words = convert_word_list(stop_words_raw)
        bad_words_raw = _vector(inputs, T.BAD_WORDS_LIST.name)
        bad_words = [] if bad_words_raw is None else convert_word_list(bad_words_raw)
        # Source: NVIDIA/TensorRT-LLM@249d93d551e8ec11d6d62aabfc9ca8df41ead84c:cpp/tensorrt_llm/kernels/penaltyKernels.cu batchApplyPenalty (bias added to every vocabulary entry)
        bias = inputs.get(T.EMBEDDING_BIAS.name)
        bias_pairs: tuple[tuple[int, float], ...] = ()
        bias_size = 0
        if bias is not None and np.asarray(bias).size:
            bias = np.asarray(bias).reshape(-1)
            if bias.dtype != np.float32:
                raise _not_emulated(f"an embedding_bias of {bias.dtype} (emulated: float32, as our configs declare it)")
            bias_size = bias.size
            bias_pairs = tuple((int(i), float(bias[i])) for i in np.flatnonzero(bias))

        # Source: NVIDIA/TensorRT-LLM@192908136e53ddfc2f282e81e6ecdb76af06eb50:triton_backend/inflight_batcher_llm/src/utils.cc getExternalDraftTokensConfigFromTensors, squeezeTensor
        draft_tokens = _vector(inputs, T.DRAFT_INPUT_IDS.name)
        draft_logits = threshold = None
        if draft_tokens is not None:
            if T.DRAFT_LOGITS.name in inputs:
                draft_logits = np.asarray(inputs[T.DRAFT_LOGITS.name])
                if draft_logits.ndim == 3 and draft_logits.shape[0] == 1:
                    draft_logits = draft_logits[0]
            threshold = _scalar(inputs, "draft_acceptance_threshold", np.float32)
            if return_log_probs and draft_tokens:
                raise _unsupported(engine_interface.LOG_PROBS_WITH_DRAFTS)

        # Source: NVIDIA/TensorRT-LLM@a678b91aafbeff265cd0b764abb59d7def624ac2:cpp/tensorrt_llm/executor/requestImpl.h Request::Impl::validate
        _check(bool(input_tokens), "!mInputTokenIds.empty()")
        _check(max_new_tokens > 0, "mMaxNewTokens > 0")
        return cls(
            input_tokens=tuple(input_tokens),
            max_new_tokens=max_new_tokens,
            end_id=end_id,
            exclude_input_from_output=config.exclude_input_in_output if exclude is None else bool(exclude),
            return_generation_logits=return_generation_logits,
            return_context_logits=return_context_logits,
            return_perf_metrics=return_perf_metrics,
            return_log_probs=return_log_probs,
            # Source: NVIDIA/TensorRT-LLM@0c8de69a1ca6213eebb20a51873890ff128666c2:triton_backend/inflight_batcher_llm/src/model_instance_state.cc ModelInstanceState::enqueue (getRequestBooleanInputTensor)
            return_num_input_tokens=_bool_input(inputs, T.ENGINE_RETURN_NUM_INPUT_TOKENS.name),
            return_num_output_tokens=_bool_input(inputs, T.ENGINE_RETURN_NUM_OUTPUT_TOKENS.name),
            stop_words=tuple(tuple(word) for word in stop_words if word),
            beam_width=beam_width,
            top_k=top_k,
            top_p=top_p,
            temperature=temperature,
            seed=0 if seed is None else int(seed),
            draft_tokens=None if draft_tokens is None else tuple(draft_tokens),
            draft_logits=draft_logits,
            draft_acceptance_threshold=threshold,
            embedding_bias_size=bias_size,
            penalties=_penalties(
                repetition_penalty=1.0 if repetition is None else float(repetition),
                presence_penalty=0.0 if presence is None else float(presence),
                frequency_penalty=0.0 if frequency is None else float(frequency),
                # Source: NVIDIA/TensorRT-LLM@1020a8d799d04a1776f8eec19496ecafa2558506:cpp/tensorrt_llm/layers/defaultDecodingParams.h getMinLength (1)
                min_tokens=ENGINE_MIN_TOKENS if min_tokens is None else int(min_tokens),
                bad_words=tuple(tuple(word) for word in bad_words if word),
                embedding_bias=bias_pairs,
            ),
        )

    @property
    def score_temperature(self) -> float:
        """The temperature the penalty kernel scales by: the one sent, else 1 (no scaling)."""
        return NEUTRAL_TEMPERATURE if self.temperature is None else min(float(self.temperature), _FLT_MAX)

    def sampling_params(self, warn: Callable[[str], None]) -> SamplingParams:
        """The distribution the decoding layers sample from: ``SamplingParams()`` (greedy) when
        top-k is 1 after TensorRT-LLM's regularisation, which turns an absent top-k AND top-p into
        top-k 1 whatever the temperature; else softmax(mask_topk_topp(logits / temperature))."""
        # Source: NVIDIA/TensorRT-LLM@21c8b6d4b656cd3e6e89698ee2bf882344b3cd01:cpp/include/tensorrt_llm/layers/defaultDecodingParams.h DefaultDecodingParams (topK 0, topP 0, temperature 1)
        top_k = 0 if self.top_k is None else self.top_k
        top_p = 0.0 if self.top_p is None else self.top_p
        # Source: NVIDIA/TensorRT-LLM@e41b05cdc69021efb4116ed5f32eeb1840a47981:cpp/tensorrt_llm/kernels/samplingTopKKernels.h clampTopK, regularizeTopKTopP
        if top_k > TOP_K_MAX:
            warn(f"TopK ({top_k}) is larger than max supported number ({TOP_K_MAX}). Clip to max supported number.")
            top_k = TOP_K_MAX
        if top_k == 0 and top_p == 0.0:
            top_k = 1
        if top_k > 0 and top_p == 0.0:
            top_p = 1.0
        # Temperature 0 with top-k/top-p: the penalty kernel multiplies by 1 / (0 + 1e-6), so the
        # distribution is the argmax's up to near-ties; emulated as the argmax of those scores.
        if top_k == 1 or self.temperature == 0:
            return SamplingParams()
        temperature = 1.0 if self.temperature is None else min(self.temperature, _FLT_MAX)  # inf: uniform
        return SamplingParams(temperature, top_k, top_p)
