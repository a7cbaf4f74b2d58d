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

How the server is run, and why (docs/design.md, "Supervision"; all measured on the bundled
Triton 2.51):

- **Explicit model control** (``--model-control-mode=explicit --load-model=*``): every model
  loads at start as before, and :class:`Supervisor` can unload and load one model again when
  its python-backend stub process dies, which Triton itself never does.
- **Restricted APIs**: the shared-memory, model-repository, logging and trace APIs answer only
  requests that carry a header whose value is a secret of this server
  (``--http-restricted-api`` / ``--grpc-restricted-protocol``); ``client_apis`` opens them.
- **Our own shared-memory prefix** (python backend ``shm-region-prefix-name``): every region
  this server's stubs use is named ``triton_python_backend_shm_region_trt_spec_<id>_...``, so a
  stop removes exactly this server's regions, never another server's.
- **A bounded stop**: SIGTERM to the server, which waits ``exit_timeout_s`` for in-flight
  requests (``--exit-timeout-secs``; Triton's default is 30 s), then SIGKILL to the whole
  process group.
- **No auto-complete stubs** (``--disable-auto-complete-config`` unless a ``model.py`` of the
  repository defines ``auto_complete_config``): our configs are complete, and the python backend
  would start one more stub per model load just to complete them (~5 s of a 15 s restart here).
  A restart (a dead decoupled model) SIGKILLs the old server's process group at once.
- **The drain flag** (:mod:`trt_spec.runtime.draining`): in the server's environment, so that our
  python engine models refuse calls that are not the loop's once :meth:`TritonServer.drain` began.
- **The log** (the server's and its stubs' stdout and stderr) goes to ``log_file`` when given,
  kept after the stop; otherwise to a temporary file removed with the server.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from trt_spec.errors import ServerError
from trt_spec.runtime.draining import DRAIN_FILE_ENV, LOOP_TOKEN_ENV
from trt_spec.serving.metrics import samples, scrape
from trt_spec.serving.reaper import group_members
from trt_spec.serving.trtllm import EngineModel, engine_models, orchestrator_command

SHM_GLOB = "triton_python_backend_shm_region_*"
SHM_PREFIX = SHM_GLOB[:-1]  # the python backend's default shm-region-prefix-name
STUB_EXECUTABLE = "triton_python_backend_stub"
DEFAULT_PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}
# The APIs a client gets only with the admin header unless the operator opens them (the names
# are Triton's, from `tritonserver --help`: --http-restricted-api / --grpc-restricted-protocol).
RESTRICTABLE_APIS = ("shared-memory", "model-repository", "logging", "trace")
ADMIN_HEADER = "trt-spec-admin-key"  # over gRPC Triton expects it as triton-grpc-protocol-<key>
EXIT_TIMEOUT_S = 2  # --exit-timeout-secs: how long a stopping server waits for in-flight requests
KILL_GRACE_S = 3.0  # after that, how long we wait for it to exit before SIGKILL
# How long a supervisor's reload of one model may take before it restarts the server instead.
# A reload takes 2-15 s here; past this the server is taken for hung: the python backend can
# abort the whole server (boost::interprocess::lock_exception in ModelInstanceExecute) when a
# request reaches the instance of a stub that was killed holding its shared-memory lock, and an
# aborting tritonserver may hang instead of exiting.
RELOAD_TIMEOUT_S = 30.0
# A stub stopped this long (SIGSTOP, a debugger) is killed and recovered as a dead one.
STOPPED_STUB_S = 1.0
# A model with requests waiting whose processes finish no execution and use no CPU for this long is
# taken for hung (a deadlock, a wait that never ends), killed and recovered as a dead one.
HUNG_MODEL_S = 5.0
# "No CPU": under this share of one core (a hung process's own housekeeping threads stay below it;
# an execution, even on a crowded machine, uses far more).
HUNG_CPU_SHARE = 0.05
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# Triton's per-model counters (its metrics port) that the hang check reads: requests queued for an
# instance, and executions and failures, whose growth is progress.
_PENDING = "nv_inference_pending_request_count"
_PROGRESS = ("nv_inference_exec_count", "nv_inference_request_failure")


@dataclass(frozen=True)
class ServerCommand:
    argv: list[str]
    env: dict[str, str]
    workdir: Path  # our backend directory (and the log unless one is given) live here; removed on stop
    bundled: bool
    orchestrator: bool = False  # TensorRT-LLM engine models: under mpirun, in orchestrator mode


@dataclass(frozen=True)
class Stub:
    """One python-backend stub process: the process a python model instance runs in."""

    pid: int
    model: str  # the model's directory name, which is its name in Triton
    instance: str  # Triton's instance name, e.g. tensorrt_llm_0_0
    region: str  # its shared-memory region (/dev/shm/<region>)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_holder(port: int) -> str | None:
    """The process listening on TCP ``port`` ("pid N (command line)"), from /proc/net/tcp{,6} and
    the processes' socket descriptors; None when none is found (or it is not ours to see)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) in inodes:
                    argv = (entry / "cmdline").read_bytes().split(b"\0")
                    command = " ".join(arg.decode(errors="replace") for arg in argv if arg)
                    return f"pid {entry.name} ({command[:120]})"
        except OSError:
            continue
    return None


def check_port_free(host: str, port: int, option: str) -> None:
    """Refuse a port something already listens on, naming the holder (Triton's gRPC listener
    binds with SO_REUSEPORT, so a second server would share the port instead of failing).

    Raises:
        ServerError: the port is taken.
    """
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            holder = port_holder(port)
            raise ServerError(
                f"port {port} on {host} is taken{f' by {holder}' if holder else ''} ({exc.strerror}); stop that "
                f"process or choose another {option}"
            ) from None


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
    stub = root / "python_backend_stubs" / python_version / STUB_EXECUTABLE
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


def parse_client_apis(text: str) -> tuple[str, ...]:
    """``--allow-client-apis`` as a tuple of API names: a comma-separated subset of
    :data:`RESTRICTABLE_APIS`, ``all`` or ``none``.

    Raises:
        ServerError: an unknown name, naming it and the valid ones.
    """
    names = [name.strip() for name in text.split(",") if name.strip()]
    if names in (["none"], []):
        return ()
    if names == ["all"]:
        return RESTRICTABLE_APIS
    unknown = [name for name in names if name not in RESTRICTABLE_APIS]
    if unknown:
        raise ServerError(
            f"unknown client API {unknown[0]!r} in {text!r}: choose from {', '.join(RESTRICTABLE_APIS)} "
            "(comma-separated), or all, or none"
        )
    return tuple(dict.fromkeys(names))


def restriction_args(restricted: Iterable[str], admin_key: str) -> list[str]:
    """Triton's options that make ``restricted`` APIs answer only requests with the admin header.

    Format ``<api>,<api>:<key>=<value>`` (``tritonserver --help``; Triton's docs,
    triton-inference-server/server docs/customization_guide/inference_protocols.md, "Limit
    Endpoint Access"). Refused requests get HTTP 403 / gRPC UNAVAILABLE, "This API is restricted".
    """
    apis = ",".join(restricted)
    if not apis:
        return []
    setting = f"{apis}:{ADMIN_HEADER}={admin_key}"
    return [f"--http-restricted-api={setting}", f"--grpc-restricted-protocol={setting}"]


def completes_configs(repo: Path) -> bool:
    """Whether a python model of ``repo`` defines ``auto_complete_config`` (upstream's llmapi model
    does; ours write complete configs): only then does Triton need to auto-complete configs, which
    the python backend does by launching one more stub per model load, before its instances
    (triton-inference-server/python_backend src/python_be.cc, ``ModelState::Create``)."""
    for model_file in repo.glob("*/*/model.py"):
        try:
            if "def auto_complete_config" in model_file.read_text(errors="replace"):
                return True
        except OSError:
            continue
    return False


def server_command(
    repo: Path,
    *,
    host: str,
    http_port: int,
    grpc_port: int,
    metrics_port: int,
    extra_args: tuple[str, ...] = (),
    admin_key: str | None = None,
    restricted_apis: Iterable[str] = RESTRICTABLE_APIS,
    shm_prefix: str | None = None,
    exit_timeout_s: int = EXIT_TIMEOUT_S,
) -> ServerCommand:
    """The command line and environment of a server on ``repo``.

    ``admin_key`` None: no API is restricted; ``shm_prefix`` None: the python backend's default
    prefix (then a stop cannot tell this server's shared memory from another's).
    """
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
        # Every model at start, as in the default mode, and reloadable one by one (Supervisor).
        "--model-control-mode=explicit",
        "--load-model=*",
        f"--exit-timeout-secs={exit_timeout_s}",
    ]
    if backends is not None:
        argv.append(f"--backend-directory={backends}")
    if not engines and not completes_configs(repo):
        # Every config is complete: no auto-complete stub per model load (a python process that
        # imports model.py, ~5 s of a restart on 2 cores). Orchestrator mode adds the flag itself.
        argv.append("--disable-auto-complete-config")
    if shm_prefix is not None:
        argv.append(f"--backend-config=python,shm-region-prefix-name={shm_prefix}")
    if admin_key is not None:
        argv += restriction_args(restricted_apis, admin_key)
    if engines:
        mpirun = shutil.which("mpirun")
        if mpirun is None:  # require_engine_server refused this above, unless PATH changed since
            raise ServerError(f"`mpirun` is not on PATH; {repo} has TensorRT-LLM engine models, which need it")
        argv, env = orchestrator_command(mpirun, argv, engines, env)
    argv += list(extra_args)
    return ServerCommand(argv=argv, env=env, workdir=workdir, bundled=bundled, orchestrator=bool(engines))


class TritonServer:
    """A running tritonserver; a context manager that always stops it and cleans up.

    ``log_file``: where the server's output goes, kept after the stop (``serve`` always gives
    one); None: a temporary file, removed at stop unless the start failed.
    ``client_apis``: the :data:`RESTRICTABLE_APIS` open to every client; the others need the
    admin header (:attr:`admin_headers`), which only this object knows.
    ``exit_timeout_s``: how long a stop lets in-flight requests finish before the server exits;
    :meth:`stop` kills what is left :data:`KILL_GRACE_S` later.

    Raises (from :meth:`start`):
        ServerError: the server exited or was not ready within ``ready_timeout_s``; the message
            carries the server log's error lines and the log's path.
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
        log_file: str | Path | None = None,
        client_apis: Iterable[str] = (),
        exit_timeout_s: int = EXIT_TIMEOUT_S,
    ):
        self.repo = Path(repo)
        self.host = host
        self.http_port = http_port or free_port(host)
        self.grpc_port = grpc_port or free_port(host)
        self.metrics_port = metrics_port or free_port(host)
        self.ready_timeout_s = ready_timeout_s
        self.extra_args = extra_args
        self.log_file = Path(log_file).resolve() if log_file is not None else None
        self.client_apis = tuple(client_apis)
        unknown = [api for api in self.client_apis if api not in RESTRICTABLE_APIS]
        if unknown:
            raise ServerError(f"unknown client API {unknown[0]!r}: choose from {', '.join(RESTRICTABLE_APIS)}")
        self.restricted_apis = tuple(api for api in RESTRICTABLE_APIS if api not in self.client_apis)
        self.exit_timeout_s = exit_timeout_s
        self.admin_key = secrets.token_hex(16)
        self.shm_prefix = f"{SHM_PREFIX}trt_spec_{secrets.token_hex(4)}_"
        self.process: subprocess.Popen | None = None
        self.command: ServerCommand | None = None
        self._lock = threading.Lock()  # one thread at a time starts or ends the server process
        self._stopping = threading.Event()
        self._answers_from_a_sender: dict[str, bool] = {}
        self.drain_file: Path | None = None  # exists while draining; None: the engine models cannot refuse

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
        if self.log_file is not None:
            return self.log_file
        assert self.command is not None
        return self.command.workdir / "tritonserver.log"

    @property
    def admin_headers(self) -> dict[str, str]:
        """The header the restricted APIs want (HTTP; gRPC: ``triton-grpc-protocol-`` + key)."""
        return {ADMIN_HEADER: self.admin_key} if self.restricted_apis else {}

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    # --- start, restart, stop ------------------------------------------------------------------

    def start(self) -> TritonServer:
        if not (self.repo / "ensemble").is_dir() and not any(self.repo.glob("*/config.pbtxt")):
            raise ServerError(f"{self.repo} holds no Triton models; `trt-spec repo --spec F -o {self.repo}` writes one")
        if self.log_file is not None:
            try:
                self.log_file.parent.mkdir(parents=True, exist_ok=True)
                self.log_file.touch()
            except OSError as exc:
                raise ServerError(
                    f"cannot write the server log {self.log_file}: {exc.strerror}; choose another path with --log-file"
                ) from None
        for name, port in (("http", self.http_port), ("grpc", self.grpc_port), ("metrics", self.metrics_port)):
            check_port_free(self.host, port, f"--{name}-port")
        self.command = server_command(
            self.repo,
            host=self.host,
            http_port=self.http_port,
            grpc_port=self.grpc_port,
            metrics_port=self.metrics_port,
            extra_args=self.extra_args,
            admin_key=self.admin_key,
            restricted_apis=self.restricted_apis,
            shm_prefix=self.shm_prefix,
            exit_timeout_s=self.exit_timeout_s,
        )
        if not self.command.orchestrator:  # TensorRT-LLM's C++ engine models cannot refuse anything
            self.command = replace(self.command, env={**self.command.env, **self._drain_env(self.command.workdir)})
        try:
            with self._lock:
                self._launch()
            self._wait_ready()
        except BaseException:
            self.stop(keep_log=True)
            raise
        return self

    def _drain_env(self, workdir: Path) -> dict[str, str]:
        """What the python engine models need to refuse direct calls while :meth:`drain` runs
        (:mod:`trt_spec.runtime.draining`): the drain flag file (absent until then), and the
        token the loop's engine calls carry."""
        self.drain_file = workdir / "draining"
        return {DRAIN_FILE_ENV: str(self.drain_file), LOOP_TOKEN_ENV: secrets.token_hex(16)}

    def restart(self, reason: str) -> float:
        """Stop the server process and start it again on the same ports and log; returns the
        seconds until it was ready again. Used when a model cannot be reloaded alone.

        Raises:
            ServerError: it did not come back (the message carries the log's errors), or
                :meth:`stop` was called meanwhile.
        """
        started = time.monotonic()
        with self._lock:
            if self.stopping:
                raise ServerError("the server is stopping; not restarted")
            # No graceful stop: the requests in flight fail anyway (those of a dead decoupled model
            # would wait forever), and SIGTERM's wait cost 1 s of every restart's outage.
            self._terminate(0)
            self._remove_shared_memory()
            if self.stopping:  # stop() was called while the old process ended: start nothing
                raise ServerError("the server is stopping; not restarted")
            with open(self.log_path, "a") as log:
                log.write(f"\n=== trt-spec: restarting tritonserver: {reason} ===\n\n")
            self._launch()
        self._wait_ready()
        return time.monotonic() - started

    def stop(self, timeout_s: float | None = None, *, keep_log: bool = False) -> None:
        """SIGTERM, then SIGKILL to the process group ``timeout_s`` later (default:
        ``exit_timeout_s`` + :data:`KILL_GRACE_S`); removes the shared memory of this server's
        stubs and its working directory. A temporary log is kept when ``keep_log`` (a failed
        start keeps the log its error names); a ``log_file`` is always kept."""
        self._stopping.set()
        with self._lock:
            self._terminate(timeout_s)
            self._remove_shared_memory()
        if self.command is not None:
            if keep_log and self.log_file is None:
                shutil.rmtree(self.command.workdir / "backends", ignore_errors=True)
            else:
                shutil.rmtree(self.command.workdir, ignore_errors=True)

    def kill(self) -> None:
        """Stop at once, for a second signal while a stop is under way: SIGKILL to the server's
        whole process group, wait (2 s at most) until it is gone, remove this server's shared
        memory and working directory. Takes no lock (the stop under way may hold it)."""
        self._stopping.set()
        process = self.process
        if process is not None:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            _wait_group_gone(process.pid, timeout_s=2.0)
        self._remove_shared_memory()
        if self.command is not None:
            shutil.rmtree(self.command.workdir, ignore_errors=True)

    def wait(self) -> int:
        """Block until the server exits; returns its exit code."""
        return self._started_process().wait()

    def _started_process(self) -> subprocess.Popen:
        """The server process; a programming error before :meth:`start` launched it."""
        if self.process is None:
            raise RuntimeError("tritonserver has not been started: call start() first")
        return self.process

    def _launch(self) -> None:
        """Start the server process (the caller holds ``_lock``); its output appends to the log."""
        # Under the reaper (serving/reaper.py): the server's process group dies with this process,
        # however this process dies.
        command = self.command
        if command is None:
            raise RuntimeError("no server command to launch: start() sets it")
        reaper = [sys.executable, "-m", "trt_spec.serving.reaper", f"--shm-prefix={self.shm_prefix}"]
        reaper += [f"--workdir={command.workdir}", "--"]
        with open(self.log_path, "a") as log:
            self.process = subprocess.Popen(
                [*reaper, *command.argv],
                env=command.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: stubs and mpirun's children die with it
            )

    def _terminate(self, timeout_s: float | None = None) -> None:
        """End the server process and everything in its process group (the caller holds ``_lock``).

        SIGTERM to the leader only (tritonserver, or mpirun which forwards it): Triton then stops
        accepting, waits up to --exit-timeout-secs for in-flight requests and unloads its models.
        What is still alive after ``timeout_s`` (a server stuck on a dead stub) is SIGKILLed with
        its whole group, as are stubs that outlive their server; ``timeout_s`` 0: at once (a restart).
        """
        process = self.process
        if process is None:
            return
        if timeout_s is None:
            timeout_s = self.exit_timeout_s + KILL_GRACE_S
        if process.poll() is None and timeout_s > 0:
            try:
                os.kill(process.pid, signal.SIGTERM)
                process.wait(timeout=timeout_s)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # the whole group is gone already
        process.wait()
        _wait_group_gone(process.pid, timeout_s=2.0)

    def _remove_shared_memory(self) -> None:
        """Remove the /dev/shm regions of this server's stubs: named with this server's own
        prefix, so other servers' regions are left alone. Triton leaves some behind: a killed
        stub's region, and every region when the server itself is killed."""
        for region in Path("/dev/shm").glob(f"{self.shm_prefix}*"):
            region.unlink(missing_ok=True)

    def _wait_ready(self) -> None:
        url = f"http://{self.http_url}/v2/health/ready"
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.stopping:
                raise ServerError("the server was stopped while it was loading")
            process = self._started_process()
            if process.poll() is not None:
                raise ServerError(
                    f"tritonserver exited with code {process.returncode} while loading: {self.log_errors()}"
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

    # --- what supervision needs --------------------------------------------------------------

    def stubs(self) -> dict[int, Stub]:
        """The python-backend stub processes of this server that serve a model instance, by pid."""
        if self.process is None:
            return {}
        return python_stubs(self.process.pid)

    def repository_index(self) -> dict[str, str]:
        """Each model's state as Triton's model-repository API reports it (READY, UNAVAILABLE, ...)."""
        body = self._post("/v2/repository/index", timeout_s=10)
        return {entry["name"]: entry.get("state", "") for entry in json.loads(body or b"[]")}

    def model_progress(self) -> dict[str, tuple[float, float]]:
        """Each model's (requests waiting for an instance, executions + failures so far) from
        Triton's metrics port."""
        progress: dict[str, tuple[float, float]] = {}
        for sample in samples(scrape(self.metrics_url)):
            model = sample.label("model")
            if model is None or not (sample.name == _PENDING or sample.name in _PROGRESS):
                continue
            pending, done = progress.get(model, (0.0, 0.0))
            value = sample.value
            progress[model] = (pending + value, done) if sample.name == _PENDING else (pending, done + value)
        return progress

    def drain(self, models: Iterable[str], timeout_s: float) -> list[str]:
        """Unload ``models`` (the clients' entry points) and wait until Triton has unloaded them,
        which it does once their requests in flight are done: new requests to them are refused at
        once and readiness says not ready. First the drain flag: from then on the python engine
        models refuse calls that are not the loop's. Returns those still busy after ``timeout_s``."""
        if self.drain_file is not None:
            self.drain_file.touch()
        states = self.repository_index()
        draining = [name for name in models if states.get(name) == "READY"]
        for name in draining:
            self.unload_model(name)
        deadline = time.monotonic() + timeout_s
        while True:
            states = self.repository_index()
            busy = [name for name in draining if states.get(name) in ("READY", "UNLOADING")]
            if not busy or time.monotonic() >= deadline:
                return busy
            time.sleep(0.2)

    def unload_model(self, name: str) -> None:
        """Unload ``name``: from now on its requests are refused at once and readiness says
        not ready. Triton unloads in the background once its in-flight requests are done."""
        self._post(f"/v2/repository/models/{name}/unload", timeout_s=30)

    def load_model(self, name: str, timeout_s: float | None = None) -> None:
        """(Re)load ``name`` from the repository and wait until it is loaded (at most ``timeout_s``,
        default the readiness timeout): new stub processes."""
        self._post(f"/v2/repository/models/{name}/load", timeout_s=timeout_s or self.ready_timeout_s)

    def answers_from_a_sender(self, name: str) -> bool:
        """Whether the model answers its requests through a response sender after ``execute()``
        returned: a decoupled model (``model_transaction_policy { decoupled: true }``), or a torch
        flavor engine model (its config carries :class:`TorchEngineParameters`: it batches its
        requests in flight). Triton leaves such a model's open requests waiting forever when its
        stub dies (measured for both), so that death restarts the server."""
        if name not in self._answers_from_a_sender:
            from google.protobuf import text_format

            from trt_spec.repository.configs import read_config
            from trt_spec.runtime.parameters import TorchEngineParameters

            try:
                config = read_config(self.repo / name / "config.pbtxt")
            except (OSError, text_format.ParseError):
                return False
            batches_in_flight = {f.name for f in fields(TorchEngineParameters)} <= set(config.parameters)
            self._answers_from_a_sender[name] = config.model_transaction_policy.decoupled or batches_in_flight
        return self._answers_from_a_sender[name]

    def _post(self, path: str, *, timeout_s: float) -> bytes:
        """POST to Triton's HTTP API with the admin header.

        Raises:
            ServerError: Triton's own error message, or why it could not be reached.
        """
        request = urllib.request.Request(
            f"http://{self.http_url}{path}", data=b"", method="POST", headers=self.admin_headers
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                return response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            try:
                detail = json.loads(detail).get("error", detail)
            except (ValueError, AttributeError):
                pass
            raise ServerError(f"POST {path}: HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise ServerError(f"POST {path}: the server at {self.http_url} did not answer: {exc}") from None

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _wait_group_gone(pgid: int, *, timeout_s: float) -> None:
    """Wait until no live process (zombies aside) is left in process group ``pgid``: a SIGKILLed
    stub takes a moment to exit, and a stop should leave none behind when it returns."""
    deadline = time.monotonic() + timeout_s
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.02)


def _process_state(pid: int) -> str:
    """A process's state letter from /proc/<pid>/stat ("" when it is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _process_cpu_ticks(pid: int) -> int:
    """CPU time a process has used so far (user + system, in clock ticks; 0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, ValueError, IndexError):
        return 0


def _process_table() -> dict[int, tuple[int, str]]:
    """Every process's parent pid and state letter, from /proc/<pid>/stat."""
    table = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                table[int(entry.name)] = (int(fields[1]), fields[0])
            except (OSError, ValueError, IndexError):
                continue
    return table


def python_stubs(server_pid: int) -> dict[int, Stub]:
    """The live python-backend stubs among the descendants of ``server_pid`` (its children, or
    its grandchildren when ``mpirun`` started the server), by pid.

    A stub's command line names its model file, region and instance (python backend,
    triton-inference-server/python_backend src/stub_launcher.cc, ``StubLauncher::Launch``:
    ``<stub> <repo>/<model>/<version>/model.py <shm region> <default size> <growth size>
    <parent pid> <backend dir> <ipc handle> <instance name> ...``). Stubs that only auto-complete
    a config at load time are named after the model, not an instance, and are left out; so are
    zombies.
    """
    table = _process_table()
    children: dict[int, list[int]] = {}
    for pid, (parent, _state) in table.items():
        children.setdefault(parent, []).append(pid)
    stubs, pending = {}, list(children.get(server_pid, []))
    while pending:
        pid = pending.pop()
        pending += children.get(pid, [])
        if table[pid][1] in "ZX":
            continue
        try:
            argv = [arg.decode(errors="replace") for arg in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")]
        except OSError:
            continue
        if len(argv) < 9 or Path(argv[0]).name != STUB_EXECUTABLE:
            continue
        model = Path(argv[1]).parent.parent.name
        if argv[8] != model:
            stubs[pid] = Stub(pid=pid, model=model, instance=argv[8], region=argv[2])
    return stubs


_RELOAD_NOTE = "reloading the model; its requests fail until it is back"
_RESTART_NOTE = (
    "restarting the server (Triton would leave the open requests of a model that answers from a response "
    "sender, decoupled or batching in flight, waiting forever)"
)


@dataclass
class Recovery:
    """One model brought back by :class:`Supervisor`."""

    model: str
    action: str  # "reload" or "restart"
    detected_at: float  # time.monotonic() when its dead process was found
    seconds: float  # from then until the reload or restart was done (the model ready again)


@dataclass
class Supervisor:
    """Watches a running :class:`TritonServer`'s python-backend stub processes and brings back a
    model whose process died (killed by the OOM killer, crashed), which Triton never does: its
    python backend leaves the instance failing every request with "Stub process ... is not
    healthy" while its health endpoints say ready (docs/design.md, "Supervision").

    Every ``interval_s`` it lists the stubs; when one it saw is gone and Triton still reports
    the model READY (a client that unloaded the model on purpose is left alone):

    - a model that is not decoupled is unloaded at once (its requests are refused, readiness
      says not ready) and loaded again: new stub processes. In-flight requests get Triton's
      "Stub process '<instance>' is not healthy". Its other old processes end once their
      requests are done; that end is not a death.
    - a model that answers from a response sender (the decoupled loop ``spec_loop`` and
      postprocessing, and the torch flavor's engine models, which batch in flight): Triton would
      leave its in-flight requests waiting forever (measured), so the whole server is restarted
      on the same ports; open connections are closed, which their clients see as an error.

    A model that cannot be reloaded gets a restart too. A model that cannot stay up is a crash
    loop: when it dies within ``window_s`` seconds of being brought back for the
    ``max_recoveries`` + 1-th time in a row, supervision gives up and :meth:`wait` returns why.
    Deaths further apart (a kill, an OOM, a hang now and then) are always recovered.
    ``on_event`` receives one line per event (``serve`` prints them).
    """

    server: TritonServer
    on_event: Callable[[str], None] = lambda message: None
    interval_s: float = 0.5
    max_recoveries: int = 5
    window_s: float = 60.0
    hung_s: float = HUNG_MODEL_S
    recoveries: list[Recovery] = field(default_factory=list, init=False)
    failure: str | None = field(default=None, init=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _done: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)
    _stopped_since: dict[int, float] = field(default_factory=dict, init=False, repr=False)
    _progress: dict[str, tuple[float, float, float]] = field(default_factory=dict, init=False, repr=False)
    # The stubs of a reloaded model's old instances: Triton ends them itself once their requests in
    # flight are done, which under load is seconds after the new ones serve. Not watched: their end
    # is not a death (taken for one, it reloaded the model again, the ensemble unavailable meanwhile).
    _retired: set[int] = field(default_factory=set, init=False, repr=False)

    def start(self) -> Supervisor:
        self._thread = threading.Thread(target=self._run, name="trt-spec-supervisor", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def wait(self) -> str | None:
        """Block until supervision ends; returns why (the server exited, or it gave up), or
        None when :meth:`stop` ended it. Signals still interrupt the wait."""
        while not self._done.wait(0.5):
            pass
        return self.failure

    @property
    def running(self) -> bool:
        return self._thread is not None and not self._done.is_set()

    def _run(self) -> None:
        try:
            known: dict[int, Stub] | None = None  # the stubs seen so far; None until the first look
            while not self._stop.wait(0 if known is None else self.interval_s):
                try:
                    if known is None:
                        known = self.server.stubs()
                        continue
                    if self._server_exited():
                        return
                    current = self.server.stubs()
                    self._retired &= current.keys()
                    current = {pid: stub for pid, stub in current.items() if pid not in self._retired}
                    self._end_stopped(current)
                    self._end_hung(current)
                    dead = {pid: stub for pid, stub in known.items() if pid not in current}
                    known.update(current)
                    if dead and not (self._stop.is_set() or self.server.stopping):  # a stop ends stubs too
                        known = self._recover(dead, known)
                except ServerError:
                    raise  # a recovery that failed: supervision gives up, with the reason
                except Exception as exc:  # noqa: BLE001 - e.g. EMFILE reading /proc: logged, supervision goes on
                    self.on_event(f"supervision check failed ({type(exc).__name__}: {exc}); retrying")
                    if self._stop.wait(1.0):
                        return
        except ServerError as exc:
            if not (self._stop.is_set() or self.server.stopping):
                time.sleep(0.2)  # a server that died meanwhile: report its exit rather than the symptom
                if not self._server_exited():
                    self.failure = str(exc)
        finally:
            self._done.set()

    def _end_stopped(self, stubs: dict[int, Stub]) -> None:
        """SIGKILL a stub that has been stopped (SIGSTOP, a debugger) for :data:`STOPPED_STUB_S`:
        Triton answers its requests "Stub process ... is not healthy" while calling the model ready,
        and a reload would wait on it; killed, it is recovered as a dead stub."""
        now = time.monotonic()
        for pid in [pid for pid in self._stopped_since if pid not in stubs]:
            del self._stopped_since[pid]
        for pid, stub in stubs.items():
            if _process_state(pid) not in ("T", "t"):
                self._stopped_since.pop(pid, None)
                continue
            since = self._stopped_since.setdefault(pid, now)
            if now - since >= STOPPED_STUB_S:
                self.on_event(
                    f"model {stub.model}: its process {stub.instance} (pid {pid}) has been stopped for "
                    f"{now - since:.1f} s; killing it to recover the model"
                )
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                del self._stopped_since[pid]

    def _end_hung(self, stubs: dict[int, Stub]) -> None:
        """SIGKILL the processes of a model that has had requests waiting for an instance while,
        for :attr:`hung_s`, it finished no execution and its processes used next to no CPU (a
        deadlock, a wait that never ends; Triton would keep queueing its requests and call it
        ready). A long execution is not a hang: it burns CPU. Killed, the model is recovered as a
        dead one. Reads Triton's own counters (:meth:`TritonServer.model_progress`) and /proc."""
        now = time.monotonic()
        for model, (pending, done) in self.server.model_progress().items():
            victims = [stub for stub in stubs.values() if stub.model == model]
            cpu_s = sum(_process_cpu_ticks(stub.pid) for stub in victims) / _CLOCK_TICKS
            seen = self._progress.get(model)
            if seen is None or pending == 0 or seen[0] != done or cpu_s - seen[1] > HUNG_CPU_SHARE * (now - seen[2]):
                self._progress[model] = (done, cpu_s, now)  # progress, or nothing waiting: the clock starts again
                continue
            if not victims or now - seen[2] < self.hung_s:
                continue
            self.on_event(
                f"model {model}: {pending:.0f} request(s) waiting while it finished none and used "
                f"{cpu_s - seen[1]:.2f} s of CPU in {now - seen[2]:.1f} s; taking it for hung and killing its "
                "processes to recover it"
            )
            for stub in victims:
                try:
                    os.kill(stub.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            del self._progress[model]

    def _server_exited(self) -> bool:
        """Whether the server process ended by itself (not by a stop); sets :attr:`failure`."""
        process = self.server.process
        if process is None or process.poll() is None or self._stop.is_set() or self.server.stopping:
            return False
        self.failure = f"tritonserver exited with code {process.returncode}: {self.server.log_errors()}"
        return True

    def _recover(self, dead: dict[int, Stub], known: dict[int, Stub]) -> dict[int, Stub]:
        """Bring back the models of the ``dead`` stubs; returns the stubs to watch from now on.

        Raises:
            ServerError: a crash loop, or the server did not come back.
        """
        detected = time.monotonic()
        models = self._models_to_recover(dead)
        known = {pid: stub for pid, stub in known.items() if pid not in dead}
        if not models:
            return known
        self._check_crash_loop(detected, list(models))
        restart = any(self.server.answers_from_a_sender(name) for name in models)
        for name, stub in models.items():
            what = _RESTART_NOTE if restart else _RELOAD_NOTE
            self.on_event(f"model {name}: its process {stub.instance} (pid {stub.pid}) is gone; {what}")
        if not restart:
            old = {pid for pid, stub in (known | self.server.stubs()).items() if stub.model in models}
            restart = bool(self._reload(list(models)))
            self._retired |= old
        if restart:
            self.server.restart(f"the process of model {', '.join(models)} died")
            known = self.server.stubs()
        else:
            fresh = {pid: stub for pid, stub in self.server.stubs().items() if pid not in self._retired}
            known = {pid: stub for pid, stub in known.items() if stub.model not in models} | fresh
        seconds = time.monotonic() - detected
        action = "restart" if restart else "reload"
        for name in models:
            self.recoveries.append(Recovery(name, action, detected, seconds))
            self.on_event(f"model {name}: back after {seconds:.1f} s ({action})")
        return known

    def _models_to_recover(self, dead: dict[int, Stub]) -> dict[str, Stub]:
        """The models of the ``dead`` stubs that Triton still reports READY (one stub each);
        a model a client unloaded on purpose (its stubs end too) is reported and left alone."""
        states = self.server.repository_index()
        models: dict[str, Stub] = {}
        for stub in dead.values():
            state = states.get(stub.model, "unknown")
            if state == "READY":
                models.setdefault(stub.model, stub)
            else:
                self.on_event(
                    f"model {stub.model}: its process (pid {stub.pid}) ended while the model is "
                    f"{state.lower()}; not reloaded (it was unloaded on purpose)"
                )
        return models

    def _reload(self, models: list[str]) -> list[str]:
        """Unload then load each model; returns those that failed (the server restarts then)."""
        failed = []
        for name in models:
            try:
                self.server.unload_model(name)
            except ServerError as exc:
                self.on_event(f"model {name}: unload failed ({exc}); loading it anyway")
        for name in models:
            try:
                self.server.load_model(name, timeout_s=RELOAD_TIMEOUT_S)
            except ServerError as exc:
                if self._stop.is_set() or self.server.stopping:
                    raise
                self.on_event(f"model {name}: reload failed ({exc}); restarting the server")
                failed.append(name)
        return failed

    def _check_crash_loop(self, now: float, models: list[str]) -> None:
        """Raises ServerError when one of ``models``, dying at ``now``, has died within ``window_s``
        of each of its last ``max_recoveries`` recoveries (deaths in a row, each soon after the last)."""
        for model in models:
            deaths, quick = [now], 0
            for recovery in reversed([r for r in self.recoveries if r.model == model]):
                if deaths[-1] - (recovery.detected_at + recovery.seconds) >= self.window_s:
                    break
                quick += 1
                deaths.append(recovery.detected_at)
            if quick >= self.max_recoveries:
                raise ServerError(
                    f"model {model}: its process died {quick + 1} times in a row, each within {self.window_s:.0f} s "
                    f"of being brought back; not recovering again (a crash loop: see the server log "
                    f"{self.server.log_path})"
                )
