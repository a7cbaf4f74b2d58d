"""``build``: compile both engines (GPU machine), or show exactly what would run."""

from __future__ import annotations

import click

from trt_spec.cli.common import read_spec, render_steps, spec_option, spec_plan
from trt_spec.engines import build as build_lib


@click.command()
@spec_option
@click.option("--dry-run", is_flag=True, help="Print the steps that would run; needs no GPU.")
@click.option("--force", is_flag=True, help="Rebuild even when the engines in place are up to date.")
def build(spec_path: str, dry_run: bool, force: bool) -> None:
    """Convert both checkpoints and compile the target and draft engines.

    Engines land in <engines>/<name>/<target|draft>/ with a manifest.json; a second run with
    the same inputs keeps them. Needs TensorRT-LLM 1.2.x and a Hopper GPU.

    \b
    Example:
      trt-spec build --spec examples/llama8b-1b-h200.yaml --dry-run
      trt-spec build --spec examples/llama8b-1b-h200.yaml
    """
    the_plan = spec_plan(read_spec(spec_path))
    if not the_plan.builds_engines:
        raise click.ClickException(
            f"spec {the_plan.spec.name!r}: triton.flavor {the_plan.spec.triton.flavor} builds no TensorRT engines "
            f"(TensorRT-LLM loads the checkpoints itself); write what serves it with "
            f"`trt-spec repo --spec {spec_path}`, or pick flavor tensorrtllm to build engines"
        )
    if dry_run:
        for line in render_steps(the_plan, spec_path):
            click.echo(line)
        click.echo(
            "# each trtllm-build writes into a temporary sibling of its --output_dir, renamed into place on "
            "success; an engine whose manifest.json matches these inputs is kept"
        )
        return
    toolchain = build_lib.probe_toolchain()
    results = build_lib.build_engines(
        the_plan, toolchain, force=force, on_event=lambda message: click.echo(message, err=True)
    )
    for result in results:
        state = "kept" if result.skipped else "built"
        click.echo(f"{result.role}: {state} {result.engine_dir} ({result.reason})")


commands = [build]
