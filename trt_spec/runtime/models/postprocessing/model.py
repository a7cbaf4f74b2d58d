"""Triton python model ``postprocessing``: TensorRT-LLM's own postprocessing interface (unary).

``TOKENS_BATCH`` ``[N, beams, L]`` (an engine's ``output_ids``) and ``SEQUENCE_LENGTH``
``[N, beams]`` in; ``OUTPUT``: each sequence's first ``SEQUENCE_LENGTH`` tokens decoded, one
string per sequence (``[N * beams]``, so a client of one prompt reads ``OUTPUT[0]``), special tokens
skipped unless the ``skip_special_tokens`` parameter says otherwise; as upstream's
(``triton_backend/all_models/inflight_batcher_llm/postprocessing/1/model.py`` @ 2e2327b, which
decodes with the tokenizer's defaults). Our ensemble streams through ``spec_postprocessing``
instead, whose deltas concatenate to the same text.
"""

import sys
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

_HERE = Path(__file__).resolve().parent
if (_HERE / "trt_spec").is_dir():
    sys.path.insert(0, str(_HERE))

from trt_spec.runtime import tensors as T  # noqa: E402
from trt_spec.runtime.parameters import TrtllmPostprocessingParameters  # noqa: E402


class RequestError(ValueError):
    """A request the model refuses; the message goes to the client as it is."""


def sequences(tokens: np.ndarray | None, lengths: np.ndarray | None) -> list[list[int]]:
    """``TOKENS_BATCH`` and ``SEQUENCE_LENGTH`` -> each sequence's tokens, prompt by prompt, beam by beam.

    Raises:
        RequestError: a missing input or shapes that do not match.
    """
    if tokens is None or lengths is None:
        raise RequestError("postprocessing needs TOKENS_BATCH [N, beams, L] and SEQUENCE_LENGTH [N, beams]")
    if tokens.ndim != 3 or lengths.shape != tokens.shape[:2]:
        raise RequestError(
            f"TOKENS_BATCH must be [N, beams, L] and SEQUENCE_LENGTH [N, beams]; got {list(tokens.shape)} and "
            f"{list(lengths.shape)}"
        )
    out = []
    for row in range(tokens.shape[0]):
        for beam in range(tokens.shape[1]):
            length = int(lengths[row, beam])
            if not 0 <= length <= tokens.shape[2]:
                raise RequestError(f"SEQUENCE_LENGTH {length} is outside TOKENS_BATCH's {tokens.shape[2]} tokens")
            out.append([int(token) for token in tokens[row, beam, :length]])
    return out


class TritonPythonModel:
    def initialize(self, args):
        import json

        from transformers import AutoTokenizer

        parameters = TrtllmPostprocessingParameters.from_config(json.loads(args["model_config"]))
        self.tokenizer = AutoTokenizer.from_pretrained(str(Path(__file__).parent / parameters.tokenizer_dir))
        self.skip_special_tokens = parameters.skip_special_tokens

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                tokens, lengths = (
                    pb_utils.get_input_tensor_by_name(request, tensor.name) for tensor in T.TRTLLM_POSTPROCESSING_INPUTS
                )
                ids = sequences(
                    None if tokens is None else tokens.as_numpy(), None if lengths is None else lengths.as_numpy()
                )
                texts = self.tokenizer.batch_decode(ids, skip_special_tokens=self.skip_special_tokens)
                output = np.array([text.encode("utf-8") for text in texts], dtype=object)
                responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(T.OUTPUT.name, output)]))
            except RequestError as exc:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))))
            except Exception as exc:  # noqa: BLE001 - one short line to the client, never a traceback
                message = f"postprocessing failed: {type(exc).__name__}: {exc}"
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)))
        return responses
