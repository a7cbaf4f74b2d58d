"""The engine build executor against a fake `trtllm-build` on PATH (no GPU needed)."""

import json
import os
import shlex
import stat
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import EXAMPLES

from trt_spec.cli import main
from trt_spec.engines import build as build_lib
from trt_spec.engines.build import Gpu, Toolchain, build_engines
from trt_spec.engines.manifest import read_manifest
from trt_spec.engines.versions import package_version
from trt_spec.errors import BuildStepFailed, CheckpointMissing, ToolchainMissing
from trt_spec.plan import make_plan
from trt_spec.spec import load_spec, parse_spec

HOPPER = Toolchain("1.2.1", "10.13.0", (Gpu("NVIDIA H100 80GB HBM3", "9.0", 81559),))

FAKE_TRTLLM_BUILD = textwrap.dedent(
    """\
    #!{python}
    # Records its argv, then writes what trtllm-build writes: config.json and rank<N>.engine.
    import json, os, sys
    argv = sys.argv[1:]
    with open(os.environ["FAKE_TRTLLM_RECORD"], "a") as record:
        record.write(json.dumps(argv) + "\\n")
    out = argv[argv.index("--output_dir") + 1]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "rank0.engine"), "wb") as engine:
        engine.write(b"not a real engine")
    print("[TRT-LLM] building... (fake)")
    if os.environ.get("FAKE_TRTLLM_FAIL"):
        print("out of memory (fake)", file=sys.stderr)
        sys.exit(3)
    with open(os.path.join(out, "config.json"), "w") as config:
        json.dump({{"build_config": {{"max_draft_len": 0}}}}, config)
    """
)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A project directory with the fake trtllm-build first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "trtllm-build"
    fake.write_text(FAKE_TRTLLM_BUILD.format(python=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_TRTLLM_RECORD", str(tmp_path / "argv.jsonl"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def fake_convert(spec, role, *, force=False, progress=None):
    """Stands in for trt-spec convert: writes a small TensorRT-LLM checkpoint."""
    out = Path(spec.paths.checkpoints) / spec.name / role / "trtllm"
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps({"architecture": "LlamaForCausalLM", "role": role}))
    (out / "rank0.safetensors").write_bytes(b"weights of " + role.encode())
    return None


def demo_plan():
    return make_plan(load_spec(EXAMPLES / "pystdlib-demo.yaml"))


def recorded(workdir):
    path = workdir / "argv.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_builds_both_engines_with_the_planned_argv_and_a_manifest(workdir):
    plan = demo_plan()
    results = build_engines(plan, HOPPER, convert=fake_convert)
    assert [(r.role, r.skipped) for r in results] == [("target", False), ("draft", False)]

    calls = recorded(workdir)
    assert len(calls) == 2
    for call, role in zip(calls, ("target", "draft")):
        planned = list(plan.engine(role).build_argv[1:])
        out = call.index("--output_dir") + 1
        # Same argv, except the output goes to a temporary sibling that is renamed afterwards.
        assert call[:out] + call[out + 1 :] == planned[:out] + planned[out + 1 :]
        assert Path(call[out]).parent == Path(planned[out]).parent
        assert Path(call[out]).name.startswith(f".{role}.partial-")

    target_dir = workdir / "engines" / "pystdlib" / "target"
    manifest = read_manifest(target_dir)
    assert manifest["role"] == "target"
    assert manifest["spec_hash"] == plan.spec.content_hash()
    assert manifest["argv"] == list(plan.target.build_argv)
    assert manifest["tensorrt_llm_version"] == "1.2.1" and manifest["tensorrt_version"] == "10.13.0"
    assert manifest["gpu"] == {"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "memory_mib": 81559}
    assert len(manifest["checkpoint_hash"]) == 64 and len(manifest["build_key"]) == 64
    assert manifest["engine_files"] == {"rank0.engine": len(b"not a real engine")}
    assert manifest["durations_s"]["build"] >= 0
    assert (target_dir / "rank0.engine").is_file() and (target_dir / "config.json").is_file()
    assert sorted(p.name for p in target_dir.parent.iterdir()) == ["draft", "target"]
    assert "[TRT-LLM] building" in (workdir / "checkpoints" / "pystdlib" / "logs" / "build-target.log").read_text()


def test_second_run_skips_and_force_rebuilds(workdir):
    plan = demo_plan()
    build_engines(plan, HOPPER, convert=fake_convert)
    again = build_engines(plan, HOPPER, convert=fake_convert)
    assert [r.skipped for r in again] == [True, True]
    assert len(recorded(workdir)) == 2
    forced = build_engines(plan, HOPPER, convert=fake_convert, force=True)
    assert [r.skipped for r in forced] == [False, False]
    assert len(recorded(workdir)) == 4


def test_changed_checkpoint_or_argv_rebuilds(workdir):
    plan = demo_plan()
    build_engines(plan, HOPPER, convert=fake_convert)

    def other_weights(spec, role, *, force=False, progress=None):
        fake_convert(spec, role)
        if role == "draft":
            (Path(spec.paths.checkpoints) / spec.name / role / "trtllm" / "rank0.safetensors").write_bytes(b"new")

    results = build_engines(plan, HOPPER, convert=other_weights)
    assert [(r.skipped, r.reason) for r in results] == [(True, "up to date"), (False, "inputs changed")]

    data = plan.spec.model_dump()
    data["engine"]["max_batch_size"] = 4
    bigger = make_plan(parse_spec(data, source_dir=EXAMPLES))
    assert [r.skipped for r in build_engines(bigger, HOPPER, convert=other_weights)] == [False, False]


def test_engine_for_another_compute_capability_is_not_reused(workdir):
    plan = demo_plan()
    build_engines(plan, HOPPER, convert=fake_convert)
    manifest_path = workdir / "engines" / "pystdlib" / "target" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["gpu"]["compute_capability"] = "8.0"
    manifest_path.write_text(json.dumps(manifest))
    results = build_engines(plan, HOPPER, convert=fake_convert)
    assert not results[0].skipped
    assert "built for compute capability 8.0" in results[0].reason
    assert read_manifest(manifest_path.parent)["gpu"]["compute_capability"] == "9.0"


def test_non_hopper_gpu_is_refused(workdir):
    ampere = Toolchain("1.2.1", "10.13.0", (Gpu("NVIDIA A100-SXM4-80GB", "8.0", 81920),))
    with pytest.raises(ToolchainMissing, match=r"A100.*compute capability 8.0.*sm_90"):
        build_engines(demo_plan(), ampere, convert=fake_convert)
    assert recorded(workdir) == []


def test_failed_build_leaves_no_half_engine_and_keeps_the_old_one(workdir, monkeypatch):
    plan = demo_plan()
    monkeypatch.setenv("FAKE_TRTLLM_FAIL", "1")
    with pytest.raises(BuildStepFailed) as raised:
        build_engines(plan, HOPPER, convert=fake_convert)
    error = raised.value
    assert error.step == "trtllm-build (target)" and error.returncode == 3
    assert "exit code 3" in str(error) and str(error.log_path) in str(error)
    assert "out of memory (fake)" in Path(error.log_path).read_text()
    engines = workdir / "engines" / "pystdlib"
    assert list(engines.iterdir()) == []  # no final dir, no partial leftovers

    monkeypatch.delenv("FAKE_TRTLLM_FAIL")
    build_engines(plan, HOPPER, convert=fake_convert)
    before = read_manifest(engines / "target")
    monkeypatch.setenv("FAKE_TRTLLM_FAIL", "1")
    with pytest.raises(BuildStepFailed):
        build_engines(plan, HOPPER, convert=fake_convert, force=True)
    assert read_manifest(engines / "target") == before
    assert sorted(p.name for p in engines.iterdir()) == ["draft", "target"]


def test_interrupted_build_leftovers_are_removed(workdir):
    plan = demo_plan()
    stale = workdir / "engines" / "pystdlib" / ".target.partial-99999"
    stale.mkdir(parents=True)
    (stale / "rank0.engine").write_bytes(b"half")
    build_engines(plan, HOPPER, convert=fake_convert)
    assert not stale.exists()


def test_missing_checkpoint_after_conversion(workdir):
    def converts_nothing(spec, role, *, force=False, progress=None):
        return None

    with pytest.raises(
        CheckpointMissing, match=r"target: no TensorRT-LLM checkpoint at checkpoints/pystdlib/target/trtllm"
    ):
        build_engines(demo_plan(), HOPPER, convert=converts_nothing)


def test_cli_build_without_toolchain_is_one_clear_line(workdir, monkeypatch):
    def missing():
        raise ToolchainMissing(
            "cannot build here: the tensorrt_llm package is not installed; `trt-spec build --dry-run` shows the commands"
        )

    monkeypatch.setattr(build_lib, "probe_toolchain", missing)
    result = CliRunner().invoke(main, ["build", "--spec", str(EXAMPLES / "pystdlib-demo.yaml")])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        "Error: cannot build here: the tensorrt_llm package is not installed; `trt-spec build --dry-run` shows the commands"
    ]
    assert recorded(workdir) == []


@pytest.mark.parametrize("installed", ["1.2.0", "1.2.1rc1", "1.3.0rc20", "1.1.0"])
def test_a_tensorrt_llm_that_cannot_build_is_refused_with_the_reason_and_fix(monkeypatch, installed):
    monkeypatch.setattr(
        build_lib, "installed_versions", lambda: {"tensorrt_llm_version": installed, "tensorrt_version": "10.13.0"}
    )
    with pytest.raises(ToolchainMissing) as caught:
        build_lib.probe_toolchain()
    message = str(caught.value)
    assert f"tensorrt_llm {installed}" in message and "tensorrt_llm==1.2.1" in message
    if installed.startswith("1.2."):
        assert "older than 1.2.1" in message and "KV-cache corruption" in message
    else:
        assert "not of the 1.2.x release line" in message


def test_real_probe_on_this_machine_names_what_is_missing():
    if package_version("tensorrt_llm") is not None:
        pytest.skip("tensorrt_llm is installed here")
    with pytest.raises(ToolchainMissing, match=r"tensorrt_llm package is not installed.*--dry-run"):
        build_lib.probe_toolchain()


def test_cli_dry_run_prints_the_commands(workdir):
    result = CliRunner().invoke(main, ["build", "--spec", str(EXAMPLES / "pystdlib-demo.yaml"), "--dry-run"])
    assert result.exit_code == 0, result.output
    plan = demo_plan()
    lines = result.output.splitlines()
    assert shlex.join(plan.target.build_argv) in lines
    assert shlex.join(plan.draft.build_argv) in lines
    assert recorded(workdir) == []


def test_cli_build_with_fake_toolchain(workdir, monkeypatch):
    monkeypatch.setattr(build_lib, "probe_toolchain", lambda: HOPPER)
    monkeypatch.setattr(build_lib, "convert_checkpoint", fake_convert)
    args = ["build", "--spec", str(EXAMPLES / "pystdlib-demo.yaml")]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    assert "target: built engines/pystdlib/target (no engine yet)" in first.output
    second = CliRunner().invoke(main, args)
    assert "target: kept engines/pystdlib/target (up to date)" in second.output


def test_build_converts_missing_checkpoints_with_the_real_converter(workdir):
    """No checkpoint yet: build runs trt-spec convert (ModelOpt, CPU) before trtllm-build."""
    plan = demo_plan()
    events = []
    results = build_engines(plan, HOPPER, on_event=events.append)
    assert [r.skipped for r in results] == [False, False]
    for role in ("target", "draft"):
        checkpoint = workdir / "checkpoints" / "pystdlib" / role / "trtllm"
        assert (checkpoint / "config.json").is_file() and (checkpoint / "rank0.safetensors").is_file()
        assert results[("target", "draft").index(role)].manifest["durations_s"]["convert"] > 0
    assert any("converting" in event for event in events)
    # Unchanged inputs: neither conversion nor compilation runs again.
    again = build_engines(plan, HOPPER, on_event=events.append)
    assert [r.skipped for r in again] == [True, True]
    assert len(recorded(workdir)) == 2
