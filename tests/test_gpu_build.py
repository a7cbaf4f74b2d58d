"""A real engine build of a tiny pair: runs only where tensorrt_llm and a CUDA GPU exist."""

import json

import pytest
from conftest import DEMO_PAIR

from trt_spec.engines.build import build_engines, probe_toolchain
from trt_spec.engines.manifest import read_manifest
from trt_spec.plan import make_plan
from trt_spec.spec import parse_spec

pytestmark = pytest.mark.gpu


def test_build_demo_pair_engines(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = parse_spec(
        {
            "name": "tiny",
            "target": {"model": str(DEMO_PAIR / "target")},
            "draft": {"model": str(DEMO_PAIR / "draft")},
            "speculative": {"num_draft_tokens": 4},
            "engine": {"max_batch_size": 4, "max_input_len": 256, "max_seq_len": 512},
        }
    )
    plan = make_plan(spec)
    toolchain = probe_toolchain()
    results = build_engines(plan, toolchain)
    assert [r.skipped for r in results] == [False, False]
    for role in ("target", "draft"):
        engine_dir = tmp_path / "engines" / "tiny" / role
        assert (engine_dir / "rank0.engine").stat().st_size > 0
        config = json.loads((engine_dir / "config.json").read_text())
        assert config["build_config"]["max_batch_size"] == 4
        assert read_manifest(engine_dir)["gpu"]["compute_capability"] == "9.0"
    target_config = json.loads((tmp_path / "engines" / "tiny" / "target" / "config.json").read_text())
    assert target_config["build_config"]["max_draft_len"] == 4
    assert [r.skipped for r in build_engines(plan, toolchain)] == [True, True]
