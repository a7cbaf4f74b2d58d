"""TensorRT-LLM 1.2.x's clients, unmodified, against the ensemble on the real Triton server (the
CPU build bundled in nvidia-pytriton, torch flavor of the demo pair): requests shaped exactly as
TensorRT-LLM's end-to-end gRPC client, Triton's OpenAI frontend and genai-perf/perf_analyzer
(``--backend tensorrtllm``) send them, and the HTTP ``generate`` endpoint (urllib and curl).
Greedy output through every path equals the target alone; inputs whose speculative treatment is
not implemented are refused unless neutral, one clear error each. One server for the module.

What each client sends is read from its source: TensorRT-LLM's
``triton_backend/inflight_batcher_llm/client/end_to_end_grpc_client.py`` (``prepare_inputs``,
``run_inference``), the Triton OpenAI frontend's ``_create_trtllm_generate_request``,
genai-perf's ``tensorrtllm_converter.py`` and Triton's ``http_server.cc``.
"""

from __future__ import annotations

import json
import queue
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

import numpy as np
import pytest
from conftest import EXAMPLES, decode, greedy_reference

from trt_spec.bench.prompts import prompt_texts
from trt_spec.repository.writer import write_repository
from trt_spec.runtime import tensors as T
from trt_spec.serving.server import TritonServer
from trt_spec.spec import load_spec

pytest.importorskip("pytriton", reason="the CPU Triton server comes with nvidia-pytriton")
grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import np_to_triton_dtype  # noqa: E402

NEW_TOKENS = 20


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("trtllm_clients")
    result = write_repository(load_spec(EXAMPLES / "pystdlib-demo.yaml"), root / "repo", "torch")
    with TritonServer(result.path, ready_timeout_s=300) as running:
        yield running


@pytest.fixture(scope="module")
def prompts():
    return prompt_texts(4, 200)


# --- how TensorRT-LLM's clients build and send tensors ---------------------------------------------


def prepare_tensor(name: str, array: np.ndarray):
    """end_to_end_grpc_client.py's prepare_tensor: the dtype from the numpy array."""
    tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    tensor.set_data_from_numpy(array)
    return tensor


@dataclass
class Answer:
    results: list  # InferResult, in arrival order
    errors: list[str]

    def text(self, index: int = 0) -> str:
        return self.results[index].as_numpy(T.TEXT_OUTPUT.name)[0].decode("utf-8")  # E2E: output[0]

    def texts(self) -> str:
        return "".join(self.text(i) for i in range(len(self.results)))

    def finals(self) -> list[bool]:
        return [r.get_response().parameters["triton_final_response"].bool_param for r in self.results]


def stream_infer(
    server, inputs: dict[str, np.ndarray], outputs: list[str] | None = None, model: str = T.ENSEMBLE
) -> Answer:
    """As end_to_end_grpc_client.py's run_inference: start_stream, async_stream_infer with the
    requested outputs, stop_stream (which waits for the server to close the stream)."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    requested = [grpcclient.InferRequestedOutput(name) for name in outputs] if outputs else None
    client.async_stream_infer(model, [prepare_tensor(k, v) for k, v in inputs.items()], outputs=requested)
    client.stop_stream()
    client.close()
    results, errors = [], []
    while not answers.empty():
        result, error = answers.get()
        if error is not None:
            errors.append(error.message())
        else:
            results.append(result)
    return Answer(results, errors)


def e2e_inputs(
    prompt: str,
    output_len: int = NEW_TOKENS,
    *,
    streaming: bool = False,
    exclude_input_in_output: bool = False,
    **optional: np.ndarray,
) -> dict[str, np.ndarray]:
    """end_to_end_grpc_client.py's prepare_inputs with its defaults (beam_width 1, temperature 1.0,
    exclude_input_in_output always sent) plus the optional inputs its flags add."""
    input0 = [[prompt]]
    inputs = {
        "text_input": np.array(input0).astype(object),
        "max_tokens": np.ones_like(input0).astype(np.int32) * output_len,
        "stream": np.array([[streaming]], dtype=bool),
        "beam_width": np.array([[1]], dtype=np.int32),
        "temperature": np.array([[1.0]], dtype=np.float32),
    }
    inputs.update(optional)
    inputs["exclude_input_in_output"] = np.array([[exclude_input_in_output]], dtype=bool)
    return inputs


def completion(target, prompt: str, tokens: int = NEW_TOKENS) -> str:
    return decode(target, greedy_reference(target, prompt, tokens))


def assert_clean_error(message: str, *fragments: str) -> None:
    for fragment in fragments:
        assert fragment in message, message
    assert "\n" not in message.strip() and "Traceback" not in message


# --- TensorRT-LLM's end-to-end gRPC client ---------------------------------------------------------
#
# Its --model-name: the ensemble (default) or tensorrt_llm_bls, which answers the same requests alike.


@pytest.fixture(params=[T.ENSEMBLE, T.BLS])
def model(request):
    return request.param


def test_e2e_client_defaults_give_prompt_and_greedy_completion(server, target, prompts, model):
    # E2E's defaults: not streaming, exclude_input_in_output False, temperature 1.0 without top_k or
    # top_p (greedy, TensorRT-LLM's rule); only text_output requested.
    answer = stream_infer(server, e2e_inputs(prompts[0]), ["text_output"], model=model)
    assert answer.errors == [] and len(answer.results) == 1 and answer.finals() == [True]
    assert answer.results[0].as_numpy("text_output").shape == (1,)  # E2E reads output[0].decode()
    assert answer.text() == prompts[0] + completion(target, prompts[0])  # E2E's check_outputs


def test_e2e_client_streaming_and_excluded_input(server, target, prompts, model):
    expected = completion(target, prompts[1])
    excluded = stream_infer(server, e2e_inputs(prompts[1], exclude_input_in_output=True), ["text_output"], model=model)
    assert excluded.errors == [] and excluded.text() == expected
    streamed = stream_infer(server, e2e_inputs(prompts[1], streaming=True, exclude_input_in_output=True), model=model)
    assert streamed.errors == [] and len(streamed.results) > 1 and streamed.texts() == expected
    assert streamed.finals()[-1] and not any(streamed.finals()[:-1])
    # Streaming never resends the prompt (TensorRT-LLM streams new tokens only).
    with_input = stream_infer(server, e2e_inputs(prompts[1], streaming=True), model=model)
    assert with_input.errors == [] and with_input.texts() == expected


def test_e2e_client_batch_inputs(server, target, prompts, model):
    # --batch-inputs: every per-prompt array concatenated along axis 0, batch_index requested.
    batch = [e2e_inputs(p, exclude_input_in_output=True) for p in prompts[:3]]
    inputs = {key: np.concatenate([one[key] for one in batch], axis=0) for key in batch[0]}
    assert inputs["text_input"].shape == (3, 1)
    answer = stream_infer(server, inputs, ["text_output", "batch_index"], model=model)
    assert answer.errors == [] and len(answer.results) == 3
    assert answer.finals().count(True) == 1 and answer.finals()[-1]
    texts = {int(r.as_numpy("batch_index")[0][0]): r.as_numpy("text_output")[0].decode() for r in answer.results}
    assert texts == {index: completion(target, prompt) for index, prompt in enumerate(prompts[:3])}


def test_e2e_client_batch_streaming_with_per_prompt_lengths(server, target, prompts, model):
    batch = [e2e_inputs(p, 12 + 4 * i, streaming=True, exclude_input_in_output=True) for i, p in enumerate(prompts[:2])]
    inputs = {key: np.concatenate([one[key] for one in batch], axis=0) for key in batch[0]}
    answer = stream_infer(server, inputs, ["text_output", "batch_index"], model=model)
    assert answer.errors == [] and answer.finals().count(True) == 1
    texts = ["", ""]
    for result in answer.results:  # E2E: batch_output_text[batch_index] += output[0]
        texts[int(result.as_numpy("batch_index")[0][0])] += result.as_numpy("text_output")[0].decode()
    assert texts == [completion(target, prompts[0], 12), completion(target, prompts[1], 16)]


def test_e2e_client_with_its_optional_inputs_at_their_defaults(server, target, prompts, model):
    # --repetition-penalty 1 --presence-penalty 0 --frequency-penalty 0 --stop-words/--bad-words
    # (empty), --end-id/--pad-id as the tokenizer's, --num-return-sequences 1, and the perf/log-prob
    # flags off: all accepted, output unchanged; every declared output may be requested.
    tokenizer = target[1]
    optional = {
        "num_return_sequences": np.array([[1]], dtype=np.int32),
        "repetition_penalty": np.array([[1.0]], dtype=np.float32),
        "presence_penalty": np.array([[0.0]], dtype=np.float32),
        "frequency_penalty": np.array([[0.0]], dtype=np.float32),
        "bad_words": np.array([[""]], dtype=object),
        "end_id": np.array([[tokenizer.eos_token_id]], dtype=np.int32),
        "pad_id": np.array([[tokenizer.eos_token_id]], dtype=np.int32),
        "return_log_probs": np.array([[False]], dtype=bool),
        "return_context_logits": np.array([[False]], dtype=bool),
        "return_generation_logits": np.array([[False]], dtype=bool),
        "return_perf_metrics": np.array([[False]], dtype=bool),
    }
    every_output = [tensor.name for tensor in T.ENSEMBLE_OUTPUTS]
    answer = stream_infer(
        server, e2e_inputs(prompts[2], exclude_input_in_output=True, **optional), every_output, model=model
    )
    assert answer.errors == [] and len(answer.results) == 1
    result = answer.results[0]
    assert answer.text() == completion(target, prompts[2])
    assert result.as_numpy("sequence_index")[0][0] == 0 and result.as_numpy("batch_index") is None  # one prompt
    assert result.as_numpy("cum_log_probs") is None  # filled only with return_log_probs


def test_end_id_and_exclude_input_in_output_per_request(server, target, prompts):
    reference = greedy_reference(target, prompts[3], NEW_TOKENS)
    index = next(i for i in range(3, len(reference)) if reference[i] not in reference[:i])
    end = {"end_id": np.array([[reference[index]]], dtype=np.int32)}
    answer = stream_infer(server, e2e_inputs(prompts[3], exclude_input_in_output=True, **end))
    assert answer.errors == [] and answer.text() == decode(target, reference[:index])
    full = stream_infer(server, e2e_inputs(prompts[3], exclude_input_in_output=False, **end))
    assert full.text() == prompts[3] + decode(target, reference[:index])


# --- Triton's OpenAI frontend (--backend tensorrtllm or an ensemble) ----------------------------------


def openai_inputs(prompt: str, *, stream: bool = False, echo: bool | None = False, **overrides) -> dict:
    """_create_trtllm_generate_request: text_input, stream and max_tokens always; top_p,
    penalties and temperature as its pydantic schema fills them (sent when not None); seed as
    UINT64 when given; exclude_input_in_output = not echo (completions only; chat sends none);
    return_num_input_tokens / return_num_output_tokens always true."""
    inputs = {
        "text_input": np.array([[prompt]], dtype=object),
        "stream": np.bool_([[stream]]),
        "max_tokens": np.int32([[overrides.pop("max_tokens", 16)]]),
        "top_p": np.float32([[overrides.pop("top_p", 1.0)]]),
        "frequency_penalty": np.float32([[0.0]]),
        "presence_penalty": np.float32([[0.0]]),
        "temperature": np.float32([[overrides.pop("temperature", 1.0)]]),
    }
    if "seed" in overrides:
        inputs["seed"] = np.uint64([[overrides.pop("seed")]])
    if "stop" in overrides:
        inputs["stop_words"] = np.array([overrides.pop("stop")], dtype=object)
    if echo is not None:
        inputs["exclude_input_in_output"] = np.bool_([[not echo]])
    inputs["return_num_input_tokens"] = np.bool_([[True]])
    inputs["return_num_output_tokens"] = np.bool_([[True]])
    assert not overrides
    return inputs


def test_openai_frontend_completion_with_usage(server, target, prompts):
    tokenizer = target[1]
    reference = greedy_reference(target, prompts[0], 16)
    answer = stream_infer(server, openai_inputs(prompts[0], temperature=0.0))
    # Non-streaming: one response (its _validate_triton_responses_non_streaming), volume 1 text.
    assert answer.errors == [] and len(answer.results) == 1 and answer.finals() == [True]
    result = answer.results[0]
    assert result.as_numpy("text_output").size == 1 and answer.text() == decode(target, reference)
    assert result.as_numpy("num_input_tokens").dtype == np.int32  # its usage reads UINT32 or INT32
    assert result.as_numpy("num_input_tokens")[0][0] == len(tokenizer(prompts[0])["input_ids"])
    assert result.as_numpy("num_output_tokens")[0][0] == len(reference)
    # echo=True: the text starts with the prompt (its test_echo).
    echoed = stream_infer(server, openai_inputs(prompts[0], temperature=0.0, echo=True))
    assert echoed.text() == prompts[0] + decode(target, reference)
    # Chat sends no exclude_input_in_output: the repository's default (true) leaves the prompt out.
    chat = stream_infer(server, openai_inputs(prompts[0], temperature=0.0, echo=None))
    assert chat.text() == decode(target, reference)


def test_openai_frontend_streaming_usage_sums_to_the_completion(server, target, prompts):
    reference = greedy_reference(target, prompts[1], 16)
    answer = stream_infer(server, openai_inputs(prompts[1], stream=True, temperature=0.0))
    assert answer.errors == [] and len(answer.results) > 1
    assert answer.texts() == decode(target, reference)  # deltas appended to the SSE stream
    # Its streaming usage: prompt_tokens from the first chunk, completion_tokens summed over chunks.
    counts = [int(r.as_numpy("num_output_tokens")[0][0]) for r in answer.results]
    assert sum(counts) == len(reference)
    assert all(
        r.as_numpy("num_input_tokens")[0][0] == answer.results[0].as_numpy("num_input_tokens")[0][0]
        for r in answer.results
    )


def test_openai_frontend_sampling_defaults_and_stop(server, target, prompts):
    # Its schema's defaults (temperature 1, top_p 1) sample; a seed reproduces the completion.
    first = stream_infer(server, openai_inputs(prompts[2], seed=5))
    again = stream_infer(server, openai_inputs(prompts[2], seed=5))
    assert first.errors == [] and again.errors == [] and first.text() == again.text()
    reference = greedy_reference(target, prompts[2], 16)
    tokenizer = target[1]
    index = next(
        i
        for i in range(3, len(reference))
        if tokenizer(decode(target, [reference[i]]), add_special_tokens=False)["input_ids"] == [reference[i]]
        and reference[i] not in reference[:i]
    )
    stopped = stream_infer(
        server, openai_inputs(prompts[2], temperature=0.0, stop=[decode(target, [reference[index]])])
    )
    assert stopped.text() == decode(target, reference[: index + 1])


# --- genai-perf / perf_analyzer --backend tensorrtllm ------------------------------------------------


@pytest.mark.parametrize("streaming", [False, True])
def test_genai_perf_payload(server, target, prompts, streaming):
    # Its record {"text_input": [text], "max_tokens": [256]} (+ "stream": [True] with --streaming),
    # sent by perf_analyzer over the gRPC streaming RPC with --shape text_input:1 --shape max_tokens:1.
    record = {"text_input": [prompts[3]], "max_tokens": [24]}
    if streaming:
        record["stream"] = [True]
    inputs = {
        "text_input": np.array([record["text_input"]], dtype=object),
        "max_tokens": np.array([record["max_tokens"]], dtype=np.int32),
    }
    if streaming:
        inputs["stream"] = np.array([record["stream"]], dtype=bool)
    answer = stream_infer(server, inputs)
    assert answer.errors == [] and (len(answer.results) > 1) == streaming
    assert answer.texts() == completion(target, prompts[3], 24)


# --- Triton's HTTP generate endpoint -----------------------------------------------------------------


def http_post(server, path: str, body: dict) -> tuple[int, str]:
    request = urllib.request.Request(
        f"http://{server.http_url}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_http_generate_the_readme_curl(server, target):
    status, body = http_post(server, "/v2/models/ensemble/generate", {"text_input": "def f():", "max_tokens": 20})
    assert status == 200, body
    answer = json.loads(body)
    assert answer["text_output"] == completion(target, "def f():", 20)  # the configured default: no prompt
    assert answer["num_output_tokens"] == len(greedy_reference(target, "def f():", 20))
    # TensorRT-LLM's documented example, with empty word lists and the prompt kept.
    status, body = http_post(
        server,
        "/v2/models/ensemble/generate",
        {
            "text_input": "def f():",
            "max_tokens": 20,
            "bad_words": "",
            "stop_words": "",
            "exclude_input_in_output": False,
        },
    )
    assert status == 200 and json.loads(body)["text_output"] == "def f():" + completion(target, "def f():", 20)


def test_http_generate_stream(server, target):
    status, body = http_post(
        server, "/v2/models/ensemble/generate_stream", {"text_input": "def f():", "max_tokens": 20, "stream": True}
    )
    assert status == 200, body
    chunks = [json.loads(line[len("data: ") :]) for line in body.splitlines() if line.startswith("data: ")]
    assert len(chunks) > 1 and "".join(chunk["text_output"] for chunk in chunks) == completion(target, "def f():", 20)


def test_http_generate_refusal_is_one_clear_error(server):
    status, body = http_post(
        server, "/v2/models/ensemble/generate", {"text_input": "def f():", "max_tokens": 4, "beam_width": 2}
    )
    assert status == 400 and "beam_width = 2 is not supported" in json.loads(body)["error"]


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl")
def test_real_curl(server, target):
    result = subprocess.run(
        [
            "curl",
            "-s",
            "-X",
            "POST",
            f"{server.http_url}/v2/models/ensemble/generate",
            "-d",
            '{"text_input": "def f():", "max_tokens": 20}',
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["text_output"] == completion(target, "def f():", 20)


# --- refusals: one clear error each, and the server keeps serving --------------------------------------

REFUSED = [
    ("beam_width", np.array([[4]], dtype=np.int32), "beam_width = 4 is not supported: speculative decoding"),
    ("num_return_sequences", np.array([[2]], dtype=np.int32), "num_return_sequences = 2 is not supported"),
    ("repetition_penalty", np.array([[0.0]], dtype=np.float32), "repetition_penalty must be between 0.01 and 100"),
    ("presence_penalty", np.array([[np.inf]], dtype=np.float32), "presence_penalty must be between"),
    ("frequency_penalty", np.array([[np.nan]], dtype=np.float32), "frequency_penalty must be between"),
    ("length_penalty", np.array([[2.0]], dtype=np.float32), "length_penalty = 2 is not supported with"),
    ("min_tokens", np.array([[-1]], dtype=np.int32), "min_tokens must be >= 0"),
    ("embedding_bias_weights", np.array([[1.5]], dtype=np.float32), "embedding_bias_words has 0 entries"),
    ("return_context_logits", np.array([[True]]), "return_context_logits = true is not supported with"),
    ("return_generation_logits", np.array([[True]]), "return_generation_logits = true is not supported with"),
    ("return_perf_metrics", np.array([[True]]), "return_perf_metrics = true is not supported with"),
    ("prompt_vocab_size", np.array([[8]], dtype=np.int32), "prompt_vocab_size = 8 is not supported with"),
    ("prompt_embedding_table", np.ones((1, 2, 4), dtype=np.float16), "prompt_embedding_table = a tensor of shape"),
    ("lora_task_id", np.array([[3]], dtype=np.uint64), "lora_task_id = 3 is not supported with"),
    ("guided_decoding_guide_type", np.array([["json"]], dtype=object), "guided_decoding_guide_type = 'json' is not"),
    ("decoder_text_input", np.array([["x"]], dtype=object), "decoder_text_input = 'x' is not supported with"),
    ("end_id", np.array([[10**6]], dtype=np.int32), "end_id must be a token id below the vocabulary size"),
    ("pad_id", np.array([[-5]], dtype=np.int32), "pad_id must be a token id below the vocabulary size"),
    # word lists are bounded before any is tokenized (100,000 bad words used to take ~7 s)
    ("bad_words", np.array([[f"w{i}" for i in range(100_000)]], dtype=object), "bad_words has 100000 entries"),
    ("stop_words", np.array([["s" * 2000]], dtype=object), "stop_words holds a 2000-byte entry"),
]


@pytest.mark.parametrize(("name", "array", "message"), REFUSED, ids=[row[0] for row in REFUSED])
def test_unsupported_values_are_refused_with_one_clear_error(server, name, array, message):
    answer = stream_infer(server, e2e_inputs("def f():", 4, **{name: array}))
    assert answer.results == [] and len(answer.errors) == 1
    assert_clean_error(answer.errors[0], message)
    if "is not supported with" in message:
        assert "send the default" in answer.errors[0] or "omit it" in answer.errors[0]


def test_the_server_keeps_serving_after_refusals_and_seed_aliases(server, prompts):
    both = {"seed": np.array([[1]], dtype=np.uint64), "random_seed": np.array([[2]], dtype=np.uint64)}
    answer = stream_infer(server, openai_inputs(prompts[0], **{}) | both)
    assert answer.results == [] and len(answer.errors) == 1
    assert_clean_error(answer.errors[0], "random_seed is an alias of seed", "got 1 and 2")
    # random_seed alone samples exactly as seed does.
    by_seed = stream_infer(server, openai_inputs(prompts[0], seed=9))
    alias = openai_inputs(prompts[0])
    alias["random_seed"] = np.uint64([[9]])
    by_alias = stream_infer(server, alias)
    assert by_seed.errors == by_alias.errors == [] and by_seed.text() == by_alias.text()
    started = time.monotonic()
    ok = stream_infer(server, e2e_inputs("def f():", 4, exclude_input_in_output=True))
    assert ok.errors == [] and ok.results[0].as_numpy("num_output_tokens")[0][0] == 4
    assert time.monotonic() - started < 60


# --- penalties, min_tokens, bad words, embedding bias and log probs -------------------------------


def penalised_case(target, prompt: str):
    """Penalties that change this prompt's greedy completion: a bad word and a negative bias on
    tokens the plain completion holds, and a minimum length beyond where it stops."""
    import torch

    from trt_spec.runtime.penalties import Penalties

    tokenizer = target[1]
    plain = greedy_reference(target, prompt, NEW_TOKENS)
    banned, biased = tokenizer.decode([plain[1]]), tokenizer.decode([plain[3]])
    penalties = Penalties(
        repetition_penalty=1.3,
        presence_penalty=0.4,
        frequency_penalty=0.2,
        min_tokens=NEW_TOKENS // 2,
        bad_words=(tuple(tokenizer.encode(banned, add_special_tokens=False)),),
        embedding_bias=tuple((token, -3.0) for token in tokenizer.encode(biased)),
    )
    inputs = {
        "repetition_penalty": np.array([[1.3]], dtype=np.float32),
        "presence_penalty": np.array([[0.4]], dtype=np.float32),
        "frequency_penalty": np.array([[0.2]], dtype=np.float32),
        "min_tokens": np.array([[NEW_TOKENS // 2]], dtype=np.int32),
        "bad_words": np.array([[banned]], dtype=object),
        "embedding_bias_words": np.array([[biased]], dtype=object),
        "embedding_bias_weights": np.array([[-3.0]], dtype=np.float32),
        "return_log_probs": np.array([[True]], dtype=bool),
    }
    expected = greedy_reference(target, prompt, NEW_TOKENS, penalties)
    assert expected != plain  # the penalties change the output: the test below can fail
    model = target[0]
    tokens = list(tokenizer(prompt)["input_ids"])
    with torch.inference_mode():
        logits = model(torch.tensor([tokens + expected])).logits[0, len(tokens) - 1 : -1]  # [n, V]
    from trt_spec.runtime.penalties import adjusted_scores

    scores = adjusted_scores(logits, 1.0, penalties, tokens, expected, target[1].eos_token_id)
    log_probs = scores.log_softmax(-1)[torch.arange(len(expected)), torch.tensor(expected)].tolist()
    return inputs, expected, log_probs


@pytest.mark.parametrize("num_draft_tokens", [4, 0])
def test_e2e_client_penalties_are_applied_exactly_as_by_the_target_alone(server, target, prompts, num_draft_tokens):
    inputs, expected, log_probs = penalised_case(target, prompts[1])
    inputs["num_draft_tokens"] = np.array([[num_draft_tokens]], dtype=np.int32)
    outputs = ["text_output", "output_log_probs", "cum_log_probs", "num_output_tokens"]
    answer = stream_infer(server, e2e_inputs(prompts[1], exclude_input_in_output=True, **inputs), outputs)
    assert answer.errors == [] and len(answer.results) == 1
    result = answer.results[0]
    assert answer.text() == decode(target, expected)
    assert result.as_numpy("num_output_tokens")[0][0] == len(expected)
    got = result.as_numpy("output_log_probs")
    assert got.shape == (1, 1, len(expected))  # [batch, beams, tokens], as TensorRT-LLM shapes it
    assert np.allclose(got.reshape(-1), log_probs, atol=1e-3)
    assert result.as_numpy("cum_log_probs").shape == (1, 1)
    assert np.isclose(result.as_numpy("cum_log_probs")[0, 0], sum(log_probs), atol=1e-2)


def test_streamed_log_probs_are_each_responses_new_tokens(server, target, prompts):
    inputs, expected, log_probs = penalised_case(target, prompts[1])
    answer = stream_infer(
        server, e2e_inputs(prompts[1], streaming=True, **inputs), ["text_output", "output_log_probs", "cum_log_probs"]
    )
    assert answer.errors == [] and answer.texts() == decode(target, expected)
    streamed = [r.as_numpy("output_log_probs") for r in answer.results if r.as_numpy("output_log_probs") is not None]
    assert np.allclose(np.concatenate([p.reshape(-1) for p in streamed]), log_probs, atol=1e-3)
    assert np.isclose(answer.results[-1].as_numpy("cum_log_probs")[0, 0], sum(log_probs), atol=1e-2)
