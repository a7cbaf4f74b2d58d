"""Triton python model ``preprocessing``: prompt text -> token ids, request parameters checked.

Every default is resolved here (temperature 0, top-k 0, top-p 1, num_draft_tokens = the spec's K,
stream true), so the loop gets complete, valid tensors. A bad request fails alone with one short
``TritonError`` naming the parameter, its value and the allowed range; never a traceback.
Temperature, top-k and top-p are checked by :class:`~trt_spec.runtime.sampling.SamplingParams`,
the one validation the loop and the engine models use too; the request-level checks (max_tokens,
num_draft_tokens against the target's max_draft_len, top_k against the vocabulary, the lengths)
are this model's.

Runs inside Triton's python-backend stub: imports numpy, the tokenizer library and
``trt_spec.runtime`` (from the copy the repository writer puts beside this file, else from the
installed package).
"""

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import triton_python_backend_utils as pb_utils

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_HERE = Path(__file__).resolve().parent
if (_HERE / "trt_spec").is_dir():
    sys.path.insert(0, str(_HERE))

from trt_spec.runtime import tensors as T  # noqa: E402
from trt_spec.runtime.errors import GenerationParamsError  # noqa: E402
from trt_spec.runtime.parameters import PreprocessingParameters  # noqa: E402
from trt_spec.runtime.sampling import GREEDY_TEMPERATURE, NO_TOP_K, NO_TOP_P, SamplingParams  # noqa: E402

# The scalar request inputs, read into one dict by tensor name (None = absent).
SCALAR_INPUTS = (T.MAX_TOKENS, T.TEMPERATURE, T.TOP_K, T.TOP_P, T.NUM_DRAFT_TOKENS, T.STREAM)


class RequestError(ValueError):
    """A request the model refuses; the message goes to the client as it is."""


@dataclass(frozen=True)
class RequestParameters:
    """A request's parameters, checked, defaults filled in."""

    max_tokens: int
    sampling: SamplingParams
    num_draft_tokens: int
    stream: bool


def check_parameters(values: dict[str, object], limits: PreprocessingParameters) -> RequestParameters:
    """Validate the scalar request parameters (by tensor name; ``None`` = absent).

    Raises:
        RequestError: the first bad parameter, with its value and the allowed range.
    """
    max_tokens = values.get(T.MAX_TOKENS.name)
    if max_tokens is None:
        raise RequestError("max_tokens is required")
    if max_tokens < 1:
        raise RequestError(f"max_tokens must be >= 1; got {max_tokens}")
    top_k = values.get(T.TOP_K.name)
    top_k = NO_TOP_K if top_k is None else int(top_k)
    if not 0 <= top_k <= limits.vocab_size:
        raise RequestError(f"top_k must be between 0 (off) and the vocabulary size {limits.vocab_size}; got {top_k}")
    temperature, top_p = values.get(T.TEMPERATURE.name), values.get(T.TOP_P.name)
    try:
        sampling = SamplingParams(
            temperature=GREEDY_TEMPERATURE if temperature is None else float(temperature),
            top_k=top_k,
            top_p=NO_TOP_P if top_p is None else float(top_p),
        )
    except GenerationParamsError as exc:
        raise RequestError(str(exc)) from None
    num_draft_tokens = values.get(T.NUM_DRAFT_TOKENS.name)
    num_draft_tokens = limits.default_num_draft_tokens if num_draft_tokens is None else int(num_draft_tokens)
    if not 0 <= num_draft_tokens <= limits.max_draft_len:
        raise RequestError(
            f"num_draft_tokens must be between 0 (plain target decoding) and the target engine's "
            f"max_draft_len {limits.max_draft_len}; got {num_draft_tokens}"
        )
    stream = values.get(T.STREAM.name)
    return RequestParameters(int(max_tokens), sampling, num_draft_tokens, True if stream is None else bool(stream))


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


def stop_words_list(words: list[list[int]]) -> np.ndarray:
    """TensorRT-LLM's ``[2, L]`` stop-word format: flat ids; end offsets padded with -1."""
    flat = [token for word in words for token in word]
    offsets = list(np.cumsum([len(word) for word in words])) if words else []
    width = max(1, len(flat))
    ids = flat + [0] * (width - len(flat))
    ends = offsets + [-1] * (width - len(offsets))
    return np.array([ids, ends], dtype=np.int32)


class Preprocessor:
    """The model's logic, without Triton: a tokenizer and the model's parameters."""

    def __init__(self, tokenizer: "PreTrainedTokenizerBase", parameters: PreprocessingParameters) -> None:
        self.tokenizer = tokenizer
        self.parameters = parameters
        self.end_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.end_id

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=add_special_tokens).input_ids)

    def __call__(self, text: str, values: dict[str, object], stop_words: Sequence[str] = ()) -> dict[str, np.ndarray]:
        """One request -> the output tensors (without the batch dimension), by name."""
        request = check_parameters(values, self.parameters)
        if not text:
            raise RequestError("text_input is empty: the prompt needs at least one token")
        input_ids = self.encode(text, add_special_tokens=self.parameters.add_special_tokens)
        check_lengths(len(input_ids), request.max_tokens, self.parameters)
        stop_ids = [self.encode(word, add_special_tokens=False) for word in stop_words if word]
        sampling = request.sampling
        return {
            T.INPUT_IDS.name: np.array(input_ids, dtype=np.int32),
            T.INPUT_LENGTHS.name: np.array([len(input_ids)], dtype=np.int32),
            T.REQUEST_OUTPUT_LEN.name: np.array([request.max_tokens], dtype=np.int32),
            T.END_ID.name: np.array([self.end_id], dtype=np.int32),
            T.PAD_ID.name: np.array([self.pad_id], dtype=np.int32),
            T.ENGINE_TEMPERATURE.name: np.array([sampling.temperature], dtype=np.float32),
            T.RUNTIME_TOP_K.name: np.array([sampling.top_k], dtype=np.int32),
            T.RUNTIME_TOP_P.name: np.array([sampling.top_p], dtype=np.float32),
            T.NUM_DRAFT_TOKENS.name: np.array([request.num_draft_tokens], dtype=np.int32),
            T.STREAMING.name: np.array([request.stream], dtype=bool),
            T.STOP_WORDS_LIST.name: stop_words_list(stop_ids),
        }


def _decode_text(value: object) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise RequestError("text_input is not valid UTF-8") from None
    return str(value)


def read_request(request) -> tuple[str, dict[str, object], list[str]]:
    """The prompt, the scalar parameters (None when absent) and the stop words of one request."""

    def array(name: str):
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        return None if tensor is None else tensor.as_numpy()

    text = array(T.TEXT_INPUT.name)
    if text is None:
        raise RequestError("text_input is required")
    if text.shape[0] != 1:
        raise RequestError(f"send one prompt per request (shape [1, 1]); got a batch of {text.shape[0]}")
    values = {}
    for tensor in SCALAR_INPUTS:
        data = array(tensor.name)
        if data is not None and data.size != 1:
            raise RequestError(f"{tensor.name} must hold one value (shape [1, 1]); got shape {list(data.shape)}")
        values[tensor.name] = None if data is None else data.reshape(-1)[0].item()
    stop = array(T.STOP_WORDS.name)
    stop_words = [] if stop is None else [_decode_text(word) for word in stop.reshape(-1)]
    return _decode_text(text.reshape(-1)[0]), values, stop_words


class TritonPythonModel:
    def initialize(self, args):
        import json

        from transformers import AutoTokenizer

        parameters = PreprocessingParameters.from_config(json.loads(args["model_config"]))
        tokenizer = AutoTokenizer.from_pretrained(str(Path(__file__).parent / parameters.tokenizer_dir))
        self.preprocessor = Preprocessor(tokenizer, parameters)

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                text, values, stop_words = read_request(request)
                outputs = self.preprocessor(text, values, stop_words)
                tensors = [pb_utils.Tensor(name, array[np.newaxis, ...]) for name, array in outputs.items()]
                responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
            except RequestError as exc:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))))
            except Exception as exc:  # noqa: BLE001 - one short line to the client, never a traceback
                message = f"preprocessing failed: {type(exc).__name__}: {exc}"
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)))
        return responses
