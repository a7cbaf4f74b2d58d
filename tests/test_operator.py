"""What an operator needs of `trt-spec serve`, against the real CPU Triton server (demo pair,
torch flavor, loopback only): a flood of idle connections to the OpenAI port under a
1,024-descriptor limit takes nothing down (the supervisor reads /proc in the same process;
uvicorn alone never closes a connection that sends no request); nothing outlives `serve`, however
it dies (SIGKILL, a second SIGTERM during the stop); a start on a taken port is refused at once,
naming the process that holds it."""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import EXAMPLES, QUICK_MODELS, decode, greedy_reference, port_free, quick_repository

from trt_spec.bench.prompts import prompt_texts
from trt_spec.client import SpecClient
from trt_spec.repository.writer import write_repository
from trt_spec.runtime import tensors as T
from trt_spec.runtime.draining import (
    DRAIN_FILE_ENV,
    LOOP_CALL_PARAMETER,
    LOOP_TOKEN_ENV,
    DrainGate,
    loop_call_parameters,
)
from trt_spec.serving.connections import RESERVED_DESCRIPTORS, connection_cap
from trt_spec.serving.server import _process_state, _process_table, free_port, python_stubs
from trt_spec.spec import load_spec

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("pytriton") is None or importlib.util.find_spec("uvicorn") is None,
    reason="needs the CPU Triton server (nvidia-pytriton) and the openai extra",
)
TRT_SPEC = str(Path(sys.executable).parent / "trt-spec")
DESCRIPTOR_LIMIT = 1024
NEW_TOKENS = 16


def _limit_descriptors() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (DESCRIPTOR_LIMIT, DESCRIPTOR_LIMIT))


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    """`trt-spec serve` with an OpenAI port, started under a 1,024-descriptor limit (as `prlimit
    --nofile=1024:1024` would)."""
    root = tmp_path_factory.mktemp("operator")
    repo = write_repository(load_spec(EXAMPLES / "pystdlib-demo.yaml"), root / "repo", "torch").path
    ports = {name: free_port() for name in ("http", "grpc", "metrics", "openai")}
    argv = [TRT_SPEC, "serve", "--repo", str(repo), "--log-file", str(root / "triton.log"), "--openai-model-name=m"]
    argv += [f"--{name}-port={port}" for name, port in ports.items()]
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=open(root / "serve.err", "w"), text=True, preexec_fn=_limit_descriptors
    )
    deadline = time.monotonic() + 300
    line = ""
    while not line.startswith("ready"):
        line = process.stdout.readline()
        assert line or process.poll() is None, (root / "serve.err").read_text()
        assert time.monotonic() < deadline, "serve was not ready in 300 s"
    yield process, ports, root
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=30)


def _completion(port: int, prompt: str) -> str:
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())["choices"][0]["text"]


def test_the_connection_cap_leaves_descriptors_for_the_rest():
    assert connection_cap(DESCRIPTOR_LIMIT) == DESCRIPTOR_LIMIT - RESERVED_DESCRIPTORS
    assert connection_cap(100) == 16  # never below a usable few


def test_the_drain_gate_admits_only_the_loops_calls_once_the_drain_file_exists(tmp_path):
    flag = tmp_path / "draining"
    environ = {DRAIN_FILE_ENV: str(flag), LOOP_TOKEN_ENV: "secret"}
    gate = DrainGate(T.TARGET, environ)
    loop_call = json.dumps(loop_call_parameters(environ))
    assert loop_call_parameters(environ) == {LOOP_CALL_PARAMETER: "secret"}
    assert not gate.draining()
    flag.touch()
    assert gate.draining()
    assert gate.admits(loop_call)
    forged = json.dumps({LOOP_CALL_PARAMETER: "guess"})
    assert not any(gate.admits(text) for text in ("", "{}", forged, "not json", '["x"]'))
    assert gate.refusal().startswith(f"{T.TARGET}: the server is draining")
    # Served by anything but serve: nothing to refuse, and the loop sends no parameter.
    assert not DrainGate(T.TARGET, {}).draining() and DrainGate(T.TARGET, {}).admits("")
    assert loop_call_parameters({}) == {}


def test_1100_idle_connections_under_a_1024_descriptor_limit_take_nothing_down(serve, target):
    process, ports, root = serve
    prompt = prompt_texts(1, 120)[0]
    expected = decode(target, greedy_reference(target, prompt, NEW_TOKENS))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1400:
        pytest.skip(f"this test process may open only {hard} descriptors")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1400), hard))
    flood = []
    try:
        for _ in range(1100):
            flood.append(socket.create_connection(("127.0.0.1", ports["openai"]), timeout=5))
        time.sleep(2.0)  # four supervision rounds while the flood holds its connections
        assert process.poll() is None, (root / "serve.err").read_text()
        started = time.perf_counter()
        assert _completion(ports["openai"], prompt) == expected  # a fresh OpenAI client
        fresh_s = time.perf_counter() - started
        with SpecClient(f"127.0.0.1:{ports['grpc']}") as client:
            assert "".join(e.text for e in client.generate(prompt, max_tokens=NEW_TOKENS, temperature=0)) == expected
        # Most of the flood was closed by the server (the cap) or by the first-request timeout.
        time.sleep(6.0)
        closed = 0
        for sock in flood:
            sock.setblocking(False)
            try:
                closed += sock.recv(1) == b""
            except BlockingIOError:
                pass
            except OSError:
                closed += 1
        print(
            f"1100 idle connections: serve up, a fresh OpenAI request took {fresh_s:.2f} s; {closed} closed by the server"
        )
        assert closed == len(flood)  # none sent a request within the keep-alive timeout
    finally:
        for sock in flood:
            sock.close()
    assert process.poll() is None
    assert "Too many open files" not in (root / "serve.err").read_text()


def test_the_openai_endpoint_answers_within_a_second_of_a_server_restart(serve, target):
    # Killing the loop's stub makes the supervisor restart Triton (a decoupled model); the
    # endpoint's gRPC channel must come back with it.
    process, ports, root = serve
    prompt = prompt_texts(1, 120)[0]
    expected = decode(target, greedy_reference(target, prompt, NEW_TOKENS))
    [loop] = [stub.pid for stub in python_stubs(process.pid).values() if stub.model == T.LOOP]

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ports['http']}/v2/health/ready", timeout=1):
                return True
        except OSError:  # a 400 while loading, nothing while restarting
            return False

    killed = time.monotonic()
    os.kill(loop, signal.SIGKILL)
    while ready() and time.monotonic() - killed < 30:  # until the supervisor takes the server down
        time.sleep(0.02)
    while not ready() and time.monotonic() - killed < 120:
        time.sleep(0.05)
    ready_at, answered_at = time.monotonic(), None
    while answered_at is None and time.monotonic() - ready_at < 30:
        try:
            assert _completion(ports["openai"], prompt) == expected
            answered_at = time.monotonic()
        except urllib.error.HTTPError as exc:
            assert exc.code == 503, exc.read()  # Triton not reachable yet
            time.sleep(0.05)
    assert answered_at is not None, (root / "serve.err").read_text()
    print(
        f"loop killed: Triton ready again {ready_at - killed:.1f} s later, the OpenAI endpoint answered "
        f"{answered_at - ready_at:.2f} s after that"
    )
    assert answered_at - ready_at < 1.5


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "m", "prompt": "a\\ud800", "max_tokens": 4}',  # a lone surrogate, as JSON escapes it
        b'{"model": "m", "prompt": "x", "max_tokens": 4294967304}',  # 2^32 + 8
        b'{"model": "m", "prompt": "x", "max_tokens": 100000000000000000000}',  # 10^20
    ],
)
def test_bad_values_are_one_400_and_nothing_on_stderr(serve, raw):
    process, ports, root = serve
    before = (root / "serve.err").read_text()
    request = urllib.request.Request(
        f"http://127.0.0.1:{ports['openai']}/v1/completions", raw, {"Content-Type": "application/json"}
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=30)
    assert caught.value.code == 400
    assert json.loads(caught.value.read())["error"]["type"] == "invalid_request_error"
    assert (root / "serve.err").read_text() == before  # no traceback, no log line


def _direct_engine_call(grpc_port: int, prompt: list[int]) -> str:
    """A client's own call to the target engine model (as TensorRT-LLM's inflight_batcher_llm
    client makes one): its output ids, or its error."""
    import numpy as np
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    arrays = {
        "input_ids": np.array([prompt], dtype=np.int32),
        "input_lengths": np.array([[len(prompt)]], dtype=np.int32),
        "request_output_len": np.array([[4]], dtype=np.int32),
    }
    inputs = []
    for name, array in arrays.items():
        inputs.append(grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype)))
        inputs[-1].set_data_from_numpy(array)
    with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:
        try:
            return f"served: {client.infer(T.TARGET, inputs).as_numpy('output_ids').tolist()}"
        except grpcclient.InferenceServerException as exc:
            return f"refused: {exc.status()} {exc.message()}"


def test_sigterm_drains_six_streams_in_flight_then_stops(serve, target):
    # The last use of the module's server: SIGTERM ends it.
    process, ports, root = serve
    prompts = prompt_texts(6, 120)
    expected = [decode(target, greedy_reference(target, prompt, 120)) for prompt in prompts]
    assert _direct_engine_call(ports["grpc"], [1, 2, 3]).startswith("served")  # before the drain: served
    texts: list[str | None] = [None] * 6
    first_tokens = threading.Barrier(7)

    def stream(index: int) -> None:
        pieces = []
        with SpecClient(f"127.0.0.1:{ports['grpc']}") as client:
            for number, event in enumerate(client.generate(prompts[index], max_tokens=120, temperature=0)):
                pieces.append(event.text)
                if number == 0:
                    first_tokens.wait(timeout=60)
        texts[index] = "".join(pieces)

    threads = [threading.Thread(target=stream, args=(index,)) for index in range(6)]
    for thread in threads:
        thread.start()
    first_tokens.wait(timeout=60)  # all six are streaming
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    not_ready_s = None
    while not_ready_s is None and time.monotonic() - signalled < 5:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{ports['http']}/v2/health/ready", timeout=1)
        except urllib.error.HTTPError:
            not_ready_s = time.monotonic() - signalled
        except OSError:
            break
        time.sleep(0.05)
    refused = None
    try:  # a new request while draining
        with SpecClient(f"127.0.0.1:{ports['grpc']}") as client:
            list(client.generate("def f():", max_tokens=4))
    except Exception as exc:  # noqa: BLE001 - any refusal will do; it is printed
        refused = f"{type(exc).__name__}: {str(exc)[:100]}"
    # A client's direct call to an engine model: refused, while the loop's calls for the six streams go on.
    direct = _direct_engine_call(ports["grpc"], [1, 2, 3])
    in_flight = sum(thread.is_alive() for thread in threads)
    for thread in threads:
        thread.join(timeout=60)
    streams_done_s = time.monotonic() - signalled
    assert process.wait(timeout=25 + 5) == 0
    exited_s = time.monotonic() - signalled
    print(
        f"SIGTERM with 6 streams in flight: not ready after {not_ready_s:.2f} s, a new request refused "
        f"({refused}), the 6 streams done {streams_done_s:.1f} s and serve gone {exited_s:.1f} s after the signal; "
        f"a direct {T.TARGET} call with {in_flight} streams in flight: {direct}"
    )
    assert texts == expected  # all six complete, each the target's greedy text
    assert in_flight > 0, "the streams ended before the direct call: it proves nothing"
    assert direct.startswith("refused: StatusCode.UNAVAILABLE"), direct
    assert f"{T.TARGET}: the server is draining (shutting down): new requests are refused" in direct
    assert not_ready_s is not None and not_ready_s < 1.0
    assert refused is not None
    assert "draining" in (root / "serve.err").read_text()


# --- nothing outlives serve ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def quick_repo(tmp_path_factory) -> Path:
    return quick_repository(tmp_path_factory.mktemp("operator_quick"))


_STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_serve_left_behind():
    """A test that fails half-way still ends the `serve` it started (SIGKILL: its reaper then takes
    Triton down), so a failure never leaves a server running beside the rest of the suite."""
    yield
    while _STARTED:
        process = _STARTED.pop()
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


def _start(repo: Path, ports: dict[str, int], **popen) -> subprocess.Popen:
    argv = [TRT_SPEC, "serve", "--repo", str(repo), "--ready-timeout", "120"]
    argv += [f"--{name}-port={port}" for name, port in ports.items()]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    _STARTED.append(process)
    line = process.stdout.readline()
    assert line.startswith("ready"), process.stderr.read() if process.poll() is not None else line
    return process


def _descendants(pid: int) -> set[int]:
    parents = {child: parent for child, (parent, state) in _process_table().items() if state not in "ZX"}
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pids: set[int]) -> set[int]:
    return {pid for pid in pids if _process_state(pid) not in ("", "Z", "X")}


def _assert_nothing_left(tree: set[int], regions: set[str], ports: dict[str, int], within_s: float = 5.0):
    deadline = time.monotonic() + within_s
    while _alive(tree) and time.monotonic() < deadline:
        time.sleep(0.05)
    gone_s = within_s - (deadline - time.monotonic())
    assert not _alive(tree), f"left running: {sorted(_alive(tree))}"
    assert regions and not {p.name for p in Path("/dev/shm").iterdir()} & regions
    assert all(port_free(port) for port in ports.values())
    return gone_s


def test_sigkill_of_serve_leaves_no_process_shared_memory_or_port(quick_repo):
    ports = {name: free_port() for name in ("http", "grpc", "metrics")}
    process = _start(quick_repo, ports)
    tree = _descendants(process.pid)
    stubs = python_stubs(process.pid)
    regions = {stub.region for stub in stubs.values()}
    assert {stub.model for stub in stubs.values()} == set(QUICK_MODELS) and len(regions) == len(stubs)
    process.kill()  # as the OOM killer would
    process.wait()
    gone_s = _assert_nothing_left(tree, regions, ports)
    print(f"SIGKILL of serve: its {len(tree)} processes gone {gone_s:.2f} s later, shared memory and ports free")


def test_a_second_sigterm_during_the_stop_is_a_bounded_hard_stop(quick_repo):
    ports = {name: free_port() for name in ("http", "grpc", "metrics")}
    process = _start(quick_repo, ports)
    tree = _descendants(process.pid)
    regions = {stub.region for stub in python_stubs(process.pid).values()}
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    time.sleep(0.3)  # the first stop is under way
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=10) == 1
    stopped_s = time.monotonic() - started
    assert "stopped hard" in process.stderr.read()
    _assert_nothing_left(tree, regions, ports, within_s=1.0)
    print(f"double SIGTERM: serve exited 1 after {stopped_s:.2f} s, nothing left")


def test_a_start_on_a_taken_port_is_refused_at_once_naming_the_holder(quick_repo, tmp_path):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    try:
        started = time.monotonic()
        result = subprocess.run(
            [TRT_SPEC, "serve", "--repo", str(quick_repo), f"--http-port={taken}"]
            + [f"--{name}-port={free_port()}" for name in ("grpc", "metrics")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        seconds = time.monotonic() - started
    finally:
        holder.close()
    assert result.returncode == 1 and not result.stdout.startswith("ready")
    assert f"port {taken} on 127.0.0.1 is taken by pid {os.getpid()}" in result.stderr, result.stderr
    assert "--http-port" in result.stderr
    assert seconds < 10, seconds
