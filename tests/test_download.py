"""``trt-spec download`` against the real huggingface_hub library, with no Hub reachable.

Three situations: local directories (nothing to fetch), a cache pre-populated in
huggingface_hub's own layout (offline mode, or an endpoint that refuses connections), and
nothing anywhere (the error path). Error mapping for answers only a live Hub gives (gated,
not found, disk full) is tested by making ``snapshot_download`` raise them.
"""

from __future__ import annotations

import errno
import hashlib
import importlib
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from trt_spec.checkpoints.config import load_model_info
from trt_spec.checkpoints.download import download, local_snapshot
from trt_spec.cli import main
from trt_spec.errors import (
    DiskFullError,
    GatedRepoError,
    HubUnreachableError,
    IncompleteSnapshotError,
    NotDownloadedError,
    RepoNotFoundError,
)
from trt_spec.layout import lock_path
from trt_spec.spec import parse_spec

DEMO = Path(__file__).resolve().parents[1] / "examples" / "pystdlib-pair"
TARGET_COMMIT = "1" * 40
DRAFT_COMMIT = "2" * 40


def populate_cache(cache: Path, repo_id: str, source: Path, commit: str, *, skip: tuple[str, ...] = ()) -> Path:
    """Lay ``source``'s files out as huggingface_hub does: blobs, snapshot symlinks, refs/main."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for file in sorted(source.iterdir()):
        if file.name in skip:
            continue
        data = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def hub_spec(tmp_path: Path, **paths) -> object:
    return parse_spec(
        {
            "name": "tiny",
            "target": {"model": "acme/tiny-target"},
            "draft": {"model": "acme/tiny-draft"},
            "engine": {"max_input_len": 512, "max_seq_len": 1008},
            "paths": {"checkpoints": str(tmp_path / "checkpoints"), "hf_cache": str(tmp_path / "hub"), **paths},
        },
        source_dir=tmp_path,
    )


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def online(monkeypatch):
    """Offline mode off (the autouse fixture turns it on) and the Hub at a port nobody listens on."""
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{closed_port()}")


def test_local_directories_are_used_in_place_and_locked(tmp_path):
    spec = parse_spec(
        {
            "name": "demo",
            "target": {"model": str(DEMO / "target")},
            "draft": {"model": str(DEMO / "draft")},
            "paths": {"checkpoints": str(tmp_path / "checkpoints"), "hf_cache": str(tmp_path / "hub")},
        }
    )
    snapshots = download(spec)
    assert [(s.role, s.path, s.commit) for s in snapshots] == [
        ("target", DEMO / "target", None),
        ("draft", DEMO / "draft", None),
    ]
    assert not (tmp_path / "hub").exists()  # nothing fetched, nothing cached
    lock = json.loads(lock_path(spec).read_text())
    assert lock["target"]["files"]["model.safetensors"] == (DEMO / "target" / "model.safetensors").stat().st_size
    assert lock["draft"]["local_dir"] == str(DEMO / "draft")


def test_offline_cache_resolves_main_and_pins_the_commit(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token_0123456789")
    populate_cache(tmp_path / "hub", "acme/tiny-target", DEMO / "target", TARGET_COMMIT)
    populate_cache(tmp_path / "hub", "acme/tiny-draft", DEMO / "draft", DRAFT_COMMIT)
    spec = hub_spec(tmp_path)

    snapshots = download(spec, progress=False)

    assert [s.commit for s in snapshots] == [TARGET_COMMIT, DRAFT_COMMIT]
    lock_text = lock_path(spec).read_text()
    lock = json.loads(lock_text)
    assert lock["target"] == {
        "model": "acme/tiny-target",
        "revision": "main",
        "commit": TARGET_COMMIT,
        "files": {p.name: p.stat().st_size for p in sorted((DEMO / "target").iterdir())},
    }
    assert "hf_not_a_real_token" not in lock_text
    # Later steps read exactly the pinned snapshot.
    assert (
        local_snapshot(spec, "draft").path == tmp_path / "hub" / "models--acme--tiny-draft" / "snapshots" / DRAFT_COMMIT
    )
    assert f"acme/tiny-target@{TARGET_COMMIT}" in load_model_info(spec, "target").source


def test_a_moved_branch_is_not_used_until_downloaded_again(tmp_path):
    """The lock pins the commit: moving refs/main in the cache changes nothing until `download` runs."""
    populate_cache(tmp_path / "hub", "acme/tiny-target", DEMO / "target", TARGET_COMMIT)
    populate_cache(tmp_path / "hub", "acme/tiny-draft", DEMO / "draft", DRAFT_COMMIT)
    spec = hub_spec(tmp_path)
    download(spec, progress=False)
    newer = "3" * 40
    populate_cache(tmp_path / "hub", "acme/tiny-target", DEMO / "target", newer)  # refs/main moves on

    assert local_snapshot(spec, "target").commit == TARGET_COMMIT
    download(spec, progress=False)
    assert local_snapshot(spec, "target").commit == newer


def test_offline_and_not_cached_is_one_clear_line(tmp_path):
    spec = hub_spec(tmp_path)
    with pytest.raises(HubUnreachableError) as caught:
        download(spec)
    message = str(caught.value)
    assert "\n" not in message
    assert "acme/tiny-target@main" in message and "HF_HUB_OFFLINE" in message and "local directory" in message
    assert caught.value.repo_id == "acme/tiny-target"
    assert isinstance(caught.value, ConnectionError)
    assert not lock_path(spec).exists()


def test_a_partial_snapshot_is_refused_and_not_locked(tmp_path):
    """An interrupted download leaves config and tokenizer but no weights: never taken as complete."""
    populate_cache(tmp_path / "hub", "acme/tiny-target", DEMO / "target", TARGET_COMMIT, skip=("model.safetensors",))
    spec = hub_spec(tmp_path)
    with pytest.raises(IncompleteSnapshotError, match=r"acme/tiny-target@main has no \*\.safetensors weights"):
        download(spec)
    assert not lock_path(spec).exists()
    with pytest.raises(
        NotDownloadedError, match=r"target: acme/tiny-target@main has not been downloaded.*trt-spec download"
    ):
        local_snapshot(spec, "target")


def test_a_truncated_weights_file_is_refused(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    for file in (DEMO / "draft").iterdir():
        (source / file.name).write_bytes(file.read_bytes())
    weights = source / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    spec = parse_spec(
        {
            "name": "x",
            "target": {"model": str(DEMO / "target")},
            "draft": {"model": str(source)},
            "paths": {"checkpoints": str(tmp_path / "checkpoints")},
        }
    )
    with pytest.raises(IncompleteSnapshotError, match=r"has a truncated model.safetensors \(\d+ of \d+ bytes\)"):
        download(spec)


def test_a_file_changed_after_download_is_caught(tmp_path):
    snapshot = populate_cache(tmp_path / "hub", "acme/tiny-target", DEMO / "target", TARGET_COMMIT)
    populate_cache(tmp_path / "hub", "acme/tiny-draft", DEMO / "draft", DRAFT_COMMIT)
    spec = hub_spec(tmp_path)
    download(spec)
    (snapshot / "config.json").unlink()
    with pytest.raises(
        IncompleteSnapshotError, match=r"config.json is missing or has changed.*download --spec FILE` again"
    ):
        local_snapshot(spec, "target")


def test_refused_connection_is_one_clear_line(tmp_path, online):
    spec = hub_spec(tmp_path)
    with pytest.raises(HubUnreachableError) as caught:
        download(spec)
    message = str(caught.value)
    # httpx (huggingface_hub >= 1) says ConnectError, requests (before) ConnectionError.
    assert re.search(r"cannot reach the Hugging Face Hub for acme/tiny-target@main \(Connect(ion)?Error\)", message)
    assert "HF_ENDPOINT" in message and "local directory" in message


def test_refused_connection_falls_back_to_a_complete_cache(tmp_path, online):
    populate_cache(tmp_path / "hub", "acme/tiny-target", DEMO / "target", TARGET_COMMIT)
    populate_cache(tmp_path / "hub", "acme/tiny-draft", DEMO / "draft", DRAFT_COMMIT)
    assert [s.commit for s in download(hub_spec(tmp_path), progress=False)] == [TARGET_COMMIT, DRAFT_COMMIT]


def test_cli_in_a_fresh_process_reads_hf_endpoint(tmp_path):
    """huggingface_hub reads HF_ENDPOINT at import: check the whole command as a user runs it."""
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(
        f"name: tiny\ntarget: {{model: acme/tiny-target}}\ndraft: {{model: acme/tiny-draft}}\n"
        f"paths: {{checkpoints: {tmp_path / 'checkpoints'}, hf_cache: {tmp_path / 'hub'}}}\n"
    )
    env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}"}
    env.pop("HF_HUB_OFFLINE")
    completed = subprocess.run(
        [sys.executable, "-c", "from trt_spec.cli import main; main()", "download", "--spec", str(spec_file)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert completed.returncode == 1
    assert completed.stderr.startswith("Error: cannot reach the Hugging Face Hub for acme/tiny-target@main")
    assert "Traceback" not in completed.stderr and completed.stderr.count("\n") == 1


def test_cli_download_prints_one_line_per_model(tmp_path):
    populate_cache(tmp_path / "hub", "acme/tiny-target", DEMO / "target", TARGET_COMMIT)
    populate_cache(tmp_path / "hub", "acme/tiny-draft", DEMO / "draft", DRAFT_COMMIT)
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(
        f"name: tiny\ntarget: {{model: acme/tiny-target}}\ndraft: {{model: acme/tiny-draft}}\n"
        f"paths: {{checkpoints: {tmp_path / 'checkpoints'}, hf_cache: {tmp_path / 'hub'}}}\n"
    )
    result = CliRunner().invoke(main, ["download", "--spec", str(spec_file), "--no-progress"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith(f"target  acme/tiny-target (main = {TARGET_COMMIT[:12]}): 5 files")
    assert lines[1].startswith(f"draft   acme/tiny-draft (main = {DRAFT_COMMIT[:12]}): 5 files")
    assert lines[2] == f"lock    {tmp_path / 'checkpoints' / 'tiny' / 'lock.json'}"


def _http_error(cls, status: int):
    """A huggingface_hub HTTP error as the library raises it, around a response of its HTTP stack."""
    import huggingface_hub.errors as hf_errors

    url = "http://hub.invalid/api/models/acme/x"
    stack = hf_errors.HfHubHTTPError.__mro__[1].__module__.split(".")[0]  # httpx/httpx2 (>= 1.0) or requests
    if stack == "requests":
        import requests

        response = requests.Response()
        response.status_code, response.url = status, url
    else:
        http = importlib.import_module(stack)
        response = http.Response(status, request=http.Request("GET", url))
    return getattr(hf_errors, cls)(f"{status} from the Hub", response=response)


@pytest.mark.parametrize(
    ("raised", "expected", "builtin", "words"),
    [
        (
            lambda: _http_error("GatedRepoError", 403),
            GatedRepoError,
            PermissionError,
            ["acme/tiny-target is gated", "accept its licence", "HF_TOKEN"],
        ),
        (
            lambda: _http_error("RepositoryNotFoundError", 404),
            RepoNotFoundError,
            FileNotFoundError,
            ["no repo acme/tiny-target", "check the spec's model id"],
        ),
        (
            lambda: _http_error("RevisionNotFoundError", 404),
            RepoNotFoundError,
            FileNotFoundError,
            ["acme/tiny-target has no revision 'main'", "fix the spec's revision"],
        ),
        (
            lambda: _http_error("HfHubHTTPError", 401),
            GatedRepoError,
            PermissionError,
            ["refused access to acme/tiny-target (HTTP 401)", "HF_TOKEN"],
        ),
        (
            lambda: _http_error("HfHubHTTPError", 503),
            HubUnreachableError,
            ConnectionError,
            ["HTTP 503 for acme/tiny-target@main", "try again later"],
        ),
        (
            lambda: OSError(errno.ENOSPC, "No space left on device"),
            DiskFullError,
            OSError,
            ["no space left", "acme/tiny-target", "paths.hf_cache", "resumes"],
        ),
    ],
)
def test_hub_errors_become_one_line_with_the_next_step(tmp_path, monkeypatch, raised, expected, builtin, words):
    import huggingface_hub

    def snapshot_download(*args, **kwargs):
        raise raised()

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    with pytest.raises(expected) as caught:
        download(hub_spec(tmp_path))
    assert isinstance(caught.value, builtin)
    assert caught.value.repo_id == "acme/tiny-target"
    message = str(caught.value)
    assert "\n" not in message
    for word in words:
        assert word in message


def test_other_errors_are_not_disguised(tmp_path, monkeypatch):
    import huggingface_hub

    def snapshot_download(*args, **kwargs):
        raise ValueError("a bug")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    with pytest.raises(ValueError, match="a bug"):
        download(hub_spec(tmp_path))


def test_only_the_needed_files_are_asked_for_and_bars_can_be_hidden(tmp_path, monkeypatch):
    import huggingface_hub
    from huggingface_hub.utils import are_progress_bars_disabled

    calls = []

    def snapshot_download(repo_id, **kwargs):
        calls.append({**kwargs, "bars_disabled": are_progress_bars_disabled()})
        return str(populate_cache(tmp_path / "hub", repo_id, DEMO / repo_id.split("-")[-1], TARGET_COMMIT))

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    was_disabled = are_progress_bars_disabled()
    download(hub_spec(tmp_path), progress=False)
    assert are_progress_bars_disabled() == was_disabled
    assert [call["bars_disabled"] for call in calls] == [True, True]
    call = calls[0]
    assert call["revision"] == "main" and call["cache_dir"] == tmp_path / "hub" and call["local_files_only"] is True
    assert "token" not in call  # huggingface_hub finds HF_TOKEN or the login itself

    from huggingface_hub.utils import filter_repo_objects

    repo_files = [
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "pytorch_model.bin",
        "consolidated.00.pth",
        "original/consolidated.00.pth",
        "original/params.json",
        "original/tokenizer.model",
        "README.md",
        "LICENSE",
        ".gitattributes",
    ]
    fetched = set(
        filter_repo_objects(repo_files, allow_patterns=call["allow_patterns"], ignore_patterns=call["ignore_patterns"])
    )
    assert fetched == {
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
    }
