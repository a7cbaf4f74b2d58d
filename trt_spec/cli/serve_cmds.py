"""``serve``: run Triton on a model repository in the foreground until SIGTERM or Ctrl-C."""

from __future__ import annotations

import signal
import sys

import click

from trt_spec.errors import ServerError
from trt_spec.triton.server import DEFAULT_PORTS, TritonServer


class _Stop(BaseException):
    """Raised by the signal handler; not an Exception, so nothing on the way swallows it."""


def _raise_stop(signum, frame) -> None:
    raise _Stop()


@click.command()
@click.option("--repo", "repo", required=True, type=click.Path(exists=True, file_okay=False),
              help="The Triton model repository (`trt-spec repo` writes one).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind; 0.0.0.0 for every interface.")
@click.option("--grpc-port", default=DEFAULT_PORTS["grpc"], show_default=True, type=click.IntRange(1, 65535))
@click.option("--http-port", default=DEFAULT_PORTS["http"], show_default=True, type=click.IntRange(1, 65535))
@click.option("--metrics-port", default=DEFAULT_PORTS["metrics"], show_default=True, type=click.IntRange(1, 65535))
@click.option("--ready-timeout", default=300.0, show_default=True, type=click.FloatRange(min=1),
              help="Seconds to wait for every model to load.")
def serve(repo: str, host: str, grpc_port: int, http_port: int, metrics_port: int, ready_timeout: float) -> None:
    """Run Triton on REPO until SIGTERM or Ctrl-C.

    Uses `tritonserver` from PATH when there is one (NVIDIA's containers), else the CPU server
    bundled in nvidia-pytriton. Prints one `ready` line with the addresses once every model is
    loaded; on a failed load, the server log's error lines.

    \b
    Example:
      trt-spec serve --repo model_repo
    """
    if len({grpc_port, http_port, metrics_port}) != 3:
        raise click.UsageError(f"--grpc-port, --http-port and --metrics-port must differ; got {grpc_port}, {http_port}, {metrics_port}")
    server = TritonServer(repo, host=host, http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port,
                          ready_timeout_s=ready_timeout)
    previous = {sig: signal.signal(sig, _raise_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.start()
        click.echo(f"ready grpc={server.grpc_url} http={server.http_url} metrics={server.metrics_url}")
        sys.stdout.flush()
        code = server.wait()
        # Only an unexpected exit gets here: a signal raises _Stop out of wait().
        message = f"tritonserver exited with code {code}: {server.log_errors()}"
        server.stop(keep_log=True)
        raise ServerError(message)
    except _Stop:
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        server.stop()
    click.echo("stopped", err=True)


commands = [serve]
