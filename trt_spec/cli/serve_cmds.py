"""``repo`` writes the Triton model repository; ``serve`` runs Triton on it in the foreground until
SIGTERM or Ctrl-C."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from click.core import ParameterSource

from trt_spec.cli.common import read_spec, read_tuning, spec_option, tuning_option
from trt_spec.errors import ServerError
from trt_spec.repository.flavors import FLAVORS, twin_route
from trt_spec.serving.serve import OPENAI_EXTRA_HINT, ServeOptions, serve_repository
from trt_spec.serving.server import DEFAULT_PORTS, RESTRICTABLE_APIS, parse_client_apis


@click.command()
@click.option(
    "--repo",
    "repo",
    required=True,
    type=click.Path(exists=True, file_okay=False),
    help="The Triton model repository (`trt-spec repo` writes one).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind; 0.0.0.0 for every interface.")
@click.option("--grpc-port", default=DEFAULT_PORTS["grpc"], show_default=True, type=click.IntRange(1, 65535))
@click.option("--http-port", default=DEFAULT_PORTS["http"], show_default=True, type=click.IntRange(1, 65535))
@click.option("--metrics-port", default=DEFAULT_PORTS["metrics"], show_default=True, type=click.IntRange(1, 65535))
@click.option(
    "--ready-timeout",
    default=300.0,
    show_default=True,
    type=click.FloatRange(min=1),
    help="Seconds to wait for every model to load.",
)
@click.option(
    "--skip-version-check",
    is_flag=True,
    help="Start even when an engine has no manifest or its manifest names other TensorRT-LLM/TensorRT "
    "versions than this runtime's (engines built by hand; a runtime you know loads them).",
)
@click.option(
    "--emulate-tensorrtllm",
    is_flag=True,
    help="Serve a tensorrtllm-flavor repository on CPU: its engine models run in an emulator of "
    "TensorRT-LLM's backend, on the engines the spec's plan would build (needs --spec). The repository "
    "is not modified; a copy in a temporary directory is served.",
)
@click.option(
    "--spec",
    "spec_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="With --emulate-tensorrtllm: the deployment spec (YAML) the repository was written from.",
)
@click.option(
    "--openai-port",
    default=None,
    type=click.IntRange(1, 65535),
    help="Also serve an OpenAI-compatible HTTP endpoint (/v1/models, /v1/completions, /v1/chat/completions) "
    f"on this port, in front of the ensemble (needs {OPENAI_EXTRA_HINT}). An llmapi repository is always "
    "served so, as trtllm-serve serves it (default port 8000, with /health and /metrics).",
)
@click.option("--openai-host", default=None, help="Address of the OpenAI endpoint. Default: --host.")
@click.option(
    "--openai-model-name",
    default=None,
    help="The model name the OpenAI endpoint serves. Default: the spec's name with --spec; for an llmapi "
    "repository, trtllm-serve's (the target checkpoint folder's name); else the repository folder's name.",
)
@click.option(
    "--log-file",
    default=None,
    type=click.Path(dir_okay=False),
    help="Where Triton's log (and its python models' output) goes; kept after the stop. "
    "Default: logs/tritonserver-<repo>-<date>-<time>-<pid>.log beside the repository.",
)
@click.option(
    "--drain-timeout",
    default=25.0,
    show_default=True,
    type=click.FloatRange(0),
    help="On SIGTERM or Ctrl-C, how long requests in flight may finish before the server stops; new ones are "
    "refused and readiness says not ready at once (fits Kubernetes' default 30 s grace period). 0: no drain.",
)
@click.option(
    "--allow-client-apis",
    default="none",
    show_default=True,
    metavar="APIS",
    help=f"Triton APIs open to every client, comma-separated: {', '.join(RESTRICTABLE_APIS)}, or all. "
    "By default they answer only `serve` itself (a secret header); inference, health, metadata, "
    "model config and statistics are always open.",
)
def serve(
    repo: str,
    host: str,
    grpc_port: int,
    http_port: int,
    metrics_port: int,
    ready_timeout: float,
    skip_version_check: bool,
    emulate_tensorrtllm: bool,
    spec_path: str | None,
    openai_port: int | None,
    openai_host: str | None,
    openai_model_name: str | None,
    log_file: str | None,
    drain_timeout: float,
    allow_client_apis: str,
) -> None:
    """Run Triton on REPO until SIGTERM or Ctrl-C.

    Uses `tritonserver` from PATH when there is one (NVIDIA's containers), else the CPU server
    bundled in nvidia-pytriton. Prints one `ready` line with the addresses once every model is
    loaded; on a failed load, the server log's error lines.

    TensorRT-LLM engine models (tensorrtllm flavor) need `tritonserver` and `mpirun` on PATH; their
    engines must exist and have been built with this runtime's TensorRT-LLM and TensorRT versions
    (their manifest.json says), and Triton runs in the backend's orchestrator mode, so a
    multi-GPU target and its draft share one server.

    With --emulate-tensorrtllm (and --spec), a tensorrtllm-flavor repository is served on CPU: a
    copy of it in a temporary directory (removed at stop) runs each engine model in the python
    backend through an emulator of TensorRT-LLM's C++ backend, with the config as written; the
    engine-directory and version checks and orchestrator mode do not apply.

    An llmapi-flavor repository (trtllm-serve.yaml) is served as trtllm-serve would serve it, on the
    PyTorch twin: the options are validated as the LLM API reads them (an unknown key is refused by
    name), a torch-flavor twin is written into a temporary directory and served by Triton on
    127.0.0.1 (free ports unless given), and the OpenAI endpoint listens on trtllm-serve's port 8000
    (or --openai-port) with /health and /metrics (docs/llmapi.md says what differs).

    With --openai-port, an OpenAI-compatible endpoint (FastAPI + uvicorn, in this process) starts
    once Triton is ready, translating each HTTP request into one streaming gRPC request to the
    ensemble; the `ready` line then ends with `openai=http://HOST:PORT/v1`. It stops with Triton.

    While serving, a supervisor watches the python models' processes: when one dies (e.g. the
    OOM killer), it prints one `supervisor:` line naming the model, reports not ready while the
    model is down, and brings it back (reloads it; restarts Triton for the decoupled loop model).
    A stop takes a few seconds at most and removes this server's shared memory. Triton's log is
    kept (--log-file). The shared-memory, model-repository, logging and trace APIs are closed to
    clients unless --allow-client-apis opens them.

    \b
    Examples:
      trt-spec serve --repo model_repo
      trt-spec serve --repo model_repo --openai-port 8080
      trt-spec serve --repo model_repo --emulate-tensorrtllm --spec examples/pystdlib-demo.yaml
      trt-spec serve --repo llmapi_repo            # an llmapi repository: OpenAI API on port 8000
    """
    if len({grpc_port, http_port, metrics_port}) != 3:
        raise click.UsageError(
            f"--grpc-port, --http-port and --metrics-port must differ; got {grpc_port}, {http_port}, {metrics_port}"
        )
    try:
        client_apis = parse_client_apis(allow_client_apis)
    except ServerError as exc:
        raise click.BadParameter(str(exc), param_hint="--allow-client-apis") from None
    if emulate_tensorrtllm and spec_path is None:
        raise click.UsageError(
            "--emulate-tensorrtllm needs the spec the repository was written from: add --spec F "
            "(e.g. --spec examples/pystdlib-demo.yaml)"
        )
    if spec_path is not None and not emulate_tensorrtllm:
        raise click.UsageError(
            "--spec is only read with --emulate-tensorrtllm: add --emulate-tensorrtllm, or drop --spec"
        )
    if not emulate_tensorrtllm and twin_route(Path(repo)) is not None:
        # The route's own server (trtllm-serve) opens only its OpenAI port: Triton behind the twin is
        # internal, on free ports unless given.
        source = click.get_current_context().get_parameter_source
        grpc_port, http_port, metrics_port = (
            port if source(name) is ParameterSource.COMMANDLINE else 0
            for name, port in (("grpc_port", grpc_port), ("http_port", http_port), ("metrics_port", metrics_port))
        )
    openai_host = openai_host or host
    if openai_port is not None:
        taken = {"--grpc-port": grpc_port, "--http-port": http_port, "--metrics-port": metrics_port}
        clash = [name for name, port in taken.items() if port == openai_port and openai_host == host]
        if clash:
            raise click.UsageError(f"--openai-port {openai_port} is also {clash[0]}: choose another port")
    serve_repository(
        ServeOptions(
            repo=Path(repo),
            host=host,
            grpc_port=grpc_port,
            http_port=http_port,
            metrics_port=metrics_port,
            ready_timeout_s=ready_timeout,
            skip_version_check=skip_version_check,
            emulate_spec=spec_path if emulate_tensorrtllm else None,
            openai_port=openai_port,
            openai_host=openai_host,
            openai_model_name=openai_model_name,
            log_file=Path(log_file) if log_file else None,
            drain_timeout_s=drain_timeout,
            client_apis=client_apis,
        ),
        say=_say,
        ready=_ready,
    )
    click.echo("stopped", err=True)


def _say(line: str) -> None:
    """One status line of `serve` on stderr, flushed (an operator's log collector reads it live)."""
    click.echo(line, err=True)
    sys.stderr.flush()


def _ready(line: str) -> None:
    """The `ready` line on stdout, flushed (a script waits for it)."""
    click.echo(line)
    sys.stdout.flush()


@click.command()
@spec_option
@click.option(
    "--flavor",
    type=click.Choice(tuple(FLAVORS)),
    default=None,
    help="tensorrtllm: TensorRT-LLM engines (GPU); torch: the PyTorch twin of the engines (CPU or GPU); "
    "llmapi: TensorRT-LLM's PyTorch backend, no engines (trtllm-serve, Triton's llmapi model). "
    "Default: the spec's triton.flavor.",
)
@click.option(
    "-o",
    "--output",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Where to write the repository (default: the spec's paths.model_repo).",
)
@click.option(
    "--engines-mount",
    default=None,
    metavar="PATH",
    help="The spec's paths.engines as the serving machine sees it (e.g. a container mount point).",
)
@click.option(
    "--adaptive-draft/--fixed-draft",
    default=False,
    show_default=True,
    help="The loop's default for requests that do not send adaptive_draft: choose K each step, up to num_draft_tokens.",
)
@click.option(
    "--torch-threads",
    type=click.IntRange(min=0),
    default=1,
    show_default=True,
    help="torch flavor: intra-op threads per engine model (0 = torch's default).",
)
@tuning_option
@click.option(
    "--trtllm-version",
    default=None,
    metavar="VERSION",
    help="llmapi flavor: the TensorRT-LLM release its files are for, 1.2 (1.2.x) or 1.3 (1.3 and later). "
    "Default: 1.3, upstream's current line.",
)
def repo(spec_path, flavor, out_dir, engines_mount, adaptive_draft, torch_threads, tuning_path, trtllm_version) -> None:
    """Write the Triton model repository: `ensemble` (spec_preprocessing -> spec_loop, the draft ->
    verify loop -> spec_postprocessing), the same pipeline as `tensorrt_llm_bls`, the engine models
    tensorrt_llm and tensorrt_llm_draft, and TensorRT-LLM's `preprocessing` and `postprocessing`.

    With engines built (tensorrtllm flavor) they are checked against the spec first; a mismatch
    is refused. The repository carries its tokenizer and the trt_spec code its python models
    import, so it can be moved (the serving Python needs numpy < 2, torch, transformers,
    pydantic and pyyaml).

    With --tuning (a `trt-spec tune` report), adaptive K starts each request from the acceptance
    measured on your prompts, the tensorrtllm flavor's K schedule by requests in flight is projected
    from it, and the torch flavor's adaptive K weighs the step costs measured there.

    \b
    Examples:
      trt-spec repo --spec examples/pystdlib-demo.yaml --flavor torch -o model_repo
      trt-spec repo --spec examples/llama8b-1b-h200.yaml --engines-mount /engines
      trt-spec repo --spec examples/pystdlib-demo.yaml --flavor torch --tuning tuning.json
      trt-spec repo --spec examples/llama70b-1b-4xh100.yaml --flavor llmapi --trtllm-version 1.2
    """
    from trt_spec.repository.writer import write_repository

    spec = read_spec(spec_path)
    tuning = read_tuning(tuning_path, spec)
    chosen = FLAVORS[flavor or spec.triton.flavor]
    if trtllm_version is not None and not chosen.takes_trtllm_version:
        raise click.UsageError(f"--trtllm-version is for the llmapi flavor; this repository's flavor is {chosen.name}")
    # The report's measured costs and K by requests in flight (tune --url) only where the flavor runs
    # on the kind of machine that tuned (its CPU times say nothing about a GPU).
    measured_here = tuning if tuning and chosen.uses_measured_step_costs else None
    schedule = measured_here.loop_schedule(spec) if measured_here else None
    result = write_repository(
        spec,
        out_dir,
        flavor,
        engines_mount=engines_mount,
        adaptive_draft=adaptive_draft,
        torch_threads=torch_threads,
        acceptance=tuning.acceptance if tuning else None,
        step_costs=measured_here.measured_step_costs() if measured_here else None,
        k_schedule=schedule,
        trtllm_version=trtllm_version,
    )
    for note in result.notes:
        click.echo(f"note: {note}")
    if schedule and measured_here and measured_here.measured_schedule:
        click.echo(
            f"note: the loop runs K {' '.join(map(str, schedule))} for 1..{len(schedule)} requests in flight, "
            f"as measured through {measured_here.measured_schedule.url} (trt-spec tune --url)"
        )
    click.echo(f"wrote {result.path} ({result.flavor} flavor): {', '.join(result.models)}")
    click.echo(f"next: {chosen.next_step(result.path)}")


commands = [repo, serve]
