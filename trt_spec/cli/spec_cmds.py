"""``init`` and ``plan``: writing a spec and showing what it will do."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import click

from trt_spec import atomic
from trt_spec.cli.common import read_spec, read_tuning, render_steps, spec_option, spec_plan, tuning_option
from trt_spec.plan import Plan
from trt_spec.plan.memory import format_bytes
from trt_spec.plan.projection import (
    DEFAULT_ALPHA,
    DEFAULT_BATCH,
    DEFAULT_MAX_K,
    Projection,
    ScheduleStep,
    k_schedule,
    loop_schedule,
    project_plan,
    render_projection,
    render_schedule,
)
from trt_spec.runtime.costs import Acceptance
from trt_spec.runtime.parameters import MAX_DRAFT_TOKENS
from trt_spec.spec import Spec


@click.command()
@click.option(
    "-o",
    "--output",
    default="spec.yaml",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="Where to write the spec.",
)
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
def init(output: str, force: bool) -> None:
    """Write an annotated spec to edit.

    \b
    Example:
      trt-spec init -o llama.yaml
    """
    path = Path(output)
    if path.exists() and not force:
        raise click.ClickException(f"{path} exists; pass --force to overwrite it")
    template = (resources.files("trt_spec") / "data" / "spec_template.yaml").read_text()
    atomic.write_text(path, template)
    click.echo(f"wrote {path}; next: edit it, then `trt-spec plan --spec {path}`")


@click.command()
@spec_option
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.option(
    "--alpha",
    type=click.FloatRange(0, 1),
    default=None,
    help=f"Per-position acceptance for the projection [default: {DEFAULT_ALPHA}, or the --tuning report's "
    "measured profile].",
)
@tuning_option
@click.option(
    "--max-k",
    type=click.IntRange(1, MAX_DRAFT_TOKENS),
    default=DEFAULT_MAX_K,
    show_default=True,
    help="Project K = 1 .. this.",
)
@click.option(
    "--context",
    type=click.IntRange(min=1),
    default=None,
    help="Tokens already in each sequence's KV cache for the projection (default: the spec's max_input_len).",
)
@click.option(
    "--batch",
    type=click.IntRange(min=1),
    default=DEFAULT_BATCH,
    show_default=True,
    help="Sequences per engine step for the projection.",
)
def plan(
    spec_path: str,
    as_json: bool,
    alpha: float | None,
    tuning_path: str | None,
    max_k: int,
    context: int | None,
    batch: int,
) -> None:
    """Show the conversion and trtllm-build steps, the GPU memory plan, and a projection of the
    speedup per K on the spec's GPU (a memory-bandwidth model) with the K schedule by requests in
    flight. Needs no GPU. With --tuning, the projection uses the acceptance measured on your prompts.

    \b
    Example:
      trt-spec plan --spec examples/llama70b-1b-4xh100.yaml
      trt-spec plan --spec examples/llama70b-1b-4xh100.yaml --alpha 0.6
      trt-spec plan --spec examples/pystdlib-demo.yaml --tuning tuning.json
      trt-spec plan --spec examples/llama70b-1b-4xh100.yaml --json | jq .projection.rows
    """
    if alpha is not None and tuning_path is not None:
        raise click.UsageError("--alpha and --tuning are alternatives: the report carries the measured acceptance")
    spec = read_spec(spec_path)
    tuning = read_tuning(tuning_path, spec)
    acceptance: Acceptance = tuning.acceptance if tuning else (DEFAULT_ALPHA if alpha is None else alpha)
    the_plan = spec_plan(spec)
    draft_share = tuning.primary.draft_share if tuning else 1.0  # hybrid: the steps its draft model ran
    projection = project_plan(the_plan, acceptance, max_k=max_k, context=context, batch=batch, draft_share=draft_share)
    schedule = k_schedule(the_plan, acceptance, context=context, draft_share=draft_share)
    tuning_warnings = tuning.warnings(spec) if tuning else []
    if as_json:
        click.echo(
            json.dumps(
                {
                    **the_plan.to_json(),
                    "projection": projection.to_json(),
                    "k_schedule": [step.to_json() for step in schedule],
                    "loop_k_schedule": list(loop_schedule(schedule, the_plan.spec.num_draft_tokens)),
                    **(
                        {"measured_loop_k_schedule": list(tuning.loop_schedule(spec) or ())}
                        if tuning and tuning.measured_schedule
                        else {}
                    ),
                    **(
                        {
                            "tuning": {
                                "recommended_method": tuning.recommended_method,
                                "recommended_k": tuning.recommended_k,
                                "warnings": tuning_warnings,
                            }
                        }
                        if tuning
                        else {}
                    ),
                },
                indent=2,
            )
        )
    else:
        click.echo(render_plan(the_plan, spec_path, projection, schedule, acceptance))
        for warning in tuning_warnings:
            click.echo(f"warning: {warning}")
        if tuning and tuning.measured_schedule:
            click.echo("")
            click.echo("\n".join(tuning.measured_schedule.render(spec.num_draft_tokens, spec.engine.max_batch_size)))


def render_plan(
    the_plan: Plan,
    spec_path: str,
    projection: Projection | None = None,
    schedule: list[ScheduleStep] | None = None,
    acceptance: Acceptance = DEFAULT_ALPHA,
) -> str:
    spec, memory = the_plan.spec, the_plan.memory
    drafter = _drafter_text(spec)
    lines = [
        f"deployment {spec.name}: {spec.target.model} (tp {spec.target.tp_size}) drafted by {drafter}, "
        f"K = {spec.num_draft_tokens}, {spec.speculative.acceptance} acceptance, {spec.engine.dtype} on "
        f"{spec.engine.gpu.upper()}",
        "",
        f"{'engine':<8} {'params':>10} {'weights/GPU':>12} {'KV/token':>10} {'activations':>12} {'KV tokens':>10}  config from",
    ]
    for role in the_plan.roles:
        engine, mem = the_plan.engine(role), getattr(memory, role)
        lines.append(
            f"{role:<8} {engine.model.num_params / 1e9:>9.3f}B {format_bytes(mem.weights_bytes):>12} "
            f"{mem.kv_bytes_per_token / 1024:>8.1f} KiB {format_bytes(mem.activation_bytes):>12} "
            f"{memory.kv_tokens:>10,}  {engine.model.source}"
        )
    lines += [
        "",
        f"{'GPU':<4} {'capacity':>12} {'target':>12} {'draft':>12} {'KV cache':>12} {'headroom':>10} {'unused':>12}",
    ]
    for gpu in memory.gpus:
        lines.append(
            f"{gpu.index:<4} {format_bytes(gpu.capacity):>12} {format_bytes(gpu.target_fixed):>12} "
            f"{format_bytes(gpu.draft_fixed):>12} {format_bytes(gpu.kv_cache):>12} {format_bytes(gpu.headroom):>10} "
            f"{format_bytes(gpu.unused):>12}"
        )
    lines.append(
        f"KV cache: {memory.kv_tokens:,} tokens per engine (max_tokens_in_paged_kv_cache), "
        f"{memory.full_sequences:,} sequences of max_seq_len + K = {memory.tokens_per_sequence:,} tokens"
    )
    lines += [f"warning: {warning}" for warning in the_plan.warnings]
    lines += [f"note: {note}" for note in the_plan.notes]
    if projection is not None:
        lines += ["", *render_projection(projection)]
    if schedule:
        loop_k = spec.num_draft_tokens if the_plan.builds_engines else None  # no loop of ours off the engine route
        lines += ["", *render_schedule(schedule, acceptance, loop_k)]
    lines += ["", *render_steps(the_plan, spec_path)]
    return "\n".join(lines)


def _drafter_text(spec: Spec) -> str:
    """What drafts for a spec, in a few words (plan's first line)."""
    lookup = spec.speculative.prompt_lookup
    ngrams = f"prompt lookup (n-grams {lookup.max_ngram}..{lookup.min_ngram} of the request's tokens)"
    parts = []
    if spec.method.uses_lookup:
        parts.append(ngrams)
    if spec.draft is not None:
        parts.append(f"{spec.draft.model} (tp {spec.draft.tp_size})")
    text = " where it matches, else ".join(parts)
    return text + ("; no draft model" if spec.draft is None else "")


commands = [init, plan]
