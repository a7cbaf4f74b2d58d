"""TensorRT-LLM 1.2.x's own models, as its clients and recipes call them, on both flavors through
the real CPU Triton server (torch: the PyTorch twin; tensorrtllm: the backend emulator), demo pair.

- ``e2e_grpc_speculative_decoding_client.py`` (``triton_backend/inflight_batcher_llm/client/`` @
  7ed07f0): ``preprocessing`` (QUERY ...) -> ``tensorrt_llm_draft`` for K tokens -> ``tensorrt_llm``
  verifying them as ``draft_input_ids`` -> ... -> ``postprocessing`` (TOKENS_BATCH ...), every call
  unary ``infer``, engines answering with the prompt in ``output_ids`` (they get no
  exclude_input_in_output). Its request shapes and stop rules are rebuilt here from its source.
- the draft-target recipe's ``curl .../v2/models/tensorrt_llm_bls/generate`` with ``text_input``,
  ``max_tokens``, ``num_draft_tokens``, ``use_draft_logits`` and ``stream`` false
  (``examples/draft_target_model/README.md`` @ 11925f6).
Greedy text equals the target alone every time. One server per flavor.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest
from conftest import EXAMPLES, decode, greedy_reference, serve_emulated

from trt_spec.bench.prompts import prompt_texts
from trt_spec.repository.writer import write_repository
from trt_spec.runtime import tensors as T
from trt_spec.serving.server import TritonServer
from trt_spec.spec import load_spec

pytest.importorskip("pytriton", reason="the CPU Triton server comes with nvidia-pytriton")
grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException, np_to_triton_dtype  # noqa: E402

OUTPUT_LEN = 24
NUM_DRAFT_TOKENS = 4


@pytest.fixture(scope="module", params=["torch", "tensorrtllm"])
def server(request, tmp_path_factory):
    spec = load_spec(EXAMPLES / "pystdlib-demo.yaml")
    root = tmp_path_factory.mktemp(f"upstream_{request.param}")
    if request.param == "tensorrtllm":
        running = serve_emulated(spec, root)
    else:
        running = TritonServer(write_repository(spec, root / "repo", "torch").path, ready_timeout_s=300).start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def prompts():
    return prompt_texts(3, 120)


def prepare_tensor(name: str, array: np.ndarray):
    tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    tensor.set_data_from_numpy(array)
    return tensor


# --- e2e_grpc_speculative_decoding_client.py, rebuilt from its source ---------------------------------


def _engine_inputs(input_ids, output_len, draft_tokens, bad_words_ids, stop_words_ids, end_id, pad_id):
    """Its get_trtllm_inputs with the script's defaults (beam 1, temperature 1.0, no penalties)."""
    inputs = [
        prepare_tensor("input_ids", np.expand_dims(input_ids, axis=0)),
        prepare_tensor("input_lengths", np.array([[len(input_ids)]], dtype=np.int32)),
        prepare_tensor("request_output_len", np.array([[output_len]], dtype=np.int32)),
        prepare_tensor("bad_words_list", bad_words_ids),
        prepare_tensor("stop_words_list", stop_words_ids),
        prepare_tensor("beam_width", np.array([[1]], dtype=np.int32)),
        prepare_tensor("temperature", np.array([[1.0]], dtype=np.float32)),
    ]
    if draft_tokens is not None:
        inputs.append(prepare_tensor("draft_input_ids", np.array([draft_tokens], dtype=np.int32)))
    inputs.append(prepare_tensor("end_id", np.array([[end_id]], dtype=np.int32)))
    inputs.append(prepare_tensor("pad_id", np.array([[pad_id]], dtype=np.int32)))
    return inputs


def _engine_outputs(result):
    output_ids = np.squeeze(result.as_numpy("output_ids").astype(np.int32), axis=(0, 1))
    lengths = result.as_numpy("sequence_length").astype(np.int32)
    assert lengths.shape[:2] == (1, 1)
    return output_ids, int(lengths[0, 0])


def speculative_client(url: str, prompt: str, output_len: int, num_draft_tokens: int, stop_words=()) -> tuple:
    """run_speculative_inference: the final text and the number of target calls."""
    client = grpcclient.InferenceServerClient(url)
    query = np.array([[prompt]]).astype(object)
    pre_inputs = [
        prepare_tensor("QUERY", query),
        prepare_tensor("REQUEST_OUTPUT_LEN", np.ones_like([[prompt]]).astype(np.int32) * output_len),
    ]
    if stop_words:
        pre_inputs.append(prepare_tensor("STOP_WORDS_DICT", np.array([list(stop_words)], dtype=object)))
    pre = client.infer(T.TRTLLM_PREPROCESSING, pre_inputs, request_id="1")
    prompt_ids = np.squeeze(pre.as_numpy("INPUT_ID").astype(np.int32), axis=0)
    bad_words_ids = pre.as_numpy("BAD_WORDS_IDS").astype(np.int32)
    stop_words_ids = pre.as_numpy("STOP_WORDS_IDS").astype(np.int32)
    end_id = pre.as_numpy("OUT_END_ID").astype(np.int32)[0][0]
    pad_id = pre.as_numpy("OUT_PAD_ID").astype(np.int32)[0][0]

    input_ids, draft_output_ids, target_calls = prompt_ids, None, 0
    while True:
        k = min(num_draft_tokens, len(prompt_ids) + output_len - len(input_ids) - 1)
        if k > 0:
            draft = client.infer(
                T.DRAFT,
                _engine_inputs(input_ids, k, None, bad_words_ids, stop_words_ids, end_id, pad_id),
                request_id="1",
            )
            draft_output_ids, draft_len = _engine_outputs(draft)
            draft_tokens = draft_output_ids[len(input_ids) : draft_len]
        target = client.infer(
            T.TARGET,
            _engine_inputs(
                input_ids,
                len(draft_tokens) + 1 if k > 0 else 1,
                draft_tokens if k > 0 else None,
                bad_words_ids,
                stop_words_ids,
                end_id,
                pad_id,
            ),
            request_id="1",
        )
        target_calls += 1
        last_input_ids, (input_ids, _) = input_ids, _engine_outputs(target)
        length_stop = len(input_ids) >= len(prompt_ids) + output_len
        target_draft_equal = draft_output_ids is not None and np.array_equal(draft_output_ids, input_ids)
        last_current_equal = np.array_equal(last_input_ids, input_ids)
        hit_stop_words = any(
            np.array_equal(input_ids[-len(row) :], row) for row in stop_words_ids[0]
        )  # its encountered_stop_words, over the rows of [2, L]
        if length_stop or target_draft_equal or last_current_equal or hit_stop_words:
            break
    post = client.infer(
        T.TRTLLM_POSTPROCESSING,
        [
            prepare_tensor("TOKENS_BATCH", np.expand_dims(input_ids, axis=(0, 1))),
            prepare_tensor("SEQUENCE_LENGTH", np.array([[len(input_ids)]], dtype=np.int32)),
        ],
        request_id="1",
    )
    client.close()
    return post.as_numpy("OUTPUT")[0].decode("utf8"), target_calls


def test_the_speculative_decoding_client_gets_the_targets_greedy_text(server, target, prompts):
    for prompt in prompts[:2]:
        text, target_calls = speculative_client(server.grpc_url, prompt, OUTPUT_LEN, NUM_DRAFT_TOKENS)
        tokens = greedy_reference(target, prompt, OUTPUT_LEN)
        # postprocessing decodes the whole sequence (the prompt's tokens included), as upstream's does
        tokenizer = target[1]
        whole = tokenizer.decode(tokenizer(prompt).input_ids + tokens, skip_special_tokens=True)
        assert text == whole
        assert target_calls < OUTPUT_LEN  # drafts were accepted: fewer target calls than tokens


def test_preprocessing_answers_as_upstreams(server, target):
    # Shapes and defaults of upstream's preprocessing: no words = [N, 2, 0], no bias = [N, 0], ids
    # right-padded with the pad id, decoder ids = [pad_id], the tokenizer's EOS and pad token.
    tokenizer = target[1]
    client = grpcclient.InferenceServerClient(server.grpc_url)
    queries = np.array([["def add(a, b):"], ["import os"]], dtype=object)
    result = client.infer(
        T.TRTLLM_PREPROCESSING,
        [
            prepare_tensor("QUERY", queries),
            prepare_tensor("REQUEST_OUTPUT_LEN", np.array([[8], [9]], dtype=np.int32)),
        ],
    )
    ids = [tokenizer(q).input_ids for q in ("def add(a, b):", "import os")]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    width = max(map(len, ids))
    assert result.as_numpy("INPUT_ID").tolist() == [row + [pad] * (width - len(row)) for row in ids]
    assert result.as_numpy("REQUEST_INPUT_LEN").tolist() == [[len(row)] for row in ids]
    assert result.as_numpy("REQUEST_OUTPUT_LEN").tolist() == [[8], [9]]
    assert result.as_numpy("BAD_WORDS_IDS").shape == (2, 2, 0)
    assert result.as_numpy("STOP_WORDS_IDS").shape == (2, 2, 0)
    assert result.as_numpy("EMBEDDING_BIAS").shape == (2, 0)
    assert result.as_numpy("OUT_END_ID").tolist() == [[tokenizer.eos_token_id]] * 2
    assert result.as_numpy("OUT_PAD_ID").tolist() == [[pad]] * 2
    assert result.as_numpy("DECODER_INPUT_ID").tolist() == [[pad]] * 2
    # Words become TensorRT-LLM's word lists; END_ID and PAD_ID pass through.
    words = client.infer(
        T.TRTLLM_PREPROCESSING,
        [
            prepare_tensor("QUERY", queries[:1]),
            prepare_tensor("REQUEST_OUTPUT_LEN", np.array([[8]], dtype=np.int32)),
            prepare_tensor("STOP_WORDS_DICT", np.array([["\n\n", "return"]], dtype=object)),
            prepare_tensor("END_ID", np.array([[7]], dtype=np.int32)),
        ],
    )
    stop = [
        tokenizer("\n\n", add_special_tokens=False).input_ids,
        tokenizer("return", add_special_tokens=False).input_ids,
    ]
    flat = stop[0] + stop[1]
    assert words.as_numpy("STOP_WORDS_IDS")[0].tolist() == [
        flat,
        [len(stop[0]), len(flat)] + [-1] * (len(flat) - 2),
    ]
    assert words.as_numpy("OUT_END_ID").tolist() == [[7]]
    # An image or a decoder query is refused by name; a huge QUERY before it is tokenized.
    with pytest.raises(InferenceServerException, match="IMAGE_URL is not supported"):
        client.infer(
            T.TRTLLM_PREPROCESSING,
            [
                prepare_tensor("QUERY", queries[:1]),
                prepare_tensor("REQUEST_OUTPUT_LEN", np.array([[8]], dtype=np.int32)),
                prepare_tensor("IMAGE_URL", np.array([["http://x/y.png"]], dtype=object)),
            ],
        )
    with pytest.raises(InferenceServerException, match=r"QUERY is \d+ bytes, more than"):
        client.infer(
            T.TRTLLM_PREPROCESSING,
            [
                prepare_tensor("QUERY", np.array([["x = 1\n" * 100_000]], dtype=object)),
                prepare_tensor("REQUEST_OUTPUT_LEN", np.array([[8]], dtype=np.int32)),
            ],
        )
    with pytest.raises(InferenceServerException, match="STOP_WORDS_DICT has 300 entries; at most 256"):
        client.infer(
            T.TRTLLM_PREPROCESSING,
            [
                prepare_tensor("QUERY", queries[:1]),
                prepare_tensor("REQUEST_OUTPUT_LEN", np.array([[8]], dtype=np.int32)),
                prepare_tensor("STOP_WORDS_DICT", np.array([[f"s{i}" for i in range(300)]], dtype=object)),
            ],
        )
    client.close()


def test_postprocessing_decodes_each_sequence_to_its_length(server, target):
    tokenizer = target[1]
    ids = tokenizer("for i in range(10):\n    print(i)").input_ids
    client = grpcclient.InferenceServerClient(server.grpc_url)
    tokens = np.array([[ids + [0, 0]], [ids[:5] + [0] * (len(ids) - 3)]], dtype=np.int32)  # [2, 1, L]
    result = client.infer(
        T.TRTLLM_POSTPROCESSING,
        [
            prepare_tensor("TOKENS_BATCH", tokens),
            prepare_tensor("SEQUENCE_LENGTH", np.array([[len(ids)], [5]], dtype=np.int32)),
        ],
    )
    assert result.as_numpy("OUTPUT").tolist() == [
        tokenizer.decode(ids, skip_special_tokens=True).encode(),
        tokenizer.decode(ids[:5], skip_special_tokens=True).encode(),
    ]
    with pytest.raises(InferenceServerException, match="SEQUENCE_LENGTH 99 is outside"):
        client.infer(
            T.TRTLLM_POSTPROCESSING,
            [
                prepare_tensor("TOKENS_BATCH", tokens[:1]),
                prepare_tensor("SEQUENCE_LENGTH", np.array([[99]], dtype=np.int32)),
            ],
        )
    client.close()


# --- end_to_end_grpc_client.py, on the ensemble and on tensorrt_llm_bls (its --model-name) --------


@pytest.mark.parametrize("model", [T.ENSEMBLE, T.BLS])
@pytest.mark.parametrize("streaming", [False, True])
def test_the_end_to_end_client_on_either_model_name(server, target, prompts, model, streaming):
    # Its prepare_inputs with its defaults: beam_width 1, temperature 1.0 (greedy without top-k or
    # top-p), exclude_input_in_output false, streaming as flagged; start_stream + async_stream_infer.
    prompt = prompts[1]
    inputs = {
        "text_input": np.array([[prompt]]).astype(object),
        "max_tokens": np.ones_like([[prompt]]).astype(np.int32) * OUTPUT_LEN,
        "stream": np.array([[streaming]], dtype=bool),
        "beam_width": np.array([[1]], dtype=np.int32),
        "temperature": np.array([[1.0]], dtype=np.float32),
        "exclude_input_in_output": np.array([[False]], dtype=bool),
    }
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: list = []
    client.start_stream(callback=lambda result, error: answers.append((result, error)))
    client.async_stream_infer(model, [prepare_tensor(name, array) for name, array in inputs.items()])
    client.stop_stream()
    client.close()
    assert [error for _, error in answers if error is not None] == []
    text = "".join(result.as_numpy("text_output")[0].decode() for result, _ in answers)
    completion = decode(target, greedy_reference(target, prompt, OUTPUT_LEN))
    # Not streaming: the prompt and the completion (exclude_input_in_output false); streaming: new text only.
    assert text == (completion if streaming else prompt + completion)


# --- the draft-target recipe's BLS request ---------------------------------------------------------


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_the_recipes_bls_generate_curl(server, target, prompts):
    body = {
        "text_input": prompts[2],
        "max_tokens": OUTPUT_LEN,
        "num_draft_tokens": NUM_DRAFT_TOKENS,
        "use_draft_logits": True,  # greedy: drafts are verified by their tokens whatever this says
        "stream": False,
    }
    done = subprocess.run(
        [
            "curl",
            "-sS",
            "-X",
            "POST",
            f"http://{server.http_url}/v2/models/{T.BLS}/generate",
            "-H",
            "Content-Type: application/json",
            "-d",
            json.dumps(body),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    answer = json.loads(done.stdout)
    assert answer.get("text_output") == decode(target, greedy_reference(target, prompts[2], OUTPUT_LEN)), answer
