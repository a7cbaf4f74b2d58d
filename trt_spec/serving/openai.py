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
  ``acceptance_rate``, ``total_draft_tokens``, ``total_accepted_draft_tokens``,
  ``num_target_calls`` and the prompt lookup's share of the drafts (``total_lookup_draft_tokens``,
  ``total_accepted_lookup_draft_tokens``); the request extension ``num_draft_tokens`` (0 = plain target decoding)
  is passed through.

Optional ensemble inputs are sent only when the ensemble declares them (read once from its
metadata), so the endpoint works with an ensemble before and after TensorRT-LLM 1.2.x's
``stream``/``exclude_input_in_output``/``return_num_input_tokens`` inputs.

Parameters OpenAI defines but this server does not implement (``n`` > 1, ``logprobs``,
``logit_bias``, tools, ``response_format`` other than text, ...) and unknown fields are refused
with a 400 in OpenAI's error shape ``{"error": {"message", "type", "param", "code"}}`` naming the
parameter; values that change nothing (``n`` = 1, ...) are accepted.

This module is the app and its server; the schemas and errors are ``openai_protocol``'s, the
ensemble's side ``openai_backend``'s.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from trt_spec.runtime import tensors as T
from trt_spec.serving.openai_backend import (
    EnsembleBackend,
    EnsembleRequest,
    Piece,
    ensemble_request,
    load_tokenizer,
    render_chat,
    tokenizer_dir_of,
)
from trt_spec.serving.openai_protocol import (
    DEFAULT_COMPLETION_MAX_TOKENS,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    ChatMessageOut,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    GenerationRequest,
    ModelCard,
    ModelList,
    OpenAIError,
    validation_error,
)

# The app, and the backend's names that callers (scripts/openai_vs_grpc.py) import from here.
__all__ = ["EnsembleBackend", "EnsembleRequest", "OpenAIServer", "create_app", "load_tokenizer", "tokenizer_dir_of"]

R = TypeVar("R")


# --- the application --------------------------------------------------------------------------


def create_app(grpc_url: str, tokenizer_dir: str | Path, model_name: str, *, ensemble: str = T.ENSEMBLE) -> FastAPI:
    """The FastAPI application: the ensemble at ``grpc_url`` as ``model_name``."""
    routes = _Routes(EnsembleBackend(grpc_url, load_tokenizer(tokenizer_dir), model=ensemble), model_name)
    app = FastAPI(
        title="trt-spec OpenAI-compatible endpoint",
        lifespan=routes.lifespan,
        docs_url=None,
        redoc_url=None,
        exception_handlers={
            OpenAIError: _openai_error,
            RequestValidationError: _invalid,
            StarletteHTTPException: _http_error,
        },
    )
    app.add_middleware(_JsonBodies)
    app.add_middleware(_BoundedBodies, backend=routes.backend)
    app.state.backend = routes.backend

    @app.get("/v1/models")
    async def models() -> ModelList:
        return routes.models()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Any:
        return await routes.completions(body, request)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
        return await routes.chat_completions(body, request)

    return app


async def _openai_error(request: Request, exc: OpenAIError) -> JSONResponse:
    return exc.response()


async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    return validation_error(exc.errors()).response()


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    error = OpenAIError(exc.status_code, str(exc.detail), code="not_found" if exc.status_code == 404 else None)
    return error.response()


class _Routes:
    """What the routes answer: the ensemble behind ``backend``, served as ``model_name``."""

    def __init__(self, backend: EnsembleBackend, model_name: str):
        self.backend = backend
        self.model_name = model_name
        self.created = int(time.time())

    @asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        await self.backend.start()
        try:
            yield
        finally:
            await self.backend.close()

    def models(self) -> ModelList:
        return ModelList(data=[ModelCard(id=self.model_name, created=self.created)])

    def check_model(self, body: GenerationRequest) -> None:
        if body.model != self.model_name:
            raise OpenAIError(
                404,
                f"the model {body.model!r} does not exist here; this server serves {self.model_name!r}",
                param="model",
                code="model_not_found",
            )
        body.refuse_unsupported()

    async def completions(self, body: CompletionRequest, request: Request) -> Any:
        self.check_model(body)
        prompt = body.prompt_text(self.backend.tokenizer)
        max_tokens = body.max_tokens or DEFAULT_COMPLETION_MAX_TOKENS
        generation = self.backend.generate(ensemble_request(body, prompt, max_tokens))
        ident, echo, model_name = f"cmpl-{uuid.uuid4().hex}", prompt if body.echo else "", self.model_name

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

    async def chat_completions(self, body: ChatCompletionRequest, request: Request) -> Any:
        self.check_model(body)
        backend, model_name = self.backend, self.model_name
        prompt = render_chat(backend.tokenizer, body.template_messages(), backend.add_special_tokens)
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
                        finish_reason=last.finish_reason,
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


class _BoundedBodies:
    """A POST whose ``Content-Length`` is over what any prompt the engines take can need
    (:attr:`EnsembleBackend.max_body_bytes`) is answered 413 without its body being kept, parsed
    or sent on: an 8 MB prompt costs the server reading past its bytes, not a copy, a JSON parse
    and a gRPC hop (measured by scripts/refusal_bench.py). The body is read to its end before the
    answer: a server that answers mid-upload and closes leaves the client a broken pipe instead
    of the 413."""

    def __init__(self, app: Any, backend: EnsembleBackend):
        self.app = app
        self.backend = backend

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        limit = self.backend.max_body_bytes
        if scope["type"] == "http" and scope["method"] == "POST" and limit is not None:
            length = next((value for key, value in scope["headers"] if key == b"content-length"), None)
            if length is not None and length.isdigit() and int(length) > limit:
                error = OpenAIError(
                    413,
                    f"the request body is {int(length)} bytes; a prompt the engines take (max_input_len "
                    f"{self.backend.max_input_len} tokens, at most {self.backend.max_prompt_bytes} bytes with this "
                    f"tokenizer) needs at most {limit}; shorten the prompt",
                    code="request_too_large",
                )
                while (await receive()).get("more_body", False):
                    pass  # discarded as it arrives
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _collect(generation: AsyncIterator[Piece]) -> list[Piece]:
    return [piece async for piece in generation]


async def _disconnected(request: Request) -> None:
    """Returns when the HTTP client has gone (the body is read by then: only a disconnect comes)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(request: Request, work: Awaitable[R]) -> R:
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
            # uvicorn annotates this int | None but hands it to asyncio.timeout, which takes float seconds.
            timeout_graceful_shutdown=self.drain_timeout_s,  # type: ignore[arg-type]
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
