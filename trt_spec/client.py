"""A small gRPC client for the ensemble: streaming generation with acceptance statistics.

    from trt_spec.client import SpecClient

    with SpecClient("127.0.0.1:8001") as client:
        for event in client.generate("def fibonacci(n):", max_tokens=64):
            print(event.text, end="", flush=True)
        print(event.acceptance_rate)

Tensor names, dtypes and shapes come from :mod:`trt_spec.runtime.tensors` (the ensemble takes
scalars as shape ``[1, 1]``). The client streams by default (it sends ``stream`` true; the
ensemble's own default is TensorRT-LLM's, false) and samples when ``temperature`` > 0. One client holds one gRPC stream, so it serves one request at a
time; run one client per concurrent request.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from trt_spec.errors import GenerationError, ServerUnreachable
from trt_spec.runtime import tensors as T

DEFAULT_URL = "127.0.0.1:8001"
_FINAL = "triton_final_response"
NO_TOP_P = 1.0  # top_p 1: the whole distribution (trt_spec.runtime.sampling.NO_TOP_P, without importing torch)


@dataclass(frozen=True)
class StreamEvent:
    """One response of a request: its new text and the request's running totals."""

    text: str
    total_draft_tokens: int
    total_accepted_draft_tokens: int
    acceptance_rate: float
    num_target_calls: int
    num_output_tokens: int  # tokens generated so far
    arrival_s: float  # time.perf_counter() when the response arrived
    log_probs: tuple[float, ...] = ()  # with return_log_probs: this response's new tokens under the target
    # The prompt lookup's share of the drafted and accepted totals (the rest: the draft model's).
    total_lookup_draft_tokens: int = 0
    total_accepted_lookup_draft_tokens: int = 0


def request_inputs(
    prompt: str,
    *,
    max_tokens: int,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    num_draft_tokens: int | None = None,
    seed: int | None = None,
    stop_words: Sequence[str] = (),
    stream: bool = True,
    adaptive_draft: bool | None = None,
    repetition_penalty: float | None = None,
    presence_penalty: float | None = None,
    frequency_penalty: float | None = None,
    min_tokens: int | None = None,
    bad_words: Sequence[str] = (),
    return_log_probs: bool | None = None,
) -> list:
    """The ensemble's input tensors for one request; optional ones only when given, but ``stream``
    always (the ensemble's default is false, as TensorRT-LLM's). The ensemble decodes greedily
    unless ``top_k`` or ``top_p`` is sent (TensorRT-LLM's rule), so a positive ``temperature``
    without either also sends ``top_p`` 1.0 (no top-p): sampling from the whole distribution."""
    import tritonclient.grpc as grpcclient

    if temperature is not None and temperature > 0 and top_k is None and top_p is None:
        top_p = NO_TOP_P

    def scalar(tensor: T.Tensor, value) -> grpcclient.InferInput:
        array = np.array([[value]], dtype=tensor.numpy_dtype)  # [batch 1, 1]
        infer_input = grpcclient.InferInput(tensor.name, list(array.shape), tensor.dtype)
        infer_input.set_data_from_numpy(array)
        return infer_input

    inputs = [scalar(T.TEXT_INPUT, prompt.encode()), scalar(T.MAX_TOKENS, max_tokens), scalar(T.STREAM, stream)]
    optional = (
        (T.TEMPERATURE, temperature),
        (T.TOP_K, top_k),
        (T.TOP_P, top_p),
        (T.NUM_DRAFT_TOKENS, num_draft_tokens),
        (T.SEED, seed),
        (T.ADAPTIVE_DRAFT, adaptive_draft),
        (T.REPETITION_PENALTY, repetition_penalty),
        (T.PRESENCE_PENALTY, presence_penalty),
        (T.FREQUENCY_PENALTY, frequency_penalty),
        (T.MIN_TOKENS, min_tokens),
        (T.RETURN_LOG_PROBS, return_log_probs),
    )
    inputs += [scalar(tensor, value) for tensor, value in optional if value is not None]
    for tensor, strings in ((T.STOP_WORDS, stop_words), (T.BAD_WORDS, bad_words)):
        if strings:
            words = np.array([[word.encode() for word in strings]], dtype=object)  # [1, n]
            infer_input = grpcclient.InferInput(tensor.name, list(words.shape), tensor.dtype)
            infer_input.set_data_from_numpy(words)
            inputs.append(infer_input)
    return inputs


class SpecClient:
    """Streaming generation against a trt-spec Triton repository over gRPC.

    Raises (from :meth:`generate`):
        ServerUnreachable: nothing answers at ``url``.
        GenerationError: the server refused or failed the request (its one-line message), or sent
            nothing for ``timeout_s``.
    """

    def __init__(self, url: str = DEFAULT_URL, *, model: str = T.ENSEMBLE, timeout_s: float = 300.0):
        import tritonclient.grpc as grpcclient

        self.url = url
        self.model = model
        self.timeout_s = timeout_s
        self._client = grpcclient.InferenceServerClient(url)
        self._responses: queue.Queue = queue.Queue()
        self._streaming = False
        self._reached = False
        self._request_count = 0

    def close(self) -> None:
        if self._streaming:
            # Cancel only what is unfinished: cancelling a request Triton has just completed can
            # leave a (2.51) ensemble request in flight for good.
            self._client.stop_stream(cancel_requests=False)
            self._streaming = False
        self._client.close()

    def __enter__(self) -> SpecClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def server_ready(self) -> bool:
        try:
            return bool(self._client.is_server_ready())
        except Exception:  # noqa: BLE001 - any failure to answer means not ready
            return False

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Block until the server is ready.

        Raises:
            ServerUnreachable: not ready within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while not self.server_ready():
            if time.monotonic() > deadline:
                raise ServerUnreachable(
                    f"no ready Triton server at {self.url} after {timeout_s:.0f} s; "
                    "start one with `trt-spec serve --repo DIR`"
                )
            time.sleep(0.1)

    def generate(self, prompt: str, *, max_tokens: int = 128, **options) -> Iterator[StreamEvent]:
        """Yield the responses of one request as they arrive (with ``stream=False``: one).

        ``options``: temperature, top_k, top_p, num_draft_tokens, seed, stop_words, stream,
        adaptive_draft, repetition_penalty, presence_penalty, frequency_penalty, min_tokens,
        bad_words, return_log_probs (:func:`request_inputs`). Closing the iterator before the end (``break``) cancels the request on
        the server.
        """
        self._ensure_stream()
        self._request_count += 1
        request_id = str(self._request_count)
        inputs = request_inputs(prompt, max_tokens=max_tokens, **options)
        try:
            self._client.async_stream_infer(self.model, inputs, request_id=request_id, enable_empty_final_response=True)
        except Exception as exc:  # noqa: BLE001 - tritonclient raises its own exception types
            self._reset_stream()
            raise _client_error(exc, self.url) from None
        finished = False
        try:
            deadline = time.monotonic() + self.timeout_s
            while True:
                try:
                    result, error, arrival = self._responses.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    raise GenerationError(f"no response from {self.url} within {self.timeout_s:.0f} s") from None
                if error is not None:
                    finished = True
                    self._reset_stream()
                    raise _client_error(error, self.url)
                response = result.get_response()
                if response.id != request_id:
                    continue  # a late response of an earlier, abandoned request
                deadline = time.monotonic() + self.timeout_s
                final = _FINAL in response.parameters and response.parameters[_FINAL].bool_param
                if response.outputs:
                    yield _event(result, arrival)
                if final:
                    finished = True
                    return
        finally:
            if not finished:  # the caller stopped early: cancel the request on the server
                self._reset_stream(cancel=True)

    def _ensure_stream(self) -> None:
        if self._streaming:
            return
        responses = self._responses

        def on_response(result=None, error=None) -> None:
            responses.put((result, error, time.perf_counter()))

        try:
            if not self._reached:  # a stream to nowhere fails only later, with a vaguer message
                self._client.is_server_live()
                self._reached = True
            self._client.start_stream(callback=on_response)
        except Exception as exc:  # noqa: BLE001 - tritonclient raises its own exception types
            raise _client_error(exc, self.url) from None
        self._streaming = True

    def _reset_stream(self, cancel: bool = False) -> None:
        """After an error or an abandoned request the stream may hold stale responses; the next
        request opens a new one (``cancel``: the server is told to cancel what is in flight)."""
        try:
            self._client.stop_stream(cancel_requests=cancel)
        except Exception:  # noqa: BLE001
            pass
        self._streaming = False
        self._responses = queue.Queue()


def _event(result, arrival: float) -> StreamEvent:
    def scalar(tensor: T.Tensor):
        value = result.as_numpy(tensor.name)
        return None if value is None else value.reshape(-1)[0]

    text = scalar(T.TEXT_OUTPUT)
    log_probs = result.as_numpy(T.OUTPUT_LOG_PROBS.name)
    return StreamEvent(
        text=text.decode("utf-8") if isinstance(text, bytes) else (text or ""),
        total_draft_tokens=int(scalar(T.TOTAL_DRAFT_TOKENS) or 0),
        total_accepted_draft_tokens=int(scalar(T.TOTAL_ACCEPTED_DRAFT_TOKENS) or 0),
        acceptance_rate=float(scalar(T.ACCEPTANCE_RATE) or 0.0),
        num_target_calls=int(scalar(T.NUM_TARGET_CALLS) or 0),
        num_output_tokens=int(scalar(T.NUM_OUTPUT_TOKENS) or 0),
        arrival_s=arrival,
        log_probs=() if log_probs is None else tuple(float(x) for x in log_probs.reshape(-1)),
        total_lookup_draft_tokens=int(scalar(T.TOTAL_LOOKUP_DRAFT_TOKENS) or 0),
        total_accepted_lookup_draft_tokens=int(scalar(T.TOTAL_ACCEPTED_LOOKUP_DRAFT_TOKENS) or 0),
    )


def _client_error(error: BaseException, url: str) -> Exception:
    message = error.message() if hasattr(error, "message") and callable(error.message) else str(error)
    lowered = message.lower()
    if "unavailable" in lowered or "failed to connect" in lowered or "connection refused" in lowered:
        return ServerUnreachable(f"no Triton server answers at {url}; start one with `trt-spec serve --repo DIR`")
    line = message.strip().splitlines()[0] if message.strip() else type(error).__name__
    return GenerationError(line.removeprefix("in ensemble 'ensemble', "))
