"""Fetch both checkpoints of a spec and pin what was fetched in the lock file.

A Hub repo id is fetched with huggingface_hub's ``snapshot_download`` into its cache
(``paths.hf_cache``, else ``HF_HUB_CACHE`` / ``HF_HOME``), at the spec's revision, and only the
files a conversion needs: configs, tokenizer files, ``*.safetensors`` and their index, at the
top level of the repo (so never Meta's ``original/`` weights, nor duplicate ``.bin``/``.pth``).
huggingface_hub does the rest as usual: the token comes from ``HF_TOKEN`` or ``hf auth login``
(we never read, print or store it), interrupted downloads resume, ``HF_HUB_OFFLINE=1`` serves
from the cache only, and ``HF_HUB_DISABLE_PROGRESS_BARS=1`` silences its progress bars.

A local directory as ``model`` is used in place: nothing is copied or fetched.

Only a snapshot found complete is written to the lock file
(``<checkpoints>/<name>/lock.json``: the resolved commit and the size of every file), and a
conversion reads its input through :func:`local_snapshot`, which checks it again. So a download
that failed half-way is never taken for a complete one.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from trt_spec import atomic
from trt_spec.checkpoints.config import hf_cache_dir, locked_entry, read_lock
from trt_spec.errors import (
    DiskFullError,
    GatedRepoError,
    HubUnreachableError,
    IncompleteSnapshotError,
    NotDownloadedError,
    RepoNotFoundError,
)
from trt_spec.layout import lock_path
from trt_spec.runtime.tensors import ROLES
from trt_spec.spec import Spec

LOCK_SCHEMA = 1

# What a conversion and the tokenizer check need; matched against top-level file names only.
ALLOW_PATTERNS = [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "*.safetensors",
    "model.safetensors.index.json",
]
# fnmatch's "*" crosses "/", so this drops every file in a sub-folder (original/, onnx/, ...).
IGNORE_PATTERNS = ["*/*"]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")
SAFETENSORS_INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class Snapshot:
    """One model's files on local disk, checked complete."""

    role: str
    model: str  # as the spec writes it: a repo id or a local directory
    revision: str | None  # the spec's revision ("main" when unset); None for a local directory
    commit: str | None  # the commit the revision resolved to; None for a local directory
    path: Path
    files: dict[str, int] = field(default_factory=dict)  # file name -> size in bytes

    @property
    def is_local(self) -> bool:
        return self.commit is None

    @property
    def total_bytes(self) -> int:
        return sum(self.files.values())

    def lock_entry(self) -> dict:
        entry = {"model": self.model, "revision": self.revision, "commit": self.commit, "files": self.files}
        if self.is_local:
            entry["local_dir"] = str(self.path)
        return entry


def download(spec: Spec, *, progress: bool = True) -> list[Snapshot]:
    """Fetch (or find) target and draft and record each in the lock file as soon as it is complete.

    ``progress=False`` hides huggingface_hub's progress bars for this call.

    Raises:
        GatedRepoError: the repo is gated or private and the token has no access.
        RepoNotFoundError: no such repo, or no such revision in it.
        HubUnreachableError: no network (or ``HF_HUB_OFFLINE=1``) and no complete cached copy.
        IncompleteSnapshotError: the files are there but incomplete (e.g. no safetensors weights).
        DiskFullError: the disk filled up.
    """
    snapshots = []
    for role in ROLES:
        snapshot = fetch(spec, role, progress=progress)
        _write_lock_entry(spec, role, snapshot.lock_entry())
        snapshots.append(snapshot)
    return snapshots


def fetch(spec: Spec, role: str, *, progress: bool = True) -> Snapshot:
    """Fetch one model (a local directory is only checked). Raises as :func:`download`."""
    ref = spec.role(role)
    local = ref.local_dir(spec.source_dir)
    if local is not None:
        return Snapshot(role, ref.model, None, None, local, _require_complete(local, ref.model))

    revision = ref.revision or "main"
    cache_dir = hf_cache_dir(spec)
    with _progress_bars(progress), _hub_errors(ref.model, revision, cache_dir):
        from huggingface_hub import snapshot_download

        path = Path(
            snapshot_download(
                ref.model,
                revision=revision,
                cache_dir=cache_dir,
                allow_patterns=ALLOW_PATTERNS,
                ignore_patterns=IGNORE_PATTERNS,
                local_files_only=hub_offline(),
            )
        )
    # The snapshot folder is named after the commit the revision resolved to.
    return Snapshot(role, ref.model, revision, path.name, path, _require_complete(path, ref.model, revision))


def local_snapshot(spec: Spec, role: str) -> Snapshot:
    """The checkpoint a conversion reads: the local directory, or the snapshot the lock file pins.

    Raises:
        NotDownloadedError: a Hub model that ``trt-spec download`` has not fetched at this revision.
        IncompleteSnapshotError: files recorded in the lock (or needed) are missing or truncated.
    """
    ref = spec.role(role)
    local = ref.local_dir(spec.source_dir)
    if local is not None:
        return Snapshot(role, ref.model, None, None, local, _require_complete(local, ref.model))

    revision = ref.revision or "main"
    entry = locked_entry(spec, role)
    if entry is None or not entry.get("commit"):
        raise NotDownloadedError(
            f"{role}: {ref.model}@{revision} has not been downloaded (no entry in {lock_path(spec)}); "
            f"run `trt-spec download --spec FILE`",
            repo_id=ref.model,
        )
    path = hf_cache_dir(spec) / f"models--{ref.model.replace('/', '--')}" / "snapshots" / entry["commit"]
    for name, size in entry.get("files", {}).items():
        file = path / name
        if not file.is_file() or file.stat().st_size != size:
            raise IncompleteSnapshotError(
                f"{role}: {file} is missing or has changed since `trt-spec download` fetched "
                f"{ref.model}@{entry['commit'][:12]}; run `trt-spec download --spec FILE` again",
                repo_id=ref.model,
            )
    return Snapshot(role, ref.model, revision, entry["commit"], path, _require_complete(path, ref.model, revision))


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` as set now (huggingface_hub itself reads it once, at import)."""
    from huggingface_hub import constants

    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return constants.HF_HUB_OFFLINE or value.upper() in {"1", "ON", "YES", "TRUE"}


def _require_complete(path: Path, model: str, revision: str | None = None) -> dict[str, int]:
    """Sizes of the checkpoint's files, after checking that a conversion has all it needs."""
    where = f"{model}@{revision}" if revision else str(path)

    def incomplete(what: str) -> IncompleteSnapshotError:
        return IncompleteSnapshotError(f"{where} {what}", repo_id=model)

    if not (path / "config.json").is_file():
        raise incomplete("has no config.json; is it a Hugging Face transformers checkpoint?")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise incomplete("has no tokenizer.json or tokenizer.model; both models need their tokenizer files")
    index = path / SAFETENSORS_INDEX
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        shards = sorted(p.name for p in path.glob("*.safetensors"))
    if not shards:
        raise incomplete(
            "has no *.safetensors weights; trt-spec converts safetensors checkpoints only "
            "(choose a revision that has them, or re-save the model with save_pretrained)"
        )
    for shard in shards:
        problem = _safetensors_problem(path / shard)
        if problem:
            raise incomplete(f"{problem} (an interrupted download or copy?); fetch it again")
    return {p.name: p.stat().st_size for p in sorted(path.iterdir()) if p.is_file()}


def _safetensors_problem(path: Path) -> str | None:
    """Why a safetensors file is unusable (missing, or shorter than its header says), or None."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            (header_len,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(header_len))
    except FileNotFoundError:
        return f"lacks {path.name}"
    except (struct.error, ValueError):
        return f"has an unreadable {path.name}"
    data_end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    if size < 8 + header_len + data_end:
        return f"has a truncated {path.name} ({size} of {8 + header_len + data_end} bytes)"
    return None


def _write_lock_entry(spec: Spec, role: str, entry: dict) -> None:
    lock = read_lock(spec)
    lock["schema"] = LOCK_SCHEMA
    lock[role] = entry
    path = lock_path(spec)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_json(path, lock)


@contextlib.contextmanager
def _progress_bars(enabled: bool) -> Iterator[None]:
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    was_disabled = are_progress_bars_disabled()
    if not enabled:
        disable_progress_bars()
    try:
        yield
    finally:
        if not enabled and not was_disabled:
            enable_progress_bars()


@contextlib.contextmanager
def _hub_errors(repo_id: str, revision: str, cache_dir: Path) -> Iterator[None]:
    """Turn huggingface_hub's exceptions into ours: one line, the repo id, the next step."""
    from huggingface_hub.errors import (
        GatedRepoError as HfGatedRepoError,
    )
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    local_hint = "or set the spec's model to a local directory"
    try:
        yield
    # GatedRepoError subclasses RepositoryNotFoundError: keep it first.
    except HfGatedRepoError:
        raise GatedRepoError(
            f"{repo_id} is gated: accept its licence at https://huggingface.co/{repo_id} with your account, "
            f"then set HF_TOKEN (or run `hf auth login`)",
            repo_id=repo_id,
        ) from None
    except RevisionNotFoundError:
        raise RepoNotFoundError(
            f"{repo_id} has no revision {revision!r}; fix the spec's revision (a branch, tag or commit)",
            repo_id=repo_id,
        ) from None
    except RepositoryNotFoundError:
        raise RepoNotFoundError(
            f"no repo {repo_id} on the Hugging Face Hub (or it is private and your token has no access); "
            f"check the spec's model id, or set HF_TOKEN",
            repo_id=repo_id,
        ) from None
    except LocalEntryNotFoundError as exc:
        # Also huggingface_hub's IncompleteSnapshotError (a subclass): cache partial, Hub unreachable.
        if hub_offline():
            raise HubUnreachableError(
                f"HF_HUB_OFFLINE is set and {repo_id}@{revision} is not completely in the cache {cache_dir}; "
                f"unset HF_HUB_OFFLINE to download it, {local_hint}",
                repo_id=repo_id,
            ) from None
        cause = exc.__cause__ or exc
        raise HubUnreachableError(
            f"cannot reach the Hugging Face Hub for {repo_id}@{revision} ({type(cause).__name__}) and no complete "
            f"copy is in the cache {cache_dir}; check the network, proxy or HF_ENDPOINT, {local_hint}",
            repo_id=repo_id,
        ) from None
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        if status in (401, 403):
            raise GatedRepoError(
                f"the Hub refused access to {repo_id} (HTTP {status}); check that HF_TOKEN is valid and may read it",
                repo_id=repo_id,
            ) from None
        raise HubUnreachableError(
            f"the Hub answered HTTP {status} for {repo_id}@{revision}; try again later, {local_hint}",
            repo_id=repo_id,
        ) from None
    except Exception as exc:
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            raise DiskFullError(
                f"no space left on the device while downloading {repo_id} into {cache_dir}; free space "
                f"or set paths.hf_cache to a larger disk, then run `trt-spec download` again (it resumes)",
                repo_id=repo_id,
            ) from None
        if not _is_network_error(exc):
            raise
        raise HubUnreachableError(
            f"lost the connection to the Hub while downloading {repo_id}@{revision} ({type(exc).__name__}); "
            f"run `trt-spec download` again (it resumes)",
            repo_id=repo_id,
        ) from None


def _is_network_error(exc: BaseException) -> bool:
    """An error raised by the HTTP stack huggingface_hub uses (httpx in 1.x+, requests before)."""
    return type(exc).__module__.split(".")[0] in {"httpx", "httpx2", "httpcore", "httpcore2", "requests", "urllib3"}
