"""Triton python model ``tensorrt_llm`` / ``tensorrt_llm_draft`` of the torch flavor.

TensorRT-LLM's engine tensor interface over the PyTorch twin (the logic, and what it takes and
returns, is :mod:`trt_spec.runtime.twin_engine`), its requests batched in flight
(:mod:`trt_spec.runtime.inflight_batcher`); this file only moves tensors in and out. The
config's parameters (:class:`~trt_spec.runtime.parameters.TorchEngineParameters`) say which engine
it is (``role``) and name the checkpoint (``hf_model_dir``).

Imports ``trt_spec`` from the copy the repository writer puts beside this file (the code that
wrote the repository), else from the installed package.
"""

import concurrent.futures
import functools
import json
import sys
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if (_HERE / "trt_spec").is_dir():
    sys.path.insert(0, str(_HERE))

import triton_python_backend_utils as pb_utils  # noqa: E402

from trt_spec.runtime.draining import DrainGate  # noqa: E402
from trt_spec.runtime.inflight_batcher import InflightBatcher  # noqa: E402
from trt_spec.runtime.parameters import TorchEngineParameters  # noqa: E402
from trt_spec.runtime.twin_engine import (  # noqa: E402
    EngineRequestError,
    TwinEngine,
    is_stop_request,
    read_request,
    request_generator,
)

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args):
        import torch

        from trt_spec.runtime.torch_engine import TorchCausalLM

        config = json.loads(args["model_config"])
        parameters = TorchEngineParameters.from_config(config)
        self.name = config["name"]
        self.gate = DrainGate(self.name)  # while serve drains, only the loop's calls are served
        if parameters.torch_threads > 0:
            torch.set_num_threads(parameters.torch_threads)
        engine = TorchCausalLM.from_pretrained(parameters.hf_model_dir, engine_dtype=parameters.dtype)
        self.engine = TwinEngine(
            engine,
            parameters.role,
            max_draft_len=parameters.max_draft_len,
            max_seq_len=parameters.max_seq_len,
            cache_slots=max(1, int(config.get("max_batch_size", 1))),
            normalize_log_probs=parameters.normalize_log_probs,
        )
        self.batcher = InflightBatcher(
            self.engine, max_batch_size=self.engine.cache_slots, max_num_tokens=parameters.max_num_tokens
        )
        self.batcher.start()
        # Each request's time from execute() to its response, for the benchmark's loop-overhead
        # figure; in-flight batching's forward passes (steps), the requests they ran (/ steps = the
        # mean batch width) and their seconds (the engine busy).
        self.families = []  # a family must live as long as its metrics
        self.seconds_metric = self._counter(
            "trt_spec_engine_execute_seconds_total",
            "Seconds from a request's arrival in a torch-flavor engine model to its response",
        )
        self.calls_metric = self._counter(
            "trt_spec_engine_requests_total", "Requests the torch-flavor engine models answered"
        )
        self.steps_metric = self._counter(
            "trt_spec_engine_steps_total",
            "Forward passes the torch-flavor engine models ran (one per in-flight batch step)",
        )
        self.step_requests_metric = self._counter(
            "trt_spec_engine_step_requests_total",
            "Requests run by those forward passes, summed over steps (/ steps = mean batch width)",
        )
        self.step_seconds_metric = self._counter(
            "trt_spec_engine_step_seconds_total",
            "Seconds the torch-flavor engine models spent in forward passes (the engine busy)",
        )
        self._exported = (0, 0, 0.0)  # the batcher's (steps, requests, seconds) already counted
        # A metric update is an IPC round trip (~40 us): done by a worker, after the response.
        self.metrics_worker = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="trt-spec-metrics"
        )

    def _counter(self, name: str, description: str):
        family = pb_utils.MetricFamily(name=name, description=description, kind=pb_utils.MetricFamily.COUNTER)
        self.families.append(family)
        return family.Metric(labels={"model": self.name})

    def finalize(self):
        self.batcher.close()
        self.metrics_worker.shutdown(wait=True)

    def _count(self, seconds: float, requests: int) -> None:
        self.seconds_metric.increment(seconds)
        self.calls_metric.increment(requests)
        stats = self.batcher.stats  # read on this worker while the batcher steps: counters only grow
        steps, step_requests, step_seconds = stats.steps, stats.requests, stats.seconds
        self.steps_metric.increment(steps - self._exported[0])
        self.step_requests_metric.increment(step_requests - self._exported[1])
        self.step_seconds_metric.increment(step_seconds - self._exported[2])
        self._exported = (steps, step_requests, step_seconds)

    def execute(self, requests):
        """Hands each request to the in-flight batcher and returns: its response is sent, with the
        final flag, when it ends (a non-decoupled model's response sender), so requests arriving
        while others run join them at the next step."""
        draining = self.gate.draining()
        for request in requests:
            arrived = time.perf_counter()
            sender = request.get_response_sender()
            if draining and not self.gate.admits(request.parameters()):
                error = pb_utils.TritonError(self.gate.refusal(), pb_utils.TritonError.UNAVAILABLE)
                self._send(sender, arrived, pb_utils.InferenceResponse(error=error))
                continue
            wanted = request.requested_output_names()  # only what the caller asked for
            try:
                inputs = {tensor.name(): tensor.as_numpy() for tensor in request.inputs()}
                if is_stop_request(inputs):
                    self._respond(sender, arrived, wanted, self.engine.execute(inputs, request.request_id()))
                    continue
                engine_request = read_request(inputs, self.engine.role, self.engine.vocab_size)
            except Exception as exc:  # noqa: BLE001 - this request's error, answered alone
                self._fail(sender, arrived, exc)
                continue
            self.batcher.submit(
                engine_request,
                request_generator(engine_request),
                functools.partial(self._done, sender, arrived, engine_request, wanted),
            )
        return None

    def _done(self, sender, arrived, engine_request, wanted, answer, error):
        """The batcher's callback (on its thread) when a request ends."""
        if error is None:
            try:
                outputs = self.engine.outputs(engine_request, answer)
            except Exception as exc:  # noqa: BLE001 - reported below, like a failed step
                error = exc
            else:
                self._respond(sender, arrived, wanted, outputs)
                return
        self._fail(sender, arrived, error)

    def _respond(self, sender, arrived, wanted, outputs):
        tensors = [pb_utils.Tensor(name, array) for name, array in outputs.items() if not wanted or name in wanted]
        self._send(sender, arrived, pb_utils.InferenceResponse(output_tensors=tensors))

    def _fail(self, sender, arrived, error):
        if isinstance(error, EngineRequestError):
            message = f"{self.name}: {error}"
        else:  # one short line to the caller, never a traceback
            message = f"{self.name} failed: {type(error).__name__}: {error}".splitlines()[0]
        self._send(sender, arrived, pb_utils.InferenceResponse(error=pb_utils.TritonError(message)))

    def _send(self, sender, arrived, response):
        """The request's one response, with the final flag; its time from arrival counted."""
        sender.send(response, flags=FINAL)
        self.metrics_worker.submit(self._count, time.perf_counter() - arrived, 1)
