"""Triton python model ``preprocessing``: prompt text -> token ids, request parameters checked.

Every default is resolved here (temperature 0, top-k 0, top-p 1, num_draft_tokens = the spec's K,
stream true), so the loop gets complete, valid tensors. A bad request fails alone with one short
``TritonError`` naming the parameter, its value and the allowed range; never a traceback.

Runs inside Triton's python-backend stub: imports numpy, the tokenizer library and the tensor
definitions of ``trt_spec`` (from the copy the repository writer puts beside this file, else from
the installed package).
"""


import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

_HERE = Path(__file__).resolve().parent
if (_HERE / "trt_spec").is_dir():
    sys.path.insert(0, str(_HERE))

from trt_spec.runtime import tensors as T  # noqa: E402


class RequestError(ValueError):
    """A request the model refuses; the message goes to the client as it is."""


@dataclass(frozen=True)
class Limits:
    max_input_len: int
    max_seq_len: int  # prompt + max_tokens
    max_draft_len: int
    default_num_draft_tokens: int
    vocab_size: int

    @classmethod
    def from_parameters(cls, parameters: dict[str, str]) -> "Limits":
        return cls(**{name: int(parameters[name]) for name in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Sampling:
    """A request's parameters, checked, defaults filled in."""

    max_tokens: int
    temperature: float
    top_k: int
    top_p: float
    num_draft_tokens: int
    stream: bool


def check_parameters(values: dict[str, object], limits: Limits) -> Sampling:
    """Validate the scalar request parameters (``None`` = absent).

    Raises:
        RequestError: the first bad parameter, with its value and the allowed range.
    """
    max_tokens = values.get("max_tokens")
    if max_tokens is None:
        raise RequestError("max_tokens is required")
    if max_tokens < 1:
        raise RequestError(f"max_tokens must be >= 1; got {max_tokens}")
    temperature = 0.0 if values.get("temperature") is None else float(values["temperature"])
    if not math.isfinite(temperature) or temperature < 0:
        raise RequestError(f"temperature must be a finite number >= 0 (0 = greedy); got {temperature}")
    top_k = 0 if values.get("top_k") is None else int(values["top_k"])
    if not 0 <= top_k <= limits.vocab_size:
        raise RequestError(f"top_k must be between 0 (off) and the vocabulary size {limits.vocab_size}; got {top_k}")
    top_p = 1.0 if values.get("top_p") is None else float(values["top_p"])
    if not (math.isfinite(top_p) and 0 < top_p <= 1):
        raise RequestError(f"top_p must be in (0, 1]; got {top_p}")
    num_draft_tokens = values.get("num_draft_tokens")
    num_draft_tokens = limits.default_num_draft_tokens if num_draft_tokens is None else int(num_draft_tokens)
    if not 0 <= num_draft_tokens <= limits.max_draft_len:
        raise RequestError(
            f"num_draft_tokens must be between 0 (plain target decoding) and the target engine's "
            f"max_draft_len {limits.max_draft_len}; got {num_draft_tokens}"
        )
    stream = True if values.get("stream") is None else bool(values["stream"])
    return Sampling(int(max_tokens), temperature, top_k, top_p, num_draft_tokens, stream)


def check_lengths(num_prompt_tokens: int, max_tokens: int, limits: Limits) -> None:
    if num_prompt_tokens == 0:
        raise RequestError("text_input is empty: the prompt needs at least one token")
    if num_prompt_tokens > limits.max_input_len:
        raise RequestError(f"the prompt is {num_prompt_tokens} tokens, over the engine's max_input_len {limits.max_input_len}")
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
    """The model's logic, without Triton: a tokenizer and the limits."""

    def __init__(self, tokenizer, limits: Limits, *, add_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.limits = limits
        self.add_special_tokens = add_special_tokens
        self.end_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.end_id

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=self.add_special_tokens)["input_ids"])

    def __call__(self, text: str, values: dict[str, object], stop_words: list[str] = ()) -> dict[str, np.ndarray]:
        """One request -> the output tensors (without the batch dimension), by name."""
        sampling = check_parameters(values, self.limits)
        if not text:
            raise RequestError("text_input is empty: the prompt needs at least one token")
        input_ids = self.encode(text)
        check_lengths(len(input_ids), sampling.max_tokens, self.limits)
        stop_ids = [self.tokenizer(word, add_special_tokens=False)["input_ids"] for word in stop_words if word]
        return {
            "input_ids": np.array(input_ids, dtype=np.int32),
            "input_lengths": np.array([len(input_ids)], dtype=np.int32),
            "request_output_len": np.array([sampling.max_tokens], dtype=np.int32),
            "end_id": np.array([self.end_id], dtype=np.int32),
            "pad_id": np.array([self.pad_id], dtype=np.int32),
            "temperature": np.array([sampling.temperature], dtype=np.float32),
            "runtime_top_k": np.array([sampling.top_k], dtype=np.int32),
            "runtime_top_p": np.array([sampling.top_p], dtype=np.float32),
            "num_draft_tokens": np.array([sampling.num_draft_tokens], dtype=np.int32),
            "streaming": np.array([sampling.stream], dtype=bool),
            "stop_words_list": stop_words_list(stop_ids),
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
    for name in ("max_tokens", "temperature", "top_k", "top_p", "num_draft_tokens", "stream"):
        data = array(name)
        if data is not None and data.size != 1:
            raise RequestError(f"{name} must hold one value (shape [1, 1]); got shape {list(data.shape)}")
        values[name] = None if data is None else data.reshape(-1)[0].item()
    stop = array(T.STOP_WORDS.name)
    stop_words = [] if stop is None else [_decode_text(word) for word in stop.reshape(-1)]
    return _decode_text(text.reshape(-1)[0]), values, stop_words


class TritonPythonModel:
    def initialize(self, args):
        import json

        from transformers import AutoTokenizer

        config = json.loads(args["model_config"])
        parameters = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        tokenizer_dir = Path(__file__).parent / parameters["tokenizer_dir"]
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        self.preprocessor = Preprocessor(
            tokenizer,
            Limits.from_parameters(parameters),
            add_special_tokens=parameters.get("add_special_tokens", "true") == "true",
        )

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
