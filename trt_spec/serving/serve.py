"""`trt-spec serve`'s orchestration: Triton under a supervisor, the OpenAI endpoint beside it, the drain, the signals."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trt_spec.engines.versions import installed_versions
from trt_spec.errors import ServerError
from trt_spec.runtime import tensors as T
from trt_spec.serving.options import ServeOptions  # its own module, for the routes serve hands a repository to
from trt_spec.serving.server import Supervisor, TritonServer, require_engine_server
from trt_spec.serving.trtllm import check_engines, engine_models
from trt_spec.spec import load_spec

if TYPE_CHECKING:
    from trt_spec.serving.openai import OpenAIServer

OPENAI_EXTRA_HINT = "pip install 'trt-spec[openai]'"

# The clients' entry points, unloaded first on a drain; the models they call stay until the stop.
ENTRY_MODELS = (T.ENSEMBLE, T.BLS, T.TRTLLM_PREPROCESSING, T.TRTLLM_POSTPROCESSING)

Say = Callable[[str], None]  # takes one line of output


def serve_repository(options: ServeOptions, *, say: Say, ready: Say) -> None:
    """Run Triton on ``options.repo`` (and the OpenAI endpoint) until SIGTERM or SIGINT.

    ``say`` gets each status line for stderr (warnings, notes, the log's path, supervision events,
    the drain), flushed as it comes; ``ready`` the one line with the addresses, once every model
    is loaded. Returns after a stop by signal; the signal handlers are restored on the way out.

    Raises:
        ServerError: the OpenAI endpoint's libraries are missing, the server did not start, or
            supervision ended (the server exited, or its models crashed in a loop).
        TrtSpecError: the engine models or their engines cannot be served (names what to fix).
    """
    twin = None
    if options.emulate_spec is None:
        from trt_spec.repository.flavors import twin_route

        twin = twin_route(options.repo)  # a route whose own server is not Triton: served on the PyTorch twin
    if options.openai_port is not None or twin is not None:
        require_openai()
    if options.emulate_spec is None and twin is None:  # emulated: the emulator checks the engine models' configs
        engines = engine_models(options.repo)
        require_engine_server(options.repo, engines)
        compare_versions = not options.skip_version_check
        for warning in check_engines(engines, installed_versions(), compare_versions=compare_versions):
            say(f"warning: {warning}")
    run = _Foreground(say, ready)
    previous = {sig: signal.signal(sig, run.on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    workdir = None
    try:
        served = options.repo
        if options.emulate_spec is not None:
            from trt_spec.serving.emulation import emulated_models, emulated_repository

            workdir = Path(tempfile.mkdtemp(prefix="trt-spec-emulated-"))
            served = emulated_repository(served, load_spec(options.emulate_spec), workdir)
            say(
                f"note: {', '.join(emulated_models(served))}: the TensorRT-LLM engines are emulated on CPU "
                "(the spec's checkpoints in the backend emulator); engine directories, versions and orchestrator "
                "mode are not checked"
            )
        add_routes = None
        if twin is not None:
            from trt_spec.serving.llmapi_route import twin_serving

            workdir = Path(tempfile.mkdtemp(prefix="trt-spec-twin-"))
            serving = twin_serving(twin, options, workdir, say)
            served, options, add_routes = serving.repo, serving.options, serving.add_routes
        openai = None
        if options.openai_port is not None:
            name = options.openai_model_name or (
                load_spec(options.emulate_spec).name if options.emulate_spec else options.repo.resolve().name
            )
            openai = _OpenAIEndpoint(served, name, options.openai_host, options.openai_port, add_routes)
        log_path = options.log_file or default_log_file(options.repo)
        say(f"log: {log_path.resolve()}")
        run.serve(
            TritonServer(
                served,
                host=options.host,
                http_port=options.http_port,
                grpc_port=options.grpc_port,
                metrics_port=options.metrics_port,
                ready_timeout_s=options.ready_timeout_s,
                log_file=log_path,
                client_apis=options.client_apis,
            ),
            openai,
            drain_timeout_s=options.drain_timeout_s,
        )
    except _Stop:
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)


def default_log_file(repo: Path) -> Path:
    """Where Triton's log goes without --log-file: ``logs/`` beside the repository (the
    repository's parent directory), one file per run, named after the repository, the start time
    and this process; never removed by trt-spec."""
    repo = repo.resolve()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return repo.parent / "logs" / f"tritonserver-{repo.name}-{stamp}-{os.getpid()}.log"


def require_openai() -> None:
    """The OpenAI endpoint's libraries, checked before Triton starts.

    Raises:
        ServerError: fastapi or uvicorn is missing, naming the install command.
    """
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise ServerError(
            f"--openai-port needs {exc.name or 'fastapi and uvicorn'}, which is not installed: {OPENAI_EXTRA_HINT}"
        ) from None


class _OpenAIEndpoint:
    """What --openai-port starts once Triton is ready (the module is imported only then)."""

    def __init__(
        self, repo: Path, model_name: str, host: str, port: int, add_routes: Callable[[Any, Any], None] | None = None
    ):
        self.repo, self.model_name, self.host, self.port = repo, model_name, host, port
        self.add_routes = add_routes  # (app, triton): routes beyond the endpoint's own (a twin route's /metrics)

    def start(self, triton: TritonServer, drain_timeout_s: float) -> OpenAIServer:
        from trt_spec.serving.openai import OpenAIServer, tokenizer_dir_of

        server = OpenAIServer(
            triton.grpc_url,
            tokenizer_dir_of(self.repo),
            self.model_name,
            host=self.host,
            port=self.port,
            drain_timeout_s=max(drain_timeout_s, 1.0),
        )
        if self.add_routes is not None:
            self.add_routes(server.app, triton)
        return server.start()


class _Stop(BaseException):
    """Raised by the signal handler; not an Exception, so nothing on the way swallows it."""


class _Foreground:
    """One run of the server in the foreground: its status lines, and the signals that stop it."""

    def __init__(self, say: Say, ready: Say):
        self.say = say
        self.ready = ready
        # The server being served; a second SIGTERM/SIGINT while the first one's stop runs kills it at once.
        self.serving: list[TritonServer] = []
        self.signals: list[int] = []

    def on_signal(self, signum: int, frame: Any) -> None:
        self.signals.append(signum)
        if len(self.signals) == 1:
            raise _Stop()
        # A second signal: a bounded hard stop that still leaves no process or shared memory behind.
        for server in self.serving:
            server.kill()
        self.say("stopped hard (a second signal during the stop)")
        sys.stderr.flush()
        os._exit(1)

    def serve(
        self, server: TritonServer, openai: _OpenAIEndpoint | None = None, *, drain_timeout_s: float = 0.0
    ) -> None:
        """Start ``server`` (and the OpenAI endpoint) under a :class:`Supervisor`, print the ready
        line, and run until a signal (raises _Stop; requests in flight get ``drain_timeout_s`` to
        finish) or the end of supervision (the server exited, or its models crashed in a loop)."""
        endpoint = supervisor = None
        self.serving.append(server)
        try:
            server.start()
            supervisor = Supervisor(server, on_event=lambda message: self.say(f"supervisor: {message}")).start()
            ready = f"ready grpc={server.grpc_url} http={server.http_url} metrics={server.metrics_url}"
            if openai is not None:
                endpoint = openai.start(server, drain_timeout_s)
                ready += f" openai={endpoint.url}"
            self.ready(ready)
            failure = supervisor.wait()
            # Only a failure gets here: a signal raises _Stop out of wait().
            raise ServerError(failure or f"supervision of tritonserver ended (log: {server.log_path})")
        except _Stop:
            if drain_timeout_s > 0 and supervisor is not None:  # the server was up
                supervisor.stop(timeout_s=0)
                self.drain(server, endpoint, drain_timeout_s)
            raise
        finally:
            if supervisor is not None:
                supervisor.stop(timeout_s=0)  # no recovery from now on; the server's stop ends its calls
            if endpoint is not None:  # first: its open requests are cancelled while Triton still answers
                endpoint.stop()
            server.stop(keep_log=True)

    def drain(self, server: TritonServer, endpoint: OpenAIServer | None, timeout_s: float) -> None:
        """Refuse new requests at once (readiness off) and let those in flight finish, ``timeout_s`` at most."""
        self.say(f"draining: new requests are refused; those in flight have {timeout_s:g} s to finish")
        if endpoint is not None:
            endpoint.begin_stop()
        try:
            busy = server.drain(ENTRY_MODELS, timeout_s)
        except ServerError as exc:
            self.say(f"drain: {exc}; stopping")
            return
        if busy:
            self.say(f"drain: requests to {', '.join(busy)} still in flight after {timeout_s:g} s are cut")
