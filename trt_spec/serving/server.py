"""Start, watch and stop a Triton Inference Server on a model repository.

Which server: ``tritonserver`` from PATH when there is one (NVIDIA's containers, GPU
machines); otherwise the CPU build bundled in the ``nvidia-pytriton`` wheel, set up as found by
trial on Debian 12 (docs/design.md, "Facts measured"): a backend directory of our own holding
the python backend and the stub for this Python, the wheel's bundled libraries and this
Python's libdir on ``LD_LIBRARY_PATH``, and this environment's ``bin`` first on ``PATH`` (the
stub finds its Python through ``python3``).

A repository with TensorRT-LLM engine models needs ``tritonserver`` from PATH (the bundled CPU
server has no ``tensorrtllm`` backend) and runs in the backend's orchestrator mode under
``mpirun`` (:mod:`trt_spec.serving.trtllm` says why and where the facts come from).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from trt_spec.errors import ServerError
from trt_spec.serving.trtllm import EngineModel, engine_models, orchestrator_command

SHM_GLOB = "triton_python_backend_shm_region_*"
DEFAULT_PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}


@dataclass(frozen=True)
class ServerCommand:
    argv: list[str]
    env: dict[str, str]
    workdir: Path  # our backend directory and log live here; removed on stop
    bundled: bool
    orchestrator: bool = False  # TensorRT-LLM engine models: under mpirun, in orchestrator mode


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _bundled_server(workdir: Path) -> tuple[Path, Path, dict[str, str]]:
    """The nvidia-pytriton tritonserver, a backend directory for it, and its environment."""
    try:
        import pytriton
    except ImportError:
        raise ServerError(
            "no Triton server here: `tritonserver` is not on PATH and nvidia-pytriton is not installed; "
            "pip install 'trt-spec[triton]' (CPU) or use NVIDIA's Triton container"
        ) from None
    root = Path(pytriton.__file__).parent / "tritonserver"
    python_version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / python_version / "triton_python_backend_stub"
    if not stub.is_file():
        raise ServerError(f"nvidia-pytriton ships no python backend stub for Python {python_version}")
    backend = workdir / "backends" / "python"
    backend.mkdir(parents=True)
    for source in (
        stub,
        root / "backends" / "python" / "libtriton_python.so",
        root / "backends" / "python" / "triton_python_backend_utils.py",
    ):
        shutil.copy2(source, backend / source.name)
    libs = Path(pytriton.__file__).parent.parent / "nvidia_pytriton.libs"
    base_libdir = sysconfig.get_config_var("LIBDIR") or str(Path(sys.base_prefix) / "lib")
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(libs), base_libdir, env.get("LD_LIBRARY_PATH")]))
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return root / "bin" / "tritonserver", workdir / "backends", env


def require_engine_server(repo: Path, engines: list[EngineModel]) -> None:
    """Refuse early what cannot load: engine models without ``tritonserver`` and ``mpirun`` on PATH.

    Raises:
        ServerError: naming the models and where they can be served.
    """
    if not engines:
        return
    names = ", ".join(model.name for model in engines)
    if shutil.which("tritonserver") is None:
        raise ServerError(
            f"{repo} has TensorRT-LLM engine models ({names}): they need `tritonserver` with the tensorrtllm backend "
            "on PATH (NVIDIA's tritonserver:<release>-trtllm-python-py3 container on a GPU machine); the bundled "
            "CPU server cannot load them. On CPU, write the torch flavor: `trt-spec repo --spec F --flavor torch`"
        )
    if shutil.which("mpirun") is None:
        raise ServerError(
            f"{repo} has TensorRT-LLM engine models ({names}), which Triton runs in orchestrator mode under `mpirun`, "
            "but `mpirun` is not on PATH; serve in NVIDIA's TensorRT-LLM Triton container (it ships Open MPI)"
        )


def server_command(
    repo: Path, *, host: str, http_port: int, grpc_port: int, metrics_port: int, extra_args: tuple[str, ...] = ()
) -> ServerCommand:
    engines = engine_models(repo)
    require_engine_server(repo, engines)
    workdir = Path(tempfile.mkdtemp(prefix="trt-spec-triton-"))
    on_path = shutil.which("tritonserver")
    if on_path:
        binary, backends, env, bundled = Path(on_path), None, dict(os.environ), False
    else:
        binary, backends, env = _bundled_server(workdir)
        bundled = True
    argv = [
        str(binary),
        f"--model-repository={repo.resolve()}",
        f"--http-address={host}",
        f"--http-port={http_port}",
        f"--grpc-address={host}",
        f"--grpc-port={grpc_port}",
        f"--metrics-address={host}",
        f"--metrics-port={metrics_port}",
        "--allow-metrics=true",
        "--exit-on-error=true",
        "--strict-readiness=true",
        "--log-verbose=0",
    ]
    if backends is not None:
        argv.append(f"--backend-directory={backends}")
    if engines:
        argv, env = orchestrator_command(shutil.which("mpirun"), argv, engines, env)
    argv += list(extra_args)
    return ServerCommand(argv=argv, env=env, workdir=workdir, bundled=bundled, orchestrator=bool(engines))


class TritonServer:
    """A running tritonserver; a context manager that always stops it and cleans up.

    Raises (from :meth:`start`):
        ServerError: the server exited or was not ready within ``ready_timeout_s``; the message
            carries the server log's error lines.
    """

    def __init__(
        self,
        repo: str | Path,
        *,
        host: str = "127.0.0.1",
        http_port: int | None = None,
        grpc_port: int | None = None,
        metrics_port: int | None = None,
        ready_timeout_s: float = 120.0,
        extra_args: tuple[str, ...] = (),
    ):
        self.repo = Path(repo)
        self.host = host
        self.http_port = http_port or free_port(host)
        self.grpc_port = grpc_port or free_port(host)
        self.metrics_port = metrics_port or free_port(host)
        self.ready_timeout_s = ready_timeout_s
        self.extra_args = extra_args
        self.process: subprocess.Popen | None = None
        self.command: ServerCommand | None = None
        self._shm_owned: set[str] = set()

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    @property
    def log_path(self) -> Path:
        assert self.command is not None
        return self.command.workdir / "tritonserver.log"

    def start(self) -> TritonServer:
        if not (self.repo / "ensemble").is_dir() and not any(self.repo.glob("*/config.pbtxt")):
            raise ServerError(f"{self.repo} holds no Triton models; `trt-spec repo --spec F -o {self.repo}` writes one")
        self.command = server_command(
            self.repo,
            host=self.host,
            http_port=self.http_port,
            grpc_port=self.grpc_port,
            metrics_port=self.metrics_port,
            extra_args=self.extra_args,
        )
        log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            self.command.argv,
            env=self.command.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        try:
            self._wait_ready()
        except BaseException:
            self.stop(keep_log=True)
            raise
        return self

    def _wait_ready(self) -> None:
        url = f"http://{self.http_url}/v2/health/ready"
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerError(
                    f"tritonserver exited with code {self.process.returncode} while loading: {self.log_errors()}"
                )
            try:
                with urllib.request.urlopen(url, timeout=1) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        raise ServerError(f"tritonserver was not ready after {self.ready_timeout_s:.0f} s: {self.log_errors()}")

    def log_errors(self, limit: int = 5) -> str:
        """The error lines of the server log (Triton prefixes them with 'E'), else its tail."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except (OSError, AssertionError):
            return "(no server log)"
        errors = [line for line in lines if line.startswith("E") or "failed to load" in line or "Error" in line]
        chosen = (errors or lines)[-limit:]
        return " | ".join(line.strip() for line in chosen) + f" (log: {self.log_path})"

    def wait(self) -> int:
        """Block until the server exits; returns its exit code."""
        return self.process.wait()

    def stop(self, timeout_s: float = 30.0, *, keep_log: bool = False) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``; removes the shared memory its python
        models leave behind and its working directory (unless ``keep_log``: a failed start keeps
        the log it names)."""
        if self.process is not None and self.process.poll() is None:
            self._shm_owned |= _stub_shm_regions(self.process.pid)
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        # Only regions of this server's own stubs: other servers on the machine keep theirs.
        for region in self._shm_owned:
            Path("/dev/shm", region).unlink(missing_ok=True)
        if self.command is not None and not keep_log:
            shutil.rmtree(self.command.workdir, ignore_errors=True)

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _stub_shm_regions(server_pid: int) -> set[str]:
    """The shared-memory regions of a server's python-backend stubs, read from their command
    lines, where each names its region. The stubs are the server's children, or its
    grandchildren when ``mpirun`` started the server."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    children = {pid for pid, parent in parents.items() if parent == server_pid}
    descendants = children | {pid for pid, parent in parents.items() if parent in children}
    regions = set()
    for pid in descendants:
        try:
            arguments = Path("/proc", str(pid), "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        regions |= {arg.decode() for arg in arguments if arg.startswith(SHM_GLOB[:-1].encode())}
    return regions
