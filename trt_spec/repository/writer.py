"""Write a Triton model repository for a plan: configs, model sources, tokenizer files.

The repository is relocatable: each python model's version directory holds its ``model.py``, a
copy of the runtime package (``trt_spec/runtime/``, the only part of ``trt_spec`` that runs
inside Triton, as TensorRT-LLM's BLS model carries its ``lib/``) and, for pre- and
postprocessing, the target's tokenizer files; engine paths can name a container's mount point.
What the serving Python needs is the runtime's dependencies (numpy < 2, torch, transformers),
not ``trt_spec`` itself. The torch flavor's engine models read the Hugging Face checkpoints from
where the spec names them.
The whole repository is written into a sibling temporary directory and renamed into place.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from trt_spec import atomic, runtime
from trt_spec.errors import RepositoryError
from trt_spec.layout import model_repo_dir
from trt_spec.plan import Plan, make_plan
from trt_spec.repository import configs, flavors
from trt_spec.runtime import tensors as T
from trt_spec.runtime.costs import Acceptance, StepCosts
from trt_spec.spec import Spec

RUNTIME_DIR = Path(runtime.__file__).resolve().parent  # trt_spec/runtime/
MODELS_SOURCE_DIR = RUNTIME_DIR / "models"
# The copy keeps the runtime's import path, trt_spec.runtime, under a package file of its own
# that says what it is; nothing else of trt_spec is copied.
RUNTIME_COPY = Path("trt_spec") / "runtime"
RUNTIME_COPY_PACKAGE_FILE = '"""A copy of trt_spec.runtime (only that) for the Triton python models beside it."""\n'
# Not needed to serve: the model sources themselves (each is copied as its model.py), bytecode.
RUNTIME_COPY_IGNORE = ("__pycache__", "*.pyc", "models")
# What AutoTokenizer may read; whichever of these the checkpoint has is copied.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "chat_template.jinja",
)
TOKENIZER_MODELS = (T.PREPROCESSING, T.POSTPROCESSING, T.TRTLLM_PREPROCESSING, T.TRTLLM_POSTPROCESSING)
# The project's model_repo/ keeps a README.md (tracked, so the folder exists); it is carried over.
KEPT_FILE = "README.md"


@dataclass
class RepositoryResult:
    path: Path
    flavor: str
    models: list[str] = field(default_factory=list)  # config and (python) sources
    notes: list[str] = field(default_factory=list)  # for the caller to show; the library never prints


def copy_runtime(version_dir: Path) -> None:
    """Put the runtime package beside a python model's ``model.py``: ``<version_dir>/trt_spec/runtime/``."""
    version_dir = Path(version_dir)
    shutil.copytree(RUNTIME_DIR, version_dir / RUNTIME_COPY, ignore=shutil.ignore_patterns(*RUNTIME_COPY_IGNORE))
    (version_dir / RUNTIME_COPY.parent / "__init__.py").write_text(RUNTIME_COPY_PACKAGE_FILE)


def hf_checkpoint_dir(spec: Spec, role: str) -> Path:
    """The role's Hugging Face checkpoint folder: a local directory, or the downloaded snapshot.

    Raises:
        NotDownloadedError: a Hub model that ``trt-spec download`` has not fetched.
    """
    local = spec.role(role).local_dir(spec.source_dir)
    if local is not None:
        return local
    from trt_spec.checkpoints.download import local_snapshot

    return local_snapshot(spec, role).path


def write_repository(
    spec: Spec,
    out_dir: str | Path | None = None,
    flavor: str | None = None,
    *,
    plan: Plan | None = None,
    engines_mount: str | Path | None = None,
    tokenizer_dir: str | Path | None = None,
    adaptive_draft: bool = False,
    torch_threads: int = 1,
    acceptance: Acceptance | None = None,
    step_costs: StepCosts | None = None,
    k_schedule: Sequence[int] | None = None,
    trtllm_version: str | None = None,
    sampled_token_match: bool = False,
) -> RepositoryResult:
    """Write the repository for ``spec`` into ``out_dir`` (default: the spec's ``paths.model_repo``).

    With engines built, they are cross-checked against the spec first; without, the configs
    follow the plan and a note says so. ``adaptive_draft``, ``torch_threads``, ``acceptance``,
    ``step_costs``, ``k_schedule`` and ``sampled_token_match``: see
    :func:`trt_spec.repository.flavors.settings_from_plan`.
    ``trtllm_version``: the TensorRT-LLM release line of a flavor's version-specific files
    (:meth:`~trt_spec.repository.flavors.Flavor.files`; the llmapi flavor's).

    Raises:
        EngineMismatchError: a built engine disagrees with the spec.
        RepositoryError: no tokenizer files, or a config that does not validate.
        NotDownloadedError: the target is a Hub model that has not been downloaded.
    """
    plan = plan or make_plan(spec)
    chosen = flavors.get(flavor or spec.triton.flavor)
    hf_dirs: dict[str, str] = {}
    tokenizer_files: list[Path] = []
    if chosen.needs_tokenizer:
        tokenizer_source = Path(tokenizer_dir) if tokenizer_dir else hf_checkpoint_dir(spec, "target")
        hf_dirs["target"] = str(tokenizer_source)
    # A flavor that runs the draft's checkpoint needs it there (downloaded).
    if spec.draft is not None and (chosen.needs_draft_checkpoint or spec.draft.local_dir(spec.source_dir) is not None):
        hf_dirs["draft"] = str(hf_checkpoint_dir(spec, "draft"))
    settings = flavors.settings_from_plan(
        plan,
        flavor=chosen.name,
        engines_mount=engines_mount,
        hf_model_dirs=hf_dirs,
        adaptive_draft=adaptive_draft,
        torch_threads=torch_threads,
        acceptance=acceptance,
        step_costs=step_costs,
        k_schedule=k_schedule,
        sampled_token_match=sampled_token_match,
    )
    notes = chosen.check(plan, settings)
    model_configs = chosen.model_configs(settings)
    own_files = chosen.files(plan, settings, trtllm_version=trtllm_version)
    for relative in own_files:
        parts = Path(relative).parts
        if Path(relative).is_absolute() or ".." in parts or parts[0] not in (*model_configs, *chosen.root_files):
            raise RepositoryError(f"flavor {chosen.name} writes {relative!r}, outside its models and root files")
    if chosen.needs_tokenizer:
        tokenizer_files = [tokenizer_source / name for name in TOKENIZER_FILES if (tokenizer_source / name).is_file()]
        if not any(path.name in ("tokenizer.json", "tokenizer.model", "vocab.json") for path in tokenizer_files):
            raise RepositoryError(
                f"no tokenizer files (tokenizer.json, tokenizer.model or vocab.json) in {tokenizer_source}"
            )

    final = Path(out_dir) if out_dir is not None else model_repo_dir(spec)
    final = final.resolve()
    _check_replaceable(final)
    result = RepositoryResult(path=final, flavor=chosen.name, notes=notes)
    with atomic.staged_dir(final) as partial:
        for name, config in model_configs.items():
            configs.write_config(config, partial)
            if config.backend != "python":
                # Triton loads only versions it finds: an ensemble or a tensorrtllm model (whose
                # engine is at gpt_model_path) still needs an (empty) version directory.
                (partial / name / "1").mkdir()
                result.models.append(name)
                continue
            version = partial / name / "1"
            version.mkdir(parents=True)
            source = chosen.source(name)
            if source is None:  # not our model.py (the flavor's files() say what is there)
                result.models.append(name)
                continue
            shutil.copy2(MODELS_SOURCE_DIR / source / "model.py", version / "model.py")
            copy_runtime(version)
            if name in TOKENIZER_MODELS:
                (version / configs.TOKENIZER_SUBDIR).mkdir()
                for path in tokenizer_files:
                    shutil.copy2(path, version / configs.TOKENIZER_SUBDIR / path.name)
            result.models.append(name)
        for relative, text in own_files.items():
            path = partial / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            if path.suffix == ".sh":
                path.chmod(0o755)
        if (final / KEPT_FILE).is_file():
            shutil.copy2(final / KEPT_FILE, partial / KEPT_FILE)
    result.notes += chosen.notes(settings, final)
    return result


def _check_replaceable(final: Path) -> None:
    """Only a previous repository (our model folders, nothing else) is ever replaced."""
    if not final.exists():
        return
    if not final.is_dir():
        raise RepositoryError(f"{final} exists and is not a directory; choose another output directory")
    ours = (*T.MODEL_NAMES, KEPT_FILE, *flavors.ROOT_FILES)
    foreign = sorted(entry.name for entry in final.iterdir() if entry.name not in ours)
    if foreign:
        raise RepositoryError(
            f"{final} holds {', '.join(foreign[:3])}{' ...' if len(foreign) > 3 else ''}, which is not a "
            "model of this repository; refusing to replace it: choose an empty or new output directory"
        )
