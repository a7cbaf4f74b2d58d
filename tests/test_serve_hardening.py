"""`trt-spec serve`'s operating defaults: the options it gives Triton (explicit model control,
restricted APIs, its own shared-memory prefix, a short exit timeout), --allow-client-apis,
--log-file and the default log kept beside the repository, a failed start that names a log that
exists, and a stop that takes a few seconds and leaves nothing in /dev/shm. Against the real CPU
Triton server on a repository of the two quick models (preprocessing, postprocessing)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import QUICK_MODELS, broken_repo, http_status, quick_repository, stub_alive

from trt_spec.cli import main
from trt_spec.errors import ServerError
from trt_spec.serving.serve import default_log_file
from trt_spec.serving.server import (
    ADMIN_HEADER,
    RESTRICTABLE_APIS,
    TritonServer,
    free_port,
    parse_client_apis,
    python_stubs,
    restriction_args,
    server_command,
)

TRT_SPEC = str(Path(sys.executable).parent / "trt-spec")  # the installed console script
QUICK = QUICK_MODELS
needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("pytriton") is None, reason="the CPU Triton server comes with nvidia-pytriton"
)

# --- no server ------------------------------------------------------------------------------------


def test_client_apis_parse_and_refuse_unknown_names():
    assert parse_client_apis("none") == () and parse_client_apis("") == ()
    assert parse_client_apis("all") == RESTRICTABLE_APIS
    assert parse_client_apis(" logging, shared-memory,logging") == ("logging", "shared-memory")
    with pytest.raises(ServerError, match=r"unknown client API 'sharedmemory'.*shared-memory, model-repository"):
        parse_client_apis("logging,sharedmemory")
    with pytest.raises(ServerError, match="unknown client API 'inference'"):
        TritonServer("repo", client_apis=("inference",))


def test_restriction_args_use_tritons_format():
    assert restriction_args(("shared-memory", "trace"), "k3y") == [
        f"--http-restricted-api=shared-memory,trace:{ADMIN_HEADER}=k3y",
        f"--grpc-restricted-protocol=shared-memory,trace:{ADMIN_HEADER}=k3y",
    ]
    assert restriction_args((), "k3y") == []


@pytest.fixture(scope="module")
def quick_repo(tmp_path_factory) -> Path:
    """The demo repository with only the two quick python models (no engines: loads in seconds)."""
    return quick_repository(tmp_path_factory.mktemp("hardening"))


@needs_triton
def test_server_command_runs_triton_hardened(quick_repo):
    command = server_command(
        quick_repo,
        host="127.0.0.1",
        http_port=1,
        grpc_port=2,
        metrics_port=3,
        admin_key="k",
        restricted_apis=("logging",),
        shm_prefix="triton_python_backend_shm_region_trt_spec_x_",
        exit_timeout_s=2,
    )
    try:
        argv = command.argv
        assert {"--model-control-mode=explicit", "--load-model=*", "--exit-timeout-secs=2"} <= set(argv)
        assert "--backend-config=python,shm-region-prefix-name=triton_python_backend_shm_region_trt_spec_x_" in argv
        assert f"--http-restricted-api=logging:{ADMIN_HEADER}=k" in argv
        assert f"--grpc-restricted-protocol=logging:{ADMIN_HEADER}=k" in argv
    finally:
        shutil.rmtree(command.workdir)


def test_default_log_file_is_beside_the_repository(tmp_path):
    path = default_log_file(tmp_path / "model_repo")
    assert path.parent == tmp_path / "logs"
    assert path.name.startswith("tritonserver-model_repo-") and path.suffix == ".log"


def test_unknown_client_api_is_a_usage_error(tmp_path):
    (tmp_path / "repo").mkdir()
    result = CliRunner().invoke(main, ["serve", "--repo", str(tmp_path / "repo"), "--allow-client-apis", "bogus"])
    assert result.exit_code == 2
    assert "unknown client API 'bogus'" in result.output and "--allow-client-apis" in result.output


# --- `trt-spec serve` against the real server ----------------------------------------------------


def _server_pid(http_port: int) -> int:
    """The tritonserver process listening on ``http_port``, found by its command line."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"tritonserver") and f"--http-port={http_port}".encode() in argv:
                return int(entry.name)
    raise AssertionError(f"no tritonserver on port {http_port}")


@needs_triton
def test_serve_opens_only_the_apis_asked_for_keeps_its_log_and_stops_quickly(quick_repo, tmp_path):
    ports = {"grpc": free_port(), "http": free_port(), "metrics": free_port()}
    log = tmp_path / "var" / "triton.log"  # a directory that does not exist yet
    command = [TRT_SPEC, "serve", "--repo", str(quick_repo), "--log-file", str(log)]
    command += ["--allow-client-apis", "shared-memory,logging", "--ready-timeout", "120"]
    command += [f"--{name}-port={port}" for name, port in ports.items()]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert line.startswith("ready "), (line, process.stderr.read() if process.poll() is not None else "")
        base = f"http://127.0.0.1:{ports['http']}"
        assert http_status(base + "/v2/systemsharedmemory/status") == 200  # opened
        assert http_status(base + "/v2/logging") == 200  # opened
        assert http_status(base + "/v2/repository/index", method="POST") == 403  # still restricted
        assert http_status(base + "/v2/trace/setting") == 403
        stubs = python_stubs(_server_pid(ports["http"]))
        assert {stub.model for stub in stubs.values()} == set(QUICK)
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        took = time.monotonic() - started
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    stderr = process.stderr.read()
    print(f"\nserve stopped {took:.2f} s after SIGTERM")
    assert took < 8, stderr
    assert f"log: {log.resolve()}" in stderr and "stopped" in stderr
    assert log.is_file() and "Started GRPCInferenceService" in log.read_text()  # kept after the stop
    present = {path.name for path in Path("/dev/shm").iterdir()}
    assert not {stub.region for stub in stubs.values()} & present
    assert not [pid for pid in stubs if stub_alive(pid)]


@needs_triton
def test_a_failed_start_names_a_log_that_exists(tmp_path):
    broken_repo(tmp_path / "repo")
    result = subprocess.run(
        [TRT_SPEC, "serve", "--repo", str(tmp_path / "repo"), "--ready-timeout", "60"]
        + [f"--{name}-port={free_port()}" for name in ("grpc", "http", "metrics")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert "boom at load" in result.stderr
    named = result.stderr.rsplit("(log: ", 1)[1].split(")")[0]
    assert Path(named).parent == tmp_path / "logs"  # the default: logs/ beside the repository
    assert Path(named).is_file() and "boom at load" in Path(named).read_text()


@needs_triton
def test_an_unwritable_log_is_refused_before_starting(quick_repo):
    result = CliRunner().invoke(main, ["serve", "--repo", str(quick_repo), "--log-file", "/proc/no/triton.log"])
    assert result.exit_code == 1
    assert "cannot write the server log /proc/no/triton.log" in result.output and "--log-file" in result.output


@needs_triton
def test_serve_exits_with_the_reason_when_tritonserver_itself_dies(quick_repo, tmp_path):
    ports = {"grpc": free_port(), "http": free_port(), "metrics": free_port()}
    log = tmp_path / "triton.log"
    command = [TRT_SPEC, "serve", "--repo", str(quick_repo), "--log-file", str(log), "--ready-timeout", "120"]
    command += [f"--{name}-port={port}" for name, port in ports.items()]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().startswith("ready ")
        server = _server_pid(ports["http"])
        stubs = python_stubs(server)
        os.kill(server, signal.SIGKILL)  # as the OOM killer would
        assert process.wait(timeout=30) == 1
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    stderr = process.stderr.read()
    assert "tritonserver exited with code -9" in stderr and f"(log: {log.resolve()})" in stderr
    assert not [pid for pid in stubs if stub_alive(pid)]
    assert not {stub.region for stub in stubs.values()} & {path.name for path in Path("/dev/shm").iterdir()}
