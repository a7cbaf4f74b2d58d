"""Triton python model ``preprocessing``: TensorRT-LLM's own preprocessing interface (unary).

What upstream's clients call before the engine models (``e2e_grpc_speculative_decoding_client.py``
runs ``preprocessing`` -> ``tensorrt_llm_draft`` / ``tensorrt_llm`` -> ``postprocessing`` itself):
``QUERY`` ``[N, 1]`` and ``REQUEST_OUTPUT_LEN`` in; ``INPUT_ID`` ``[N, L]`` (right-padded with each
row's pad id), ``REQUEST_INPUT_LEN``, ``BAD_WORDS_IDS``/``STOP_WORDS_IDS`` (``[N, 2, L]``;
``[N, 2, 0]`` without words), ``EMBEDDING_BIAS`` (``[N, V]``; ``[N, 0]`` without words),
``OUT_END_ID``/``OUT_PAD_ID`` (the tokenizer's EOS and pad token unless sent) and, for a
decoder-only model, ``DECODER_INPUT_ID`` = the pad id with ``REQUEST_DECODER_INPUT_LEN`` 1. The
shapes and defaults are upstream's (``triton_backend/all_models/inflight_batcher_llm/preprocessing/
1/model.py`` @ 01259b1: ``_create_request``, ``_to_word_list_format``, ``_get_embedding_bias``).

The repository serves text models: an image, video or decoder query is refused by name. Unlike
upstream, a ``QUERY`` longer in bytes than the engines' ``max_input_len`` tokens can cover is
refused before it is tokenized (:mod:`trt_spec.runtime.tokenizing`), so it holds up no one.
Our own ensemble does not use this model (``spec_preprocessing`` checks far more, :mod:`tensors`).
"""

import sys
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

_HERE = Path(__file__).resolve().parent
if (_HERE / "trt_spec").is_dir():
    sys.path.insert(0, str(_HERE))

from trt_spec.runtime import tensors as T  # noqa: E402
from trt_spec.runtime.parameters import TrtllmPreprocessingParameters  # noqa: E402
from trt_spec.runtime.tokenizing import (  # noqa: E402
    PromptTooLarge,
    WordListTooLarge,
    check_prompt_size,
    check_word_list,
    embedding_bias,
    max_prompt_bytes,
    stack_word_lists,
    word_list,
)

REFUSED = (T.DECODER_QUERY, *T.VISION_INPUTS)


class RequestError(ValueError):
    """A request the model refuses; the message goes to the client as it is."""


def _text(value: object, name: str) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise RequestError(f"{name} is not valid UTF-8") from None
    return str(value)


class UpstreamPreprocessor:
    """The model's logic without Triton: a tokenizer and the model's parameters."""

    def __init__(self, tokenizer, parameters: TrtllmPreprocessingParameters) -> None:
        self.tokenizer = tokenizer
        self.parameters = parameters
        self.max_prompt_bytes = max_prompt_bytes(tokenizer, parameters.max_input_len)
        pad_token = tokenizer.pad_token or tokenizer.eos_token
        # Upstream encodes the tokens' text (the same ids for a tokenizer whose specials encode as one).
        self.end_id = tokenizer.encode(tokenizer.eos_token, add_special_tokens=False)[0]
        self.pad_id = tokenizer.encode(pad_token, add_special_tokens=False)[0]
        self.vocab_size = len(tokenizer.get_vocab())

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def __call__(self, inputs: dict[str, np.ndarray | None]) -> dict[str, np.ndarray]:
        """The request's input arrays by name (None = absent) -> its outputs by name.

        Raises:
            RequestError: naming the input, its value and the fix.
        """
        for tensor in REFUSED:
            if inputs.get(tensor.name) is not None:
                raise RequestError(
                    f"{tensor.name} is not supported: this repository serves a text model; send QUERY only"
                )
        query = inputs.get(T.QUERY.name)
        if query is None or query.ndim != 2 or query.shape[0] == 0 or query.shape[1] != 1:
            shape = None if query is None else list(query.shape)
            raise RequestError(f"QUERY must hold one prompt per row (shape [N, 1]); got {shape}")
        size = query.shape[0]
        output_len = inputs.get(T.TRTLLM_REQUEST_OUTPUT_LEN.name)
        if output_len is None:
            raise RequestError("REQUEST_OUTPUT_LEN is required")
        for name, array in inputs.items():
            if array is not None and (array.ndim == 0 or array.shape[0] != size):
                raise RequestError(f"{name} must have one row per prompt ({size}, as QUERY); got {list(array.shape)}")
        for row in range(size):
            try:
                check_prompt_size(query[row, 0], self.max_prompt_bytes, self.parameters.max_input_len, T.QUERY.name)
                for tensor in (T.BAD_WORDS_DICT, T.STOP_WORDS_DICT, T.UPPER_EMBEDDING_BIAS_WORDS):
                    words = inputs.get(tensor.name)
                    if words is not None:
                        check_word_list(words[row], tensor.name)
            except (PromptTooLarge, WordListTooLarge) as exc:
                raise RequestError(str(exc)) from None

        end_ids = self._ids(inputs.get(T.UPPER_END_ID.name), self.end_id, size)
        pad_ids = self._ids(inputs.get(T.UPPER_PAD_ID.name), self.pad_id, size)
        prompts = [
            list(
                self.tokenizer(
                    _text(query[row, 0], T.QUERY.name), add_special_tokens=self.parameters.add_special_tokens
                ).input_ids
            )
            for row in range(size)
        ]
        width = max(len(ids) for ids in prompts)
        input_id = np.array(
            [ids + [int(pad_ids[row, 0])] * (width - len(ids)) for row, ids in enumerate(prompts)], dtype=np.int32
        )
        outputs = {
            T.INPUT_ID.name: input_id,
            T.REQUEST_INPUT_LEN.name: np.array([[len(ids)] for ids in prompts], dtype=np.int32),
            T.DECODER_INPUT_ID.name: pad_ids.copy(),
            T.REQUEST_DECODER_INPUT_LEN.name: np.ones((size, 1), dtype=np.int32),
            T.BAD_WORDS_IDS.name: self._word_lists(inputs.get(T.BAD_WORDS_DICT.name), size),
            T.STOP_WORDS_IDS.name: self._word_lists(inputs.get(T.STOP_WORDS_DICT.name), size),
            T.UPPER_EMBEDDING_BIAS.name: self._bias(
                inputs.get(T.UPPER_EMBEDDING_BIAS_WORDS.name), inputs.get(T.UPPER_EMBEDDING_BIAS_WEIGHTS.name), size
            ),
            T.OUT_REQUEST_OUTPUT_LEN.name: np.asarray(output_len, dtype=np.int32),
            T.OUT_END_ID.name: end_ids,
            T.OUT_PAD_ID.name: pad_ids,
        }
        extra = inputs.get(T.PROMPT_TABLE_EXTRA_ID_IN.name)
        if extra is not None:
            # p-tuning's id for each prompt-table token (ids past the vocabulary); a text prompt has none.
            outputs[T.OUT_PROMPT_TABLE_EXTRA_IDS.name] = np.where(
                input_id >= self.vocab_size, extra.reshape(size, 1).astype(np.uint64), np.uint64(0)
            ).astype(np.uint64)
        return outputs

    @staticmethod
    def _ids(array: np.ndarray | None, default: int, size: int) -> np.ndarray:
        if array is None:
            return np.full((size, 1), default, dtype=np.int32)
        return np.asarray(array, dtype=np.int32).reshape(size, 1)

    def _word_lists(self, array: np.ndarray | None, size: int) -> np.ndarray:
        if array is None:
            return np.empty((size, 2, 0), dtype=np.int32)
        lists = []
        for row in range(size):
            words = [self.encode(_text(word, "word")) for word in array[row].reshape(-1)]
            lists.append(word_list([ids for ids in words if ids]))
        return stack_word_lists(lists)

    def _bias(self, words: np.ndarray | None, weights: np.ndarray | None, size: int) -> np.ndarray:
        if words is None or weights is None:
            return np.empty((size, 0), dtype=np.float32)
        rows = []
        for row in range(size):
            row_words = [_text(word, T.UPPER_EMBEDDING_BIAS_WORDS.name) for word in words[row].reshape(-1)]
            row_weights = np.asarray(weights[row], dtype=np.float64).reshape(-1)
            if len(row_words) != row_weights.size:
                raise RequestError(
                    f"EMBEDDING_BIAS_WORDS has {len(row_words)} entries and EMBEDDING_BIAS_WEIGHTS "
                    f"{row_weights.size}: send one weight per word"
                )
            rows.append(embedding_bias(self.tokenizer, row_words, row_weights, self.vocab_size))
        return np.stack(rows)


class TritonPythonModel:
    def initialize(self, args):
        import json

        from transformers import AutoTokenizer

        parameters = TrtllmPreprocessingParameters.from_config(json.loads(args["model_config"]))
        tokenizer = AutoTokenizer.from_pretrained(str(Path(__file__).parent / parameters.tokenizer_dir))
        self.preprocessor = UpstreamPreprocessor(tokenizer, parameters)

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                inputs = {}
                for tensor in T.TRTLLM_PREPROCESSING_INPUTS:
                    found = pb_utils.get_input_tensor_by_name(request, tensor.name)
                    inputs[tensor.name] = None if found is None else found.as_numpy()
                outputs = self.preprocessor(inputs)
                tensors = [pb_utils.Tensor(name, array) for name, array in outputs.items()]
                responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
            except RequestError as exc:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))))
            except Exception as exc:  # noqa: BLE001 - one short line to the client, never a traceback
                message = f"preprocessing failed: {type(exc).__name__}: {exc}"
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)))
        return responses
