"""Against the real Triton server (the CPU build bundled in nvidia-pytriton): the repository's
preprocessing and postprocessing models, bad requests, and `trt-spec serve` start and stop."""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import broken_repo, port_free

from trt_spec.repository.writer import write_repository
from trt_spec.runtime import tensors as T
from trt_spec.serving.server import TritonServer, free_port
from trt_spec.spec import load_spec

pytest.importorskip("pytriton", reason="the CPU Triton server comes with nvidia-pytriton")
grpcclient = pytest.importorskip("tritonclient.grpc")

ROOT = Path(__file__).resolve().parents[1]
SERVED = (T.PREPROCESSING, T.POSTPROCESSING)
TRT_SPEC = str(Path(sys.executable).parent / "trt-spec")  # the installed console script


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """The writer's real output, minus the models that need part B's sources or a GPU."""
    root = tmp_path_factory.mktemp("triton")
    cwd = os.getcwd()
    os.chdir(root)
    try:
        write_repository(load_spec(ROOT / "examples" / "pystdlib-demo.yaml"), root / "repo", "tensorrtllm")
    finally:
        os.chdir(cwd)
    for model in T.MODEL_NAMES:
        if model not in SERVED:
            shutil.rmtree(root / "repo" / model)
    return root / "repo"


@pytest.fixture(scope="module")
def server(repo):
    with TritonServer(repo, ready_timeout_s=120) as running:
        yield running


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(ROOT / "examples" / "pystdlib-pair" / "target"))


def _input(name: str, array: np.ndarray):
    datatype = "BYTES" if array.dtype == object else grpcclient.np_to_triton_dtype(array.dtype)
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def _preprocess(client, text: str, **params):
    inputs = [_input("text_input", np.array([[text.encode()]], dtype=object))]
    for name, array in params.items():
        inputs.append(_input(name, array))
    return client.infer(T.PREPROCESSING, inputs)


def test_preprocessing_on_the_real_server(server, tokenizer):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    result = _preprocess(client, "import os\n", max_tokens=np.array([[16]], dtype=np.int32))
    assert result.as_numpy("input_ids").tolist() == [tokenizer("import os\n")["input_ids"]]
    assert result.as_numpy("num_draft_tokens").tolist() == [[4]]  # the demo spec's K


@pytest.mark.parametrize(
    ("text", "params", "message"),
    [
        ("x", {"max_tokens": np.array([[0]], dtype=np.int32)}, "max_tokens must be >= 1; got 0"),
        (
            "x",
            {"max_tokens": np.array([[4]], dtype=np.int32), "num_draft_tokens": np.array([[9]], dtype=np.int32)},
            "max_draft_len 4; got 9",
        ),
        ("", {"max_tokens": np.array([[4]], dtype=np.int32)}, "text_input is empty"),
        ("x = 1\n" * 200, {"max_tokens": np.array([[4]], dtype=np.int32)}, "over the engine's max_input_len 512"),
        ("x", {"max_tokens": np.array([[4.0]], dtype=np.float32)}, "max_tokens"),  # wrong dtype: Triton's check
    ],
)
def test_bad_request_gets_one_clear_error_and_the_server_keeps_serving(server, text, params, message):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(grpcclient.InferenceServerException) as caught:
        _preprocess(client, text, **params)
    assert message in caught.value.message()
    assert "Traceback" not in caught.value.message()
    ok = _preprocess(client, "def f():", max_tokens=np.array([[4]], dtype=np.int32))
    assert ok.as_numpy("input_lengths")[0, 0] > 0
    assert client.is_server_live() and client.is_model_ready(T.PREPROCESSING)


def test_streamed_detokenization_on_the_real_server(server, tokenizer):
    # Postprocessing is decoupled (the loop's probes get no response): a stream, one request at a time.
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    text = "print('你好, wörld 🎉')\n"
    ids = tokenizer(text)["input_ids"]
    deltas, sent = [], 0
    for cut in range(1, len(ids) + 1):  # one token per response, as a streaming loop sends them
        start = T.window_start(sent)
        window = np.array([ids[start:cut]], dtype=np.int32)
        client.async_stream_infer(
            T.POSTPROCESSING,
            [
                _input("output_ids", window),
                _input("num_context_tokens", np.array([[sent - start]], dtype=np.int32)),
                _input("is_final", np.array([[cut == len(ids)]], dtype=bool)),
            ],
        )
        result, error = answers.get(timeout=30)
        assert error is None, error
        deltas.append(result.as_numpy("text_output")[0].decode("utf-8"))  # 1-D, as TensorRT-LLM's postprocessing
        sent = cut
    client.stop_stream()
    assert "".join(deltas) == text
    assert "" in deltas  # some responses held back half a character


def _processes_serving(repo: Path, grpc_port: int | None = None) -> list[int]:
    """tritonserver processes on ``repo`` (and ``grpc_port``), found by their command line."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            port_matches = grpc_port is None or f"--grpc-port={grpc_port} " in cmdline + " "
            if f"--model-repository={repo.resolve()}" in cmdline and port_matches:
                pids.append(int(entry.name))
    return pids


def test_serve_reports_ready_and_stops_on_sigterm(repo):
    ports = {"grpc": free_port(), "http": free_port(), "metrics": free_port()}
    command = [
        TRT_SPEC,
        "serve",
        "--repo",
        str(repo),
        "--grpc-port",
        str(ports["grpc"]),
        "--http-port",
        str(ports["http"]),
        "--metrics-port",
        str(ports["metrics"]),
        "--ready-timeout",
        "120",
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert line.startswith("ready "), (line, process.stderr.read() if process.poll() is not None else "")
        assert f"grpc=127.0.0.1:{ports['grpc']}" in line and f"http=127.0.0.1:{ports['http']}" in line
        assert f"127.0.0.1:{ports['metrics']}/metrics" in line
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{ports['grpc']}")
        assert client.is_server_ready()
        assert _processes_serving(repo, ports["grpc"])
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    deadline = time.monotonic() + 10
    while _processes_serving(repo, ports["grpc"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _processes_serving(repo, ports["grpc"]) == []
    assert all(port_free(port) for port in ports.values())


def test_serve_reports_a_failed_load(tmp_path):
    broken_repo(tmp_path / "repo")
    result = subprocess.run(
        [
            TRT_SPEC,
            "serve",
            "--repo",
            str(tmp_path / "repo"),
            "--grpc-port",
            str(free_port()),
            "--http-port",
            str(free_port()),
            "--metrics-port",
            str(free_port()),
            "--ready-timeout",
            "60",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert "ready" not in result.stdout
    assert "boom at load" in result.stderr or "broken" in result.stderr
    assert _processes_serving(tmp_path / "repo") == []


def test_bls_roundtrip_script_measures_the_transport():
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "bls_roundtrip.py"),
            "--calls",
            "30",
            "--work-ms",
            "0",
            "--work-ms",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("callee work")]
    assert [line.split("ms:")[0].split()[-1] for line in lines] == ["0.0", "2.0"]
    for line in lines:
        median = float(line.split("transport median ")[1].split(" ms")[0])
        assert 0 < median < 100  # transport only: the callee's 2 ms of work is subtracted
