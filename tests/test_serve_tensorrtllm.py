"""`trt-spec serve` on a tensorrtllm-flavor repository, without a GPU: the engines' versions
against the runtime's (fabricated), the engine models' GPUs, and the orchestrator-mode launch
against a fake `mpirun` and `tritonserver` on PATH that record their argv and environment."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import EXAMPLES

from trt_spec.cli import main
from trt_spec.engines.versions import installed_versions
from trt_spec.errors import EngineNotFoundError, EngineVersionMismatch, RepositoryError, ServerError
from trt_spec.plan import make_plan
from trt_spec.repository import configs, flavors
from trt_spec.runtime import tensors as T
from trt_spec.serving import serve as orchestration
from trt_spec.serving.server import free_port, server_command
from trt_spec.serving.trtllm import EngineModel, check_engines, engine_models, orchestrator_command
from trt_spec.spec import load_spec

TRT_SPEC = str(Path(sys.executable).parent / "trt-spec")
BUILT_WITH = {"tensorrt_llm_version": "1.2.1", "tensorrt_version": "10.13.3.9"}

FAKE_MPIRUN = textwrap.dedent(
    """\
    #!{python}
    # Records its argv and the orchestrator variables, then runs the command after its options.
    import json, os, sys
    argv = sys.argv[1:]
    env = {{key: value for key, value in os.environ.items() if key.startswith("TRTLLM_")}}
    with open(os.environ["FAKE_RECORD"], "a") as record:
        record.write(json.dumps({{"tool": "mpirun", "argv": argv, "env": env}}) + "\\n")
    i = 0
    while argv[i].startswith("-"):
        i += 2 if argv[i] == "-n" else 1
    os.execv(argv[i], argv[i:])
    """
)

FAKE_TRITONSERVER = textwrap.dedent(
    """\
    #!{python}
    # Records its argv, then answers Triton's readiness probe (and nothing else) until SIGTERM.
    import json, os, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    argv = sys.argv[1:]
    with open(os.environ["FAKE_RECORD"], "a") as record:
        record.write(json.dumps({{"tool": "tritonserver", "argv": argv, "pid": os.getpid()}}) + "\\n")
    options = dict(arg[2:].split("=", 1) for arg in argv if arg.startswith("--") and "=" in arg)

    class Ready(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/v2/health/ready" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    HTTPServer((options["http-address"], int(options["http-port"])), Ready).serve_forever()
    """
)


def _install(bin_dir: Path, name: str, source: str) -> None:
    path = bin_dir / name
    path.write_text(source.format(python=sys.executable))
    path.chmod(0o755)


@pytest.fixture
def fake_bin(tmp_path, monkeypatch):
    """A directory first on PATH with fake `mpirun` and `tritonserver`; returns the record path."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _install(bin_dir, "mpirun", FAKE_MPIRUN)
    _install(bin_dir, "tritonserver", FAKE_TRITONSERVER)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    record = tmp_path / "record.jsonl"
    monkeypatch.setenv("FAKE_RECORD", str(record))
    return record


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _settings(tmp_path, monkeypatch, target_tp: int = 4) -> configs.RepositorySettings:
    """The 70B/1B example's tensorrtllm settings, engines mounted under tmp_path, target at ``target_tp``."""
    monkeypatch.chdir(tmp_path)
    settings = flavors.settings_from_plan(
        make_plan(load_spec(EXAMPLES / "llama70b-1b-4xh100.yaml")),
        flavor="tensorrtllm",
        engines_mount=tmp_path / "engines",
    )
    return dataclasses.replace(settings, target=dataclasses.replace(settings.target, tp_size=target_tp))


def _engine_repo(tmp_path, monkeypatch, *, target_tp: int = 4, manifest: dict | None = BUILT_WITH) -> Path:
    """A repository with the two engine models (and one python model), engines "built" beside it."""
    settings = _settings(tmp_path, monkeypatch, target_tp)
    repo = tmp_path / "repo"
    for role in ("target", "draft"):
        configs.write_config(flavors.engine_config(settings, role), repo)
        engine_dir = Path(settings.engine(role).engine_dir)
        engine_dir.mkdir(parents=True)
        if manifest is not None:
            (engine_dir / "manifest.json").write_text(json.dumps({"role": role, **manifest}))
    configs.write_config(configs.postprocessing_config(settings), repo)
    return repo


def _params(config) -> dict[str, str]:
    return {key: value.string_value for key, value in config.parameters.items()}


# --- the engine models' GPUs ------------------------------------------------------------------------


@pytest.mark.parametrize(("target_tp", "target_gpus"), [(1, "0"), (2, "0,1"), (4, "0,1,2,3")])
def test_target_ranks_take_gpus_from_0_and_the_tp1_draft_shares_gpu_0(tmp_path, monkeypatch, target_tp, target_gpus):
    settings = _settings(tmp_path, monkeypatch, target_tp)
    assert settings.draft.tp_size == 1
    target, draft = flavors.engine_config(settings, "target"), flavors.engine_config(settings, "draft")
    assert _params(target)["gpu_device_ids"] == target_gpus
    assert _params(draft)["gpu_device_ids"] == "0"  # beside target rank 0, where the memory plan puts it
    for config in (target, draft):
        # Orchestrator mode with spawned workers: no participant_ids, no fast logits.
        assert "participant_ids" not in _params(config)
        assert _params(config)["speculative_decoding_fast_logits"] == "false"
        assert [(group.count, group.kind) for group in config.instance_group] == [
            (1, config.instance_group[0].KIND_CPU)
        ]


def test_engine_models_are_read_from_the_written_configs(tmp_path, monkeypatch):
    repo = _engine_repo(tmp_path, monkeypatch)
    models = {model.name: model for model in engine_models(repo)}
    assert sorted(models) == [T.TARGET, T.DRAFT]  # postprocessing is a python model
    assert models[T.TARGET].engine_dir == tmp_path / "engines" / "llama70b-1b" / "target"
    assert models[T.TARGET].gpu_device_ids == (0, 1, 2, 3)
    assert models[T.DRAFT].gpu_device_ids == (0,)


def test_a_torch_flavor_repository_has_no_engine_models(tmp_path, monkeypatch):
    settings = dataclasses.replace(_settings(tmp_path, monkeypatch), flavor="torch")
    for config in flavors.model_configs(settings).values():
        configs.write_config(config, tmp_path / "repo")
    assert engine_models(tmp_path / "repo") == []


def test_a_bad_gpu_device_ids_is_named(tmp_path, monkeypatch):
    repo = _engine_repo(tmp_path, monkeypatch)
    path = repo / T.DRAFT / "config.pbtxt"
    path.write_text(path.read_text().replace('string_value: "0"\n', 'string_value: "${gpu_device_ids}"\n'))
    with pytest.raises(RepositoryError, match=r"gpu_device_ids .*'\$\{gpu_device_ids\}'"):
        engine_models(repo)


def test_an_engine_model_without_gpt_model_path_is_named(tmp_path, monkeypatch):
    repo = _engine_repo(tmp_path, monkeypatch)
    path = repo / T.TARGET / "config.pbtxt"
    path.write_text(path.read_text().replace('key: "gpt_model_path"', 'key: "engine_dir_unused"'))
    with pytest.raises(RepositoryError, match=r"tensorrt_llm/config.pbtxt: a tensorrtllm model without gpt_model_path"):
        engine_models(repo)


# --- engine versions against the runtime's -------------------------------------------------------------


def _models(tmp_path, manifest: dict | None = BUILT_WITH) -> list[EngineModel]:
    models = []
    for name, role in ((T.TARGET, "target"), (T.DRAFT, "draft")):
        engine_dir = tmp_path / "engines" / role
        engine_dir.mkdir(parents=True)
        if manifest is not None:
            (engine_dir / "manifest.json").write_text(json.dumps(manifest))
        models.append(EngineModel(name=name, engine_dir=engine_dir, gpu_device_ids=(0,)))
    return models


def test_engines_built_with_the_runtime_versions_pass(tmp_path):
    assert check_engines(_models(tmp_path), dict(BUILT_WITH)) == []


@pytest.mark.parametrize(
    ("key", "runtime_value", "label"),
    [
        ("tensorrt_llm_version", "1.2.2", "TensorRT-LLM"),
        ("tensorrt_version", "10.14.1.48", "TensorRT"),
    ],
)
def test_another_version_is_refused_naming_model_versions_and_fix(tmp_path, key, runtime_value, label):
    runtime = {**BUILT_WITH, key: runtime_value}
    with pytest.raises(EngineVersionMismatch) as caught:
        check_engines(_models(tmp_path), runtime)
    message = str(caught.value)
    assert isinstance(caught.value, RuntimeError)
    assert caught.value.model == T.TARGET and f"model {T.TARGET}:" in message
    assert f"{label} {BUILT_WITH[key]}" in message and f"{label} {runtime_value}" in message
    assert "make build-engines" in message and "trt-spec build --spec F" in message
    assert "\n" not in message
    assert caught.value.engine_versions[key] == BUILT_WITH[key] and caught.value.runtime_versions[key] == runtime_value


@pytest.mark.parametrize("built_with", ["1.2.0", "1.2.1rc2", "1.2.0rc8"])
def test_engines_built_before_1_2_1_are_refused_with_the_reason(tmp_path, built_with):
    engine = {**BUILT_WITH, "tensorrt_llm_version": built_with}
    models = _models(tmp_path, manifest=engine)
    with pytest.raises(EngineVersionMismatch) as caught:
        check_engines(models, dict(engine))  # the runtime that built them: the same release
    message = str(caught.value)
    assert f"TensorRT-LLM {built_with}" in message and "older than 1.2.1" in message
    assert "KV-cache corruption with chunked context" in message and "trt-spec build --spec F" in message


def test_a_missing_engine_dir_names_the_path_and_engines_mount(tmp_path):
    models = [EngineModel(name=T.TARGET, engine_dir=Path("/engines/llama70b-1b/target"), gpu_device_ids=(0,))]
    with pytest.raises(EngineNotFoundError) as caught:
        check_engines(models, dict(BUILT_WITH))
    assert isinstance(caught.value, FileNotFoundError)
    assert "/engines/llama70b-1b/target" in str(caught.value) and "--engines-mount" in str(caught.value)
    with pytest.raises(EngineNotFoundError):  # a path that is not here cannot be served, flag or not
        check_engines(models, dict(BUILT_WITH), compare_versions=False)


def test_a_missing_manifest_is_refused_unless_the_check_is_skipped(tmp_path):
    models = _models(tmp_path, manifest=None)
    with pytest.raises(EngineNotFoundError) as caught:
        check_engines(models, dict(BUILT_WITH))
    assert str(models[0].engine_dir / "manifest.json") in str(caught.value)
    assert "trt-spec build" in str(caught.value) and "--skip-version-check" in str(caught.value)
    assert check_engines(models, dict(BUILT_WITH), compare_versions=False) == []


def test_another_version_passes_when_the_check_is_skipped(tmp_path):
    assert check_engines(_models(tmp_path), {**BUILT_WITH, "tensorrt_version": "9.0"}, compare_versions=False) == []


def test_a_runtime_without_the_packages_gets_one_warning_naming_the_needed_versions(tmp_path):
    warnings = check_engines(_models(tmp_path), {"tensorrt_llm_version": None, "tensorrt_version": None})
    assert len(warnings) == 1
    assert "tensorrt_llm and tensorrt" in warnings[0]
    assert "TensorRT-LLM 1.2.1" in warnings[0] and "TensorRT 10.13.3.9" in warnings[0]


def test_a_known_half_of_the_runtime_is_still_compared(tmp_path):
    with pytest.raises(EngineVersionMismatch):
        check_engines(_models(tmp_path), {"tensorrt_llm_version": "1.2.2", "tensorrt_version": None})


# --- the launch ---------------------------------------------------------------------------------------


def test_orchestrator_command_runs_tritonserver_under_mpirun_with_its_gpu_pools_off():
    models = [EngineModel(T.TARGET, Path("/e/t"), (0, 1, 2, 3)), EngineModel(T.DRAFT, Path("/e/d"), (0,))]
    argv, env = orchestrator_command("/usr/bin/mpirun", ["tritonserver", "--model-repository=/r"], models, {"A": "1"})
    assert argv[:6] == ["/usr/bin/mpirun", "--allow-run-as-root", "-n", "1", "tritonserver", "--model-repository=/r"]
    assert {"--disable-auto-complete-config", "--pinned-memory-pool-byte-size=0", "--enable-peer-access=false"} <= set(
        argv
    )
    assert [arg for arg in argv if arg.startswith("--cuda-memory-pool-byte-size=")] == [
        f"--cuda-memory-pool-byte-size={gpu}:0" for gpu in range(8)
    ]
    assert env == {"A": "1", "TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1"}
    wide = [EngineModel(T.TARGET, Path("/e/t"), (8, 9))]
    assert "--cuda-memory-pool-byte-size=9:0" in orchestrator_command("mpirun", ["tritonserver"], wide, {})[0]


def test_server_command_for_engine_models_is_orchestrator_mode(tmp_path, monkeypatch, fake_bin):
    repo = _engine_repo(tmp_path, monkeypatch)
    monkeypatch.setenv("TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES", "0")  # a stray setting must not win
    command = server_command(repo, host="127.0.0.1", http_port=1, grpc_port=2, metrics_port=3)
    try:
        assert command.orchestrator and not command.bundled
        assert command.argv[:5] == [
            str(fake_bin.parent / "bin" / "mpirun"),
            "--allow-run-as-root",
            "-n",
            "1",
            str(fake_bin.parent / "bin" / "tritonserver"),
        ]
        assert f"--model-repository={repo.resolve()}" in command.argv
        assert "--backend-directory" not in " ".join(command.argv)  # the container's own backends
        assert command.env["TRTLLM_ORCHESTRATOR"] == "1"
        assert command.env["TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES"] == "1"
    finally:
        command.workdir.rmdir()


def test_server_command_without_engine_models_is_unchanged(tmp_path, monkeypatch, fake_bin):
    settings = dataclasses.replace(_settings(tmp_path, monkeypatch), flavor="torch")
    for config in flavors.model_configs(settings).values():
        configs.write_config(config, tmp_path / "repo")
    monkeypatch.delenv("TRTLLM_ORCHESTRATOR", raising=False)
    command = server_command(tmp_path / "repo", host="127.0.0.1", http_port=1, grpc_port=2, metrics_port=3)
    command.workdir.rmdir()
    assert not command.orchestrator
    assert command.argv[0] == str(fake_bin.parent / "bin" / "tritonserver")
    assert "mpirun" not in " ".join(command.argv) and "TRTLLM_ORCHESTRATOR" not in command.env


def test_engine_models_without_tritonserver_on_path_get_one_clear_error(tmp_path, monkeypatch):
    repo = _engine_repo(tmp_path, monkeypatch)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ServerError, match=r"tensorrt_llm, tensorrt_llm_draft.*tritonserver.*--flavor torch"):
        server_command(repo, host="127.0.0.1", http_port=1, grpc_port=2, metrics_port=3)


def test_engine_models_without_mpirun_get_one_clear_error(tmp_path, monkeypatch, fake_bin):
    repo = _engine_repo(tmp_path, monkeypatch)
    (fake_bin.parent / "bin" / "mpirun").unlink()
    monkeypatch.setenv("PATH", str(fake_bin.parent / "bin"))
    with pytest.raises(ServerError, match=r"`mpirun` is not on PATH"):
        server_command(repo, host="127.0.0.1", http_port=1, grpc_port=2, metrics_port=3)


# --- the CLI --------------------------------------------------------------------------------------------


def test_cli_refuses_engines_of_another_version_before_starting_anything(tmp_path, monkeypatch, fake_bin):
    repo = _engine_repo(tmp_path, monkeypatch)
    monkeypatch.setattr(orchestration, "installed_versions", lambda: {**BUILT_WITH, "tensorrt_llm_version": "1.2.2"})
    result = CliRunner().invoke(main, ["serve", "--repo", str(repo)])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: model {T.TARGET}:")
    assert "TensorRT-LLM 1.2.1" in lines[0] and "TensorRT-LLM 1.2.2" in lines[0]
    assert _records(fake_bin) == []  # nothing was launched


def test_cli_skip_version_check_starts_with_other_versions(tmp_path, monkeypatch, fake_bin):
    """With the flag the check gives way; the server start then fails on purpose (a port is taken)."""
    repo = _engine_repo(tmp_path, monkeypatch, manifest=None)
    monkeypatch.setattr(orchestration, "installed_versions", lambda: dict(BUILT_WITH))
    refused = CliRunner().invoke(main, ["serve", "--repo", str(repo)])
    assert refused.exit_code == 1 and "manifest.json is missing" in refused.output
    monkeypatch.setattr(orchestration, "TritonServer", _NoServer)
    started = CliRunner().invoke(main, ["serve", "--repo", str(repo), "--skip-version-check"])
    assert started.exit_code == 1 and "no server in this test" in started.output


class _NoServer:
    def __init__(self, *args, **kwargs):
        pass

    def start(self):
        raise ServerError("no server in this test")

    def stop(self, **kwargs):
        pass


def test_cli_serves_engine_models_in_orchestrator_mode(tmp_path, monkeypatch, fake_bin):
    """The real `trt-spec serve` against the fakes: argv and environment as launched, the `ready`
    line, the warning that this Python has no tensorrt_llm to compare with, and a clean stop."""
    repo = _engine_repo(tmp_path, monkeypatch)
    ports = {"grpc": free_port(), "http": free_port(), "metrics": free_port()}
    process = subprocess.Popen(
        [
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
            "60",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = process.stdout.readline()
        assert line.startswith("ready "), (line, process.stderr.read() if process.poll() is not None else "")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        stderr = process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    if all(version is None for version in installed_versions().values()):
        assert "warning: cannot compare the engines' versions" in stderr and "TensorRT-LLM 1.2.1" in stderr
    mpirun, tritonserver = _records(fake_bin)
    assert mpirun["tool"] == "mpirun" and tritonserver["tool"] == "tritonserver"
    assert mpirun["argv"][:4] == ["--allow-run-as-root", "-n", "1", str(fake_bin.parent / "bin" / "tritonserver")]
    assert mpirun["env"]["TRTLLM_ORCHESTRATOR"] == "1" and mpirun["env"]["TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES"] == "1"
    argv = tritonserver["argv"]
    assert f"--model-repository={repo.resolve()}" in argv
    assert f"--grpc-port={ports['grpc']}" in argv and f"--http-port={ports['http']}" in argv
    assert {
        "--disable-auto-complete-config",
        "--pinned-memory-pool-byte-size=0",
        "--enable-peer-access=false",
        "--cuda-memory-pool-byte-size=0:0",
        "--cuda-memory-pool-byte-size=3:0",
    } <= set(argv)
    assert not Path(f"/proc/{tritonserver['pid']}").exists() or _is_zombie(tritonserver["pid"])


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_serving_reads_the_parameters_the_writer_names():
    from dataclasses import fields

    from trt_spec.runtime.parameters import TrtllmEngineParameters
    from trt_spec.serving import trtllm

    assert {trtllm.MODEL_PATH_KEY, trtllm.DEVICE_IDS_KEY} <= {field.name for field in fields(TrtllmEngineParameters)}
