"""An OpenAI-compatible HTTP endpoint in front of the Triton ensemble.

``GET /v1/models``, ``POST /v1/completions`` and ``POST /v1/chat/completions`` (streaming as
server-sent events, or one JSON body), built on FastAPI (request and response schemas as pydantic
models), served by uvicorn. Each HTTP request becomes ONE request to the decoupled ``ensemble``
over a gRPC stream of its own (``grpc.aio``: concurrent HTTP requests run concurrently on one
channel); an HTTP client that leaves cancels its Triton request.

What maps to what:

- ``prompt`` (completions) or the target tokenizer's chat template applied to ``messages`` (chat;
  the tokenizer files are the repository's, ``<repo>/preprocessing/1/tokenizer/``) -> ``text_input``;
- ``max_tokens`` (chat: ``max_completion_tokens`` first) -> ``max_tokens``; absent: 16 for
  completions (OpenAI's default), the rest of the engine's ``max_seq_len`` for chat;
- ``temperature`` 0 -> greedy: no ``temperature``/``top_p``/``top_k`` sent (TensorRT-LLM decodes
  greedily when neither top_k nor top_p is given); above 0 -> ``temperature`` and ``top_p``
  (default 1, so the ensemble samples) and the extension ``top_k`` when given;
- ``presence_penalty``/``frequency_penalty`` (-2..2) and the extensions ``repetition_penalty`` and
  ``min_tokens`` (vLLM's names) -> the ensemble inputs of the same names, applied by TensorRT-LLM's
  rules (after temperature, prompt tokens counted: ``trt_spec/runtime/penalties.py``);
- ``seed`` -> ``seed``; ``stop`` -> ``stop_words`` (the ensemble stops on their tokens) and, as
  OpenAI does, the text ends before the first stop string (matched on text here too);
- ``usage`` from the ensemble's ``num_input_tokens`` (``return_num_input_tokens``; an ensemble
  that does not declare it: the prompt counted with the same tokenizer) and its running total
  ``num_output_tokens`` (``return_num_output_tokens`` is not sent: with it, each streamed
  response would carry only its own count);
- the final chunk / response carries the extension ``speculative`` with the request's
  ``acceptance_rate``, ``total_draft_tokens``, ``total_accepted_draft_tokens`` and
  ``num_target_calls``; the request extension ``num_draft_tokens`` (0 = plain target decoding)
  is passed through.

Optional ensemble inputs are sent only when the ensemble declares them (read once from its
metadata), so the endpoint works with an ensemble before and after TensorRT-LLM 1.2.x's
``stream``/``exclude_input_in_output``/``return_num_input_tokens`` inputs.

Parameters OpenAI defines but this server does not implement (``n`` > 1, ``logprobs``,
``logit_bias``, tools, ``response_format`` other than text, ...) and unknown fields are refused
with a 400 in OpenAI's error shape ``{"error": {"message", "type", "param", "code"}}`` naming the
parameter; values that change nothing (``n`` = 1, ...) are accepted.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import grpc
import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from starlette.exceptions import HTTPException as StarletteHTTPException
from tritonclient.grpc import InferInput, InferResult, service_pb2, service_pb2_grpc

from trt_spec.runtime import tensors as T

R = TypeVar("R")
TOKENIZER_PATH = (T.PREPROCESSING, "1", "tokenizer")  # the repository's target tokenizer files
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_SEED = 2**64 - 1  # the ensemble's seed is UINT64
MAX_INT32 = 2**31 - 1  # max_tokens, top_k, num_draft_tokens and min_tokens are INT32 tensors: no wraparound
# stop: bounded before anything is tokenized (each string costs a tokenizer call per request).
MAX_STOP_STRINGS = 32
MAX_STOP_BYTES = 1024
_MAX_MESSAGE_BYTES = 2**31 - 1
_GRPC_OPTIONS = [("grpc.max_send_message_length", _MAX_MESSAGE_BYTES), ("grpc.max_receive_message_length", -1)]

# Ensemble inputs and outputs by name (TensorRT-LLM's names; ours for the speculative statistics).
_STREAM = "stream"
_EXCLUDE_INPUT = "exclude_input_in_output"
_RETURN_NUM_INPUT = "return_num_input_tokens"
_NUM_INPUT_TOKENS = "num_input_tokens"
_NUM_OUTPUT_TOKENS = "num_output_tokens"
_SPECULATIVE_OUTPUTS = ("acceptance_rate", "total_draft_tokens", "total_accepted_draft_tokens", "num_target_calls")

# A Triton error message that is about the request's parameters (the ensemble's preprocessing and
# loop name the parameter, its value and the allowed range) rather than a failure of the server.
_BAD_REQUEST = re.compile(
    r"must be|must hold|is required|is empty|is not valid|over the engine's|more than the engine's|; got |"
    r"unexpected (inference )?input|unexpected datatype|unexpected shape",
    re.IGNORECASE,
)


# --- errors -----------------------------------------------------------------------------------


class OpenAIError(Exception):
    """An error answered in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    @property
    def type(self) -> str:
        if self.status == 404:
            return "not_found_error"
        if self.status < 500:
            return "invalid_request_error"
        return "service_unavailable_error" if self.status == 503 else "server_error"

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def bad_request(message: str, param: str | None = None, code: str | None = "invalid_value") -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def _unsupported(param: str, fix: str, value: Any = None) -> OpenAIError:
    shown = param if value is None else f"{param}={value!r}"
    return bad_request(f"{shown} is not supported by this server; {fix}", param, "unsupported_parameter")


# --- request schemas --------------------------------------------------------------------------


def _refuse_lone_surrogates(value: Any, path: str = "") -> None:
    """A JSON string may escape a lone UTF-16 surrogate (``"\\ud800"``), which is no Unicode
    character and cannot be encoded: refused by where it is, before any use of the text."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(
                f"{path or 'a string'} holds a lone UTF-16 surrogate, which is not valid Unicode"
            ) from None
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            _refuse_lone_surrogates(getattr(value, name), f"{path}.{name}" if path else name)
        for name, item in (value.model_extra or {}).items():
            _refuse_lone_surrogates(item, f"{path}.{name}" if path else name)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _refuse_lone_surrogates(item, f"{path}[{index}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            _refuse_lone_surrogates(key, path)
            _refuse_lone_surrogates(item, f"{path}.{key}" if isinstance(key, str) else path)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None  # vLLM's; usage on the final chunk only, here


class _GenerationRequest(BaseModel):
    """The fields both endpoints share. Unknown fields are refused (extra="forbid")."""

    model_config = ConfigDict(extra="forbid")

    model: str
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_INT32)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    stop: str | list[str] | None = None
    n: int | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    user: str | None = None  # accepted, changes nothing
    # Extensions: TensorRT-LLM's top_k; the draft length (0 = plain target decoding; changes speed, not the output).
    top_k: int | None = Field(default=None, ge=0, le=MAX_INT32)
    num_draft_tokens: int | None = Field(default=None, ge=0, le=MAX_INT32)
    repetition_penalty: float | None = Field(default=None, gt=0)
    min_tokens: int | None = Field(default=None, ge=0, le=MAX_INT32)

    @field_validator("stop")
    @classmethod
    def _bounded_stop(cls, stop: str | list[str] | None) -> str | list[str] | None:
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are allowed; got {len(stops)}")
        for text in stops:
            if len(text.encode("utf-8", "surrogatepass")) > MAX_STOP_BYTES:
                raise ValueError(f"each stop string may have at most {MAX_STOP_BYTES} bytes")
        return stop

    @model_validator(mode="after")
    def _valid_unicode(self) -> _GenerationRequest:
        _refuse_lone_surrogates(self)
        return self

    def refuse_unsupported(self) -> None:
        """Values of OpenAI parameters this server does not implement: one 400 naming the first."""
        if self.n not in (None, 1):
            raise _unsupported(
                "n",
                "this server returns one choice per request: send n=1 (or leave it out) and send "
                "several requests for several choices",
                self.n,
            )
        if self.logit_bias:
            raise _unsupported("logit_bias", "leave it out")

    def stop_strings(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [stop for stop in stops if stop]


class CompletionRequest(_GenerationRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool | None = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.logprobs is not None:
            raise _unsupported("logprobs", "leave it out")
        if self.best_of not in (None, 1):
            raise _unsupported("best_of", "send best_of=1 or leave it out", self.best_of)
        if self.suffix:
            raise _unsupported("suffix", "leave it out")

    def prompt_text(self, tokenizer: Any) -> str:
        """The prompt as text. Token ids (OpenAI's ``[int, ...]``, or a list of one such list, as
        lm-eval's ``local-completions`` sends by default) are decoded with the served tokenizer:
        the ensemble takes text, and preprocessing encodes it again."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and all(isinstance(token, int) for token in prompt):
            return _decode_prompt(tokenizer, prompt)  # type: ignore[arg-type]
        if isinstance(prompt, list):
            if len(prompt) != 1 or not isinstance(prompt[0], (str, list)):
                raise bad_request(
                    "prompt must be one string, one list of token ids, or a list of one of those: this server "
                    "takes one prompt per request",
                    "prompt",
                )
            return _decode_prompt(tokenizer, prompt[0]) if isinstance(prompt[0], list) else prompt[0]
        return prompt


def _decode_prompt(tokenizer: Any, tokens: list[int]) -> str:
    vocab = len(tokenizer) if tokenizer is not None else 0
    bad = next((token for token in tokens if not 0 <= token < vocab), None)
    if not tokens or bad is not None:
        raise bad_request(
            f"prompt token ids must be in 0..{vocab - 1} (the served tokenizer's vocabulary); got {bad}"
            if tokens
            else "prompt is an empty list of token ids",
            "prompt",
        )
    return str(tokenizer.decode(tokens, skip_special_tokens=False, clean_up_tokenization_spaces=False))


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, tool_call_id, ... go to the template as they are

    role: str
    content: str | list[dict[str, Any]] | None = None

    @field_validator("role")
    @classmethod
    def _known_role(cls, role: str) -> str:
        if role not in ("system", "developer", "user", "assistant"):
            raise ValueError(f"role {role!r} is not supported here (system, developer, user, assistant)")
        return role

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad_request(
                    f"message content parts of type {part.get('type')!r} are not supported: send text parts "
                    '({"type": "text", "text": ...}) or a string',
                    "messages",
                )
            parts.append(part["text"])
        return "".join(parts)


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_INT32)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None  # changes nothing without tools
    metadata: dict[str, str] | None = None  # accepted, changes nothing
    store: bool | None = None  # accepted, nothing is stored

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.logprobs:
            raise _unsupported("logprobs", "send logprobs=false or leave it out")
        if self.top_logprobs:
            raise _unsupported("top_logprobs", "leave it out")
        if self.response_format is not None and self.response_format.get("type") != "text":
            raise _unsupported("response_format", 'send {"type": "text"} or leave it out')
        if self.tools:
            raise _unsupported("tools", "leave them out")
        if self.tool_choice not in (None, "none"):
            raise _unsupported("tool_choice", 'send "none" or leave it out')

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def template_messages(self) -> list[dict[str, Any]]:
        messages = []
        for message in self.messages:
            extra = {key: value for key, value in (message.model_extra or {}).items() if value is not None}
            role = "system" if message.role == "developer" else message.role
            messages.append({**extra, "role": role, "content": message.text()})
        return messages


# --- response schemas -------------------------------------------------------------------------


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Speculative(BaseModel):
    """The extension field: the request's speculative-decoding statistics."""

    acceptance_rate: float
    total_draft_tokens: int
    total_accepted_draft_tokens: int
    num_target_calls: int


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    speculative: Speculative | None = None


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatMessageOut
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None
    speculative: Speculative | None = None


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    speculative: Speculative | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "trt-spec"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# --- the ensemble over gRPC -------------------------------------------------------------------


@dataclass
class EnsembleRequest:
    prompt: str
    max_tokens: int
    stream: bool
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    num_draft_tokens: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None


@dataclass
class Piece:
    """What the endpoint sends for one ensemble response: new text, and at the end the totals."""

    text: str
    finish_reason: str | None = None
    usage: Usage | None = None
    speculative: Speculative | None = None


class EnsembleBackend:
    """The ensemble over one gRPC channel; every request gets its own bidirectional stream."""

    def __init__(self, grpc_url: str, tokenizer: Any, *, model: str = T.ENSEMBLE, timeout_s: float = 600.0):
        self.grpc_url = grpc_url
        self.model = model
        self.tokenizer = tokenizer
        self.timeout_s = timeout_s
        self.inputs: dict[str, str] = {}  # declared ensemble inputs: name -> Triton datatype
        self.outputs: set[str] = set()
        self.max_seq_len: int | None = None
        self.add_special_tokens = True
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = None

    async def start(self) -> None:
        """Open the channel and read the ensemble's inputs and the engine limits (once)."""
        self._channel = grpc.aio.insecure_channel(self.grpc_url, options=_GRPC_OPTIONS)
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        try:
            metadata = await self._stub.ModelMetadata(service_pb2.ModelMetadataRequest(name=self.model), timeout=30)
            self.inputs = {tensor.name: tensor.datatype for tensor in metadata.inputs}
            self.outputs = {tensor.name for tensor in metadata.outputs}
            config = await self._stub.ModelConfig(service_pb2.ModelConfigRequest(name=T.PREPROCESSING), timeout=30)
            parameters = config.config.parameters
            if "max_seq_len" in parameters:
                self.max_seq_len = int(parameters["max_seq_len"].string_value)
            if "add_special_tokens" in parameters:
                self.add_special_tokens = parameters["add_special_tokens"].string_value.strip().lower() == "true"
        except grpc.aio.AioRpcError as exc:
            raise OpenAIError(503, f"the Triton server at {self.grpc_url} did not answer: {exc.details()}") from None

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()

    def count_tokens(self, text: str) -> int:
        """The prompt's tokens as preprocessing counts them (0 without a tokenizer)."""
        if self.tokenizer is None:
            return 0
        return len(self.tokenizer(text, add_special_tokens=self.add_special_tokens)["input_ids"])

    def _request(self, request: EnsembleRequest, request_id: str) -> Any:
        tensors: list[InferInput] = []

        def add(name: str, value: Any) -> None:
            if value is None or name not in self.inputs:
                return
            datatype = self.inputs[name]
            array = np.array([[value]], dtype=T.NUMPY_DTYPES[datatype])  # [batch 1, 1]
            tensor = InferInput(name, list(array.shape), datatype)
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)

        add(T.TEXT_INPUT.name, request.prompt.encode())
        add(T.MAX_TOKENS.name, request.max_tokens)
        add(_STREAM, request.stream)
        add(T.TEMPERATURE.name, request.temperature)
        add(T.TOP_P.name, request.top_p)
        add(T.TOP_K.name, request.top_k)
        add(T.SEED.name, request.seed)
        add(T.NUM_DRAFT_TOKENS.name, request.num_draft_tokens)
        add(T.PRESENCE_PENALTY.name, request.presence_penalty)
        add(T.FREQUENCY_PENALTY.name, request.frequency_penalty)
        add(T.REPETITION_PENALTY.name, request.repetition_penalty)
        add(T.MIN_TOKENS.name, request.min_tokens)
        add(_EXCLUDE_INPUT, True)
        add(_RETURN_NUM_INPUT, True)
        # No return_num_output_tokens: without it num_output_tokens is the running total on every response
        # (with it, TensorRT-LLM's count of each response's own tokens).
        if request.stop and T.STOP_WORDS.name in self.inputs:
            words = np.array([[word.encode() for word in request.stop]], dtype=object)  # [1, n]
            tensor = InferInput(T.STOP_WORDS.name, list(words.shape), "BYTES")
            tensor.set_data_from_numpy(words)
            tensors.append(tensor)
        infer = service_pb2.ModelInferRequest(model_name=self.model, id=request_id)
        for tensor in tensors:
            infer.inputs.extend([tensor._get_tensor()])
            infer.raw_input_contents.extend([tensor._get_content()])
        # The final flag arrives as an empty response (the loop may end without one of its own).
        infer.parameters["triton_enable_empty_final_response"].bool_param = True
        return infer

    async def generate(self, request: EnsembleRequest) -> AsyncIterator[Piece]:
        """The request's text as it arrives, with OpenAI's stop-string semantics; the last piece
        has the finish reason, usage and speculative statistics. Closing the iterator early
        (or cancelling its task) cancels the request on the server.

        Raises:
            OpenAIError: 400 for a request the ensemble refused, 503 when Triton is unreachable,
                500 for another failure.
        """
        if self._stub is None:
            raise OpenAIError(503, "the endpoint is not started")
        done = asyncio.Event()
        infer = self._request(request, uuid.uuid4().hex[:16])

        async def requests() -> AsyncIterator[Any]:
            yield infer
            await done.wait()  # keep our side open until the request is over

        call = self._stub.ModelStreamInfer(requests(), timeout=self.timeout_s)
        stops = request.stop
        hold = max((len(stop) for stop in stops), default=1) - 1  # chars that may begin a stop string
        text, sent = "", 0  # all text received; how much of it went out
        stats: dict[str, Any] = {}
        num_output_tokens = 0
        finished = False
        try:
            async for response in call:
                if response.error_message:
                    finished = True
                    raise _triton_error(response.error_message)
                infer_response = response.infer_response
                final = infer_response.parameters["triton_final_response"].bool_param
                if infer_response.outputs:
                    result = InferResult(infer_response)
                    chunk = _scalar(result, T.TEXT_OUTPUT.name)
                    text += chunk.decode("utf-8", errors="replace") if isinstance(chunk, bytes) else str(chunk or "")
                    for name in (*_SPECULATIVE_OUTPUTS, _NUM_INPUT_TOKENS, _NUM_OUTPUT_TOKENS):
                        value = _scalar(result, name)
                        if value is not None:
                            stats[name] = value
                    # A running total (we never send return_num_output_tokens): the last is the largest.
                    num_output_tokens = max(num_output_tokens, int(stats.get(_NUM_OUTPUT_TOKENS, 0)))
                cut = _first_stop(text, stops) if stops else -1
                if cut >= 0:
                    text = text[:cut]
                    if not final:  # the ensemble goes on (its token match missed): stop it
                        call.cancel()
                    finished = True
                    break
                if final:
                    finished = True
                    break
                if len(text) - hold > sent:
                    yield Piece(text[sent : len(text) - hold])
                    sent = len(text) - hold
            else:
                raise OpenAIError(500, "the Triton stream ended without a final response")
            stopped = cut >= 0 or num_output_tokens < request.max_tokens
            prompt_tokens = stats.get(_NUM_INPUT_TOKENS)
            if prompt_tokens is None:
                prompt_tokens = self.count_tokens(request.prompt)
            usage = Usage(
                prompt_tokens=int(prompt_tokens),
                completion_tokens=num_output_tokens,
                total_tokens=int(prompt_tokens) + num_output_tokens,
            )
            speculative = Speculative(
                acceptance_rate=float(stats.get("acceptance_rate", 0.0)),
                total_draft_tokens=int(stats.get("total_draft_tokens", 0)),
                total_accepted_draft_tokens=int(stats.get("total_accepted_draft_tokens", 0)),
                num_target_calls=int(stats.get("num_target_calls", 0)),
            )
            yield Piece(text[sent:], "stop" if stopped else "length", usage, speculative)
        except grpc.aio.AioRpcError as exc:
            finished = True
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                raise OpenAIError(
                    503, f"the Triton server at {self.grpc_url} is unavailable: {exc.details()}"
                ) from None
            if exc.code() == grpc.StatusCode.CANCELLED:
                raise
            raise OpenAIError(500, f"Triton: {exc.code().name}: {exc.details()}") from None
        finally:
            done.set()
            if not finished:  # the HTTP client left (or the server is stopping): cancel the request
                call.cancel()


def _scalar(result: Any, name: str) -> Any:
    value = result.as_numpy(name)
    return None if value is None else value.reshape(-1)[0]


def _first_stop(text: str, stops: list[str]) -> int:
    """Where the first stop string begins in ``text`` (-1: none)."""
    found = [index for index in (text.find(stop) for stop in stops) if index >= 0]
    return min(found, default=-1)


def _triton_error(message: str) -> OpenAIError:
    line = (message.strip().splitlines() or ["Triton refused the request"])[0]
    line = re.sub(r"^in ensemble '[^']*', ", "", line)
    if "cancel" in line.lower():
        return OpenAIError(500, f"the request was cancelled on the server: {line}", code="cancelled")
    if _BAD_REQUEST.search(line) and " failed: " not in line:
        return bad_request(line)
    return OpenAIError(500, f"generation failed: {line}", code="internal_error")


# --- the application --------------------------------------------------------------------------


def load_tokenizer(tokenizer_dir: str | Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


def tokenizer_dir_of(repo: str | Path) -> Path:
    return Path(repo).joinpath(*TOKENIZER_PATH)


def render_chat(tokenizer: Any, messages: list[dict[str, Any]], add_special_tokens: bool) -> str:
    """The chat template applied to ``messages`` with the assistant's turn opened.

    Raises:
        OpenAIError: 400 when the tokenizer has no chat template or the template fails.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise bad_request(
            "the model's tokenizer has no chat template, so /v1/chat/completions cannot build a prompt: use "
            "/v1/completions with the prompt text, or serve a tokenizer whose tokenizer_config.json has a "
            "chat_template",
            "messages",
            "no_chat_template",
        )
    try:
        text = str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    except Exception as exc:  # noqa: BLE001 - a template raises what its author chose (jinja's exceptions)
        raise bad_request(
            f"the chat template failed on these messages: {type(exc).__name__}: {exc}", "messages"
        ) from None
    # The template writes the BOS token itself; preprocessing would add another one.
    bos = getattr(tokenizer, "bos_token", None)
    if add_special_tokens and bos and text.startswith(bos):
        ids = tokenizer("x", add_special_tokens=True)["input_ids"]
        if ids and ids[0] == tokenizer.bos_token_id:
            text = text[len(bos) :]
    return text


def create_app(grpc_url: str, tokenizer_dir: str | Path, model_name: str, *, ensemble: str = T.ENSEMBLE) -> FastAPI:
    """The FastAPI application: the ensemble at ``grpc_url`` as ``model_name``."""
    tokenizer = load_tokenizer(tokenizer_dir)
    backend = EnsembleBackend(grpc_url, tokenizer, model=ensemble)
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await backend.start()
        try:
            yield
        finally:
            await backend.close()

    app = FastAPI(title="trt-spec OpenAI-compatible endpoint", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.add_middleware(_JsonBodies)
    app.state.backend = backend

    @app.exception_handler(OpenAIError)
    async def _openai_error(request: Request, exc: OpenAIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_error(exc.errors()).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        error = OpenAIError(exc.status_code, str(exc.detail), code="not_found" if exc.status_code == 404 else None)
        return error.response()

    @app.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=model_name, created=created)])

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    def check_model(body: _GenerationRequest) -> None:
        if body.model != model_name:
            raise OpenAIError(
                404,
                f"the model {body.model!r} does not exist here; this server serves {model_name!r}",
                param="model",
                code="model_not_found",
            )
        body.refuse_unsupported()

    def ensemble_request(body: _GenerationRequest, prompt: str, max_tokens: int) -> EnsembleRequest:
        temperature = 1.0 if body.temperature is None else body.temperature
        sampled = temperature > 0
        stop = body.stop_strings()
        return EnsembleRequest(
            prompt=prompt,
            max_tokens=max_tokens,
            # Stop strings are matched on the text as it streams, and the request is cancelled at
            # the first: the ensemble's token match misses a stop string that tokenizes otherwise.
            stream=bool(body.stream) or bool(stop),
            temperature=temperature if sampled else None,
            top_p=(1.0 if body.top_p is None else body.top_p) if sampled else None,
            top_k=body.top_k if sampled and body.top_k else None,
            seed=body.seed,
            stop=stop,
            num_draft_tokens=body.num_draft_tokens,
            presence_penalty=body.presence_penalty or None,
            frequency_penalty=body.frequency_penalty or None,
            repetition_penalty=body.repetition_penalty,
            min_tokens=body.min_tokens,
        )

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Any:
        check_model(body)
        prompt = body.prompt_text(tokenizer)
        max_tokens = body.max_tokens or DEFAULT_COMPLETION_MAX_TOKENS
        generation = backend.generate(ensemble_request(body, prompt, max_tokens))
        ident, echo = f"cmpl-{uuid.uuid4().hex}", prompt if body.echo else ""

        def completion(text: str, piece: Piece | None) -> CompletionResponse:
            return CompletionResponse(
                id=ident,
                created=int(time.time()),
                model=model_name,
                choices=[CompletionChoice(text=text, finish_reason=piece.finish_reason if piece else None)],
                usage=piece.usage if piece else None,
                speculative=piece.speculative if piece else None,
            )

        if not body.stream:
            pieces = await _unless_disconnected(request, _collect(generation))
            return completion(echo + "".join(piece.text for piece in pieces), pieces[-1])
        include_usage = bool(body.stream_options and body.stream_options.include_usage)

        def chunks(piece: Piece, first: bool) -> list[BaseModel]:
            text = (echo if first else "") + piece.text
            if piece.finish_reason is None:
                return [completion(text, None)]
            last = completion(text, piece)
            last.usage = None
            out: list[BaseModel] = [last]
            if include_usage:
                out.append(
                    CompletionResponse(id=ident, created=last.created, model=model_name, choices=[], usage=piece.usage)
                )
            return out

        return await _event_stream(request, generation, chunks)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
        check_model(body)
        prompt = render_chat(tokenizer, body.template_messages(), backend.add_special_tokens)
        max_tokens = body.requested_max_tokens()
        if max_tokens is None:
            room = (backend.max_seq_len or 0) - backend.count_tokens(prompt)
            max_tokens = room if room >= 1 else DEFAULT_COMPLETION_MAX_TOKENS
        generation = backend.generate(ensemble_request(body, prompt, max_tokens))
        ident = f"chatcmpl-{uuid.uuid4().hex}"

        if not body.stream:
            pieces = await _unless_disconnected(request, _collect(generation))
            last = pieces[-1]
            return ChatCompletionResponse(
                id=ident,
                created=int(time.time()),
                model=model_name,
                choices=[
                    ChatChoice(
                        message=ChatMessageOut(content="".join(piece.text for piece in pieces)),
                        finish_reason=last.finish_reason,  # type: ignore[arg-type]
                    )
                ],
                usage=last.usage,
                speculative=last.speculative,
            )
        include_usage = bool(body.stream_options and body.stream_options.include_usage)

        def chunk(delta: ChatDelta, piece: Piece | None = None, **fields: Any) -> ChatCompletionChunk:
            return ChatCompletionChunk(
                id=ident,
                created=int(time.time()),
                model=model_name,
                choices=[ChatChunkChoice(delta=delta, finish_reason=piece.finish_reason if piece else None)],
                **fields,
            )

        def chunks(piece: Piece, first: bool) -> list[BaseModel]:
            out: list[BaseModel] = []
            if first:
                out.append(chunk(ChatDelta(role="assistant", content="")))
            if piece.finish_reason is None:
                out.append(chunk(ChatDelta(content=piece.text)))
                return out
            if piece.text:
                out.append(chunk(ChatDelta(content=piece.text)))
            out.append(chunk(ChatDelta(), piece, speculative=piece.speculative))
            if include_usage:
                out.append(
                    ChatCompletionChunk(
                        id=ident, created=int(time.time()), model=model_name, choices=[], usage=piece.usage
                    )
                )
            return out

        return await _event_stream(request, generation, chunks)

    return app


class _JsonBodies:
    """Every body this API takes is JSON: a POST without a ``Content-Type``, or with the form type
    ``curl -d`` sends by default, is read as JSON (as OpenAI's own clients always label it)."""

    FORM = b"application/x-www-form-urlencoded"

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            headers = [(key, value) for key, value in scope["headers"] if key != b"content-type"]
            given = [value for key, value in scope["headers"] if key == b"content-type"]
            if not given or given[0].split(b";")[0].strip().lower() == self.FORM:
                scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)


async def _collect(generation: AsyncIterator[Piece]) -> list[Piece]:
    return [piece async for piece in generation]


async def _disconnected(request: Request) -> None:
    """Returns when the HTTP client has gone (the body is read by then: only a disconnect comes)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(request: Request, work: Coroutine[Any, Any, R]) -> R:
    """Run ``work``; cancel it (and so its Triton request) when the HTTP client goes away."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            raise OpenAIError(499, "the client closed the connection", code="client_closed_request")
        return task.result()
    finally:
        watcher.cancel()
        task.cancel()


async def _event_stream(
    request: Request, generation: AsyncIterator[Piece], chunks: Callable[[Piece, bool], list[BaseModel]]
) -> StreamingResponse | JSONResponse:
    """Server-sent events: ``data: {chunk}`` per piece, then ``data: [DONE]``. The first piece is
    awaited before answering, so a request the ensemble refuses gets a plain 400, not a stream.
    A client that leaves mid-stream cancels the generation (and its Triton request) at once, not
    only when the next chunk fails to go out."""
    try:
        first = await _unless_disconnected(request, generation.__anext__())
    except OpenAIError as exc:
        return exc.response()
    pieces: asyncio.Queue[Piece | OpenAIError | None] = asyncio.Queue()

    async def pump() -> None:
        try:
            async for piece in generation:
                pieces.put_nowait(piece)
        except OpenAIError as exc:
            pieces.put_nowait(exc)
        finally:
            pieces.put_nowait(None)

    async def events() -> AsyncIterator[str]:
        pump_task = asyncio.ensure_future(pump()) if first.finish_reason is None else None
        watcher = asyncio.ensure_future(_disconnected(request))
        if pump_task is not None:
            watcher.add_done_callback(lambda done: done.cancelled() or pump_task.cancel())
        try:
            for chunk in chunks(first, True):
                yield _sse(chunk)
            while pump_task is not None and (item := await pieces.get()) is not None:
                if isinstance(item, OpenAIError):
                    yield f"data: {json.dumps(item.body())}\n\n"
                    break
                for chunk in chunks(item, False):
                    yield _sse(chunk)
            yield "data: [DONE]\n\n"
        finally:
            watcher.cancel()
            if pump_task is not None:
                pump_task.cancel()

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _sse(chunk: BaseModel) -> str:
    return f"data: {chunk.model_dump_json()}\n\n"


def _validation_error(errors: Any) -> OpenAIError:
    """FastAPI's validation errors -> one 400 in OpenAI's shape, naming the first parameter."""
    error = list(errors)[0] if errors else {"loc": (), "msg": "invalid request", "type": ""}
    loc = [str(part) for part in error.get("loc", ()) if part != "body"]
    param = ".".join(loc) or None
    if error.get("type") == "extra_forbidden":
        return _unsupported(
            param or "this field",
            "leave it out (the server implements OpenAI's parameters it documents, plus top_k and num_draft_tokens)",
        )
    message = str(error.get("msg", "invalid request")).removeprefix("Value error, ")
    if error.get("type") == "value_error" and not loc:  # a check of the whole request (lone surrogates)
        return bad_request(message, None)
    if error.get("type") == "json_invalid" or not loc:
        return bad_request(f"the request body is not valid JSON or not an object: {message}", None, "invalid_json")
    if error.get("type") == "missing":
        return bad_request(f"{param} is required", param, "missing_required_parameter")
    given = ascii(error.get("input"))  # ascii: a lone surrogate in the value must not break the JSON answer
    return bad_request(f"{param}: {message}; got {given if len(given) <= 80 else given[:77] + '...'}", param)


# --- running it beside Triton -----------------------------------------------------------------


class OpenAIServer:
    """uvicorn serving :func:`create_app` in a thread of this process, on a socket bound here (so
    a port in use fails at :meth:`start` with the address)."""

    def __init__(
        self,
        grpc_url: str,
        tokenizer_dir: str | Path,
        model_name: str,
        *,
        host: str = "127.0.0.1",
        port: int = 8080,
        ready_timeout_s: float = 60.0,
        drain_timeout_s: float = 5.0,
    ):
        self.host = host
        self.port = port
        self.ready_timeout_s = ready_timeout_s
        self.drain_timeout_s = drain_timeout_s  # how long a stop lets open requests finish
        self.app = create_app(grpc_url, tokenizer_dir, model_name)
        self._server: Any = None
        self._thread: Any = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    def start(self) -> OpenAIServer:
        """Bind, start serving, wait until the app is up.

        Raises:
            ServerError: the port cannot be bound, or the app did not start (e.g. Triton is not
                reachable).
        """
        import socket
        import threading

        import uvicorn

        from trt_spec.errors import ServerError
        from trt_spec.serving.connections import connection_cap, raise_open_files_limit, uvicorn_protocol

        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            raise ServerError(
                f"cannot serve the OpenAI endpoint on {self.host}:{self.port}: {exc.strerror}; choose another "
                "--openai-port"
            ) from None
        self.port = sock.getsockname()[1]
        # Idle and excess connections are closed so that no client can use up this process's file
        # descriptors (serving/connections.py).
        protocol = uvicorn_protocol(connection_cap(raise_open_files_limit()))
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=self.drain_timeout_s,
            lifespan="on",
            http=protocol,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="openai-endpoint", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + self.ready_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise ServerError(
                    f"the OpenAI endpoint on {self.host}:{self.port} did not start (is Triton serving the ensemble?)"
                )
            time.sleep(0.02)
        return self

    def begin_stop(self) -> None:
        """Stop taking connections (the listener closes, idle connections too); requests under way
        go on for up to ``drain_timeout_s``. :meth:`stop` waits for the end."""
        if self._server is not None:
            self._server.should_exit = True

    def stop(self, timeout_s: float = 10.0) -> None:
        self.begin_stop()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
            if self._thread.is_alive() and self._server is not None:
                self._server.force_exit = True
                self._thread.join(timeout=timeout_s)

    def __enter__(self) -> OpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
