"""Triton python model ``tensorrt_llm`` / ``tensorrt_llm_draft`` of the torch flavor.

TensorRT-LLM's engine tensor interface over the PyTorch twin (the logic, and what it takes and
returns, is :mod:`trt_spec.runtime.twin_engine`); this file only moves tensors in and out. The
config's parameters (:class:`~trt_spec.runtime.parameters.TorchEngineParameters`) say which engine
it is (``role``) and name the checkpoint (``hf_model_dir``).

Imports ``trt_spec`` from the copy the repository writer puts beside this file (the code that
wrote the repository), else from the installed package.
"""

import concurrent.futures
import json
import sys
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if (_HERE / "trt_spec").is_dir():
    sys.path.insert(0, str(_HERE))

import triton_python_backend_utils as pb_utils  # noqa: E402

from trt_spec.runtime.draining import DrainGate  # noqa: E402
from trt_spec.runtime.parameters import TorchEngineParameters  # noqa: E402
from trt_spec.runtime.twin_engine import EngineRequestError, TwinEngine  # noqa: E402


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
        engine = TorchCausalLM.from_pretrained(parameters.hf_model_dir)
        self.engine = TwinEngine(
            engine,
            parameters.role,
            max_draft_len=parameters.max_draft_len,
            max_seq_len=parameters.max_seq_len,
            cache_slots=max(1, int(config.get("max_batch_size", 1))),
            normalize_log_probs=parameters.normalize_log_probs,
        )
        # Time inside execute(), for the benchmark's loop-overhead figure; the families must live
        # as long as their metrics.
        self.seconds_family = pb_utils.MetricFamily(
            name="trt_spec_engine_execute_seconds_total",
            description="Seconds the torch-flavor engine models spent inside execute()",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self.calls_family = pb_utils.MetricFamily(
            name="trt_spec_engine_requests_total",
            description="Requests the torch-flavor engine models answered",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self.seconds_metric = self.seconds_family.Metric(labels={"model": self.name})
        self.calls_metric = self.calls_family.Metric(labels={"model": self.name})
        # A metric update is an IPC round trip (~40 us): done by a worker, after the response.
        self.metrics_worker = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="trt-spec-metrics"
        )

    def finalize(self):
        self.metrics_worker.shutdown(wait=True)

    def _count(self, seconds: float, requests: int) -> None:
        self.seconds_metric.increment(seconds)
        self.calls_metric.increment(requests)

    def execute(self, requests):
        started = time.perf_counter()
        responses = []
        draining = self.gate.draining()
        for request in requests:
            if draining and not self.gate.admits(request.parameters()):
                error = pb_utils.TritonError(self.gate.refusal(), pb_utils.TritonError.UNAVAILABLE)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            try:
                inputs = {tensor.name(): tensor.as_numpy() for tensor in request.inputs()}
                outputs = self.engine.execute(inputs, request.request_id())
                wanted = request.requested_output_names()  # only what the caller asked for
                tensors = [
                    pb_utils.Tensor(name, array) for name, array in outputs.items() if not wanted or name in wanted
                ]
                responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
            except EngineRequestError as exc:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"{self.name}: {exc}")))
            except Exception as exc:  # noqa: BLE001 - one short line to the caller, never a traceback
                message = f"{self.name} failed: {type(exc).__name__}: {exc}".splitlines()[0]
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)))
        self.metrics_worker.submit(self._count, time.perf_counter() - started, len(requests))
        return responses
