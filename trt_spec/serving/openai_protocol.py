"""The OpenAI API as this endpoint speaks it: request and response schemas, bounds, errors in OpenAI's shape."""

from __future__ import annotations

from typing import Any, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_SEED = 2**64 - 1  # the ensemble's seed is UINT64
MAX_INT32 = 2**31 - 1  # max_tokens, top_k, num_draft_tokens and min_tokens are INT32 tensors: no wraparound
# stop: bounded before anything is tokenized (each string costs a tokenizer call per request).
MAX_STOP_STRINGS = 32
MAX_STOP_BYTES = 1024


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


def unsupported(param: str, fix: str, value: Any = None) -> OpenAIError:
    shown = param if value is None else f"{param}={value!r}"
    return bad_request(f"{shown} is not supported by this server; {fix}", param, "unsupported_parameter")


def validation_error(errors: Any) -> OpenAIError:
    """FastAPI's validation errors -> one 400 in OpenAI's shape, naming the first parameter."""
    error = list(errors)[0] if errors else {"loc": (), "msg": "invalid request", "type": ""}
    loc = [str(part) for part in error.get("loc", ()) if part != "body"]
    param = ".".join(loc) or None
    if error.get("type") == "extra_forbidden":
        return unsupported(
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


class GenerationRequest(BaseModel):
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
    def _valid_unicode(self) -> GenerationRequest:
        _refuse_lone_surrogates(self)
        return self

    def refuse_unsupported(self) -> None:
        """Values of OpenAI parameters this server does not implement: one 400 naming the first."""
        if self.n not in (None, 1):
            raise unsupported(
                "n",
                "this server returns one choice per request: send n=1 (or leave it out) and send "
                "several requests for several choices",
                self.n,
            )
        if self.logit_bias:
            raise unsupported("logit_bias", "leave it out")

    def stop_strings(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [stop for stop in stops if stop]


class CompletionRequest(GenerationRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool | None = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.logprobs is not None:
            raise unsupported("logprobs", "leave it out")
        if self.best_of not in (None, 1):
            raise unsupported("best_of", "send best_of=1 or leave it out", self.best_of)
        if self.suffix:
            raise unsupported("suffix", "leave it out")

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


class ChatCompletionRequest(GenerationRequest):
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
            raise unsupported("logprobs", "send logprobs=false or leave it out")
        if self.top_logprobs:
            raise unsupported("top_logprobs", "leave it out")
        if self.response_format is not None and self.response_format.get("type") != "text":
            raise unsupported("response_format", 'send {"type": "text"} or leave it out')
        if self.tools:
            raise unsupported("tools", "leave them out")
        if self.tool_choice not in (None, "none"):
            raise unsupported("tool_choice", 'send "none" or leave it out')

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
    # The prompt lookup's share of the totals (the rest: the draft model's).
    total_lookup_draft_tokens: int = 0
    total_accepted_lookup_draft_tokens: int = 0


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
