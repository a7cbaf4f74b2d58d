"""The ``manifest.json`` written beside a converted checkpoint and a compiled engine, and the engine's build key.

A converted TensorRT-LLM checkpoint's manifest records its conversion inputs (source files, tp size,
dtype, converter and library versions); an engine's records its build key and what went into it
(``trtllm-build`` argv, checkpoint hash, TensorRT-LLM and TensorRT versions, GPU). Equal inputs
mean the directory in place is current and the step is skipped.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
MANIFEST_SCHEMA = 1  # of an engine's manifest
_PATH_FLAGS = ("--checkpoint_dir", "--output_dir")  # values that don't change the engine
_UNKEYED_FLAGS = ("--workers",)  # build parallelism, not engine content


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in the file ``path``; None when the file is absent, unreadable or holds no JSON object."""
    try:
        value = json.loads(Path(path).read_text())
    except (OSError, ValueError):  # ValueError: invalid JSON or text
        return None
    return value if isinstance(value, dict) else None


def read_manifest(directory: Path) -> dict[str, Any] | None:
    """``directory``'s ``manifest.json``; None when there is none (or it is unreadable)."""
    return read_json(Path(directory) / MANIFEST)


def build_key(
    argv: Sequence[str],
    checkpoint_hash: str,
    *,
    tensorrt_llm_version: str,
    tensorrt_version: str,
    compute_capability: str,
) -> str:
    """sha256 of everything that determines an engine's content: the ``trtllm-build`` argv without
    its paths and parallelism, the checkpoint's content hash, the tool versions and the GPU's compute
    capability."""
    keyed, skip_next = [], False
    for arg in argv:
        if skip_next:
            skip_next = False
            continue
        if arg in _PATH_FLAGS or arg in _UNKEYED_FLAGS:
            skip_next = True
            continue
        keyed.append(arg)
    inputs = {
        "argv": keyed,
        "checkpoint_hash": checkpoint_hash,
        "tensorrt_llm_version": tensorrt_llm_version,
        "tensorrt_version": tensorrt_version,
        "compute_capability": compute_capability,
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
