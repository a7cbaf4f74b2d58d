"""Every error trt-spec raises on purpose.

Each one carries a complete, one-line message: what is wrong (naming the offending value) and
the next step. The CLI maps them once (``trt_spec.cli``); library code never prints.
Where a builtin fits, the error subclasses it too, so callers can catch either.
"""

from __future__ import annotations

from pathlib import Path

# The errors code inside a Triton model can raise live in the runtime package (the only code a
# model repository carries); re-exported here so that callers find every error in one module.
from trt_spec.runtime.errors import GenerationParamsError as GenerationParamsError
from trt_spec.runtime.errors import ModelParametersError as ModelParametersError
from trt_spec.runtime.errors import TrtSpecError as TrtSpecError


class SpecError(TrtSpecError, ValueError):
    """The spec file is missing, unparsable, or has a bad value.

    ``key_path`` is the dotted path of the offending key (``speculative.num_draft_tokens``),
    or ``None`` when the problem is the file itself.
    """

    def __init__(self, message: str, *, key_path: str | None = None, path: Path | None = None):
        where = f"{path}: " if path else ""
        super().__init__(f"{where}{message}")
        self.key_path = key_path
        self.path = path


class ModelConfigError(TrtSpecError, FileNotFoundError):
    """A model's ``config.json`` cannot be found or read."""

    def __init__(self, message: str, *, model: str):
        super().__init__(message)
        self.model = model


class PlanError(TrtSpecError, ValueError):
    """The spec is valid but cannot be deployed as asked (e.g. it does not fit in GPU memory)."""


class ToolchainMissing(TrtSpecError, RuntimeError):
    """TensorRT-LLM, ``trtllm-build`` or a CUDA GPU is not available here."""


class BuildStepFailed(TrtSpecError, RuntimeError):
    """One step of an engine build (conversion or ``trtllm-build``) exited non-zero."""

    def __init__(self, step: str, returncode: int, log_path: Path, *, detail: str | None = None):
        what = detail or f"failed with exit code {returncode}"
        super().__init__(f"{step} {what}; see the log: {log_path}")
        self.step = step
        self.returncode = returncode
        self.log_path = log_path


class CheckpointMissing(TrtSpecError, FileNotFoundError):
    """A converted TensorRT-LLM checkpoint that a build needs is not there."""


class HubError(TrtSpecError):
    """Base of the download errors; ``repo_id`` names the Hugging Face repo concerned."""

    def __init__(self, message: str, *, repo_id: str):
        super().__init__(message)
        self.repo_id = repo_id


class GatedRepoError(HubError, PermissionError):
    """The repo is gated (or private) and the token in use has no access to it."""


class RepoNotFoundError(HubError, FileNotFoundError):
    """No such repo on the Hub, or no such revision (branch, tag or commit) in it."""


class HubUnreachableError(HubError, ConnectionError):
    """The Hub cannot be reached (no network, or offline mode) and no complete cached copy exists."""


class NotDownloadedError(HubError, FileNotFoundError):
    """A Hub model has not been fetched by ``trt-spec download`` at the spec's revision."""


class IncompleteSnapshotError(HubError, FileNotFoundError):
    """A snapshot lacks files a conversion needs (e.g. an interrupted download, or no safetensors)."""


class DiskFullError(HubError, OSError):
    """The disk filled up while downloading."""


class ConversionFailed(TrtSpecError, RuntimeError):
    """HF -> TensorRT-LLM conversion of one model failed; ``log_path`` has the details."""

    def __init__(self, message: str, *, role: str, log_path: Path | None):
        super().__init__(message)
        self.role = role
        self.log_path = log_path


class ServerError(TrtSpecError, RuntimeError):
    """The Triton server could not be started, or failed while loading the repository."""


class PairMismatch(TrtSpecError, ValueError):
    """The draft and target cannot run as a pair (e.g. their vocabularies differ in size)."""


class EngineMismatchError(TrtSpecError, ValueError):
    """A built engine disagrees with the spec a Triton repository is generated from.

    ``role`` is ``target`` or ``draft``; ``key`` the engine ``config.json`` field; ``engine_value``
    and ``spec_value`` the two values that disagree.
    """

    def __init__(self, message: str, *, role: str, key: str, engine_value: object, spec_value: object):
        super().__init__(message)
        self.role = role
        self.key = key
        self.engine_value = engine_value
        self.spec_value = spec_value


class EngineNotFoundError(TrtSpecError, FileNotFoundError):
    """A served model's engine directory (its ``gpt_model_path``), or the ``manifest.json`` in it,
    is not there. ``model`` names the Triton model, ``path`` the missing path."""

    def __init__(self, message: str, *, model: str, path: Path):
        super().__init__(message)
        self.model = model
        self.path = path


class EngineVersionMismatch(TrtSpecError, RuntimeError):
    """An engine was built with other TensorRT-LLM or TensorRT versions than the serving runtime's.

    ``model`` names the Triton model; ``engine_versions`` and ``runtime_versions`` map the
    manifest keys (``tensorrt_llm_version``, ``tensorrt_version``) to the two sides' versions.
    """

    def __init__(
        self,
        message: str,
        *,
        model: str,
        engine_versions: dict[str, str | None],
        runtime_versions: dict[str, str | None],
    ):
        super().__init__(message)
        self.model = model
        self.engine_versions = engine_versions
        self.runtime_versions = runtime_versions


class RepositoryError(TrtSpecError, ValueError):
    """A Triton model repository cannot be generated (e.g. a config does not validate, or the
    tokenizer files are missing)."""


class ServerUnreachable(TrtSpecError, ConnectionError):
    """No Triton server answers at the given address."""


class GenerationError(TrtSpecError, RuntimeError):
    """The server refused or failed a generation request; the message is the server's one line."""
