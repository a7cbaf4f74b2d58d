"""Triton python model ``spec_postprocessing``: token ids -> text, streaming-safe and stateless.

Each loop response reaches this model as its own request; the loop's other outputs (statistics,
log probs, ...) pass through unchanged; ``text_output`` is a 1-D ``[1]`` string tensor per response, as TensorRT-LLM's own postprocessing returns it. The protocol that makes the streamed
deltas concatenate to decoding everything at once (multi-byte characters included) is written
down in ``trt_spec/runtime/tensors.py``: the loop resends a window of already-covered tokens
(``num_context_tokens`` of them) before the new ones, and the last, possibly incomplete,
character is held back until a later response (or ``is_final``) settles it.

Decoupled, so that a request may end with no response at all: the loop's liveness probes (an
empty window that is not final, sent while a non-streaming request runs) are answered with the
final flag only, and reach no client, but a probe that arrives cancelled relays the cancellation
to the loop as any response does: Triton marks the ensemble's later step requests cancelled,
never the loop step already running (``tensors.py``).

Runs inside Triton's python-backend stub: imports numpy, the tokenizer library and
``trt_spec.runtime`` (the copy the repository writer puts beside this file, else the installed
package); the decoding itself is :func:`trt_spec.runtime.text.text_delta`.
"""

import collections
import sys
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

_HERE = Path(__file__).resolve().parent
if (_HERE / "trt_spec").is_dir():
    sys.path.insert(0, str(_HERE))

from trt_spec.runtime import tensors as T  # noqa: E402
from trt_spec.runtime.parameters import PostprocessingParameters  # noqa: E402
from trt_spec.runtime.text import text_delta  # noqa: E402

RELAYED_KEYS_KEPT = 1024  # cancellations already relayed, remembered so each is sent once
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
PASSED_THROUGH = tuple(tensor.name for tensor in T.LOOP_DIRECT_OUTPUTS)


class TritonPythonModel:
    def initialize(self, args):
        import json

        from transformers import AutoTokenizer

        parameters = PostprocessingParameters.from_config(json.loads(args["model_config"]))
        self.tokenizer = AutoTokenizer.from_pretrained(str(Path(__file__).parent / parameters.tokenizer_dir))
        self.loop_model = parameters.loop_model
        self.relayed = collections.OrderedDict()  # request keys whose cancellation went to the loop

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            if request.is_cancelled():
                # Answered as usual afterwards: an error here leaves Triton 2.51's cancelled
                # ensemble request in flight for good.
                self.relay_cancellation(request)
            try:
                ids = pb_utils.get_input_tensor_by_name(request, T.LOOP_OUTPUT_IDS.name).as_numpy()
                context = pb_utils.get_input_tensor_by_name(request, T.NUM_CONTEXT_TOKENS.name).as_numpy()
                final = pb_utils.get_input_tensor_by_name(request, T.IS_FINAL.name).as_numpy()
                if T.is_probe(ids, final):
                    sender.send(flags=FINAL)  # no response: nothing reaches the client
                    continue
                texts = [
                    text_delta(
                        self.tokenizer,
                        ids[row].tolist(),
                        int(context[row].reshape(-1)[0]),
                        bool(final[row].reshape(-1)[0]),
                    )
                    for row in range(ids.shape[0])
                ]
                # 1-D, one string per row, as TensorRT-LLM's postprocessing returns it: its clients
                # read a response's text as ``as_numpy("text_output")[0]``.
                output = np.array([text.encode("utf-8") for text in texts], dtype=object)
                tensors = [pb_utils.Tensor(T.TEXT_OUTPUT.name, output)]
                for name in PASSED_THROUGH:  # the loop's other outputs, as they came
                    tensor = pb_utils.get_input_tensor_by_name(request, name)
                    if tensor is not None:
                        tensors.append(pb_utils.Tensor(name, tensor.as_numpy()))
                response = pb_utils.InferenceResponse(output_tensors=tensors)
            except Exception as exc:  # noqa: BLE001 - one short line to the client, never a traceback
                message = f"postprocessing failed: {type(exc).__name__}: {exc}"
                response = pb_utils.InferenceResponse(error=pb_utils.TritonError(message))
            sender.send(response, flags=FINAL)
        return None

    def relay_cancellation(self, request) -> None:
        """Tell the loop model that the client of this request is gone (Triton cancels only an
        ensemble's next steps, not the loop already running; see tensors.py)."""
        key = pb_utils.get_input_tensor_by_name(request, T.REQUEST_KEY.name)
        if key is None or not self.loop_model:
            return
        key = int(key.as_numpy().reshape(-1)[0])
        if key in self.relayed:
            return
        self.relayed[key] = None
        while len(self.relayed) > RELAYED_KEYS_KEPT:
            self.relayed.popitem(last=False)
        cancel = pb_utils.InferenceRequest(
            model_name=self.loop_model,
            inputs=[pb_utils.Tensor(T.CANCEL_REQUEST_KEY.name, np.array([[key]], dtype=np.uint64))],
            requested_output_names=[],
        )
        for _ in cancel.exec(decoupled=True):
            pass
