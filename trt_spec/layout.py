"""Where every file of a deployment lives (DESIGN.md, "Where files go"). Pure path arithmetic."""

from __future__ import annotations

from pathlib import Path

from trt_spec.spec import Spec

ROLES = ("target", "draft")


def checkpoints_dir(spec: Spec) -> Path:
    """``<checkpoints>/<name>``: downloads lock file, converted checkpoints, build logs."""
    return Path(spec.paths.checkpoints) / spec.name


def lock_path(spec: Spec) -> Path:
    """The download lock file: the resolved commit of each model."""
    return checkpoints_dir(spec) / "lock.json"


def trtllm_checkpoint_dir(spec: Spec, role: str) -> Path:
    """The converted TensorRT-LLM checkpoint (``config.json``, ``rank<N>.safetensors``)."""
    return checkpoints_dir(spec) / role / "trtllm"


def logs_dir(spec: Spec) -> Path:
    """Long tool output (conversion, ``trtllm-build``) goes here, one file per step."""
    return checkpoints_dir(spec) / "logs"


def engine_dir(spec: Spec, role: str) -> Path:
    """``<engines>/<name>/<role>``: the compiled engine and its ``manifest.json`` only."""
    return Path(spec.paths.engines) / spec.name / role


def model_repo_dir(spec: Spec) -> Path:
    return Path(spec.paths.model_repo)
