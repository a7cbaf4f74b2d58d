"""What serving a repository's TensorRT-LLM engine models takes: finding them, checking that this
runtime can load their engines, and launching Triton in the backend's orchestrator mode.

**Versions.** A TensorRT engine is only guaranteed to load with the TensorRT version that built
it, and a TensorRT-LLM engine with the TensorRT-LLM version that built it. So serving requires
both to equal the versions in the engine's ``manifest.json`` (written by ``trt-spec build``),
compared with this Python's installed ``tensorrt_llm`` and ``tensorrt`` packages
(:func:`trt_spec.engines.versions.installed_versions`): in NVIDIA's containers those come from
the same release as the C++ backend that loads the engines.

**Orchestrator mode.** TensorRT-LLM 1.2.x's C++ Triton backend runs a multi-GPU (TP > 1) engine
over MPI. In its default (leader) mode every MPI rank is a Triton process that loads every
TensorRT-LLM model with that rank, so a TP-4 target cannot sit beside a TP-1 draft. In
orchestrator mode the one Triton process starts each model's ranks itself as separate
``trtllmExecutorWorker`` processes (``MPI_Comm_spawn``) on the model's ``gpu_device_ids`` and
relays requests to them; that is how TensorRT-LLM's draft-target Triton recipe serves a target
and a draft in one server. Facts this module relies on, from NVIDIA/TensorRT-LLM:

- ``triton_backend/inflight_batcher_llm/src/model_instance_state.cc``: a non-zero
  ``TRTLLM_ORCHESTRATOR`` selects orchestrator mode and initialises MPI;
  ``TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES`` unset or non-zero spawns the workers, and only when
  it is 0 must each model name its pre-started ranks in ``participant_ids``;
  ``speculative_decoding_fast_logits`` needs spawning off (so we leave it off).
- ``triton_backend/inflight_batcher_llm/src/model_state.cc``: ``gpu_device_ids`` is
  comma-separated devices per instance (rank r on the r-th), ``;`` between instances; the worker
  executable is the ``executor_worker_path`` parameter, by default
  ``/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker`` (NVIDIA's containers).
- ``triton_backend/scripts/launch_triton_server.py --multi-model`` (world size 1): sets
  ``TRTLLM_ORCHESTRATOR=1`` and ``TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES=1``, runs
  ``mpirun --allow-run-as-root -n 1 tritonserver ... --disable-auto-complete-config``, and, with
  spawned workers, ``--pinned-memory-pool-byte-size=0 --enable-peer-access=false`` and a zero
  ``--cuda-memory-pool-byte-size`` on every GPU, so the Triton process itself takes no GPU memory.
- ``examples/draft_target_model/README.md`` (Triton workflow): ``--multi-model`` is needed when
  an engine uses TP; draft and target may share a GPU.

Its per-rank ``--backend-config=python,shm-region-prefix-name=prefix<rank>_`` is left out: with
one Triton process there is nothing to keep apart, and the default prefix is what
:mod:`trt_spec.serving.server` cleans up after.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format

from trt_spec.engines.manifest import MANIFEST, read_manifest
from trt_spec.engines.versions import MIN_TRTLLM, VERSION_PACKAGES, trtllm_version_problem
from trt_spec.errors import EngineNotFoundError, EngineVersionMismatch, RepositoryError
from trt_spec.repository.configs import read_config

BACKEND = "tensorrtllm"
# The two parameters serving reads of an engine model's config (fields of
# trt_spec.runtime.parameters.TrtllmEngineParameters, which writes them; a test holds them equal).
# Read by key, not through TrtllmEngineParameters.from_config: a hand-edited config may carry more.
MODEL_PATH_KEY = "gpt_model_path"
DEVICE_IDS_KEY = "gpu_device_ids"
VERSION_KEYS = {"tensorrt_llm_version": "TensorRT-LLM", "tensorrt_version": "TensorRT"}  # manifest key: name
ORCHESTRATOR_ENV = {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1"}
# GPUs whose Triton memory pools are zeroed: a whole 8-GPU node, more if a config names more.
# Triton ignores pool sizes given for devices it does not have (core src/cuda_memory_manager.cc).
NODE_GPUS = 8


@dataclass(frozen=True)
class EngineModel:
    """A model of the repository on TensorRT-LLM's C++ backend."""

    name: str
    engine_dir: Path  # gpt_model_path: where the server reads the engine
    gpu_device_ids: tuple[int, ...]  # every device its instances use; empty: the backend chooses


def engine_models(repo: str | Path) -> list[EngineModel]:
    """The repository's ``backend: "tensorrtllm"`` models, by name.

    Raises:
        RepositoryError: a ``config.pbtxt`` does not parse, or an engine model has no
            ``gpt_model_path`` or a ``gpu_device_ids`` that is not device numbers (names the file).
    """
    models = []
    for path in sorted(Path(repo).glob("*/config.pbtxt")):
        try:
            # Unknown fields are the server's business (a newer Triton may know them), not ours.
            config = read_config(path, allow_unknown_fields=True)
        except (OSError, text_format.ParseError) as exc:
            raise RepositoryError(
                f"cannot read {path}: {exc}; rewrite the repository with `trt-spec repo --spec F`"
            ) from None
        if config.backend != BACKEND:
            continue
        parameters = {key: value.string_value for key, value in config.parameters.items()}
        if not parameters.get(MODEL_PATH_KEY):
            raise RepositoryError(
                f"{path}: a tensorrtllm model without gpt_model_path; rewrite the repository with `trt-spec repo --spec F`"
            )
        devices = parameters.get(DEVICE_IDS_KEY, "")
        try:
            ids = tuple(int(device) for group in devices.split(";") for device in group.split(",") if device.strip())
        except ValueError:
            raise RepositoryError(
                f"{path}: gpu_device_ids must be device numbers such as '0,1,2,3'; got {devices!r}; "
                "rewrite the repository with `trt-spec repo --spec F`"
            ) from None
        models.append(
            EngineModel(
                name=config.name or path.parent.name,
                engine_dir=Path(parameters[MODEL_PATH_KEY]),
                gpu_device_ids=ids,
            )
        )
    return models


def check_engines(
    models: Iterable[EngineModel], runtime: Mapping[str, str | None], *, compare_versions: bool = True
) -> list[str]:
    """Can ``runtime`` load these models' engines? Returns warnings for the caller to show.

    Every engine directory must exist here. With ``compare_versions``, each must also hold
    ``manifest.json`` whose ``tensorrt_llm_version`` and ``tensorrt_version`` equal ``runtime``'s,
    and a TensorRT-LLM version trt-spec serves (``versions.trtllm_version_problem``: 1.2.1 or a
    later 1.2.x);
    a runtime version that is None (package not installed) cannot be compared and gives one
    warning naming the versions the engines need.

    Raises:
        EngineNotFoundError: an engine directory does not exist here, or has no readable manifest.
        EngineVersionMismatch: a manifest's version differs from the runtime's, or its TensorRT-LLM
            is older than 1.2.1 (names the model, the versions and the fix).
    """
    models = list(models)
    needed: dict[str, set[str]] = {key: set() for key in VERSION_KEYS}  # the engines' versions
    for model in models:
        if not model.engine_dir.is_dir():
            raise EngineNotFoundError(
                f"model {model.name}: its engine directory {model.engine_dir} (gpt_model_path) does not exist here; "
                "serve where the engines are at that path (e.g. the container whose mount point was given to "
                "`trt-spec repo --engines-mount`), or rewrite the repository with "
                "`trt-spec repo --spec F --engines-mount DIR` naming where this machine sees paths.engines",
                model=model.name,
                path=model.engine_dir,
            )
        if not compare_versions:
            continue
        manifest = read_manifest(model.engine_dir)
        if manifest is None:
            path = model.engine_dir / MANIFEST
            raise EngineNotFoundError(
                f"model {model.name}: {path} is missing or unreadable, so the TensorRT-LLM and TensorRT versions "
                "that built the engine are unknown; build the engines with `trt-spec build --spec F` "
                "(`make build-engines`), or pass --skip-version-check if you built them with this runtime's versions",
                model=model.name,
                path=path,
            )
        engine = {key: manifest.get(key) for key in VERSION_KEYS}
        problem = trtllm_version_problem(str(engine["tensorrt_llm_version"]))
        if problem is not None:
            raise EngineVersionMismatch(
                f"model {model.name}: the engine in {model.engine_dir} was built with {_versions(engine)}, and "
                f"{problem}; rebuild the engines with tensorrt_llm {MIN_TRTLLM} or a later 1.2.x "
                "(`make build-engines`, or `trt-spec build --spec F` in a container that carries it) and serve "
                "them there",
                model=model.name,
                engine_versions=engine,
                runtime_versions=dict(runtime),
            )
        if any(runtime.get(key) is not None and runtime[key] != engine[key] for key in VERSION_KEYS):
            raise EngineVersionMismatch(
                f"model {model.name}: the engine in {model.engine_dir} was built with {_versions(engine)} but this runtime "
                f"has {_versions(runtime)}; TensorRT engines load only with the versions that built them: rebuild them "
                "in this container (`make build-engines`, or `trt-spec build --spec F`), or serve in a container with "
                f"{_versions(engine)}",
                model=model.name,
                engine_versions=engine,
                runtime_versions=dict(runtime),
            )
        for key in VERSION_KEYS:
            needed[key].add(str(engine[key]))
    unknown = [key for key in VERSION_KEYS if runtime.get(key) is None]
    if not (compare_versions and unknown and models):
        return []
    missing = " and ".join(VERSION_PACKAGES[key][0] for key in unknown)
    wanted = ", ".join(f"{VERSION_KEYS[key]} {' / '.join(sorted(needed[key]))}" for key in unknown)
    return [
        f"cannot compare the engines' versions with this runtime's: no {missing} package in this Python; "
        + f"the engines need {wanted}"
    ]


def _versions(versions: Mapping[str, str | None]) -> str:
    return " and ".join(f"{label} {versions.get(key) or 'unknown'}" for key, label in VERSION_KEYS.items())


def orchestrator_command(
    mpirun: str, server_argv: list[str], models: Iterable[EngineModel], env: Mapping[str, str]
) -> tuple[list[str], dict[str, str]]:
    """``server_argv`` (``tritonserver`` and its options) run in orchestrator mode, as
    ``launch_triton_server.py --multi-model`` runs it: under ``mpirun -n 1``, with the
    orchestrator variables set and Triton's own GPU memory pools off. Returns (argv, env)."""
    named = [device for model in models for device in model.gpu_device_ids]
    gpus = range(max(NODE_GPUS, max(named, default=-1) + 1))
    argv = [
        mpirun,
        "--allow-run-as-root",
        "-n",
        "1",
        *server_argv,
        "--disable-auto-complete-config",
        "--pinned-memory-pool-byte-size=0",
        "--enable-peer-access=false",
        *(f"--cuda-memory-pool-byte-size={gpu}:0" for gpu in gpus),
    ]
    return argv, {**env, **ORCHESTRATOR_ENV}
