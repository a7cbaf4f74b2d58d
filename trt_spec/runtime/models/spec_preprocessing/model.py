"""Triton python model ``spec_preprocessing``: prompt text -> token ids, request parameters checked.

The logic, the defaults it resolves as TensorRT-LLM does and its messages are
:mod:`trt_spec.runtime.preprocess`'s; this file only moves tensors in and out. A request may
carry N prompts (``text_input`` ``[N, 1]``); a bad request fails alone with one short
``TritonError`` naming the input, its value and what is allowed; never a traceback.

Runs inside Triton's python-backend stub: imports numpy, the tokenizer library and
``trt_spec.runtime`` (from the copy the repository writer puts beside this file, else from the
installed package).
"""

import sys
from pathlib import Path

import triton_python_backend_utils as pb_utils

_HERE = Path(__file__).resolve().parent
if (_HERE / "trt_spec").is_dir():
    sys.path.insert(0, str(_HERE))

from trt_spec.runtime.parameters import PreprocessingParameters  # noqa: E402
from trt_spec.runtime.preprocess import Preprocessor, Prompt, RequestError, read_prompts  # noqa: E402


def read_request(request, max_bytes: int | None = None, max_input_len: int = 0) -> list[Prompt]:
    """The prompts of one request (:func:`~trt_spec.runtime.preprocess.read_prompts` over its input
    tensors, each read when needed); with ``max_bytes``, a prompt longer than that is refused
    before anything else is read."""

    def array(name: str):
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        return None if tensor is None else tensor.as_numpy()

    return read_prompts(array, max_bytes, max_input_len)


class TritonPythonModel:
    def initialize(self, args):
        import json

        from transformers import AutoTokenizer

        parameters = PreprocessingParameters.from_config(json.loads(args["model_config"]))
        tokenizer = AutoTokenizer.from_pretrained(str(Path(__file__).parent / parameters.tokenizer_dir))
        self.preprocessor = Preprocessor(tokenizer, parameters)

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                preprocessor = self.preprocessor
                prompts = read_request(request, preprocessor.max_prompt_bytes, preprocessor.parameters.max_input_len)
                outputs = preprocessor.batch(prompts)
                tensors = [pb_utils.Tensor(name, array) for name, array in outputs.items()]
                responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
            except RequestError as exc:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))))
            except Exception as exc:  # noqa: BLE001 - one short line to the client, never a traceback
                message = f"preprocessing failed: {type(exc).__name__}: {exc}"
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)))
        return responses
