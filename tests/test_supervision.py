"""Supervision of the real Triton server (the CPU build bundled in nvidia-pytriton) on the demo
pair's torch-flavor repository: a python model's process killed with SIGKILL (as the OOM killer
would) under load is noticed, readiness says not ready while the model is down, the requests in
flight get one error, and the service comes back on its own with the same greedy output. Each
crash prints its recovery time. The supervisor's decisions are also tested on a fake server.

Run alone: ``.venv/bin/python -m pytest -q -s tests/test_supervision.py`` (``-s`` shows the
measured times)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import EXAMPLES, http_status, stub_alive

from trt_spec.client import SpecClient
from trt_spec.errors import ServerError
from trt_spec.repository.writer import write_repository
from trt_spec.runtime import tensors as T
from trt_spec.serving.server import (
    RELOAD_TIMEOUT_S,
    Recovery,
    Stub,
    Supervisor,
    TritonServer,
    completes_configs,
    server_command,
)
from trt_spec.spec import load_spec

PROMPT = "def read_config(path):\n"
NEW_TOKENS = 24
RECOVERY_LIMIT_S = 30.0  # the figure: the service returns on its own within 30 s
# The loop model's recovery is a whole server restart: every model loads again, 10 s on an idle
# 2-core machine, up to ~45 s while other jobs share it.
RESTART_LIMIT_S = 120.0
DECOUPLED_MODELS = (T.LOOP, T.POSTPROCESSING)


# --- the supervisor's decisions, on a fake server (no Triton) -------------------------------------


@dataclass
class FakeServer:
    """What Supervisor uses of a TritonServer: stubs, states, reloads, restarts."""

    stubs_now: dict[int, Stub]
    states: dict[str, str] = field(default_factory=dict)
    decoupled: set[str] = field(default_factory=set)
    calls: list[str] = field(default_factory=list)
    process = None
    stopping = False
    log_path = "/nowhere.log"

    def stubs(self) -> dict[int, Stub]:
        return dict(self.stubs_now)

    def repository_index(self) -> dict[str, str]:
        return dict(self.states)

    def answers_from_a_sender(self, name: str) -> bool:
        return name in self.decoupled

    def model_progress(self) -> dict[str, tuple[float, float]]:
        return {}  # nothing ever waits: the hang check is tested on the real server

    def unload_model(self, name: str) -> None:
        self.calls.append(f"unload {name}")

    def load_model(self, name: str, timeout_s: float | None = None) -> None:
        self.calls.append(f"load {name}")
        self._respawn(name)

    def restart(self, reason: str) -> float:
        self.calls.append("restart")
        for name in {stub.model for stub in self.stubs_now.values()} | self.decoupled:
            self._respawn(name)
        return 0.0

    def _respawn(self, name: str) -> None:
        self.stubs_now = {pid: stub for pid, stub in self.stubs_now.items() if stub.model != name}
        pid = max(self.stubs_now, default=1000) + 1
        self.stubs_now[pid] = Stub(pid, name, f"{name}_0_0", f"region{pid}")


def _stub(pid: int, model: str) -> Stub:
    return Stub(pid, model, f"{model}_0_0", f"region{pid}")


def _fake(*models: str, decoupled: tuple[str, ...] = ()) -> FakeServer:
    stubs = {100 + index: _stub(100 + index, model) for index, model in enumerate(models)}
    return FakeServer(stubs, {model: "READY" for model in models}, set(decoupled))


def _until(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_a_dead_model_process_is_reloaded_and_reported_by_name():
    server = _fake(T.PREPROCESSING, T.TARGET)
    events: list[str] = []
    supervisor = Supervisor(server, on_event=events.append, interval_s=0.02).start()
    try:
        del server.stubs_now[101]  # the target's stub is gone
        _until(lambda: supervisor.recoveries)
    finally:
        supervisor.stop()
    assert server.calls == [f"unload {T.TARGET}", f"load {T.TARGET}"]
    assert [r.model for r in supervisor.recoveries] == [T.TARGET]
    assert supervisor.recoveries[0].action == "reload"
    assert events[0].startswith(f"model {T.TARGET}: its process {T.TARGET}_0_0 (pid 101) is gone; reloading")
    assert events[1].startswith(f"model {T.TARGET}: back after")
    assert supervisor.failure is None


def test_a_dead_decoupled_model_restarts_the_server():
    server = _fake(T.LOOP, T.TARGET, decoupled=(T.LOOP,))
    events: list[str] = []
    supervisor = Supervisor(server, on_event=events.append, interval_s=0.02).start()
    try:
        del server.stubs_now[100]
        _until(lambda: supervisor.recoveries)
    finally:
        supervisor.stop()
    assert server.calls == ["restart"]
    assert supervisor.recoveries[0].action == "restart"
    assert "restarting the server" in events[0] and "decoupled" in events[0]


def test_the_old_processes_of_a_reloaded_model_end_without_another_reload():
    # Under load Triton ends a reloaded model's old instances only once their requests are done,
    # seconds after the new ones serve: that is no death (CI once took it for one: a second reload
    # with the ensemble unavailable meanwhile, and the next test's request refused).
    server = _fake(T.PREPROCESSING, T.PREPROCESSING, T.TARGET)
    respawn = server._respawn

    def respawn_keeping_the_old(name: str) -> None:
        old = {pid: stub for pid, stub in server.stubs_now.items() if stub.model == name}
        respawn(name)
        server.stubs_now |= old

    server._respawn = respawn_keeping_the_old
    supervisor = Supervisor(server, interval_s=0.02).start()
    try:
        del server.stubs_now[100]  # one preprocessing instance killed; 101 still finishing requests
        _until(lambda: supervisor.recoveries)
        time.sleep(0.1)
        del server.stubs_now[101]  # its requests done, Triton ends it
        time.sleep(0.2)
        assert len(supervisor.recoveries) == 1
        del server.stubs_now[max(server.stubs_now)]  # a new instance killed: that is a death
        _until(lambda: len(supervisor.recoveries) == 2)
    finally:
        supervisor.stop()
    assert server.calls == [f"unload {T.PREPROCESSING}", f"load {T.PREPROCESSING}"] * 2


def test_a_model_unloaded_on_purpose_is_left_alone():
    server = _fake(T.PREPROCESSING, T.TARGET)
    events: list[str] = []
    supervisor = Supervisor(server, on_event=events.append, interval_s=0.02).start()
    try:
        server.states[T.TARGET] = "UNAVAILABLE"
        del server.stubs_now[101]
        _until(lambda: events)
        time.sleep(0.1)
    finally:
        supervisor.stop()
    assert server.calls == [] and supervisor.recoveries == []
    assert "not reloaded" in events[0]


def test_a_failed_reload_falls_back_to_a_restart():
    server = _fake(T.DRAFT)

    def failing_load(name: str, timeout_s: float | None = None) -> None:
        server.calls.append(f"load {name}")
        raise ServerError(f"POST /v2/repository/models/{name}/load: HTTP 400: failed to load")

    server.load_model = failing_load
    events: list[str] = []
    supervisor = Supervisor(server, on_event=events.append, interval_s=0.02).start()
    try:
        del server.stubs_now[100]
        _until(lambda: supervisor.recoveries)
    finally:
        supervisor.stop()
    assert server.calls == [f"unload {T.DRAFT}", f"load {T.DRAFT}", "restart"]
    assert any("reload failed" in event and "failed to load" in event for event in events)


def test_a_crash_loop_ends_supervision_with_the_reason():
    server = _fake(T.TARGET)
    supervisor = Supervisor(server, interval_s=0.02, max_recoveries=2, window_s=60)
    supervisor.recoveries = [Recovery(T.TARGET, "reload", time.monotonic(), 1.0) for _ in range(2)]
    supervisor.start()
    del server.stubs_now[100]
    assert "died 3 times in a row, each within 60 s of being brought back" in supervisor.wait()
    assert not supervisor.running and server.calls == []


def test_deaths_spaced_out_are_always_recovered():
    # A kill, an OOM or a hang now and then is not a crash loop: only deaths soon after a recovery count.
    server = _fake(T.TARGET)
    supervisor = Supervisor(server, interval_s=0.02, max_recoveries=2, window_s=60)
    long_ago = time.monotonic() - 3600
    supervisor.recoveries = [Recovery(T.TARGET, "reload", long_ago + 120 * i, 1.0) for i in range(10)]
    supervisor.start()
    try:
        del server.stubs_now[100]
        _until(lambda: len(supervisor.recoveries) == 11)
        assert supervisor.running and server.calls == [f"unload {T.TARGET}", f"load {T.TARGET}"]
    finally:
        supervisor.stop()


def test_triton_auto_completes_configs_only_for_a_model_that_asks(tmp_path):
    # Ours are complete: no auto-complete stub per model load (a restart's 15 s was 10 s without).
    for name, source in (("ours", "class TritonPythonModel:\n    pass\n"), ("upstream", HANGING_MODEL)):
        (tmp_path / "repo" / name / "1").mkdir(parents=True)
        (tmp_path / "repo" / name / "1" / "model.py").write_text(source)
        (tmp_path / "repo" / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n')
    assert not completes_configs(tmp_path / "repo")
    (tmp_path / "repo" / "upstream" / "1" / "model.py").write_text(
        "class TritonPythonModel:\n    @staticmethod\n    def auto_complete_config(config):\n        return config\n"
    )
    assert completes_configs(tmp_path / "repo")
    pytest.importorskip("pytriton")  # server_command sets up the bundled CPU server
    for repo, disabled in ((tmp_path / "repo", False), (tmp_path / "ours", True)):
        if disabled:
            shutil.copytree(tmp_path / "repo" / "ours", repo / "ours")
        command = server_command(repo, host="127.0.0.1", http_port=1, grpc_port=2, metrics_port=3)
        shutil.rmtree(command.workdir)
        assert ("--disable-auto-complete-config" in command.argv) == disabled


# --- the real server: kill -9 a model's process under load ---------------------------------------

needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("pytriton") is None, reason="the CPU Triton server comes with nvidia-pytriton"
)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("supervision")
    return write_repository(load_spec(EXAMPLES / "pystdlib-demo.yaml"), root / "repo", "torch").path


@pytest.fixture(scope="module")
def supervised(repo, tmp_path_factory):
    """One server for the module's crash tests, under a supervisor whose events are kept."""
    log = tmp_path_factory.mktemp("logs") / "triton.log"
    server = TritonServer(repo, ready_timeout_s=300, log_file=log).start()
    events: list[str] = []
    supervisor = Supervisor(server, on_event=events.append).start()
    try:
        yield server, supervisor, events
    finally:
        supervisor.stop(timeout_s=0)
        server.stop()


def generate_text(server: TritonServer, prompt: str = PROMPT) -> str:
    with SpecClient(server.grpc_url, timeout_s=60) as client:
        return "".join(event.text for event in client.generate(prompt, max_tokens=NEW_TOKENS))


def readiness(server: TritonServer) -> int:
    """HTTP status of /v2/health/ready; 0 when nothing answers (a restarting server)."""
    try:
        with urllib.request.urlopen(f"http://{server.http_url}/v2/health/ready", timeout=1) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


@dataclass
class Outcome:
    started: float
    ended: float
    error: str | None


class Load:
    """``workers`` threads streaming greedy requests back to back until stopped, each outcome
    kept with its times; and a poller of the server's readiness."""

    def __init__(self, server: TritonServer, workers: int = 2):
        self.server = server
        self.outcomes: list[Outcome] = []
        self.readiness: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._work, daemon=True) for _ in range(workers)]
        self._threads.append(threading.Thread(target=self._poll, daemon=True))

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=70)
        assert not any(thread.is_alive() for thread in self._threads), "a request hung"

    def _work(self) -> None:
        client = SpecClient(self.server.grpc_url, timeout_s=60)
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                for _ in client.generate(PROMPT, max_tokens=48):
                    pass
                error = None
            except Exception as exc:  # noqa: BLE001 - every failure is an outcome to look at
                error = f"{type(exc).__name__}: {exc}"
                client.close()
                client = SpecClient(self.server.grpc_url, timeout_s=60)
                time.sleep(0.1)
            self.outcomes.append(Outcome(started, time.monotonic(), error))
        client.close()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.readiness.append((time.monotonic(), readiness(self.server)))
            time.sleep(0.05)

    def successes_after(self, moment: float) -> list[Outcome]:
        return [o for o in self.outcomes if o.error is None and o.started > moment]

    def in_flight_at(self, moment: float) -> list[Outcome]:
        return [o for o in self.outcomes if o.started < moment < o.ended]


def _down_and_ready_again(readiness: list[tuple[float, int]], since: float) -> tuple[float | None, float | None]:
    """The first not-ready sample after ``since`` and the first ready one after it (None: not seen yet)."""
    samples = list(readiness)  # the poller appends meanwhile
    down = next((t for t, status in samples if t > since and status != 200), None)
    if down is None:
        return None, None
    return down, next((t for t, status in samples if t > down and status == 200), None)


@needs_triton
@pytest.mark.parametrize(
    ("model", "errors_in_flight"),
    [
        (T.TARGET, True),
        (T.DRAFT, True),
        (T.PREPROCESSING, False),  # quick: the requests in flight may be past it
        (T.POSTPROCESSING, False),  # decoupled (its probes get no response): the server is restarted
        (T.LOOP, True),  # decoupled: the server is restarted
    ],
)
def test_a_killed_model_process_comes_back_under_load(supervised, model, errors_in_flight):
    server, supervisor, events = supervised
    restarts = model in DECOUPLED_MODELS
    # A reload may fall back to a restart: the python backend can abort the whole server when a
    # request reaches a stub killed holding its shared-memory lock (server.RELOAD_TIMEOUT_S).
    wait = RESTART_LIMIT_S + (0 if restarts else RELOAD_TIMEOUT_S)
    before = generate_text(server)
    assert before
    done = len(supervisor.recoveries)
    with Load(server) as load:
        _until(lambda: len(load.successes_after(0)) >= 2, timeout_s=30)
        victim = next(stub for stub in server.stubs().values() if stub.model == model)
        killed = time.monotonic()
        os.kill(victim.pid, signal.SIGKILL)
        _until(lambda: len(supervisor.recoveries) > done, timeout_s=wait + 30)
        _until(lambda: load.successes_after(supervisor.recoveries[-1].detected_at), timeout_s=30)
        # Requests can succeed before readiness is back (preprocessing's other instance serves
        # them while the killed one reloads): keep polling until the poller has seen it back. From
        # the detection on: on a crowded machine a poll before it can time out (no answer in 1 s).
        detected = supervisor.recoveries[-1].detected_at
        _until(lambda: _down_and_ready_again(load.readiness, detected)[1] is not None, timeout_s=wait + 30)
    recovery = supervisor.recoveries[-1]
    served_again = min(o.ended for o in load.successes_after(recovery.detected_at))
    down, ready_again = _down_and_ready_again(load.readiness, recovery.detected_at)
    assert down is not None and ready_again is not None
    print(
        f"\n{model}: killed pid {victim.pid}; found dead after {recovery.detected_at - killed:.2f} s, "
        f"{recovery.action} took {recovery.seconds:.1f} s; ready again {ready_again - killed:.1f} s "
        f"and served again {served_again - killed:.1f} s after the kill"
    )
    assert recovery.model == model
    assert recovery.action == "restart" if restarts else recovery.action in ("reload", "restart")
    limit = RECOVERY_LIMIT_S if recovery.action == "reload" else wait
    if recovery.action == "restart" and not restarts:
        print(f"  {model}: the reload fell back to a server restart (the server aborted or hung)")
    assert served_again - killed < limit
    # Not ready while it was down (400 from the strict readiness; no answer during a restart),
    # from soon after the kill until the recovery.
    assert down - killed < 5 and ready_again >= recovery.detected_at + recovery.seconds - 1
    in_flight = load.in_flight_at(killed)
    assert all(o.ended - killed < 30 for o in in_flight)  # none hung
    if errors_in_flight:
        failed = [o.error for o in in_flight if o.error]
        assert failed, "a request in flight at the kill should have failed"
        print(f"  in flight at the kill: {len(in_flight)}, failed with: {failed[0][:120]}")
    assert any(event.startswith(f"model {model}: its process") for event in events)
    assert readiness(server) == 200
    assert generate_text(server) == before  # greedy: the same output after the recovery


@needs_triton
@pytest.mark.parametrize("model", [T.TARGET, T.DRAFT])
def test_a_stopped_engine_process_is_killed_and_recovered_under_load(supervised, model):
    # SIGSTOP: the stub is alive but answers nothing; Triton fails its requests ("Stub process ...
    # is not healthy") and calls the model ready. The supervisor kills it and recovers the model.
    server, supervisor, events = supervised
    before = generate_text(server)
    done = len(supervisor.recoveries)
    with Load(server) as load:
        _until(lambda: len(load.successes_after(0)) >= 2, timeout_s=30)
        [victim] = [stub for stub in server.stubs().values() if stub.model == model]
        stopped = time.monotonic()
        os.kill(victim.pid, signal.SIGSTOP)
        try:
            _until(lambda: len(supervisor.recoveries) > done, timeout_s=RELOAD_TIMEOUT_S + RESTART_LIMIT_S + 30)
        finally:
            try:
                os.kill(victim.pid, signal.SIGCONT)  # in case it was not killed
            except ProcessLookupError:
                pass
        _until(lambda: load.successes_after(supervisor.recoveries[-1].detected_at), timeout_s=30)
    recovery = supervisor.recoveries[-1]
    served_again = min(o.ended for o in load.successes_after(recovery.detected_at))
    down = min(t for t, status in load.readiness if t > stopped and status != 200)
    print(
        f"\n{model}: stopped pid {victim.pid}; not ready {down - stopped:.2f} s later; {recovery.action} took "
        f"{recovery.seconds:.1f} s; served again {served_again - stopped:.1f} s after the stop"
    )
    assert any(f"pid {victim.pid}) has been stopped for" in event for event in events)
    assert recovery.model == model
    assert down - stopped < 5  # not ready within 5 s
    assert served_again - stopped < 30 + (RESTART_LIMIT_S if recovery.action == "restart" else 0)
    assert readiness(server) == 200
    assert generate_text(server) == before


# --- a model that hangs without dying (a deadlock), on a server of its own ------------------------

# Waits forever (a deadlock) when sent WORK = -1, burns CPU for WORK seconds when sent a positive
# number (a long execution, which is not a hang), answers at once when sent 0.
HANGING_MODEL = """
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            work = float(pb_utils.get_input_tensor_by_name(request, "WORK").as_numpy().reshape(-1)[0])
            if work < 0:
                threading.Event().wait()
            end = time.monotonic() + work
            while time.monotonic() < end:
                pass
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("DONE", np.array([work], np.float32))]))
        return responses
"""
HANGING_CONFIG = """
name: "hanging"
backend: "python"
max_batch_size: 0
input [{ name: "WORK", data_type: TYPE_FP32, dims: [1] }]
output [{ name: "DONE", data_type: TYPE_FP32, dims: [1] }]
instance_group [{ count: 1, kind: KIND_CPU }]
"""


@pytest.fixture
def hanging(tmp_path):
    model = tmp_path / "repo" / "hanging"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(HANGING_MODEL)
    (model / "config.pbtxt").write_text(HANGING_CONFIG)
    server = TritonServer(tmp_path / "repo", ready_timeout_s=120, log_file=tmp_path / "triton.log").start()
    events: list[str] = []
    supervisor = Supervisor(server, on_event=events.append).start()
    try:
        yield server, supervisor, events
    finally:
        supervisor.stop(timeout_s=0)
        server.stop()


def _work(server: TritonServer, seconds: float, results: list) -> threading.Thread:
    """Send WORK = ``seconds`` to the hanging model in a thread; its outcome is appended to ``results``."""
    import numpy as np
    import tritonclient.http as httpclient

    def send() -> None:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
        tensor = httpclient.InferInput("WORK", [1], "FP32")
        tensor.set_data_from_numpy(np.array([seconds], np.float32))
        try:
            results.append(float(client.infer("hanging", [tensor]).as_numpy("DONE")[0]))
        except Exception as exc:  # noqa: BLE001 - the test reads the error
            results.append(str(exc))
        finally:
            client.close()

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


@needs_triton
def test_a_hung_model_is_killed_and_recovered_and_a_long_execution_is_not(hanging):
    server, supervisor, events = hanging
    # A long execution with requests waiting is not a hang: it burns CPU.
    busy: list = []
    threads = [_work(server, 8.0, busy), _work(server, 0.0, busy)]
    for thread in threads:
        thread.join(60)
    assert sorted(busy) == [0.0, 8.0], busy
    assert not supervisor.recoveries, events

    stuck: list = []
    _work(server, -1.0, stuck)  # deadlocked in execute from now on
    time.sleep(1.0)
    assert readiness(server) == 200  # Triton cannot tell: its process is alive
    waiting = time.monotonic()
    _work(server, 0.0, stuck)  # queued behind it
    _until(lambda: readiness(server) != 200, timeout_s=supervisor.hung_s + 10)
    not_ready = time.monotonic() - waiting
    _until(lambda: bool(supervisor.recoveries), timeout_s=RELOAD_TIMEOUT_S + RESTART_LIMIT_S)
    _until(lambda: readiness(server) == 200, timeout_s=30)
    served: list = []
    _work(server, 0.0, served).join(30)
    serving = time.monotonic() - waiting
    print(
        f"\nhung model: not ready {not_ready:.1f} s after a request queued behind the hang, "
        f"{supervisor.recoveries[0].action} took {supervisor.recoveries[0].seconds:.1f} s, serving {serving:.1f} s after"
    )
    assert served == [0.0]
    assert any("taking it for hung" in event for event in events), events
    assert not_ready < supervisor.hung_s + 2
    _until(lambda: len(stuck) == 2, timeout_s=30)  # both requests got an error, neither hangs on
    assert all(isinstance(outcome, str) for outcome in stuck), stuck


# --- hardened defaults and a bounded stop, on the same server ------------------------------------


RESTRICTED_URLS = [
    ("GET", "/v2/systemsharedmemory/status"),
    ("GET", "/v2/cudasharedmemory/status"),
    ("POST", "/v2/repository/index"),
    ("POST", f"/v2/repository/models/{T.TARGET}/unload"),
    ("GET", "/v2/logging"),
    ("GET", "/v2/trace/setting"),
]


@needs_triton
def test_restricted_apis_are_refused_to_a_plain_client(supervised):
    import tritonclient.grpc as grpcclient

    server, _, _ = supervised
    base = f"http://{server.http_url}"
    for method, path in RESTRICTED_URLS:
        assert http_status(base + path, method=method) == 403, path
    client = grpcclient.InferenceServerClient(server.grpc_url)
    for call in (client.get_system_shared_memory_status, client.get_log_settings, client.get_model_repository_index):
        with pytest.raises(grpcclient.InferenceServerException, match="restricted"):
            call()
    # What clients need stays open: health, metadata, config, statistics, inference.
    assert client.is_server_ready() and client.is_model_ready(T.ENSEMBLE)
    assert client.get_model_config(T.ENSEMBLE).config.name == T.ENSEMBLE
    assert client.get_inference_statistics(T.ENSEMBLE).model_stats
    # serve's own header opens them (the supervisor's reloads use it).
    assert http_status(base + "/v2/systemsharedmemory/status", headers=server.admin_headers) == 200
    assert http_status(base + "/v2/repository/index", method="POST", headers=server.admin_headers) == 200


@needs_triton
def test_stop_with_a_request_stuck_on_a_dead_process_is_quick_and_removes_only_its_shared_memory(
    supervised, repo, tmp_path
):
    """A second server on the same machine (the module's keeps running): its loop model's process
    is killed under a request, which then waits forever (Triton 2.51), as the stop would have
    (30 s before). The stop takes a few seconds, removes this server's shared memory and
    processes, keeps its log, and leaves the other server's regions alone."""
    other, _, _ = supervised
    log = tmp_path / "second.log"
    server = TritonServer(repo, ready_timeout_s=300, log_file=log).start()
    outcome: dict[str, object] = {}

    def request() -> None:
        try:
            with SpecClient(server.grpc_url, timeout_s=120) as client:
                for event in client.generate(PROMPT, max_tokens=400):
                    outcome.setdefault("first", event)
        except Exception as exc:  # noqa: BLE001
            outcome["error"] = exc

    stubs = server.stubs()
    regions = {stub.region for stub in stubs.values()}
    assert regions and all(region.startswith(server.shm_prefix) for region in regions)
    thread = threading.Thread(target=request, daemon=True)
    thread.start()
    _until(lambda: "first" in outcome, timeout_s=60)
    [loop] = [stub for stub in stubs.values() if stub.model == T.LOOP]
    os.kill(loop.pid, signal.SIGKILL)
    time.sleep(1.5)
    assert thread.is_alive()  # stuck: Triton never answers it
    started = time.monotonic()
    server.stop()
    took = time.monotonic() - started
    print(f"\nstop with a stuck request: {took:.2f} s")
    assert took < server.exit_timeout_s + 5
    thread.join(timeout=30)
    assert not thread.is_alive() and "error" in outcome  # the stuck request got an error at the stop
    assert not list(Path("/dev/shm").glob(f"{server.shm_prefix}*"))
    assert not [pid for pid in stubs if stub_alive(pid)]
    assert log.is_file() and "Started GRPCInferenceService" in log.read_text()
    # The other server's regions are untouched, and it still serves.
    assert {stub.region for stub in other.stubs().values()} <= {p.name for p in Path("/dev/shm").iterdir()}
    assert generate_text(other)
