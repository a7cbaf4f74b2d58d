"""``spec_preprocessing``'s logic, without Triton: prompt text -> token ids, request parameters checked.

The Triton python model (``models/spec_preprocessing/model.py``) reads a request's tensors and
hands them here (:func:`read_prompts`, then :meth:`Preprocessor.batch`); it sends the outputs or
the error back. It takes every input of the ensemble (TensorRT-LLM 1.2.x's interface,
``tensors.py``) but the seeds and ``adaptive_draft``, and resolves every default as TensorRT-LLM
does, so the loop gets complete, valid tensors:

- greedy decoding unless ``top_k`` (> 0) or ``top_p`` is sent, whatever ``temperature`` says;
  when sampling, temperature absent = 1.0, top_k absent = 0 (off), top_p absent = 1.0;
- ``stream`` absent = false; ``exclude_input_in_output`` absent = the repository's configured
  default (:class:`~trt_spec.runtime.parameters.PreprocessingParameters`);
- ``end_id`` absent = the tokenizer's EOS (-1: never stop at an end token), ``pad_id`` absent =
  its pad token (else EOS); ``num_draft_tokens`` absent = the spec's K, flagged
  (``num_draft_tokens_is_default``) so that the loop may lower it to its K schedule under load;
- ``beam_width`` and ``num_return_sequences`` must be 1: speculative decoding here decodes one
  sequence per prompt;
- penalties (``repetition_penalty`` > 0, ``presence_penalty``, ``frequency_penalty``; absent =
  none), ``min_tokens`` (absent = 1, TensorRT-LLM's default), ``bad_words`` (each string's tokens,
  as TensorRT-LLM's preprocessing encodes them) and the embedding bias (every token of each
  ``embedding_bias_words`` entry gets its weight, as TensorRT-LLM's preprocessing adds
  them (``triton_backend/all_models/inflight_batcher_llm/preprocessing/1/model.py``, ``_get_embedding_bias``)
  them; a ``[V]`` row, ``[0]`` when none) go to the loop, which applies them identically to the
  draft and the target (:mod:`trt_spec.runtime.penalties`); ``return_log_probs`` absent = false;
- the inputs whose speculative treatment is not implemented (logits, perf metrics, prompt
  tables, LoRA, guided decoding, encoder-decoder text) are accepted only with their neutral
  value (:data:`NOT_YET`): any other value is refused, never silently ignored.

A prompt is refused before it is decoded or tokenized when it has more bytes than
``max_input_len`` tokens can cover (:func:`max_prompt_bytes`), so a huge prompt costs no
tokenizer time and holds up no other request.

A request may carry N prompts (``text_input`` ``[N, 1]``, every other input ``[N, ...]``); each
row is checked on its own and the outputs are ``[N, ...]``, ``input_ids`` right-padded with the
row's ``pad_id``. A bad request fails alone with one short :class:`RequestError` (the model's
``TritonError``) naming the input, its value and what is allowed; never a traceback. Temperature,
top-k and top-p are checked by :class:`~trt_spec.runtime.sampling.SamplingParams`, the one
validation the loop and the engine models use too.

Imports numpy, the tokenizer library (through the caller's tokenizer) and ``trt_spec.runtime``:
copied into model repositories with the rest of :mod:`trt_spec.runtime`.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from trt_spec.runtime import tensors as T
from trt_spec.runtime.errors import GenerationParamsError
from trt_spec.runtime.parameters import PreprocessingParameters
from trt_spec.runtime.penalties import ENGINE_MIN_TOKENS, MAX_BIAS_WEIGHT, Penalties
from trt_spec.runtime.sampling import GREEDY_TEMPERATURE, NO_TOP_K, NO_TOP_P, SamplingParams
from trt_spec.runtime.tokenizing import (
    PromptTooLarge,
    WordListTooLarge,
    check_prompt_size,
    check_word_list,
    embedding_bias,
    max_prompt_bytes,
    stack_word_lists,
    word_list,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# TensorRT-LLM's temperature when a sampled request sends none (executor SamplingConfig default).
DEFAULT_TEMPERATURE = 1.0
NO_END_ID = -1  # end_id -1: never stop at an end token (TensorRT-LLM's ignore_eos)

# How each input is read, one row (prompt) at a time; None = absent.
NUMBER_INPUTS = tuple(
    tensor for tensor in T.PREPROCESSING_INPUTS if tensor.dims == (1,) and tensor.dtype not in ("BYTES",)
)  # one number or bool
TEXT_INPUTS = (T.DECODER_TEXT_INPUT, T.GUIDED_DECODING_GUIDE_TYPE, T.GUIDED_DECODING_GUIDE)  # one string
WORD_LIST_INPUTS = (T.BAD_WORDS, T.STOP_WORDS, T.EMBEDDING_BIAS_WORDS)  # strings
ARRAY_INPUTS = (T.EMBEDDING_BIAS_WEIGHTS, T.PROMPT_EMBEDDING_TABLE, T.LORA_WEIGHTS, T.LORA_CONFIG)  # numbers


class RequestError(ValueError):
    """A request the model refuses; the message goes to the client as it is."""


@dataclass(frozen=True)
class NotYetSupported:
    """An input whose speculative treatment is not implemented: accepted only when ``neutral``."""

    tensor: T.Tensor
    default: str | None  # what to send instead, for the message; None: only leaving it out
    neutral: Callable[[object], bool]


def _empty_array(array: object) -> bool:
    return np.asarray(array).size == 0


NOT_YET = (
    # TensorRT-LLM's default is 0.0; 1.0 is as neutral (it scales beam-search scores only).
    NotYetSupported(T.LENGTH_PENALTY, "0.0 (or 1.0)", lambda value: value in (0.0, 1.0)),
    NotYetSupported(T.RETURN_CONTEXT_LOGITS, "false", lambda value: not value),
    NotYetSupported(T.REQUEST_RETURN_GENERATION_LOGITS, "false", lambda value: not value),
    NotYetSupported(T.REQUEST_RETURN_PERF_METRICS, "false", lambda value: not value),
    NotYetSupported(T.PROMPT_EMBEDDING_TABLE, "an empty table", _empty_array),
    NotYetSupported(T.PROMPT_VOCAB_SIZE, "0", lambda value: value == 0),
    NotYetSupported(T.PROMPT_TABLE_EXTRA_ID, "0", lambda value: value == 0),
    NotYetSupported(T.LORA_TASK_ID, None, lambda value: False),
    NotYetSupported(T.LORA_WEIGHTS, "an empty tensor", _empty_array),
    NotYetSupported(T.LORA_CONFIG, "an empty tensor", _empty_array),
    NotYetSupported(T.GUIDED_DECODING_GUIDE_TYPE, '""', lambda value: value == ""),
    NotYetSupported(T.GUIDED_DECODING_GUIDE, '""', lambda value: value == ""),
    NotYetSupported(T.DECODER_TEXT_INPUT, '"" (it is for encoder-decoder models)', lambda value: value == ""),
)
# Inputs that must be 1: this loop decodes one sequence per prompt.
ONE_SEQUENCE = (
    (T.REQUEST_BEAM_WIDTH, "speculative decoding in trt-spec decodes one sequence per prompt (no beam search)"),
    (T.NUM_RETURN_SEQUENCES, "speculative decoding in trt-spec returns one sequence per prompt"),
)


def _shown(value: object) -> str:
    """A request value as an error message shows it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, np.ndarray):
        return f"a tensor of shape {list(value.shape)}"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass(frozen=True)
class RequestParameters:
    """One prompt's parameters, checked, defaults filled in."""

    max_tokens: int
    sampling: SamplingParams
    num_draft_tokens: int
    stream: bool
    exclude_input_in_output: bool
    return_num_input_tokens: bool
    return_num_output_tokens: bool
    end_id: int | None  # None: the tokenizer's
    pad_id: int | None  # None: the tokenizer's
    penalties: Penalties  # without bad words and bias (they need the tokenizer)
    return_log_probs: bool = False
    num_draft_tokens_is_default: bool = False  # the request sent none: the loop's K schedule applies


def _int(values: dict[str, object], tensor: T.Tensor) -> int | None:
    """An integer parameter (an INT/BOOL tensor's value), or None when absent."""
    value = values.get(tensor.name)
    if value is None or isinstance(value, int):
        return value
    raise RequestError(f"{tensor.name} must be an integer; got {_shown(value)}")


def _float(values: dict[str, object], tensor: T.Tensor) -> float | None:
    """A number parameter (a FP or INT tensor's value), or None when absent."""
    value = values.get(tensor.name)
    if value is None or isinstance(value, float):
        return value
    if isinstance(value, int):
        return float(value)
    raise RequestError(f"{tensor.name} must be a number; got {_shown(value)}")


def _sampling(values: dict[str, object]) -> SamplingParams:
    """TensorRT-LLM's rule: neither top_k (> 0) nor top_p = greedy, whatever the temperature
    (which is still checked)."""
    top_k, top_p, temperature = _int(values, T.TOP_K), _float(values, T.TOP_P), _float(values, T.TEMPERATURE)
    try:
        if temperature is not None:
            SamplingParams(temperature=temperature, top_k=NO_TOP_K, top_p=NO_TOP_P)  # raises on a bad value
        if not top_k and top_p is None:
            return SamplingParams(temperature=GREEDY_TEMPERATURE, top_k=NO_TOP_K, top_p=NO_TOP_P)
        return SamplingParams(
            temperature=DEFAULT_TEMPERATURE if temperature is None else temperature,
            top_k=NO_TOP_K if top_k is None else top_k,
            top_p=NO_TOP_P if top_p is None else top_p,
        )
    except GenerationParamsError as exc:
        raise RequestError(str(exc)) from None


def check_parameters(values: dict[str, object], limits: PreprocessingParameters) -> RequestParameters:
    """Validate one prompt's request parameters (by tensor name; ``None`` = absent).

    Raises:
        RequestError: the first bad parameter, with its value and what is allowed.
    """
    for tensor, why in ONE_SEQUENCE:
        value = values.get(tensor.name)
        if value is not None and value != 1:
            raise RequestError(f"{tensor.name} = {_shown(value)} is not supported: {why}; send 1 or omit it")
    for rule in NOT_YET:
        value = values.get(rule.tensor.name)
        if value is not None and not rule.neutral(value):
            instead = "omit it" if rule.default is None else f"send the default {rule.default} or omit it"
            raise RequestError(
                f"{rule.tensor.name} = {_shown(value)} is not supported with speculative decoding in trt-spec yet; "
                f"{instead}"
            )
    max_tokens = _int(values, T.MAX_TOKENS)
    if max_tokens is None:
        raise RequestError("max_tokens is required")
    if max_tokens < 1:
        raise RequestError(f"max_tokens must be >= 1; got {max_tokens}")
    top_k = _int(values, T.TOP_K)
    if top_k is not None and not 0 <= top_k <= limits.vocab_size:
        raise RequestError(f"top_k must be between 0 (off) and the vocabulary size {limits.vocab_size}; got {top_k}")
    sampling = _sampling(values)
    # Greedy verification compares tokens, so draft logits change nothing there; a sampled request
    # needs them, and engines built without generation logits cannot give them.
    if values.get(T.USE_DRAFT_LOGITS.name) and not sampling.greedy and not limits.draft_logits:
        raise RequestError(
            "use_draft_logits = true needs engines that return generation logits, and this deployment's are built "
            "without them (speculative.acceptance: greedy; sampled requests decode without drafts here); send false "
            "or omit it, or set speculative.acceptance: probabilistic in the spec and rebuild"
        )
    requested_k = _int(values, T.NUM_DRAFT_TOKENS)
    num_draft_tokens = limits.default_num_draft_tokens if requested_k is None else requested_k
    if not 0 <= num_draft_tokens <= limits.max_draft_len:
        raise RequestError(
            f"num_draft_tokens must be between 0 (plain target decoding) and the target engine's "
            f"max_draft_len {limits.max_draft_len}; got {num_draft_tokens}"
        )
    end_id, pad_id = _int(values, T.REQUEST_END_ID), _int(values, T.REQUEST_PAD_ID)
    if end_id is not None and end_id != NO_END_ID and not 0 <= end_id < limits.vocab_size:
        raise RequestError(
            f"end_id must be a token id below the vocabulary size {limits.vocab_size} (or -1: none); got {end_id}"
        )
    if pad_id is not None and not 0 <= pad_id < limits.vocab_size:
        raise RequestError(f"pad_id must be a token id below the vocabulary size {limits.vocab_size}; got {pad_id}")
    exclude = values.get(T.REQUEST_EXCLUDE_INPUT_IN_OUTPUT.name)
    words, weights = values.get(T.EMBEDDING_BIAS_WORDS.name), values.get(T.EMBEDDING_BIAS_WEIGHTS.name)
    num_words = 0 if words is None else len(words)  # type: ignore[arg-type]
    num_weights = 0 if weights is None else np.asarray(weights).size
    if num_words != num_weights:
        raise RequestError(
            f"embedding_bias_words has {num_words} entries and embedding_bias_weights {num_weights}: "
            "send one weight per word"
        )
    if weights is not None and not np.all(np.abs(np.asarray(weights, dtype=np.float64)) <= MAX_BIAS_WEIGHT):
        raise RequestError(f"embedding_bias_weights must be between -{MAX_BIAS_WEIGHT:g} and {MAX_BIAS_WEIGHT:g}")
    return RequestParameters(
        max_tokens=max_tokens,
        sampling=sampling,
        num_draft_tokens=num_draft_tokens,
        stream=bool(values.get(T.STREAM.name) or False),
        exclude_input_in_output=limits.exclude_input_in_output if exclude is None else bool(exclude),
        return_num_input_tokens=bool(values.get(T.RETURN_NUM_INPUT_TOKENS.name) or False),
        return_num_output_tokens=bool(values.get(T.RETURN_NUM_OUTPUT_TOKENS.name) or False),
        end_id=end_id,
        pad_id=pad_id,
        penalties=_penalties(values),
        return_log_probs=bool(values.get(T.RETURN_LOG_PROBS.name) or False),
        num_draft_tokens_is_default=requested_k is None,
    )


def _penalties(values: dict[str, object]) -> Penalties:
    """The penalties and min_tokens, TensorRT-LLM's defaults for what is absent (checked by
    :class:`Penalties`, the one validation the loop and the engine models use too)."""
    repetition, presence, frequency = (
        _float(values, t) for t in (T.REPETITION_PENALTY, T.PRESENCE_PENALTY, T.FREQUENCY_PENALTY)
    )
    min_tokens = _int(values, T.MIN_TOKENS)
    try:
        return Penalties(
            repetition_penalty=1.0 if repetition is None else repetition,
            presence_penalty=0.0 if presence is None else presence,
            frequency_penalty=0.0 if frequency is None else frequency,
            min_tokens=ENGINE_MIN_TOKENS if min_tokens is None else min_tokens,
        )
    except GenerationParamsError as exc:
        raise RequestError(str(exc)) from None


def check_lengths(num_prompt_tokens: int, max_tokens: int, limits: PreprocessingParameters) -> None:
    if num_prompt_tokens == 0:
        raise RequestError("text_input is empty: the prompt needs at least one token")
    if num_prompt_tokens > limits.max_input_len:
        raise RequestError(
            f"the prompt is {num_prompt_tokens} tokens, over the engine's max_input_len {limits.max_input_len}"
        )
    if num_prompt_tokens + max_tokens > limits.max_seq_len:
        raise RequestError(
            f"prompt ({num_prompt_tokens} tokens) + max_tokens ({max_tokens}) = {num_prompt_tokens + max_tokens} "
            f"is over the engine's max_seq_len {limits.max_seq_len}; lower max_tokens to at most "
            f"{max(0, limits.max_seq_len - num_prompt_tokens)}"
        )


@dataclass(frozen=True)
class Prompt:
    """One row of a request: the prompt, its parameters by tensor name (None = absent; a number,
    a string, a list of strings or an array, as the input is) and its stop words."""

    text: str
    values: dict[str, object]
    stop_words: tuple[str, ...] = ()
    bad_words: tuple[str, ...] = ()


class Preprocessor:
    """The model's logic, without Triton: a tokenizer and the model's parameters."""

    def __init__(self, tokenizer: "PreTrainedTokenizerBase", parameters: PreprocessingParameters) -> None:
        self.tokenizer = tokenizer
        self.parameters = parameters
        self.max_prompt_bytes = max_prompt_bytes(tokenizer, parameters.max_input_len)
        self.end_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.end_id

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=add_special_tokens).input_ids)

    def embedding_bias(self, values: dict[str, object]) -> np.ndarray:
        """``[V]`` float32: each word's weight added at every one of its tokens (TensorRT-LLM's
        preprocessing encodes the word with the tokenizer's defaults); ``[0]`` without words."""
        words = values.get(T.EMBEDDING_BIAS_WORDS.name) or []
        if not words:
            return np.zeros(0, dtype=np.float32)
        weights = np.asarray(values[T.EMBEDDING_BIAS_WEIGHTS.name], dtype=np.float64).reshape(-1)
        return embedding_bias(self.tokenizer, words, weights, self.parameters.vocab_size)  # type: ignore[arg-type]

    def __call__(
        self, text: str, values: dict[str, object], stop_words: Sequence[str] = (), bad_words: Sequence[str] = ()
    ) -> dict[str, np.ndarray]:
        """One prompt -> the output tensors (without the batch dimension), by name."""
        request = check_parameters(values, self.parameters)
        if not text:
            raise RequestError("text_input is empty: the prompt needs at least one token")
        input_ids = self.encode(text, add_special_tokens=self.parameters.add_special_tokens)
        check_lengths(len(input_ids), request.max_tokens, self.parameters)
        stop_ids = [self.encode(word, add_special_tokens=False) for word in stop_words if word]
        bad_ids = [ids for ids in (self.encode(word, add_special_tokens=False) for word in bad_words if word) if ids]
        sampling = request.sampling
        penalties = request.penalties
        return {
            T.INPUT_IDS.name: np.array(input_ids, dtype=np.int32),
            T.INPUT_LENGTHS.name: np.array([len(input_ids)], dtype=np.int32),
            T.REQUEST_OUTPUT_LEN.name: np.array([request.max_tokens], dtype=np.int32),
            T.END_ID.name: np.array([self.end_id if request.end_id is None else request.end_id], dtype=np.int32),
            T.PAD_ID.name: np.array([self.pad_id if request.pad_id is None else request.pad_id], dtype=np.int32),
            T.ENGINE_TEMPERATURE.name: np.array([sampling.temperature], dtype=np.float32),
            T.RUNTIME_TOP_K.name: np.array([sampling.top_k], dtype=np.int32),
            T.RUNTIME_TOP_P.name: np.array([sampling.top_p], dtype=np.float32),
            T.NUM_DRAFT_TOKENS.name: np.array([request.num_draft_tokens], dtype=np.int32),
            T.STREAMING.name: np.array([request.stream], dtype=bool),
            T.STOP_WORDS_LIST.name: word_list(stop_ids),
            T.BAD_WORDS_LIST.name: word_list(bad_ids),
            T.EMBEDDING_BIAS.name: self.embedding_bias(values),
            T.ENGINE_REPETITION_PENALTY.name: np.array([penalties.repetition_penalty], dtype=np.float32),
            T.ENGINE_PRESENCE_PENALTY.name: np.array([penalties.presence_penalty], dtype=np.float32),
            T.ENGINE_FREQUENCY_PENALTY.name: np.array([penalties.frequency_penalty], dtype=np.float32),
            T.ENGINE_MIN_TOKENS.name: np.array([penalties.min_tokens], dtype=np.int32),
            T.EXCLUDE_INPUT_IN_OUTPUT.name: np.array([request.exclude_input_in_output], dtype=bool),
            T.RESOLVED_RETURN_LOG_PROBS.name: np.array([request.return_log_probs], dtype=bool),
            T.RESOLVED_RETURN_NUM_INPUT_TOKENS.name: np.array([request.return_num_input_tokens], dtype=bool),
            T.RESOLVED_RETURN_NUM_OUTPUT_TOKENS.name: np.array([request.return_num_output_tokens], dtype=bool),
            T.NUM_DRAFT_TOKENS_IS_DEFAULT.name: np.array([request.num_draft_tokens_is_default], dtype=bool),
        }

    def batch(self, prompts: Sequence[Prompt]) -> dict[str, np.ndarray]:
        """The prompts of one request -> the output tensors ``[N, ...]``, by name: ``input_ids``
        right-padded with each row's ``pad_id``, ``stop_words_list`` with ids 0 and offsets -1
        (as TensorRT-LLM's preprocessing pads them)."""
        rows = []
        for index, prompt in enumerate(prompts):
            try:
                rows.append(self(prompt.text, prompt.values, prompt.stop_words, prompt.bad_words))
            except RequestError as exc:
                if len(prompts) == 1:
                    raise
                raise RequestError(f"prompt {index} of {len(prompts)}: {exc}") from None
        outputs = {}
        for name in rows[0]:
            arrays = [row[name] for row in rows]
            if name == T.INPUT_IDS.name:
                width = max(array.shape[0] for array in arrays)
                arrays = [
                    np.pad(array, (0, width - array.shape[0]), constant_values=int(row[T.PAD_ID.name][0]))
                    for array, row in zip(arrays, rows)
                ]
            elif name == T.EMBEDDING_BIAS.name:
                width = max(array.shape[0] for array in arrays)  # [0] rows padded with zeros to [V]
                arrays = [np.pad(array, (0, width - array.shape[0])) for array in arrays]
            elif name in (T.STOP_WORDS_LIST.name, T.BAD_WORDS_LIST.name):
                outputs[name] = stack_word_lists(arrays)
                continue
            outputs[name] = np.stack(arrays)
        return outputs


def _decode_text(value: object, name: str) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise RequestError(f"{name} is not valid UTF-8") from None
    return str(value)


def read_prompts(
    array: Callable[[str], np.ndarray | None], max_bytes: int | None = None, max_input_len: int = 0
) -> list[Prompt]:
    """The prompts of one request (one per row of ``text_input``), each with its own values;
    ``array(name)``: the request's input of that name as numpy, None when absent (read as
    needed); with ``max_bytes``, a prompt longer than that is refused before anything else is read."""
    text = array(T.TEXT_INPUT.name)
    if text is None:
        raise RequestError("text_input is required")
    if text.ndim == 0 or text.shape[0] == 0:
        raise RequestError(f"text_input must hold one prompt per row (shape [N, 1]); got shape {list(text.shape)}")
    size = text.shape[0]
    if max_bytes is not None:
        for row in range(size):
            for value in text[row].reshape(-1):
                try:
                    check_prompt_size(value, max_bytes, max_input_len, T.TEXT_INPUT.name)
                except PromptTooLarge as exc:
                    raise RequestError(str(exc)) from None
    columns = {}
    for tensor in (*NUMBER_INPUTS, *TEXT_INPUTS, *WORD_LIST_INPUTS, *ARRAY_INPUTS):
        data = array(tensor.name)
        if data is not None and (data.ndim == 0 or data.shape[0] != size):
            raise RequestError(
                f"{tensor.name} must have one row per prompt ({size}, as text_input); got shape {list(data.shape)}"
            )
        if data is not None and tensor in WORD_LIST_INPUTS:
            for row in range(size):
                try:
                    check_word_list(data[row], tensor.name)
                except WordListTooLarge as exc:
                    raise RequestError(str(exc)) from None
        columns[tensor] = data
    prompts = []
    for row in range(size):
        if text[row].size != 1:
            raise RequestError(f"text_input must hold one prompt per row (shape [N, 1]); got shape {list(text.shape)}")
        values: dict[str, object] = {}
        words: dict[str, tuple[str, ...]] = {}  # the word lists, decoded
        for tensor, data in columns.items():
            if data is None:
                values[tensor.name] = None
            elif tensor in NUMBER_INPUTS or tensor in TEXT_INPUTS:
                if data[row].size != 1:
                    raise RequestError(
                        f"{tensor.name} must hold one value per prompt (shape [N, 1]); got shape {list(data.shape)}"
                    )
                value = data[row].reshape(-1)[0]
                values[tensor.name] = _decode_text(value, tensor.name) if tensor in TEXT_INPUTS else value.item()
            elif tensor in WORD_LIST_INPUTS:
                words[tensor.name] = tuple(_decode_text(word, tensor.name) for word in data[row].reshape(-1))
                values[tensor.name] = list(words[tensor.name])
            else:
                values[tensor.name] = data[row]
        stop_words = words.get(T.STOP_WORDS.name, ())
        bad_words = words.get(T.BAD_WORDS.name, ())
        prompts.append(Prompt(_decode_text(text[row].reshape(-1)[0], T.TEXT_INPUT.name), values, stop_words, bad_words))
    return prompts
