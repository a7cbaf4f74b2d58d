"""Triton python model ``postprocessing``: token ids -> text, streaming-safe and stateless.

Each loop response reaches this model as its own request. The protocol that makes the streamed
deltas concatenate to decoding everything at once (multi-byte characters included) is written
down in ``trt_spec/triton/tensors.py``: the loop resends a window of already-covered tokens
(``num_context_tokens`` of them) before the new ones, and the last, possibly incomplete,
character is held back until a later response (or ``is_final``) settles it.

Runs inside Triton's python-backend stub: imports numpy, the tokenizer library and the tensor
definitions (``trt_spec_tensors.py``, copied beside this file by the repository writer) only.
"""


import importlib.util
import sys
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

REPLACEMENT = "\ufffd"  # what a decoder yields for bytes that are not (yet) a whole character


def _load_tensors():
    """The repository's own copy of trt_spec/triton/tensors.py, else the installed package's."""
    sibling = Path(__file__).with_name("trt_spec_tensors.py")
    if sibling.is_file():
        spec = importlib.util.spec_from_file_location("trt_spec_tensors", sibling)
        module = importlib.util.module_from_spec(spec)
        sys.modules["trt_spec_tensors"] = module
        spec.loader.exec_module(module)
        return module
    from trt_spec.triton import tensors

    return tensors


T = _load_tensors()


def decode(tokenizer, ids) -> str:
    # No clean-up: it rewrites text already streamed (" ." -> "."), which a stream cannot undo.
    return tokenizer.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)


def settled(text: str) -> str:
    """``text`` without its last character if that may still change: an incomplete UTF-8
    sequence decodes to exactly one U+FFFD, and only the last one can become something else."""
    return text[:-1] if text.endswith(REPLACEMENT) else text


def text_delta(tokenizer, window_ids, num_context_tokens: int, is_final: bool) -> str:
    """The new text of one response: ``window_ids[num_context_tokens:]`` are new tokens, the
    ones before them were covered by earlier responses."""
    if not 0 <= num_context_tokens <= len(window_ids):
        raise ValueError(f"num_context_tokens {num_context_tokens} is outside 0..{len(window_ids)}")
    before = settled(decode(tokenizer, window_ids[:num_context_tokens])) if num_context_tokens else ""
    after = decode(tokenizer, window_ids)
    if not is_final:
        after = settled(after)
    if not after.startswith(before):
        # Only a tokenizer whose decode is not prefix-stable gets here; send what is new.
        common = 0
        for old, new in zip(before, after):
            if old != new:
                break
            common += 1
        return after[common:]
    return after[len(before):]


class TritonPythonModel:
    def initialize(self, args):
        import json

        from transformers import AutoTokenizer

        config = json.loads(args["model_config"])
        parameters = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        self.tokenizer = AutoTokenizer.from_pretrained(str(Path(__file__).parent / parameters["tokenizer_dir"]))

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                ids = pb_utils.get_input_tensor_by_name(request, T.LOOP_OUTPUT_IDS.name).as_numpy()
                context = pb_utils.get_input_tensor_by_name(request, T.NUM_CONTEXT_TOKENS.name).as_numpy()
                final = pb_utils.get_input_tensor_by_name(request, T.IS_FINAL.name).as_numpy()
                texts = [
                    text_delta(self.tokenizer, ids[row].tolist(), int(context[row].reshape(-1)[0]), bool(final[row].reshape(-1)[0]))
                    for row in range(ids.shape[0])
                ]
                output = np.array([[text.encode("utf-8")] for text in texts], dtype=object)
                responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(T.TEXT_OUTPUT.name, output)]))
            except Exception as exc:  # noqa: BLE001 - one short line to the client, never a traceback
                message = f"postprocessing failed: {type(exc).__name__}: {exc}"
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)))
        return responses
