"""Triton python model ``spec_loop``: the draft -> verify loop (decoupled, async).

Each request runs as its own asyncio task, and each of its prompts (a request may carry N, as
TensorRT-LLM's ensemble takes them) as one more (:func:`trt_spec.runtime.bls.run_loop`), awaiting
the two engine models through ``pb_utils.InferenceRequest(...).async_exec()``, so prompts interleave
and the engines can batch them. With ``stream`` true every step that emits tokens is streamed as
one response (the window protocol of :mod:`trt_spec.runtime.tensors`, so postprocessing stays
streaming-safe) carrying the running totals; with ``stream`` false (the default) one response per
prompt carries its whole completion (after the prompt, when ``exclude_input_in_output`` is
false). A prompt of several carries ``batch_index``; the Triton final flag goes on the last
response of the request, as TensorRT-LLM's decoupled backend sends a batch. A cancelled
request stops before its next engine call: cancelled directly, or through the ensemble, where
postprocessing relays the cancellation back with the request's key (see ``tensors.py``). A
failing request ends with one short error line and the others go on. Prometheus metrics
(python-backend custom metrics) are updated per request; ``trt_spec_loop_scheduled_steps_total``
counts iterations by requests in flight and the K used, so the K schedule
(``LoopParameters.k_schedule``: K by requests in flight, for requests that send no
``num_draft_tokens``) can be watched at work, and ``trt_spec_loop_draft_tokens_by_source_total`` /
``trt_spec_loop_accepted_draft_tokens_by_source_total`` split the drafts by where they came from
(``source``: ``draft_model``, ``prompt_lookup``).
Responses, cancellation checks and metric updates (each an IPC round trip) run on one worker
thread, off the loop's path from one engine call to the next.

At most ``max_batch_size`` prompts run at once (the engines' batch, and the number of sequences
whose KV caches the torch engines keep); the others wait in arrival order, so more concurrent
requests queue instead of interleaving beyond what the engines hold (which evicts KV caches and
makes every step recompute its prefix). ``execute`` returns only when its requests are done:
the python backend runs a decoupled model's async ``execute`` in the background and hands the
instance its next requests at once (``pb_stub.cc``, ``Stub::ProcessRequests``: "Do not wait for
async decoupled execute to return"), and a coroutine that finishes before the stub has added its
future to its background set logs "Cannot remove future from background" (``Stub::RunCoroutine``
adds the future after ``add_done_callback``) and leaks the future.

Imports ``trt_spec`` from the copy the repository writer puts beside this file (the code that
wrote the repository), else from the installed package.
"""

import asyncio
import concurrent.futures
import json
import sys
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if (_HERE / "trt_spec").is_dir():
    sys.path.insert(0, str(_HERE))

import triton_python_backend_utils as pb_utils  # noqa: E402

from trt_spec.runtime import bls, draining, methods  # noqa: E402
from trt_spec.runtime import tensors as T  # noqa: E402
from trt_spec.runtime.errors import GenerationParamsError  # noqa: E402
from trt_spec.runtime.parameters import MAX_DRAFT_TOKENS, LoopParameters  # noqa: E402

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# An execute coroutine lasts at least this long, so that the stub has added its future to its
# background set before it completes (module docstring): a relayed cancellation is instant.
MIN_EXECUTE_SECONDS = 0.005


class TritonEngineClient:
    """:class:`trt_spec.runtime.bls.EngineClient` over BLS calls to the engine models.

    With several requests running, each call is ``await async_exec()``, so they overlap and the
    engines see them together. A request running alone calls ``exec()`` instead: it blocks the
    event loop, which has nothing else to do, and skips async_exec's hop through a thread pool
    (~0.3 ms a call on a CPU); before each call it yields once, so a request arriving meanwhile
    (or a relayed cancellation) starts after the current call at the latest. Only for a call of
    one step's tokens at most (``request_output_len`` <= K + 1): a plain call for many tokens
    (``bls.plain_call_len``) would keep arrivals out of the engines' batch until it ends.
    """

    BLOCKING_MAX_TOKENS = MAX_DRAFT_TOKENS + 1

    def __init__(self):
        self.active = 0  # generation requests running in this model instance
        # This server's token, so that the engine models serve these calls while `serve` drains.
        self.parameters = draining.loop_call_parameters()

    async def infer(self, model, inputs, outputs):
        request = pb_utils.InferenceRequest(
            model_name=model,
            inputs=[pb_utils.Tensor(name, array) for name, array in inputs.items()],
            requested_output_names=list(outputs),
            parameters=self.parameters,
        )
        if self.active <= 1 and int(inputs[T.REQUEST_OUTPUT_LEN.name].reshape(-1)[0]) <= self.BLOCKING_MAX_TOKENS:
            await asyncio.sleep(0)  # let arrivals (a new request, a relayed cancellation) start
            response = request.exec()
        else:
            response = await request.async_exec()
        if response.has_error():
            raise bls.EngineCallError(f"{model}: {response.error().message()}".splitlines()[0])
        result = {}
        for name in outputs:
            tensor = pb_utils.get_output_tensor_by_name(response, name)
            if tensor is not None:
                result[name] = tensor.as_numpy()
        return result


class LoopMetrics:
    """Counters and gauges on Triton's metrics port; the families live as long as the model."""

    COUNTERS = {
        "iterations": ("trt_spec_loop_iterations_total", "Draft -> verify iterations of the loop model"),
        "target_calls": ("trt_spec_loop_target_calls_total", "Target engine calls of the loop model"),
        "draft_tokens": ("trt_spec_loop_draft_tokens_total", "Draft tokens proposed"),
        "accepted": ("trt_spec_loop_accepted_draft_tokens_total", "Draft tokens the target accepted"),
        "rejections": ("trt_spec_loop_rejections_total", "Iterations that ended on a rejected draft"),
        "output_tokens": ("trt_spec_loop_output_tokens_total", "Tokens generated"),
        "loop_seconds": ("trt_spec_loop_iteration_seconds_total", "Seconds of loop iterations (engine calls included)"),
        "engine_wait_seconds": ("trt_spec_loop_engine_wait_seconds_total", "Seconds the loop awaited engine models"),
    }
    OUTCOMES = ("finished", "cancelled", "failed")

    def __init__(self, model: str):
        labels = {"model": model}
        kind = pb_utils.MetricFamily
        self.families = {
            key: pb_utils.MetricFamily(name=name, description=text, kind=kind.COUNTER)
            for key, (name, text) in self.COUNTERS.items()
        }
        self.counters = {key: family.Metric(labels=labels) for key, family in self.families.items()}
        self.families["requests"] = pb_utils.MetricFamily(
            name="trt_spec_loop_requests_total", description="Requests of the loop model by outcome", kind=kind.COUNTER
        )
        self.requests = {
            outcome: self.families["requests"].Metric(labels={**labels, "outcome": outcome})
            for outcome in self.OUTCOMES
        }
        self.families["acceptance"] = pb_utils.MetricFamily(
            name="trt_spec_loop_acceptance_rate",
            description="Accepted / drafted tokens since the model loaded",
            kind=kind.GAUGE,
        )
        self.families["tokens_per_target_call"] = pb_utils.MetricFamily(
            name="trt_spec_loop_tokens_per_target_call",
            description="Generated tokens per target call since the model loaded",
            kind=kind.GAUGE,
        )
        self.acceptance_rate = self.families["acceptance"].Metric(labels=labels)
        self.tokens_per_target_call = self.families["tokens_per_target_call"].Metric(labels=labels)
        self.totals = dict.fromkeys(self.COUNTERS, 0.0)
        # Iterations by the requests in flight each saw and the K it used: the K schedule at work.
        self.families["scheduled_steps"] = pb_utils.MetricFamily(
            name="trt_spec_loop_scheduled_steps_total",
            description="Iterations of the loop model by requests in flight and the K used (0 = plain decoding)",
            kind=kind.COUNTER,
        )
        self.labels = labels
        self.scheduled_steps: dict = {}  # (in_flight, k) -> its counter, made when first seen
        # Drafts by where they came from (methods.SOURCES: the draft model, prompt lookup).
        self.families["drafted_by_source"] = pb_utils.MetricFamily(
            name="trt_spec_loop_draft_tokens_by_source_total",
            description="Draft tokens proposed, by source (draft_model, prompt_lookup)",
            kind=kind.COUNTER,
        )
        self.families["accepted_by_source"] = pb_utils.MetricFamily(
            name="trt_spec_loop_accepted_draft_tokens_by_source_total",
            description="Draft tokens the target accepted, by source (draft_model, prompt_lookup)",
            kind=kind.COUNTER,
        )
        self.by_source = {
            (key, source): self.families[key].Metric(labels={**labels, "source": source})
            for key in ("drafted_by_source", "accepted_by_source")
            for source in methods.SOURCES
        }

    def _scheduled_steps(self, in_flight: int, k: int):
        counter = self.scheduled_steps.get((in_flight, k))
        if counter is None:
            labels = {**self.labels, "in_flight": str(in_flight), "k": str(k)}
            counter = self.scheduled_steps[(in_flight, k)] = self.families["scheduled_steps"].Metric(labels=labels)
        return counter

    def record(self, outcome: str, state, times: bls.LoopTimes) -> None:
        stats = state.stats if state is not None else None
        values = {
            "iterations": times.iterations,
            "target_calls": stats.target_calls if stats else 0,
            "draft_tokens": stats.drafted_tokens if stats else 0,
            "accepted": stats.accepted_tokens if stats else 0,
            "rejections": stats.rejections if stats else 0,
            "output_tokens": stats.emitted_tokens if stats else 0,
            "loop_seconds": times.loop_seconds,
            "engine_wait_seconds": times.engine_wait_seconds,
        }
        for key, value in values.items():
            if value:
                self.counters[key].increment(value)
                self.totals[key] += value
        self.requests[outcome].increment(1)
        for (in_flight, k), count in times.steps_by_load.items():
            self._scheduled_steps(in_flight, k).increment(count)
        if stats:
            for key, counts in (
                ("drafted_by_source", stats.drafted_by_source),
                ("accepted_by_source", stats.accepted_by_source),
            ):
                for source, count in counts.items():
                    if count:
                        self.by_source[(key, source)].increment(count)
        if self.totals["draft_tokens"]:
            self.acceptance_rate.set(self.totals["accepted"] / self.totals["draft_tokens"])
        if self.totals["target_calls"]:
            self.tokens_per_target_call.set(self.totals["output_tokens"] / self.totals["target_calls"])


class ResponseSender:
    """Sends the responses of every request from one worker thread, in order, so the loop goes
    on to its next engine call while a response travels (a send blocks ~0.25 ms on a CPU). After
    each send the worker asks whether the request was cancelled, so that check (an IPC round
    trip too) is also off the loop's path; the loop reads the answer from ``cancelled``."""

    def __init__(self, cancelled: dict):
        self.cancelled = cancelled
        self.worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="trt-spec-send")

    def send(self, request, sender, response, key, final: bool = False) -> None:
        """``response``: an InferenceResponse, a dict of output arrays (made into one by the
        worker), or None (only the final flag)."""
        self.worker.submit(self._send, request, sender, response, key, final)

    def _send(self, request, sender, response, key, final: bool) -> None:
        try:
            if isinstance(response, dict):
                response = pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor(name, array) for name, array in response.items()]
                )
            if response is None:
                sender.send(flags=FINAL)
            else:
                sender.send(response, flags=FINAL if final else 0)
            if not final and key in self.cancelled and request.is_cancelled():
                self.cancelled[key] = True
        except Exception as exc:  # noqa: BLE001 - the client may be gone; nothing to tell it
            pb_utils.Logger.log_warn(f"{T.LOOP}: could not send a response: {type(exc).__name__}: {exc}")

    def close(self) -> None:
        self.worker.shutdown(wait=True)


def _error_response(message: str):
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.name = config["name"]
        self.settings = LoopParameters.from_config(config)
        self.running = None  # asyncio.Semaphore(max_batch_size), made on the stub's event loop
        self.max_running = max(1, int(config.get("max_batch_size", 1)))
        self.engines = TritonEngineClient()
        self.metrics = LoopMetrics(self.name)
        self.input_names = [tensor.name for tensor in T.LOOP_INPUTS]
        self.cancelled = {}  # request key -> cancelled, for the requests running now
        self.responses = ResponseSender(self.cancelled)
        self.tasks = set()  # the requests running now

    def finalize(self):
        self.responses.close()

    async def execute(self, requests):
        # One task per request, awaited here: the stub runs this coroutine in the background and
        # hands the instance its next requests meanwhile (module docstring).
        loop = asyncio.get_running_loop()
        if self.running is None:
            self.running = asyncio.Semaphore(self.max_running)
        started = loop.time()
        tasks = []
        for request in requests:
            task = loop.create_task(self._serve(request))
            self.tasks.add(task)  # the loop keeps only weak references to tasks
            task.add_done_callback(self.tasks.discard)
            tasks.append(task)
        await asyncio.gather(*tasks, return_exceptions=True)
        left = MIN_EXECUTE_SECONDS - (loop.time() - started)
        if left > 0:
            await asyncio.sleep(left)
        return None

    async def _serve(self, request):
        sender = request.get_response_sender()
        cancel = pb_utils.get_input_tensor_by_name(request, T.CANCEL_REQUEST_KEY.name)
        if cancel is not None:  # postprocessing relays a client's cancellation (tensors.py)
            key = int(cancel.as_numpy().reshape(-1)[0])
            if key in self.cancelled:
                self.cancelled[key] = True
            self.responses.send(request, sender, None, key, final=True)
            return
        key = bls.new_request_key()
        self.cancelled[key] = False
        try:
            await self._generate(request, sender, key)
        finally:
            del self.cancelled[key]

    async def _generate(self, request, sender, key):
        try:
            inputs = {}
            for name in self.input_names:
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                if tensor is not None:
                    inputs[name] = tensor.as_numpy()
            prompts = bls.read_loop_requests(inputs, self.settings)
        except Exception as exc:  # noqa: BLE001 - one short line to the client, never a traceback
            failed = f"{self.name} failed: {type(exc).__name__}: {exc}"
            message = str(exc) if isinstance(exc, GenerationParamsError) else failed
            self.responses.send(request, sender, _error_response(message.splitlines()[0]), key, True)
            self.responses.worker.submit(self.metrics.record, "failed", None, bls.LoopTimes())
            return
        # Each prompt runs as its own task; each ends with one last response, and the Triton final
        # flag goes on the last of those (TensorRT-LLM's decoupled backend does the same per batch item).
        unfinished = len(prompts)
        failures: list[str] = []

        def respond(arrays, last_of_prompt: bool) -> None:
            nonlocal unfinished
            unfinished -= last_of_prompt
            self.responses.send(request, sender, arrays, key, last_of_prompt and unfinished == 0)

        await asyncio.gather(*(self._admit(request, key, prompt, respond, failures) for prompt in prompts))
        if failures:
            self.responses.send(request, sender, _error_response(failures[0]), key, True)

    def _in_flight(self) -> int:
        """Prompts running in run_loop now (admitted; those queued for a slot are not in flight)."""
        return self.engines.active

    async def _admit(self, request, key, prompt: bls.LoopRequest, respond, failures: list[str]) -> None:
        """Run one prompt once fewer than max_batch_size prompts are running (arrival order)."""
        async with self.running:
            self.engines.active += 1
            try:
                await self._generate_prompt(request, key, prompt, respond, failures)
            finally:
                self.engines.active -= 1

    async def _generate_prompt(self, request, key, prompt: bls.LoopRequest, respond, failures: list[str]) -> None:
        """One prompt of a request, to its last response (unless a prompt of the request failed:
        then the request ends with that error alone)."""
        times = bls.LoopTimes()
        state = bls.new_state(prompt)
        windows = bls.ResponseWindows()
        log_probs: list[float] = []  # return_log_probs: one per generated token
        last_sent = False

        def stream(current, new_tokens):
            nonlocal last_sent
            window, context = windows.next(current.output)
            last_sent = current.finished
            arrays = bls.response_arrays(current, window, context, current.finished, key, prompt, log_probs)
            respond(arrays, current.finished)

        last_probe = time.monotonic()

        def probe(current, new_tokens):
            # Non-streaming: a liveness probe now and then, so that a cancelled client is noticed
            # (postprocessing relays it; tensors.py). It carries only postprocessing's inputs.
            nonlocal last_probe
            now = time.monotonic()
            if now - last_probe >= T.PROBE_INTERVAL_S and not current.finished:
                last_probe = now
                respond(bls.probe_arrays(key), False)

        def cancelled():
            # The sender checks request.is_cancelled() after every response and probe it sends.
            return bool(failures) or self.cancelled[key]

        try:
            await bls.run_loop(
                prompt,
                self.settings,
                self.engines,
                state=state,
                on_tokens=stream if prompt.stream else probe,
                is_cancelled=cancelled,
                times=times,
                log_probs=log_probs,
                in_flight=self._in_flight,
            )
            outcome = "finished"
        except bls.Cancelled:
            # The client is gone (or another prompt failed). A plain last response, not an error:
            # Triton 2.51 never completes a cancelled ensemble request whose decoupled step ends
            # with an error.
            outcome = "cancelled"
        except (GenerationParamsError, bls.EngineCallError) as exc:
            failures.append(str(exc))
            outcome = "failed"
        except Exception as exc:  # noqa: BLE001 - one short line to the client, never a traceback
            failures.append(f"{self.name} failed: {type(exc).__name__}: {exc}".splitlines()[0])
            outcome = "failed"
        if not last_sent and not failures:
            window, context = bls.final_window(prompt, state, windows)
            respond(bls.response_arrays(state, window, context, True, key, prompt, log_probs), True)
        self.responses.worker.submit(self.metrics.record, outcome, state, times)
