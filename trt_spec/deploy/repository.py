"""The model repository a deployment serves, written for the pod's mount points.

``trt-spec repo --engines-mount PATH`` already points the engine models' ``gpt_model_path`` at
the volume; the torch flavor's engine models name their Hugging Face checkpoints
(``hf_model_dir``) by this machine's paths, and so do the llmapi flavor's ``trtllm-serve.yaml``,
``trtllm-serve.sh`` and ``tensorrt_llm/1/model.yaml`` (the target and the draft), so those are
pointed at ``<mount>/checkpoints/<role>`` here, where docs/deploy.md says to copy them. The llmapi
files are written for the TensorRT-LLM release of the deployment's image.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trt_spec import atomic
from trt_spec.deploy.manifests import Deployment
from trt_spec.errors import RepositoryError
from trt_spec.plan import make_plan
from trt_spec.repository import configs, flavors, llm_args
from trt_spec.repository.flavors.llmapi import COMMAND_FILE, MODEL_YAML, OPTIONS_FILE, checkpoint
from trt_spec.repository.writer import RepositoryResult, hf_checkpoint_dir, write_repository
from trt_spec.spec import Spec

HF_MODEL_DIR = "hf_model_dir"
# trtllm-serve's Prometheus switch and its buffer (TorchLlmArgs / BaseLlmArgs upstream; see
# trt_spec.deploy.manifests.TRTLLM_QUEUE_SERIES): upstream keys a user adds to the options file for
# the autoscaling, outside trt_spec/repository/llm_args.py's table, so left out of its validation here.
PERF_METRICS_KEY = "return_perf_metrics"
PERF_KEYS = (PERF_METRICS_KEY, "perf_metrics_max_requests")
LLMAPI_FILES: dict[str, llm_args.Kind] = {OPTIONS_FILE: "options", MODEL_YAML: "model_yaml"}  # file -> llm_args kind
DRAFT_KEYS = ("speculative_model", "speculative_model_dir")


def write_mounted_repository(spec: Spec, deployment: Deployment, out_dir: str | Path, **kwargs) -> RepositoryResult:
    """``write_repository`` for ``deployment``'s pod: engines at ``deployment.engines_path``, the torch
    and llmapi flavors' checkpoints at ``deployment.checkpoints_path``/<role>, the llmapi files for the
    deployment's TensorRT-LLM release. ``kwargs`` go to ``write_repository``.

    Raises:
        RepositoryError: a rewritten llmapi file would not validate.
    """
    chosen = flavors.get(kwargs.get("flavor") or spec.triton.flavor)
    if chosen.takes_trtllm_version and deployment.trtllm_version:
        kwargs.setdefault("trtllm_version", deployment.trtllm_version)
    result = write_repository(spec, out_dir, engines_mount=deployment.engines_path, **kwargs)
    local: dict[str, str] = {}  # this machine's checkpoint directory -> its role; read only when needed
    for path in sorted(result.path.glob("*/config.pbtxt")):
        config = configs.read_config(path)
        parameter = config.parameters.get(HF_MODEL_DIR)
        if parameter is None or not parameter.string_value:
            continue
        local = local or {str(hf_checkpoint_dir(spec, role)): role for role in ("target", "draft")}
        role = local.get(parameter.string_value)
        if role is None:
            continue
        config.parameters[HF_MODEL_DIR].string_value = f"{deployment.checkpoints_path}/{role}"
        configs.write_config(config, result.path)  # atomic, file by file
    if (result.path / OPTIONS_FILE).is_file():
        _mount_llmapi_checkpoints(spec, deployment, result.path, kwargs.get("trtllm_version"))
    return result


def _mount_llmapi_checkpoints(spec: Spec, deployment: Deployment, repo: Path, version: str | None) -> None:
    """Point the llmapi files' target and draft at ``deployment.checkpoints_path``/<role>."""
    plan = make_plan(spec)
    mounted = {checkpoint(plan, role): f"{deployment.checkpoints_path}/{role}" for role in ("target", "draft")}
    line = llm_args.version_line(version or llm_args.DEFAULT_TRTLLM_VERSION)
    for name, kind in LLMAPI_FILES.items():
        path = repo / name
        text = path.read_text()
        header = "".join(line_ for line_ in text.splitlines(keepends=True) if line_.startswith("#"))
        data = yaml.safe_load(text)
        if data.get("model") in mounted:
            data["model"] = mounted[data["model"]]
        speculative = data.get("speculative_config") or {}
        for key in DRAFT_KEYS:
            if speculative.get(key) in mounted:
                speculative[key] = mounted[speculative[key]]
        llm_args.validate_options(data, line, kind)
        atomic.write_text(path, header + yaml.safe_dump(data, sort_keys=False, default_flow_style=False))
    command = repo / COMMAND_FILE
    text = command.read_text()
    for local, there in mounted.items():
        text = text.replace(shlex.quote(local), shlex.quote(there))
    atomic.write_text(command, text)
    command.chmod(0o755)


@dataclass(frozen=True)
class LlmapiFile:
    """One of a repository's LLM-API files (``trtllm-serve.yaml`` or the llmapi model's ``model.yaml``)."""

    name: str
    kind: llm_args.Kind  # "options" | "model_yaml"
    options: dict[str, Any]

    def problems(self, line: str) -> list[str]:
        """Why TensorRT-LLM ``line`` would refuse it (llm_args' table; the Prometheus keys aside)."""
        data = {key: value for key, value in self.options.items() if key not in PERF_KEYS}
        try:
            llm_args.validate_options(data, line, self.kind)
        except RepositoryError as exc:
            return [f"{exc} (the deployment's image carries TensorRT-LLM {llm_args.VERSION_LABELS[line]})"]
        return []

    def checkpoints(self) -> dict[str, str]:
        """The checkpoints it names, by key."""
        found = {"model": self.options["model"]} if isinstance(self.options.get("model"), str) else {}
        speculative = self.options.get("speculative_config") or {}
        for key in DRAFT_KEYS:
            if isinstance(speculative.get(key), str):
                found[f"speculative_config.{key}"] = speculative[key]
        return found


def llmapi_files(repo: str | Path) -> dict[str, LlmapiFile]:
    """The repository's LLM-API files, by name; {} when it has no ``trtllm-serve.yaml``.

    Raises:
        RepositoryError: one is not a YAML mapping.
    """
    repo = Path(repo)
    if not (repo / OPTIONS_FILE).is_file():
        return {}
    found = {}
    for name, kind in LLMAPI_FILES.items():
        path = repo / name
        if not path.is_file():
            continue
        data = yaml.safe_load(path.read_text())
        if not isinstance(data, dict):
            raise RepositoryError(f"{path}: not a YAML mapping")
        found[name] = LlmapiFile(name, kind, data)
    return found


def perf_metrics_enabled(repo: str | Path) -> bool:
    """Whether the repository's ``trtllm-serve.yaml`` sets ``return_perf_metrics: true`` (trtllm-serve
    then serves Prometheus metrics to scale on); False for a repository without one."""
    files = llmapi_files(repo)
    return OPTIONS_FILE in files and files[OPTIONS_FILE].options.get(PERF_METRICS_KEY) is True
