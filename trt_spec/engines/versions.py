"""Installed package versions, read from package metadata (nothing is imported).

A TensorRT engine loads only with the TensorRT version that built it, and a TensorRT-LLM engine
only with the TensorRT-LLM version that built it, so both versions are recorded in each engine's
``manifest.json`` at build time and compared with this Python's at serving time. trt-spec builds
TensorRT engines with TensorRT-LLM's 1.2.x release line: later releases removed that path.
"""

from __future__ import annotations

from importlib import metadata

SUPPORTED_TRTLLM = "1.2."  # the TensorRT-LLM release line engines are built with (a version prefix)
# TensorRT's version: the meta package, or the CUDA-specific wheel where only that is installed.
TENSORRT_PACKAGES = ("tensorrt", "tensorrt_cu12", "tensorrt_cu13")
# Manifest key: the packages its version is read from, the first installed one wins.
VERSION_PACKAGES = {"tensorrt_llm_version": ("tensorrt_llm",), "tensorrt_version": TENSORRT_PACKAGES}


def package_version(*names: str) -> str | None:
    """The installed version of the first of ``names`` that is installed in this Python; None if none is."""
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def installed_versions() -> dict[str, str | None]:
    """This Python's TensorRT-LLM and TensorRT versions under their manifest keys
    (``tensorrt_llm_version``, ``tensorrt_version``), None where the package is not installed."""
    return {key: package_version(*packages) for key, packages in VERSION_PACKAGES.items()}
