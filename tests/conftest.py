"""Shared fixtures: every test runs with a private HF cache and no network."""

from __future__ import annotations

from pathlib import Path

import pytest

import trt_spec.errors  # noqa: F401  (import early: fail fast if the package is broken)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
DEMO_PAIR = EXAMPLES / "pystdlib-pair"


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory, monkeypatch):
    """Keep tests off the user's HF cache and off any network."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HF_HOME", str(home / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("TRT_SPEC_DEBUG", raising=False)


def gpu_available() -> bool:
    """tensorrt_llm importable and a CUDA GPU present: the condition for `gpu` tests."""
    try:
        import tensorrt_llm  # noqa: F401
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs tensorrt_llm and a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
