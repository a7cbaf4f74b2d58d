"""``demo``: the embedded demo pair end to end on CPU, through a real Triton server."""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

import click

from trt_spec.cli.common import DEMO_SPEC

DEMO_PROMPTS = (
    "def read_config(path):\n",
    'class LRUCache:\n    """A least-recently-used cache."""\n\n    def __init__(self, maxsize=128):\n',
    "import os\n\n\ndef walk_files(top):\n",
)


@click.command()
@click.option(
    "--spec",
    "spec_path",
    type=click.Path(dir_okay=False),
    default=None,
    help=f"The spec to demonstrate (default: the embedded demo pair, {DEMO_SPEC.name}).",
)
@click.option("--max-tokens", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--keep", is_flag=True, help="Keep the temporary directory (repository and server log).")
def demo(spec_path, max_tokens, keep) -> None:
    """The demo pair end to end on CPU: check -> plan -> repo (torch flavor) -> serve -> generate
    a few prompts, streaming -> acceptance and speed -> stop the server.

    Runs in its own temporary directory on free ports; nothing is left behind.

    \b
    Example:
      trt-spec demo
    """
    from trt_spec.bench.demo import MEASURE_PROMPTS, explain_here, explain_on_gpu, measure_step_costs, server_alpha
    from trt_spec.cli.common import read_spec
    from trt_spec.client import SpecClient
    from trt_spec.plan import make_plan
    from trt_spec.plan.check import check_pair
    from trt_spec.repository.writer import write_repository
    from trt_spec.serving.server import TritonServer

    path = Path(spec_path) if spec_path else DEMO_SPEC
    if not path.is_file():
        raise click.ClickException(
            f"no demo spec at {path}: the demo pair ships with the repository (examples/); run from a clone, "
            "or pass --spec FILE"
        )
    spec = read_spec(str(path))
    workdir = Path(tempfile.mkdtemp(prefix="trt-spec-demo-"))
    server = None
    try:
        step("check", f"the pair {spec.target.model} / {spec.draft.model if spec.draft else 'prompt lookup'}")
        checked = check_pair(spec)
        if not checked.ok:
            raise click.ClickException("; ".join(f"{row.check}: {row.detail}" for row in checked.fatal))
        click.echo(f"  {len(checked.rows)} checks passed ({len(checked.warnings)} warning(s))")

        step("plan", "engines and memory (what a GPU build would run)")
        plan = make_plan(spec)
        click.echo(
            f"  K = {spec.num_draft_tokens}, {spec.speculative.acceptance} acceptance; target build: "
            f"{' '.join(plan.target.build_argv[:3])} ... ({len(plan.target.build_argv)} arguments)"
        )

        step("repo", f"torch flavor in {workdir / 'model_repo'}")
        result = write_repository(spec, workdir / "model_repo", "torch", plan=plan)
        click.echo(f"  {', '.join(result.models)}")

        step("serve", "Triton on free ports (the CPU server bundled in nvidia-pytriton)")
        started = time.perf_counter()
        server = TritonServer(result.path, ready_timeout_s=300, log_file=workdir / "tritonserver.log").start()
        click.echo(
            f"  ready in {time.perf_counter() - started:.1f} s: grpc {server.grpc_url}, metrics {server.metrics_url}"
        )

        step("generate", f"{len(DEMO_PROMPTS)} prompts, streamed over gRPC, {max_tokens} new tokens at most")
        totals = {"spec": [0, 0.0], "plain": [0, 0.0]}
        drafted = accepted = calls = 0
        with SpecClient(server.grpc_url) as client:
            for prompt in DEMO_PROMPTS:
                click.secho(prompt, nl=False, bold=True)
                began = time.perf_counter()
                last = None
                for event in client.generate(prompt, max_tokens=max_tokens):
                    click.echo(event.text, nl=False)
                    sys.stdout.flush()
                    last = event
                seconds = time.perf_counter() - began
                click.echo()
                tokens = last.num_output_tokens if last else 0
                totals["spec"][0] += tokens
                totals["spec"][1] += seconds
                drafted += last.total_draft_tokens if last else 0
                accepted += last.total_accepted_draft_tokens if last else 0
                calls += last.num_target_calls if last else 0
                click.secho(
                    f"  [{tokens} tokens, {tokens / seconds:.0f} tokens/s, acceptance "
                    f"{last.acceptance_rate if last else 0:.2f}, {tokens / max(last.num_target_calls if last else 1, 1):.2f} "
                    f"tokens per target call]",
                    dim=True,
                )
                began = time.perf_counter()
                plain = list(client.generate(prompt, max_tokens=max_tokens, num_draft_tokens=0))
                totals["plain"][1] += time.perf_counter() - began
                totals["plain"][0] += plain[-1].num_output_tokens if plain else 0

        alpha = server_alpha(server.metrics_url, requests=2 * len(DEMO_PROMPTS))
        step("measure", "step costs in-process on one thread, as each engine model runs (the bench code)")
        report = measure_step_costs(spec, max_tokens)
        if alpha is None:
            alpha = report.rows[0].alpha
            click.echo("  (alpha from the in-process run: the server's metrics could not be read)")
        times, inprocess = report.step_times, report.rows[0]
        click.echo(
            f"  {MEASURE_PROMPTS} prompts in-process (no Triton): speedup x{inprocess.speedup:.2f} at K = "
            f"{inprocess.k}, alpha {inprocess.alpha:.2f}"
        )

        step("summary", "")
        spec_speed = totals["spec"][0] / totals["spec"][1]
        plain_speed = totals["plain"][0] / totals["plain"][1]
        click.echo(
            f"  speculative: {spec_speed:.0f} tokens/s, acceptance {accepted / max(drafted, 1):.2f} "
            f"({accepted}/{drafted} drafts), {totals['spec'][0] / max(calls, 1):.2f} tokens per target call\n"
            f"  plain target decoding on the same server: {plain_speed:.0f} tokens/s -> speedup x{spec_speed / plain_speed:.2f}"
        )
        click.echo(explain_here(spec_speed / plain_speed, alpha, spec.num_draft_tokens, times))
        click.echo(explain_on_gpu(plan, alpha, _shown(path)))
    finally:
        if server is not None:
            server.stop()
            step("stop", "server stopped")
        if keep:
            click.echo(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _shown(path: Path) -> str:
    """``path`` relative to the current directory when it is below it (as a user would type it)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def step(name: str, what: str) -> None:
    click.secho(f"== {name}", bold=True, nl=False)
    click.echo(f" {what}" if what else "")


commands = [demo]
