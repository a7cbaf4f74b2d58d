"""The model repository a deployment serves, written for the pod's mount points.

``trt-spec repo --engines-mount PATH`` already points the engine models' ``gpt_model_path`` at
the volume; the torch flavor's engine models name their Hugging Face checkpoints
(``hf_model_dir``) by this machine's paths, so those are pointed at ``<mount>/checkpoints/<role>``
here, where docs/deploy.md says to copy them.
"""

from __future__ import annotations

from pathlib import Path

from trt_spec.deploy.manifests import Deployment
from trt_spec.repository import configs
from trt_spec.repository.writer import RepositoryResult, hf_checkpoint_dir, write_repository
from trt_spec.spec import Spec

HF_MODEL_DIR = "hf_model_dir"


def write_mounted_repository(spec: Spec, deployment: Deployment, out_dir: str | Path, **kwargs) -> RepositoryResult:
    """``write_repository`` for ``deployment``'s pod: engines at ``deployment.engines_path``, the torch
    flavor's checkpoints at ``deployment.checkpoints_path``/<role>. ``kwargs`` go to ``write_repository``."""
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
    return result
