"""Serving under floods and hostile input, against the real CPU Triton on the demo repository
(bounded, loopback only): 32 concurrent greedy streams each equal to its lone run, an 8 MB prompt
refused at once without delaying anyone, non-streaming and streaming cancellation, values the
engines could not compute safely refused by name, and no error-level log line on normal traffic.
The crash-and-recover cycle is ``test_supervision.py``'s."""

from __future__ import annotations

import queue
import re
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import EXAMPLES, decode, greedy_reference

from trt_spec.bench.prompts import prompt_texts
from trt_spec.client import SpecClient
from trt_spec.errors import GenerationError
from trt_spec.repository.writer import write_repository
from trt_spec.serving.server import TritonServer
from trt_spec.spec import load_spec

grpcclient = pytest.importorskip("tritonclient.grpc", reason="needs tritonclient[grpc]")
pytest.importorskip("pytriton", reason="the CPU Triton server comes with nvidia-pytriton")

NEW_TOKENS = 24
CANCELLED = 'trt_spec_loop_requests_total{model="spec_loop",outcome="cancelled"}'
OUTPUT_TOKENS = 'trt_spec_loop_output_tokens_total{model="spec_loop"}'


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("reliability")
    result = write_repository(load_spec(EXAMPLES / "pystdlib-demo.yaml"), root / "repo", "torch")
    with TritonServer(result.path, ready_timeout_s=300, log_file=root / "triton.log") as running:
        running.ready_log_size = running.log_path.stat().st_size  # what startup wrote
        yield running


def generate(server, prompt: str, **options) -> str:
    with SpecClient(server.grpc_url) as client:
        return "".join(event.text for event in client.generate(prompt, max_tokens=NEW_TOKENS, **options))


def metric(server, name: str) -> float:
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def _input(name: str, array: np.ndarray):
    tensor = grpcclient.InferInput(name, list(array.shape), "BYTES" if array.dtype == object else "INT32")
    tensor.set_data_from_numpy(array)
    return tensor


def test_a_flood_of_32_streams_each_equals_its_lone_run(server, target):
    prompts = prompt_texts(8, 200)
    expected = {prompt: decode(target, greedy_reference(target, prompt, NEW_TOKENS)) for prompt in prompts}
    requests = [prompts[index % len(prompts)] for index in range(32)]
    with ThreadPoolExecutor(32) as pool:
        texts = list(pool.map(lambda prompt: generate(server, prompt), requests))
    differ = [index for index, (prompt, text) in enumerate(zip(requests, texts)) if text != expected[prompt]]
    assert differ == [], f"{len(differ)}/32 streams differ from their lone run"


def _refusal_beside_a_greedy_request(server, target, hostile: list) -> tuple[float, str, float, float]:
    """Send the ``hostile`` inputs to the ensemble beside a greedy request, 5 times interleaved with
    the greedy request alone: (fastest refusal s, its message, median beside s, median alone s)."""
    prompt = prompt_texts(1, 200)[0]
    expected = decode(target, greedy_reference(target, prompt, NEW_TOKENS))
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((error, time.perf_counter())))

    def send_hostile() -> tuple[float, str]:
        begun = time.perf_counter()
        client.async_stream_infer("ensemble", hostile)
        error, answered = answers.get(timeout=60)
        return answered - begun, "" if error is None else error.message()

    def timed() -> float:
        started = time.perf_counter()
        assert generate(server, prompt) == expected
        return time.perf_counter() - started

    generate(server, prompt)  # warm
    alone, beside, refusals = [], [], []
    for _ in range(5):  # interleaved: a drift of the shared machine hits both alike
        alone.append(timed())
        with ThreadPoolExecutor(1) as pool:
            refused = pool.submit(send_hostile)
            beside.append(timed())
            refusals.append(refused.result())
    client.stop_stream()
    client.close()
    seconds, message = min(refusals)
    return seconds, message, sorted(beside)[2], sorted(alone)[2]


def test_an_8_mb_prompt_is_refused_at_once_and_delays_nobody(server, target):
    huge = ("x = 1\n" * (8 * 1024 * 1024 // 6)).encode()
    hostile = [
        _input("text_input", np.array([[huge]], dtype=object)),
        _input("max_tokens", np.array([[8]], dtype=np.int32)),
    ]
    seconds, message, beside_s, alone_s = _refusal_beside_a_greedy_request(server, target, hostile)
    assert "text_input is" in message and "bytes" in message and "shorten the prompt" in message, message
    print(
        f"8 MB prompt refused in {seconds * 1000:.0f} ms (client side, the transfer included); a greedy request "
        f"beside it {beside_s:.3f} s, alone {alone_s:.3f} s (medians of 5)"
    )
    assert seconds < 0.1  # the figure: refused in under 100 ms
    # What is left is the 8 MB's own copy through gRPC and Triton competing for 2 cores (16-60 ms
    # measured across runs); queueing behind its tokenization cost 25 s before admission refused it.
    assert beside_s - alone_s < 0.1


def test_100000_bad_words_are_refused_at_once_and_delay_nobody(server, target):
    words = np.array([[f"w{i}".encode() for i in range(100_000)]], dtype=object)
    hostile = [
        _input("text_input", np.array([[b"def f():"]], dtype=object)),
        _input("max_tokens", np.array([[8]], dtype=np.int32)),
        _input("bad_words", words),
    ]
    seconds, message, beside_s, alone_s = _refusal_beside_a_greedy_request(server, target, hostile)
    assert "bad_words has 100000 entries; at most 256" in message, message
    print(
        f"100,000 bad words refused in {seconds * 1000:.0f} ms; a greedy request beside them {beside_s:.3f} s, "
        f"alone {alone_s:.3f} s (medians of 5; before the bound: 7.2 s, and 5-7 s for everyone else)"
    )
    # 53 ms and +59 ms measured on the 2-core VM, most of it the 100,000 strings' (de)serialization
    # in the client, Triton and the stub; the bounds leave room for a busy CI machine.
    assert seconds < 0.25
    assert beside_s - alone_s < 0.15


def test_cancelling_a_non_streaming_request_stops_it(server):
    # Nothing streams back to carry the cancellation: the loop's probes do (tensors.py).
    before_cancelled, before_tokens = metric(server, CANCELLED), metric(server, OUTPUT_TOKENS)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: None)
    inputs = [
        _input("text_input", np.array([[b"def f(x):"]], dtype=object)),
        _input("max_tokens", np.array([[900]], dtype=np.int32)),
    ]
    client.async_stream_infer("ensemble", inputs)
    time.sleep(0.8)
    client.stop_stream(cancel_requests=True)
    client.close()
    deadline = time.monotonic() + 20
    while metric(server, CANCELLED) <= before_cancelled:
        assert time.monotonic() < deadline, "the loop model never saw the cancellation"
        time.sleep(0.2)
    assert metric(server, OUTPUT_TOKENS) - before_tokens < 900  # stopped early, not run to max_tokens


def test_cancelling_a_streaming_request_stops_it(server):
    before = metric(server, CANCELLED)
    with SpecClient(server.grpc_url) as client:
        stream = client.generate("def f(x):", max_tokens=900)
        next(stream)
        stream.close()
    deadline = time.monotonic() + 20
    while metric(server, CANCELLED) <= before:
        assert time.monotonic() < deadline, "the loop model never saw the cancellation"
        time.sleep(0.2)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"temperature": 1e-45, "top_k": 5}, None),  # scaled as TensorRT-LLM does: finite, near-greedy
        ({"repetition_penalty": 1e-30}, "repetition_penalty must be between 0.01 and 100"),
        ({"presence_penalty": 1e30}, "presence_penalty must be between -100 and 100"),
        ({"temperature": float("nan"), "top_k": 5}, "temperature must be a finite number"),
    ],
)
def test_sampling_values_are_computed_safely_or_refused_by_name(server, options, message):
    if message is None:
        assert generate(server, "def f(x):", **options)
    else:
        with pytest.raises(GenerationError, match=message):
            generate(server, "def f(x):", **options)


def test_invalid_utf8_in_stop_words_is_reported_as_stop_words(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(error))
    inputs = [
        _input("text_input", np.array([[b"def f(x):"]], dtype=object)),
        _input("max_tokens", np.array([[4]], dtype=np.int32)),
        _input("stop_words", np.array([[b"\xff\xfe"]], dtype=object)),
    ]
    client.async_stream_infer("ensemble", inputs)
    error = answers.get(timeout=60)
    client.stop_stream()
    client.close()
    assert error is not None and "stop_words is not valid UTF-8" in error.message(), error


def test_normal_traffic_logs_no_error_lines(server):
    # After the tests above (floods, refusals, cancellations): Triton's error lines start with "E".
    generate(server, "import os\n")
    lines = server.log_path.read_text(errors="replace")[server.ready_log_size :].splitlines()
    errors = [line for line in lines if re.match(r"E\d{4} ", line)]
    assert errors == [], errors[:5]
