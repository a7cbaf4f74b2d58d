"""What `trt-spec serve` runs (:class:`ServeOptions`): made by the command (trt_spec/cli/serve_cmds.py),
taken by the orchestration (:mod:`trt_spec.serving.serve`) and by the routes it hands a repository to
(:mod:`trt_spec.serving.llmapi_route`). Its own module, first in that flow, so that a route does not
import the orchestration that calls it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ServeOptions:
    """What `trt-spec serve` runs, its options already checked against each other (the command's
    help says what each one does)."""

    repo: Path
    host: str
    grpc_port: int
    http_port: int
    metrics_port: int
    ready_timeout_s: float
    skip_version_check: bool
    # --emulate-tensorrtllm: the spec (--spec) the repository was written from; None: not emulated.
    emulate_spec: str | None
    openai_port: int | None  # None: no OpenAI endpoint
    openai_host: str
    openai_model_name: str | None
    log_file: Path | None  # None: default_log_file(repo)
    drain_timeout_s: float
    client_apis: tuple[str, ...]
