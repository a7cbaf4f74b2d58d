"""Carry out a plan's engine builds with TensorRT-LLM 1.2.x.

For each of target and draft: make sure the converted TensorRT-LLM checkpoint is current
(``trt-spec convert``), then run the plan's ``trtllm-build`` argv into a temporary sibling
directory, write ``manifest.json`` there and rename it into place. A failed or interrupted
build never leaves a half engine where a loader would look. A build whose inputs (argv, the
checkpoint's content, tool versions, GPU compute capability) match the manifest of the engine
already in place is skipped (:mod:`trt_spec.engines.manifest`).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trt_spec import __version__, atomic
from trt_spec.engines.convert import convert_checkpoint
from trt_spec.engines.manifest import MANIFEST, MANIFEST_SCHEMA, build_key, read_json, read_manifest
from trt_spec.engines.versions import MIN_TRTLLM, installed_versions, trtllm_version_problem
from trt_spec.errors import BuildStepFailed, CheckpointMissing, ToolchainMissing
from trt_spec.layout import logs_dir
from trt_spec.plan import EnginePlan, Plan
from trt_spec.runtime.tensors import ROLES

HOPPER_COMPUTE_CAPABILITY = "9.0"  # h100 and h200
_HASH_CACHE = ".trt-spec-sha256.json"

Events = Callable[[str], None]


@dataclass(frozen=True)
class Gpu:
    name: str
    compute_capability: str  # "9.0"
    memory_mib: int


@dataclass(frozen=True)
class Toolchain:
    """What this machine offers for building engines."""

    tensorrt_llm_version: str
    tensorrt_version: str
    gpus: tuple[Gpu, ...]

    @property
    def gpu(self) -> Gpu:
        return self.gpus[0]


@dataclass
class EngineResult:
    role: str
    engine_dir: Path
    skipped: bool
    reason: str
    manifest: dict[str, Any] = field(default_factory=dict)


def probe_toolchain() -> Toolchain:
    """Is TensorRT-LLM 1.2.x with ``trtllm-build`` and a CUDA GPU here?

    Reads package metadata and ``nvidia-smi``; imports nothing heavy.

    Raises:
        ToolchainMissing: naming what is missing, and that ``--dry-run`` shows the commands.
    """
    hint = "engines are built on a GPU machine with TensorRT-LLM 1.2.1 or a later 1.2.x (e.g. NVIDIA's Triton TensorRT-LLM container); `trt-spec build --dry-run` shows the commands"
    versions = installed_versions()
    trtllm_version = versions["tensorrt_llm_version"]
    if trtllm_version is None:
        raise ToolchainMissing(f"cannot build here: the tensorrt_llm package is not installed; {hint}")
    problem = trtllm_version_problem(trtllm_version)
    if problem is not None:
        raise ToolchainMissing(
            f"cannot build here: {problem}; install tensorrt_llm {MIN_TRTLLM} or a later 1.2.x "
            f"(pip install tensorrt_llm=={MIN_TRTLLM}, or NVIDIA's container that carries it); {hint}"
        )
    tensorrt_version = versions["tensorrt_version"]
    if tensorrt_version is None:
        raise ToolchainMissing(f"cannot build here: TensorRT is not installed; {hint}")
    if shutil.which("trtllm-build") is None:
        raise ToolchainMissing(f"cannot build here: `trtllm-build` is not on PATH; {hint}")
    gpus = query_gpus()
    if not gpus:
        raise ToolchainMissing(f"cannot build here: no CUDA GPU found (nvidia-smi lists none); {hint}")
    return Toolchain(tensorrt_llm_version=trtllm_version, tensorrt_version=tensorrt_version, gpus=gpus)


def query_gpus() -> tuple[Gpu, ...]:
    """This machine's CUDA GPUs as ``nvidia-smi`` lists them; empty when it lists none or is not installed."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,compute_cap,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    gpus = []
    for line in out.strip().splitlines():
        name, compute_capability, memory_mib = (part.strip() for part in line.split(","))
        gpus.append(Gpu(name=name, compute_capability=compute_capability, memory_mib=int(float(memory_mib))))
    return tuple(gpus)


def build_engines(
    plan: Plan,
    toolchain: Toolchain,
    *,
    force: bool = False,
    convert: Callable[..., object] | None = None,
    on_event: Events = lambda message: None,
) -> list[EngineResult]:
    """Build (or keep) both engines of ``plan``; returns one result per engine, target first.

    ``convert(spec, role, force=..., progress=...)`` brings the role's TensorRT-LLM checkpoint up to date;
    by default :func:`trt_spec.engines.convert.convert_checkpoint`.

    Raises:
        ToolchainMissing: the GPU is not a Hopper (sm_90) GPU as the spec's ``engine.gpu`` says.
        CheckpointMissing: the conversion left no checkpoint (no ``config.json``).
        BuildStepFailed: ``trtllm-build`` exited non-zero or produced no engine (names the log).
    """
    if toolchain.gpu.compute_capability != HOPPER_COMPUTE_CAPABILITY:
        raise ToolchainMissing(
            f"this machine's GPU is {toolchain.gpu.name} (compute capability {toolchain.gpu.compute_capability}); "
            f"engine.gpu {plan.spec.engine.gpu} needs sm_90 engines: build on an H100 or H200"
        )
    convert = convert or convert_checkpoint
    results = []
    for role in ROLES:
        engine = plan.engine(role)
        on_event(f"{role}: checking the TensorRT-LLM checkpoint {engine.convert.output_dir}")
        convert_s = _ensure_checkpoint(plan, role, convert, force=force, on_event=on_event)
        results.append(_build_one(plan, engine, toolchain, force=force, convert_s=convert_s, on_event=on_event))
    return results


def _ensure_checkpoint(
    plan: Plan, role: str, convert: Callable[..., object], *, force: bool, on_event: Events
) -> float | None:
    """Brings the role's checkpoint up to date with ``convert``; returns the conversion's duration in
    seconds, or None when nothing was converted (the converter skipped, or did not say)."""
    checkpoint_dir = plan.engine(role).convert.output_dir
    result = convert(plan.spec, role, force=force, progress=on_event)
    if not (checkpoint_dir / "config.json").is_file():
        raise CheckpointMissing(
            f"{role}: no TensorRT-LLM checkpoint at {checkpoint_dir}: the conversion left no config.json"
        )
    return None if getattr(result, "skipped", True) else getattr(result, "duration_s", None)


def _build_one(
    plan: Plan, engine: EnginePlan, toolchain: Toolchain, *, force: bool, convert_s: float | None, on_event: Events
) -> EngineResult:
    final_dir = engine.engine_dir
    checkpoint_hash = hash_directory(engine.convert.output_dir)
    key = build_key(
        engine.build_argv,
        checkpoint_hash,
        tensorrt_llm_version=toolchain.tensorrt_llm_version,
        tensorrt_version=toolchain.tensorrt_version,
        compute_capability=toolchain.gpu.compute_capability,
    )
    existing = read_manifest(final_dir)
    reason = _rebuild_reason(existing, key, toolchain, final_dir)
    if reason is None and not force:
        on_event(f"{engine.role}: engine is up to date, skipped ({final_dir})")
        return EngineResult(engine.role, final_dir, skipped=True, reason="up to date", manifest=existing or {})
    reason = "--force" if reason is None else reason

    log_path = logs_dir(plan.spec) / f"build-{engine.role}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    on_event(f"{engine.role}: building ({reason}); log: {log_path}")
    started = time.time()
    with atomic.staged_dir(final_dir) as partial_dir:
        argv = _with_output_dir(engine.build_argv, partial_dir)
        with open(log_path, "w") as log:
            log.write("$ " + " ".join(argv) + "\n")
            log.flush()
            returncode = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
        if returncode != 0:
            raise BuildStepFailed(f"trtllm-build ({engine.role})", returncode, log_path)
        engine_files = sorted(p.name for p in partial_dir.glob("rank*.engine"))
        if not engine_files or not (partial_dir / "config.json").is_file():
            raise BuildStepFailed(
                f"trtllm-build ({engine.role})",
                0,
                log_path,
                detail="exited 0 but wrote no rank*.engine and config.json",
            )
        manifest: dict[str, Any] = {
            "schema": MANIFEST_SCHEMA,
            "name": plan.spec.name,
            "role": engine.role,
            "build_key": key,
            "spec_hash": plan.spec.content_hash(),
            "checkpoint_dir": str(engine.convert.output_dir),
            "checkpoint_hash": checkpoint_hash,
            "tensorrt_llm_version": toolchain.tensorrt_llm_version,
            "tensorrt_version": toolchain.tensorrt_version,
            "gpu": asdict(toolchain.gpu),
            "argv": list(engine.build_argv),
            "num_draft_tokens": plan.spec.num_draft_tokens if engine.role == "target" else 0,
            "engine_files": {name: (partial_dir / name).stat().st_size for name in engine_files},
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "durations_s": {"convert": convert_s, "build": round(time.time() - started, 3)},
            "trt_spec_version": __version__,
        }
        atomic.write_json(partial_dir / MANIFEST, manifest)
    on_event(f"{engine.role}: built in {manifest['durations_s']['build']:.1f} s -> {final_dir}")
    return EngineResult(engine.role, final_dir, skipped=False, reason=reason, manifest=manifest)


def _rebuild_reason(manifest: dict[str, Any] | None, key: str, toolchain: Toolchain, engine_dir: Path) -> str | None:
    if manifest is None:
        return "no engine yet"
    built_for = manifest.get("gpu", {}).get("compute_capability")
    if built_for != toolchain.gpu.compute_capability:
        return f"the engine in place was built for compute capability {built_for}, this GPU is {toolchain.gpu.compute_capability}"
    if any(not (engine_dir / name).is_file() for name in manifest.get("engine_files", {})):
        return "engine files are missing"
    if manifest.get("build_key") != key:
        return "inputs changed"
    return None


def _with_output_dir(argv: tuple[str, ...], output_dir: Path) -> list[str]:
    out = list(argv)
    out[out.index("--output_dir") + 1] = str(output_dir)
    return out


def hash_directory(directory: Path) -> str:
    """sha256 over every file's relative path and content.

    Per-file digests are cached in the directory, keyed by size and mtime, so an unchanged
    multi-GB checkpoint is not re-read on every build.
    """
    cache_path = directory / _HASH_CACHE
    cache = read_json(cache_path) or {}
    fresh, total = {}, hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and p.name != _HASH_CACHE):
        relative = path.relative_to(directory).as_posix()
        stat = path.stat()
        stamp = f"{stat.st_size}:{stat.st_mtime_ns}"
        entry = cache.get(relative)
        digest = entry["sha256"] if entry and entry.get("stamp") == stamp else _sha256_file(path)
        fresh[relative] = {"stamp": stamp, "sha256": digest}
        total.update(f"{relative}\0{digest}\n".encode())
    if fresh != cache:
        try:
            atomic.write_json(cache_path, fresh)
        except OSError:
            pass  # a read-only checkpoint is hashed again next time; nothing else is lost
    return total.hexdigest()


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()
