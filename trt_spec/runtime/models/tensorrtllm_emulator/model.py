"""Triton python model ``tensorrt_llm`` / ``tensorrt_llm_draft`` of an emulated tensorrtllm repository.

``trt-spec serve --emulate-tensorrtllm`` (:mod:`trt_spec.serving.emulation`) swaps only the
``backend`` of the tensorrtllm flavor's engine models to ``python`` and puts this file beside
``emulated_engine.json`` (the engine the spec's plan builds, as
:class:`~trt_spec.runtime.trtllm_emulator.EngineFacts`). The logic, the backend's rules and its
messages are :class:`~trt_spec.runtime.trtllm_emulator.TrtllmBackendEmulator`'s; this file only
moves tensors in and out. A config the backend refuses fails the model's load with the backend's
message; a request it refuses gets that message as one error, never a traceback.

A ``stop`` request is answered as the emulator answers it (an empty response: nothing runs
concurrently here); a request cancelled before its turn is not run and gets a CANCELLED error.

Imports ``trt_spec`` from the copy beside this file, else from the installed package.
"""

import json
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if (_HERE / "trt_spec").is_dir():
    sys.path.insert(0, str(_HERE))

import triton_python_backend_utils as pb_utils  # noqa: E402

from trt_spec.runtime.trtllm_emulator import BackendError, EngineFacts, TrtllmBackendEmulator  # noqa: E402

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

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                if request.is_cancelled():
                    error = pb_utils.TritonError("request cancelled", pb_utils.TritonError.CANCELLED)
                    responses.append(pb_utils.InferenceResponse(error=error))
                    continue
                inputs = {tensor.name(): tensor.as_numpy() for tensor in request.inputs()}
                outputs = self.backend.execute(
                    inputs, request.requested_output_names(), request_id=request.request_id()
                )
                tensors = [pb_utils.Tensor(name, array) for name, array in outputs.items()]
                responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
            except BackendError as exc:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))))
            except Exception as exc:  # noqa: BLE001 - one short line to the caller, never a traceback
                message = f"{self.name} failed: {type(exc).__name__}: {exc}".splitlines()[0]
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)))
        if self.backend.warnings:
            self._log_warnings()
        return responses
