"""Installed package versions, read from package metadata (nothing is imported).

A TensorRT engine loads only with the TensorRT version that built it, and a TensorRT-LLM engine
only with the TensorRT-LLM version that built it, so both versions are recorded in each engine's
``manifest.json`` at build time and compared with this Python's at serving time. trt-spec builds
TensorRT engines with TensorRT-LLM's 1.2.x release line: later releases removed that path.
"""

from __future__ import annotations

from importlib import metadata

from packaging.version import InvalidVersion, Version

SUPPORTED_TRTLLM = "1.2."  # the TensorRT-LLM release line engines are built with (a version prefix)
# The first release of that line whose KV-cache manager does not corrupt blocks reused across a
# chunked context (enable_chunked_context with enable_kv_cache_reuse: the tensorrtllm flavor's
# configuration). The fix (nvbugs 6025177) is NVIDIA/TensorRT-LLM PR 12673, cherry-picked to
# release/1.2.1 by PR 12769; the 1.2.1 release note (PR 12825) lists "Fixed KV cache corruption".
MIN_TRTLLM = "1.2.1"
MIN_TRTLLM_REASON = (
    f"TensorRT-LLM {MIN_TRTLLM} fixed KV-cache corruption with chunked context and KV-cache block reuse, "
    "which trt-spec's engines run (NVIDIA/TensorRT-LLM PR 12769)"
)
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


def trtllm_version_problem(version: str) -> str | None:
    """Why TensorRT-LLM ``version`` cannot build or serve trt-spec's engines, or None when it can:
    it must be of the 1.2 line (later releases removed the TensorRT-engine path) and at least
    ``MIN_TRTLLM`` (a pre-release of 1.2.1 is before it)."""
    try:
        parsed = Version(version)
    except InvalidVersion:
        return f"tensorrt_llm {version!r} is not a version number"
    if not version.startswith(SUPPORTED_TRTLLM):
        return (
            f"tensorrt_llm {version} is not of the {SUPPORTED_TRTLLM}x release line, with which trt-spec builds "
            "TensorRT engines (later releases removed that path)"
        )
    if parsed < Version(MIN_TRTLLM):
        return f"tensorrt_llm {version} is older than {MIN_TRTLLM}: {MIN_TRTLLM_REASON}"
    return None


def installed_versions() -> dict[str, str | None]:
    """This Python's TensorRT-LLM and TensorRT versions under their manifest keys
    (``tensorrt_llm_version``, ``tensorrt_version``), None where the package is not installed."""
    return {key: package_version(*packages) for key, packages in VERSION_PACKAGES.items()}
