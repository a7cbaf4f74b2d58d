"""The OpenAI-compatible endpoint (``trt_spec.serving.openai``) in front of the real CPU Triton
server on the demo pair's torch-flavor repository, driven by the ``openai`` SDK and curl:
completions and chat completions, streaming and not, exact greedy output, usage, stop, seed,
refused parameters in OpenAI's error shape, cancellation, and ``trt-spec serve --openai-port``.
One Triton server and one endpoint for the module."""

from __future__ import annotations

import concurrent.futures
import json
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import EXAMPLES, decode, greedy_reference

from trt_spec.bench.prompts import prompt_texts
from trt_spec.repository.writer import write_repository
from trt_spec.serving.server import TritonServer, free_port
from trt_spec.spec import load_spec

pytest.importorskip("pytriton", reason="the CPU Triton server comes with nvidia-pytriton")
pytest.importorskip("fastapi", reason="the OpenAI endpoint needs trt-spec[openai]")
openai = pytest.importorskip("openai", reason="the tests drive the endpoint with the openai SDK")

from trt_spec.serving.openai import OpenAIServer, tokenizer_dir_of  # noqa: E402

MODEL = "pystdlib"
NEW_TOKENS = 32
CHAT_TEMPLATE = (
    "{% for m in messages %}# {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}# assistant:\n{% endif %}"
)


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("openai")
    return write_repository(load_spec(EXAMPLES / "pystdlib-demo.yaml"), root / "repo", "torch").path


@pytest.fixture(scope="module")
def triton(repo):
    running = TritonServer(repo, ready_timeout_s=300).start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def endpoint(triton, repo):
    with OpenAIServer(triton.grpc_url, tokenizer_dir_of(repo), MODEL, port=free_port()) as server:
        yield server


@pytest.fixture(scope="module")
def chat_tokenizer_dir(repo, tmp_path_factory) -> Path:
    """A copy of the repository's tokenizer files with a small chat template."""
    copy = tmp_path_factory.mktemp("chat-tokenizer")
    for path in tokenizer_dir_of(repo).iterdir():
        shutil.copy2(path, copy / path.name)
    config = json.loads((copy / "tokenizer_config.json").read_text())
    config["chat_template"] = CHAT_TEMPLATE
    (copy / "tokenizer_config.json").write_text(json.dumps(config))
    return copy


@pytest.fixture(scope="module")
def chat_endpoint(triton, chat_tokenizer_dir):
    """The same Triton server behind an endpoint whose tokenizer has a chat template."""
    with OpenAIServer(triton.grpc_url, chat_tokenizer_dir, MODEL, port=free_port()) as server:
        yield server


@pytest.fixture(scope="module")
def client(endpoint):
    return openai.OpenAI(base_url=endpoint.url, api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def chat_client(chat_endpoint):
    return openai.OpenAI(base_url=chat_endpoint.url, api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def prompts():
    return prompt_texts(6, 200)


def prompt_tokens(target, prompt: str) -> int:
    return len(target[1](prompt)["input_ids"])


def error_of(caught) -> dict:
    """The ``error`` object of an openai.APIStatusError's body."""
    body = caught.value.body
    return body.get("error", body) if isinstance(body, dict) else {}


# --- completions ----------------------------------------------------------------------------------


def test_models_lists_the_deployment(client):
    assert [model.id for model in client.models.list().data] == [MODEL]


def test_greedy_completion_equals_the_target_alone(client, target, prompts):
    reference = greedy_reference(target, prompts[0], NEW_TOKENS)
    response = client.completions.create(model=MODEL, prompt=prompts[0], max_tokens=NEW_TOKENS, temperature=0)
    assert response.object == "text_completion" and len(response.choices) == 1
    assert response.choices[0].text == decode(target, reference)
    assert response.choices[0].finish_reason == ("length" if len(reference) == NEW_TOKENS else "stop")
    assert response.usage.completion_tokens == len(reference)
    assert response.usage.prompt_tokens == prompt_tokens(target, prompts[0])
    assert response.usage.total_tokens == response.usage.prompt_tokens + response.usage.completion_tokens
    speculative = response.model_extra["speculative"]
    assert speculative["total_draft_tokens"] > 0 and 0 < speculative["num_target_calls"] < len(reference)
    assert speculative["acceptance_rate"] == pytest.approx(
        speculative["total_accepted_draft_tokens"] / speculative["total_draft_tokens"]
    )


def test_greedy_streamed_completion_equals_the_target_alone(client, target, prompts):
    reference = greedy_reference(target, prompts[1], NEW_TOKENS)
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt=prompts[1],
            max_tokens=NEW_TOKENS,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text_chunks = [chunk for chunk in chunks if chunk.choices]
    assert len(text_chunks) > 2  # streamed, several chunks
    assert "".join(chunk.choices[0].text for chunk in text_chunks) == decode(target, reference)
    assert [chunk.choices[0].finish_reason for chunk in text_chunks][:-1] == [None] * (len(text_chunks) - 1)
    assert text_chunks[-1].choices[0].finish_reason in ("length", "stop")
    assert text_chunks[-1].model_extra["speculative"]["total_draft_tokens"] > 0
    usage = chunks[-1].usage  # include_usage: a last chunk with no choices and the usage
    assert not chunks[-1].choices
    assert usage.completion_tokens == len(reference)
    assert usage.prompt_tokens == prompt_tokens(target, prompts[1])


def test_stream_without_include_usage_has_no_usage_chunk(client, prompts):
    chunks = list(client.completions.create(model=MODEL, prompt=prompts[2], max_tokens=8, temperature=0, stream=True))
    assert all(chunk.choices and chunk.usage is None for chunk in chunks)


def _stop_index(target, reference: list[int]) -> int:
    """A token of the reference whose text is one token on its own and appears once."""
    tokenizer = target[1]
    return next(
        i
        for i in range(3, len(reference))
        if tokenizer(decode(target, [reference[i]]), add_special_tokens=False)["input_ids"] == [reference[i]]
        and decode(target, [reference[i]]).strip()
        and decode(target, [reference[i]]) not in decode(target, reference[:i])
    )


@pytest.mark.parametrize("stream", [False, True])
def test_stop_ends_the_text_before_the_stop_string(client, target, prompts, stream):
    reference = greedy_reference(target, prompts[2], NEW_TOKENS)
    index = _stop_index(target, reference)
    stop = decode(target, [reference[index]])
    options = {"model": MODEL, "prompt": prompts[2], "max_tokens": NEW_TOKENS, "temperature": 0}
    if stream:
        chunks = list(client.completions.create(**options, stop=[stop, "never appears \u2603"], stream=True))
        text = "".join(chunk.choices[0].text for chunk in chunks)
        finish = chunks[-1].choices[0].finish_reason
    else:
        response = client.completions.create(**options, stop=stop)
        text, finish = response.choices[0].text, response.choices[0].finish_reason
    assert text == decode(target, reference[:index])  # OpenAI: the stop string is not part of the text
    assert finish == "stop"


def test_seeded_sampling_is_reproducible(client, prompts):
    def sample(seed: int) -> str:
        response = client.completions.create(model=MODEL, prompt=prompts[3], max_tokens=24, temperature=1.0, seed=seed)
        return response.choices[0].text

    first = sample(11)
    assert sample(11) == first
    assert any(sample(seed) != first for seed in (12, 13, 14))


def test_plain_decoding_extension_gives_the_same_text(client, target, prompts):
    response = client.completions.create(
        model=MODEL, prompt=prompts[0], max_tokens=NEW_TOKENS, temperature=0, extra_body={"num_draft_tokens": 0}
    )
    assert response.choices[0].text == decode(target, greedy_reference(target, prompts[0], NEW_TOKENS))
    assert response.model_extra["speculative"]["total_draft_tokens"] == 0


def test_concurrent_streams_each_get_their_own_text(client, target, prompts):
    expected = [decode(target, greedy_reference(target, prompt, 24)) for prompt in prompts[:4]]
    texts: list[str | None] = [None] * 4
    spans = [(0.0, 0.0)] * 4

    def one(index: int) -> None:
        stream = client.completions.create(
            model=MODEL, prompt=prompts[index], max_tokens=24, temperature=0, stream=True
        )
        parts, times = [], []
        for chunk in stream:
            parts.append(chunk.choices[0].text)
            times.append(time.monotonic())
        texts[index], spans[index] = "".join(parts), (times[0], times[-1])

    threads = [threading.Thread(target=one, args=(index,)) for index in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert texts == expected
    # Served together: most streams had their first chunk before any stream ended.
    assert sum(first < min(last for _, last in spans) for first, _ in spans) >= 2


# --- chat -----------------------------------------------------------------------------------------


def test_chat_without_a_chat_template_is_one_clear_400(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 400
    error = error_of(caught)
    assert error["code"] == "no_chat_template" and "no chat template" in error["message"]
    assert "/v1/completions" in error["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_greedy_chat_equals_the_target_on_the_templated_prompt(chat_client, chat_tokenizer_dir, target, stream):
    from transformers import AutoTokenizer

    messages = [
        {"role": "system", "content": "You write Python."},
        {"role": "user", "content": "def parse_args(argv):"},
    ]
    rendered = AutoTokenizer.from_pretrained(str(chat_tokenizer_dir)).apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    reference = greedy_reference(target, rendered, NEW_TOKENS)
    options = {"model": MODEL, "messages": messages, "temperature": 0}
    if stream:
        chunks = list(chat_client.chat.completions.create(**options, max_completion_tokens=NEW_TOKENS, stream=True))
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)
        assert chunks[-1].choices[0].finish_reason in ("length", "stop")
        assert chunks[-1].model_extra["speculative"]["num_target_calls"] > 0
    else:
        response = chat_client.chat.completions.create(**options, max_tokens=NEW_TOKENS)
        assert response.object == "chat.completion" and response.choices[0].message.role == "assistant"
        text = response.choices[0].message.content
        assert response.usage.prompt_tokens == prompt_tokens(target, rendered)
        assert response.usage.completion_tokens == len(reference)
    assert text == decode(target, reference)


def test_chat_without_max_tokens_fills_the_context(chat_client):
    response = chat_client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "import os\n"}], temperature=0, seed=1
    )
    assert response.choices[0].finish_reason in ("stop", "length")
    assert response.usage.total_tokens <= 1008  # the engine's max_seq_len


def test_a_stop_string_that_tokenizes_otherwise_ends_generation_streamed_or_not(client, target, prompts):
    """The ensemble's stop-word match is on tokens; "\n\n" arrives here as two tokens, so only the
    text match can end it: both ways the text stops there and only what was generated is billed."""
    prompt = prompts[5]
    reference = greedy_reference(target, prompt, 200)
    text = decode(target, reference)
    cut = text.find("\n\n")
    reached = next(n for n in range(1, len(reference) + 1) if "\n\n" in decode(target, reference[:n]))
    options = {"model": MODEL, "prompt": prompt, "max_tokens": 200, "temperature": 0, "stop": ["\n\n"]}
    response = client.completions.create(**options)
    assert response.choices[0].text == text[:cut] and response.choices[0].finish_reason == "stop"
    # Generated up to the iteration that produced the stop string: at most K + 1 tokens past it.
    assert reached <= response.usage.completion_tokens <= reached + 5
    assert response.model_extra["speculative"]["num_target_calls"] <= reached
    chunks = list(client.completions.create(**options, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text[:cut]
    assert chunks[-1].usage.completion_tokens <= reached + 5


@pytest.mark.parametrize("nested", [False, True])
def test_a_prompt_of_token_ids_answers_as_its_text(client, target, prompts, nested):
    ids = target[1](prompts[0])["input_ids"]
    options = {"model": MODEL, "max_tokens": 8, "temperature": 0}
    by_ids = client.completions.create(prompt=[ids] if nested else ids, **options)
    assert by_ids.choices[0].text == client.completions.create(prompt=prompts[0], **options).choices[0].text
    assert by_ids.usage.prompt_tokens == len(ids)
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(prompt=[5, 1_000_000], **options)
    assert error_of(caught)["param"] == "prompt" and "1000000" in error_of(caught)["message"]


def test_a_prompt_over_the_byte_limit_is_one_400(client):
    with pytest.raises(openai.BadRequestError) as caught:  # a 4xx: the SDK does not retry it
        client.completions.create(model=MODEL, prompt="x" * 100_000, max_tokens=4)
    error = error_of(caught)
    assert "the prompt is 100000 bytes, more than the engine's max_input_len" in error["message"]
    assert error["param"] == "prompt" and error["code"] == "context_length_exceeded"


@pytest.mark.parametrize("route", ["completions", "chat"])
def test_a_body_no_prompt_could_need_is_one_413_before_it_is_parsed(endpoint, client, route):
    backend = endpoint.app.state.backend
    assert backend.max_body_bytes is not None and backend.max_body_bytes < 8_000_000
    with pytest.raises(openai.APIStatusError) as caught:  # 413: not retried by the SDK
        if route == "completions":
            client.completions.create(model=MODEL, prompt="x = 1\n" * 1_400_000, max_tokens=4)
        else:
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x" * 8_000_000}])
    assert caught.value.status_code == 413
    error = error_of(caught)
    assert error["code"] == "request_too_large" and "shorten the prompt" in error["message"]
    assert f"max_input_len {backend.max_input_len} tokens" in error["message"]
    # the connection stays usable: the server read the body to its end before answering
    assert client.completions.create(model=MODEL, prompt="def f():", max_tokens=2).choices[0].text is not None


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_curl_without_a_content_type_is_read_as_json(endpoint, target, prompts):
    body = {"model": MODEL, "prompt": prompts[4], "max_tokens": 8, "temperature": 0}
    result = subprocess.run(  # curl -d labels the body application/x-www-form-urlencoded
        ["curl", "-sS", f"{endpoint.url}/completions", "-d", json.dumps(body)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["choices"][0]["text"] == decode(target, greedy_reference(target, prompts[4], 8))


# --- refused requests -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "param", "text"),
    [
        ({"n": 2}, "n", "send n=1"),
        ({"presence_penalty": 2.5}, "presence_penalty", "less than or equal to 2"),
        ({"logit_bias": {"10": 1.0}}, "logit_bias", "leave it out"),
        ({"logprobs": 2}, "logprobs", "not supported"),
        ({"extra_body": {"ignore_eos": True}}, "ignore_eos", "not supported"),
        ({"temperature": 3.0}, "temperature", "less than or equal to 2"),
        ({"max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
        # INT32 tensors: checked before any cast (2**32 + 8 used to wrap to 8)
        ({"max_tokens": 2**32 + 8}, "max_tokens", "less than or equal to 2147483647"),
        ({"extra_body": {"top_k": 2**32 + 5}}, "top_k", "less than or equal to 2147483647"),
        ({"extra_body": {"num_draft_tokens": 2**32 + 3}}, "num_draft_tokens", "less than or equal to 2147483647"),
        ({"max_tokens": 10**20}, "max_tokens", "less than or equal to 2147483647"),
        ({"stop": ["x"] * 33}, "stop", "at most 32 stop strings"),
        ({"stop": "y" * 1025}, "stop", "at most 1024 bytes"),
    ],
)
def test_unsupported_or_bad_parameters_are_refused_in_openai_shape(client, options, param, text):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(**{"model": MODEL, "prompt": "x = 1\n", "max_tokens": 4, **options})
    error = error_of(caught)
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert text in error["message"]


def test_100000_stop_strings_are_refused_at_once_and_delay_nobody(endpoint, client, target, prompts):
    body = json.dumps({"model": MODEL, "prompt": "x = 1\n", "max_tokens": 4, "stop": [f"s{i}" for i in range(100_000)]})
    request = urllib.request.Request(f"{endpoint.url}/completions", body.encode(), {"Content-Type": "application/json"})

    def refuse() -> float:
        started = time.perf_counter()
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=60)
        seconds = time.perf_counter() - started
        error = json.loads(caught.value.read())["error"]
        assert caught.value.code == 400 and error["param"] == "stop" and "at most 32" in error["message"]
        assert len(error["message"]) < 300  # the list is not echoed back
        return seconds

    expected = decode(target, greedy_reference(target, prompts[5], 64))

    def neighbour() -> float:
        started = time.perf_counter()
        response = client.completions.create(model=MODEL, prompt=prompts[5], max_tokens=64, temperature=0)
        assert response.choices[0].text == expected
        return time.perf_counter() - started

    neighbour()  # warm
    alone, beside, refusals = [], [], []
    for _ in range(5):  # interleaved
        alone.append(neighbour())
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            refused = pool.submit(refuse)
            beside.append(neighbour())
            refusals.append(refused.result())
    alone_s, beside_s = sorted(alone)[2], sorted(beside)[2]
    print(
        f"100,000 stop strings refused in {min(refusals) * 1000:.0f} ms (the 1.3 MB body's upload and parse "
        f"included); a greedy request beside them {beside_s:.3f} s, alone {alone_s:.3f} s (medians of 5)"
    )
    assert min(refusals) < 0.5
    assert beside_s - alone_s < 0.15  # room for a busy CI machine; the figure is printed


@pytest.mark.parametrize("where", ["prompt", "stop", "messages"])
def test_a_lone_surrogate_is_one_400_naming_where_it_is(endpoint, where):
    # JSON may escape a lone UTF-16 surrogate; it is no Unicode character: a 400, never a 500.
    body = {"model": MODEL, "max_tokens": 4, "prompt": "x = 1\n"}
    path = "completions"
    if where == "stop":
        body["stop"] = ["a\ud800"]
    elif where == "prompt":
        body["prompt"] = "a\ud800"
    else:
        path = "chat/completions"
        del body["prompt"]
        body["messages"] = [{"role": "user", "content": "a\ud800"}]
    raw = json.dumps(body).encode()  # ensure_ascii: the surrogate travels as the escape \ud800, as clients send it
    request = urllib.request.Request(f"{endpoint.url}/{path}", raw, {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=60)
    error = json.loads(caught.value.read())["error"]
    assert caught.value.code == 400, error
    assert "lone UTF-16 surrogate" in error["message"] and where in error["message"], error


def test_n_2_is_refused_for_chat_too(chat_client):
    with pytest.raises(openai.BadRequestError) as caught:
        chat_client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], n=2)
    assert error_of(caught)["param"] == "n" and "n=1" in error_of(caught)["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_the_ensemble_refuses_is_a_400_with_its_message(client, stream):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt="x = 1\n" * 200, max_tokens=4, stream=stream)
    assert "over the engine's max_input_len 512" in error_of(caught)["message"]
    again = client.completions.create(model=MODEL, prompt="def f():\n", max_tokens=4, temperature=0)  # greedy: no EOS
    assert again.usage.completion_tokens == 4


def test_an_unknown_model_is_a_404(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="gpt-4o", prompt="x", max_tokens=2)
    assert error_of(caught)["code"] == "model_not_found" and MODEL in error_of(caught)["message"]


# --- the wire: curl, cancellation -----------------------------------------------------------------


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_curl_gets_server_sent_events(endpoint, target, prompts):
    body = {"model": MODEL, "prompt": prompts[4], "max_tokens": 16, "temperature": 0, "stream": True}
    result = subprocess.run(
        ["curl", "-sSN", f"{endpoint.url}/completions", "-H", "Content-Type: application/json", "-d", json.dumps(body)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith("data: [DONE]\n\n")
    events = result.stdout.split("\n\n")[:-1]
    assert all(event.startswith("data: ") for event in events)
    chunks = [json.loads(event.removeprefix("data: ")) for event in events[:-1]]
    assert "".join(chunk["choices"][0]["text"] for chunk in chunks) == decode(
        target, greedy_reference(target, prompts[4], 16)
    )


def _metric(triton, prefix: str) -> float:
    with urllib.request.urlopen(triton.metrics_url, timeout=10) as response:
        lines = response.read().decode().splitlines()
    return sum(float(line.rpartition(" ")[2]) for line in lines if line.startswith(prefix))


def test_a_client_that_leaves_cancels_its_triton_request(client, triton, prompts):
    cancelled = 'trt_spec_loop_requests_total{model="spec_loop",outcome="cancelled"}'
    before = _metric(triton, cancelled)
    stream = client.completions.create(
        model=MODEL,
        prompt=prompts[5],
        max_tokens=900,
        temperature=0,
        stream=True,
        extra_body={"num_draft_tokens": 1},
    )
    next(iter(stream))
    stream.close()  # the HTTP connection closes mid-stream
    deadline = time.monotonic() + 30
    while _metric(triton, cancelled) <= before:
        assert time.monotonic() < deadline, "the loop model never saw the cancellation"
        time.sleep(0.1)
    again = client.completions.create(model=MODEL, prompt="def f():\n", max_tokens=4, temperature=0)  # greedy: no EOS
    assert again.usage.completion_tokens == 4


# --- the CLI --------------------------------------------------------------------------------------


def test_serve_with_openai_port_prints_the_address_and_stops_on_sigterm(repo):
    ports = [free_port() for _ in range(4)]
    while len(set(ports)) < 4:
        ports = [free_port() for _ in range(4)]
    grpc_port, http_port, metrics_port, openai_port = ports
    argv = [str(Path(sys.executable).parent / "trt-spec"), "serve", "--repo", str(repo)]
    argv += ["--grpc-port", str(grpc_port), "--http-port", str(http_port), "--metrics-port", str(metrics_port)]
    argv += ["--openai-port", str(openai_port)]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()  # blocks until ready (or the process ends)
        assert line.startswith("ready "), process.stderr.read() if process.poll() is not None else line
        url = f"http://127.0.0.1:{openai_port}/v1"
        assert f"openai={url}" in line.split()
        assert f"grpc=127.0.0.1:{grpc_port}" in line.split()
        model = Path(repo).name
        answer = openai.OpenAI(base_url=url, api_key="unused", max_retries=0).completions.create(
            model=model, prompt="def f():\n", max_tokens=3, temperature=0
        )
        assert answer.usage.completion_tokens == 3
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        assert time.monotonic() - started < 30
        assert "stopped" in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_serve_names_the_extra_when_the_endpoint_libraries_are_missing(tmp_path):
    code = (
        "import sys; sys.modules['fastapi'] = None\n"
        "from click.testing import CliRunner\n"
        "from trt_spec.cli import main\n"
        f"result = CliRunner().invoke(main, ['serve', '--repo', {str(tmp_path)!r}, '--openai-port', '9'])\n"
        "print(result.exit_code); print(result.output)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    exit_code, _, output = result.stdout.partition("\n")
    assert exit_code == "1"
    assert "pip install 'trt-spec[openai]'" in output and "fastapi" in output
    assert re.search(r"--openai-port needs", output)


# --- the Kubernetes OpenAI sidecar, as `trt-spec k8s --openai` writes it ---------------------------


def test_the_kubernetes_openai_sidecar_serves_as_written(triton, repo, target, prompts):
    """The sidecar `trt-spec k8s --openai` puts beside NVIDIA's Triton image runs its manifest's own
    command (``python3 -c ...``) here, with only the pod's paths and ports mapped to this machine's:
    it answers the openai SDK with the target's greedy text."""
    from trt_spec.deploy import manifests
    from trt_spec.plan import make_plan
    from trt_spec.serving.server import DEFAULT_PORTS

    spec = load_spec(EXAMPLES / "pystdlib-demo.yaml")
    spec = spec.model_copy(update={"triton": spec.triton.model_copy(update={"flavor": "tensorrtllm"})})
    options = manifests.DeployOptions(openai=True)
    deployment = manifests.build(make_plan(spec), options)
    pod = next(obj for obj in deployment.objects if obj["kind"] == "Deployment")["spec"]["template"]["spec"]
    sidecar = next(container for container in pod["containers"] if container["name"] == "openai")
    assert sidecar["command"][:2] == ["python3", "-c"]
    code, port = sidecar["command"][2], free_port()
    mapping = {
        f"'{options.mount_path}/model_repo/": f"'{repo}/",  # the volume, as mounted in the pod
        f"'127.0.0.1:{DEFAULT_PORTS['grpc']}'": f"'{triton.grpc_url}'",  # the pod's own Triton
        f"port={manifests.OPENAI_PORT}": f"port={port}",
        "host='0.0.0.0'": "host='127.0.0.1'",
    }
    for pod_value, here in mapping.items():
        assert code.count(pod_value) == 1, (pod_value, code)  # the command still has the shape mapped here
        code = code.replace(pod_value, here)
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}/v1"
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, process.stdout.read().decode() if process.stdout else ""
            try:
                with urllib.request.urlopen(f"{url}/models", timeout=2):
                    break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, "the sidecar did not answer within 120 s"
                time.sleep(0.5)
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=300)
        assert [model.id for model in client.models.list().data] == [spec.name]
        reference = greedy_reference(target, prompts[2], NEW_TOKENS)
        response = client.completions.create(model=spec.name, prompt=prompts[2], max_tokens=NEW_TOKENS, temperature=0)
        assert response.choices[0].text == decode(target, reference)
    finally:
        process.terminate()
        process.wait(timeout=30)
