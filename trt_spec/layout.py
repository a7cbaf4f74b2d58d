"""Where every file of a deployment lives. Pure path arithmetic.

- ``<paths.checkpoints>/<name>/lock.json``: the download lock file, each model's resolved commit;
- ``<paths.checkpoints>/<name>/<role>/trtllm/``: the converted TensorRT-LLM checkpoint, with ``manifest.json``;
- ``<paths.checkpoints>/<name>/logs/``: conversion and ``trtllm-build`` logs, one file per step;
- ``<paths.engines>/<name>/<role>/``: the compiled engine and its ``manifest.json``;
- ``<paths.model_repo>``: the Triton model repository.

``<role>`` is ``target`` or ``draft``. Hugging Face downloads go to the huggingface_hub cache
(``paths.hf_cache`` when set).
"""

from __future__ import annotations

from pathlib import Path

from trt_spec.spec import Spec


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
