"""The Triton side of the endpoint: requests as the ensemble's gRPC inputs, streamed text, stop strings, cancellation."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import InferInput, InferResult, service_pb2, service_pb2_grpc

from trt_spec.runtime import tensors as T
from trt_spec.runtime.tokenizing import MAX_WORD_BYTES, MAX_WORDS, PromptTooLarge, check_prompt_size, max_prompt_bytes
from trt_spec.serving.openai_protocol import GenerationRequest, OpenAIError, Speculative, Usage, bad_request

TOKENIZER_PATH = (T.PREPROCESSING, "1", "tokenizer")  # the repository's target tokenizer files
_MAX_MESSAGE_BYTES = 2**31 - 1
_GRPC_OPTIONS = [("grpc.max_send_message_length", _MAX_MESSAGE_BYTES), ("grpc.max_receive_message_length", -1)]

# Ensemble inputs and outputs by name (TensorRT-LLM's names; ours for the speculative statistics).
# A request body's bound (EnsembleBackend.max_body_bytes): JSON writes a byte as at most 6
# (\u00XX); the other fields get the stop and bad words' bounds, both lists, plus 64 KiB.
JSON_ESCAPE_FACTOR = 6
OTHER_FIELDS_BYTES = JSON_ESCAPE_FACTOR * 2 * MAX_WORDS * MAX_WORD_BYTES + 64 * 1024
_STREAM = "stream"
_EXCLUDE_INPUT = "exclude_input_in_output"
_RETURN_NUM_INPUT = "return_num_input_tokens"
_NUM_INPUT_TOKENS = "num_input_tokens"
_NUM_OUTPUT_TOKENS = "num_output_tokens"
_SPECULATIVE_OUTPUTS = (
    "acceptance_rate",
    "total_draft_tokens",
    "total_accepted_draft_tokens",
    "num_target_calls",
    T.TOTAL_LOOKUP_DRAFT_TOKENS.name,
    T.TOTAL_ACCEPTED_LOOKUP_DRAFT_TOKENS.name,
)

# A Triton error message that is about the request's parameters (the ensemble's preprocessing and
# loop name the parameter, its value and the allowed range) rather than a failure of the server.
_BAD_REQUEST = re.compile(
    r"must be|must hold|is required|is empty|is not valid|over the engine's|more than the engine's|; got |"
    r"unexpected (inference )?input|unexpected datatype|unexpected shape",
    re.IGNORECASE,
)


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


def ensemble_request(body: GenerationRequest, prompt: str, max_tokens: int) -> EnsembleRequest:
    """What ``body`` asks of the ensemble, for ``prompt`` and at most ``max_tokens`` tokens."""
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
        # A prompt over this many bytes is over the engines' max_input_len without tokenizing it
        # (tokenizing.max_prompt_bytes, as preprocessing computes it); None = not known.
        self.max_prompt_bytes: int | None = None
        self.max_input_len = 0
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
            if "max_input_len" in parameters and self.tokenizer is not None:
                self.max_input_len = int(parameters["max_input_len"].string_value)
                self.max_prompt_bytes = max_prompt_bytes(self.tokenizer, self.max_input_len)
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

    @property
    def max_body_bytes(self) -> int | None:
        """The largest request body that can hold a prompt the engines take: the prompt's bytes
        JSON-escaped (at most 6 bytes a byte, ``\\u00XX``) and room for every other field (the stop
        words' and bad words' bounds among them). None = not known."""
        if self.max_prompt_bytes is None:
            return None
        return JSON_ESCAPE_FACTOR * self.max_prompt_bytes + OTHER_FIELDS_BYTES

    def check_prompt(self, text: str) -> None:
        """Refuse a prompt too long in bytes for max_input_len before sending it to the server.

        Raises:
            OpenAIError: 400, naming the size, the limit and the fix (preprocessing's words).
        """
        if self.max_prompt_bytes is None:
            return
        try:
            check_prompt_size(text, self.max_prompt_bytes, self.max_input_len, "the prompt")
        except PromptTooLarge as exc:
            raise OpenAIError(400, str(exc), param="prompt", code="context_length_exceeded") from None

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
        self.check_prompt(request.prompt)
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
                total_lookup_draft_tokens=int(stats.get(T.TOTAL_LOOKUP_DRAFT_TOKENS.name, 0)),
                total_accepted_lookup_draft_tokens=int(stats.get(T.TOTAL_ACCEPTED_LOOKUP_DRAFT_TOKENS.name, 0)),
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


# --- the prompt: the tokenizer and the chat template ------------------------------------------


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
