"""Triton python model ``tensorrt_llm`` / ``tensorrt_llm_draft`` of an emulated tensorrtllm repository.

``trt-spec serve --emulate-tensorrtllm`` (:mod:`trt_spec.serving.emulation`) swaps only the
``backend`` of the tensorrtllm flavor's engine models to ``python`` and puts this file beside
``emulated_engine.json`` (the engine the spec's plan builds, as
:class:`~trt_spec.runtime.trtllm_emulator.EngineFacts`). The logic, the backend's rules and its
messages are :class:`~trt_spec.runtime.trtllm_emulator.TrtllmBackendEmulator`'s; this file only
moves tensors in and out. A config the backend refuses fails the model's load with the backend's
message; a request it refuses gets that message as one error, never a traceback.

The requests of one ``execute`` are one batch of the emulated executor (scheduled together). A
``stop`` request is answered as the emulator answers it (an empty response); a request
cancelled before its turn is not run and gets a CANCELLED error.

Imports ``trt_spec`` from the copy beside this file, else from the installed package.
"""

import json
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if (_HERE / "trt_spec").is_dir():
    sys.path.insert(0, str(_HERE))

import triton_python_backend_utils as pb_utils  # noqa: E402

from trt_spec.runtime.draining import DrainGate  # noqa: E402
from trt_spec.runtime.trtllm_emulator import BackendError, BatchItem, EngineFacts, TrtllmBackendEmulator  # noqa: E402

# Intra-op threads per engine model: a request keeps one engine busy at a time, and the server's
# other processes need the remaining cores (as the torch flavor's default).
TORCH_THREADS = 1


class TritonPythonModel:
    def initialize(self, args):
        import torch

        torch.set_num_threads(TORCH_THREADS)
        config = json.loads(args["model_config"])
        self.name = config.get("name", "tensorrt_llm")
        self.logger = pb_utils.Logger
        # Not the backend's: while `trt-spec serve` drains, only the loop's calls are served (draining.py).
        self.gate = DrainGate(self.name)
        engine = EngineFacts.from_json(json.loads((_HERE / EngineFacts.FILE).read_text()))
        try:
            self.backend = TrtllmBackendEmulator.load(config, engine)
        except BackendError as exc:
            # The load fails with the backend's message, as the real backend's does (Triton logs
            # it as "Internal: BackendError: <message>" and the frame that raised it: only this one).
            raise exc.with_traceback(None) from None
        self._log_warnings()

    def _log_warnings(self) -> None:
        for warning in self.backend.warnings:
            self.logger.log_warn(f"{self.name}: {warning}")
        self.backend.warnings.clear()
        for note in self.backend.notes:
            self.logger.log_info(f"{self.name}: {note}")
        self.backend.notes.clear()

    def execute(self, requests):
        """Triton's dynamic batcher hands over the requests that queued together: they reach the
        emulated executor as one batch and are scheduled together, as upstream's in-flight batcher
        would run them in the same steps."""
        responses = [None] * len(requests)
        batch, places = [], []
        draining = self.gate.draining()
        for index, request in enumerate(requests):
            if request.is_cancelled():
                error = pb_utils.TritonError("request cancelled", pb_utils.TritonError.CANCELLED)
                responses[index] = pb_utils.InferenceResponse(error=error)
                continue
            if draining and not self.gate.admits(request.parameters()):
                error = pb_utils.TritonError(self.gate.refusal(), pb_utils.TritonError.UNAVAILABLE)
                responses[index] = pb_utils.InferenceResponse(error=error)
                continue
            inputs = {tensor.name(): tensor.as_numpy() for tensor in request.inputs()}
            batch.append(BatchItem(inputs, request.requested_output_names(), request.request_id()))
            places.append(index)
        try:
            results = self.backend.execute_batch(batch)
        except Exception as exc:  # noqa: BLE001 - one short line to each caller, never a traceback
            message = f"{self.name} failed: {type(exc).__name__}: {exc}".splitlines()[0]
            results = [BackendError(message, stage="emulator")] * len(batch)
        for index, result in zip(places, results):
            if isinstance(result, BackendError):
                responses[index] = pb_utils.InferenceResponse(error=pb_utils.TritonError(str(result)))
            else:
                tensors = [pb_utils.Tensor(name, array) for name, array in result.items()]
                responses[index] = pb_utils.InferenceResponse(output_tensors=tensors)
        if self.backend.warnings or self.backend.notes:
            self._log_warnings()
        return responses
