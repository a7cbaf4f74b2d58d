"""``trt-spec tune``: acceptance measured on the user's prompts with the spec's own checkpoints,
the projected speedup on the spec's GPU from that measured profile, the recommended K, and the
report ``plan``, ``check`` and ``repo`` read (``trt_spec.plan.tuning``).

Acceptance is a property of the pair and the traffic, not of the hardware: greedy acceptance is
the same tokens on any device, so measuring it in-process (CPU, or CUDA where present) and
projecting the step times for the GPU is sound. The speed measured here is this machine's and is
reported as such; the recommendation comes from the projection.

Each K is run on its own (one row per K and temperature: tokens per target call and acceptance
per position as measured at that K); the profile the projection uses is the one measured at the
largest K, which covers every smaller K too (E(K) = 1 + the fractions accepted through positions
1..K), so the projection can rank K that were not run.
"""

from __future__ import annotations

import datetime
import platform
import statistics
from collections.abc import Sequence

from trt_spec.bench.inprocess import BenchConfig, BenchReport, run_local_bench
from trt_spec.bench.rows import FixedRow, Progress
from trt_spec.bench.server import ServerBenchConfig, run_server_bench
from trt_spec.plan import Plan
from trt_spec.plan.projection import k_schedule, project_plan
from trt_spec.plan.tuning import (
    REPORT_VERSION,
    KRow,
    LengthSummary,
    MeasuredSchedule,
    MeasuredStepCosts,
    MethodResult,
    SchedulePoint,
    TemperatureResult,
    TuningReport,
    Workload,
    recommend_method,
)
from trt_spec.runtime import methods
from trt_spec.runtime.costs import AcceptanceProfile
from trt_spec.twin import TwinPair

DEFAULT_KS = (1, 2, 3, 4, 6, 8)
DEFAULT_TEMPERATURES = (0.0,)
DEFAULT_LOADS = (1, 4, 8)  # requests in flight measured through a server (tune --url)


def applicable_methods(pair: TwinPair) -> tuple[str, ...]:
    """The methods ``pair`` can run, its own first: every registered one, less those needing a
    draft model where the pair has none."""
    runnable = [
        name for name, method in methods.METHODS.items() if pair.draft is not None or not method.uses_draft_model
    ]
    return tuple(dict.fromkeys([pair.method.name, *runnable]))


def run_tuning(
    plan: Plan,
    pair: TwinPair,
    *,
    prompts: Sequence[Sequence[int]] | None = None,
    source: str = "packaged prompts",
    ks: Sequence[int] = DEFAULT_KS,
    temperatures: Sequence[float] = DEFAULT_TEMPERATURES,
    method_names: Sequence[str] = (),
    num_prompts: int = 8,
    max_new_tokens: int = 96,
    repeats: int = 1,
    progress: Progress | None = None,
) -> TuningReport:
    """Measure each method in ``method_names`` (default :func:`applicable_methods`; the pair's own
    is always measured, first) on ``prompts`` (token ids; default the packaged ones) at each K and
    temperature in one interleaved run, project each on ``plan``'s GPU and recommend a method and
    K (see the module docstring).

    Raises:
        ValueError: a K outside 1..16, an unknown method or one the pair cannot run.
    """
    chosen = tuple(dict.fromkeys([pair.method.name, *(method_names or applicable_methods(pair))]))
    config = BenchConfig(
        ks=tuple(sorted(set(ks))),
        temperatures=tuple(temperatures),
        num_prompts=len(prompts) if prompts else num_prompts,
        max_new_tokens=max_new_tokens,
        repeats=repeats,
        hf_assisted=False,
        adaptive=False,
        prompts=tuple(tuple(prompt) for prompt in prompts) if prompts else None,
        methods=chosen,
    )
    bench = run_local_bench(pair, config, progress)
    largest = max(config.ks)
    results = [
        MethodResult(
            name=name,
            temperatures=[
                _temperature_result(plan, bench, name, temperature, largest) for temperature in config.temperatures
            ],
            step_costs=_measured_step_costs(bench, name, largest),
        )
        for name in chosen
    ]
    lengths = [len(prompt) for prompt in prompts] if prompts else [config.prompt_tokens] * config.num_prompts
    spec = plan.spec
    recommended = recommend_method(results)
    return TuningReport(
        version=REPORT_VERSION,
        spec_name=spec.name,
        target=spec.target.model,
        draft=spec.draft.model if spec.draft else None,
        method=spec.speculative.method,
        spec_k=spec.num_draft_tokens,
        gpu=spec.engine.gpu,
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        machine=f"{platform.node()} ({platform.machine()}, {platform.processor() or 'cpu'})",
        runner=f"{bench.runner} runner, {bench.threads} torch threads",
        workload=Workload(
            source=source,
            prompts=len(lengths),
            prompt_tokens=LengthSummary(min=min(lengths), median=statistics.median(lengths), max=max(lengths)),
            max_new_tokens=max_new_tokens,
        ),
        methods=results,
        recommended_method=recommended,
        recommended_k=next(result for result in results if result.name == recommended).primary.recommended_k,
    )


def _temperature_result(
    plan: Plan, bench: BenchReport, name: str, temperature: float, largest: int
) -> TemperatureResult:
    """One method at one temperature: its rows, and the projection from the profile at the largest K.

    The profile counts acceptance per step (accepted at position i / all steps), so a prompt-lookup
    step that found no match counts as drafting nothing, and E(K) = 1 + its sum is the tokens per
    target call measured. The projection charges such a step t_(K+1) all the same: conservative.
    The draft engine is charged on the steps it ran (``draft_share``)."""
    rows = {r.k: r for r in bench.rows if isinstance(r, FixedRow) and r.temperature == temperature and r.method == name}
    at_largest = rows[largest]
    profile = AcceptanceProfile.measured(at_largest.accepted_through_per_step, at_largest.alpha)
    method = methods.get(name)
    if not method.uses_draft_model:
        draft_share = 0.0
    elif not method.uses_lookup:
        draft_share = 1.0
    else:
        model_steps = at_largest.steps_by_source.get(methods.DRAFT_MODEL, 0)
        draft_share = min(1.0, model_steps / at_largest.target_calls) if at_largest.target_calls else 1.0
    projection = project_plan(plan, profile, max_k=largest, draft_share=draft_share)
    return TemperatureResult(
        temperature=temperature,
        alpha=profile.alpha,
        accepted_through=list(profile.accepted_through),
        rows=[
            KRow(
                k=k,
                tokens_per_target_call=row.tokens_per_target_call,
                profile_tokens_per_target_call=profile.tokens_per_call(k),
                acceptance_rate=row.acceptance_rate,
                alpha=row.alpha,
                accepted_through=list(row.accepted_through_per_step),
                measured_speedup=row.speedup,
            )
            for k, row in sorted(rows.items())
        ],
        projected_speedup=[row.speedup for row in projection.rows],
        recommended_k=projection.recommended_k,
        k_schedule=[step.k for step in k_schedule(plan, profile, draft_share=draft_share)],
        draft_share=draft_share,
    )


def _measured_step_costs(bench: BenchReport, name: str, largest: int) -> MeasuredStepCosts:
    costs = bench.step_times_by_method[name].step_costs(largest)
    return MeasuredStepCosts(draft=costs.draft, verify_slope=costs.verify_slope)


def measure_schedule(
    url: str,
    prompts: Sequence[str],
    *,
    ks: Sequence[int],
    method: str,
    loads: Sequence[int] = DEFAULT_LOADS,
    temperature: float = 0.0,
    max_new_tokens: int = 96,
    metrics_url: str | None = None,
    progress: Progress | None = None,
    stream: bool = True,
) -> MeasuredSchedule:
    """The best K by requests in flight on the server at ``url`` (serving a spec of ``method``):
    each K and plain decoding at each load in ``loads``, interleaved on the same server
    (``bench --url``, :mod:`trt_spec.bench.server`); ``stream`` False: requests that ask for one
    final response, whose plain decoding takes many tokens per target call.

    Raises:
        ServerUnreachable, GenerationError: the server cannot be reached or fails a request.
    """
    config = ServerBenchConfig(
        ks=tuple(sorted(set(ks))),
        temperatures=(temperature,),
        concurrency=tuple(loads),
        num_prompts=len(prompts),
        max_new_tokens=max_new_tokens,
        prompts=tuple(prompts),
        stream=stream,
    )
    rows = run_server_bench(url, config, metrics_url=metrics_url, progress=progress).rows
    points = []
    for load in sorted({1, *loads}):
        at_load = {row.k: row.speedup for row in rows if row.concurrency == load and row.speedup is not None}
        points.append(SchedulePoint(in_flight=load, speedups=at_load))
    return MeasuredSchedule(
        url=url,
        method=method,
        temperature=temperature,
        prompts=len(prompts),
        max_new_tokens=max_new_tokens,
        points=points,
        stream=stream,
    )


def render_report(report: TuningReport) -> list[str]:
    """The report as text: per method and temperature, the profile, a row per K, the method's best
    K; then the methods side by side and the recommendation."""
    workload = report.workload
    lines = [
        f"tuned {report.spec_name} on {workload.source}: {workload.prompts} prompts of "
        f"{workload.prompt_tokens.min}-{workload.prompt_tokens.max} tokens, {workload.max_new_tokens} new tokens each "
        f"({report.runner})",
    ]
    for method in report.methods:
        for result in method.temperatures:
            lines += ["", *_render_temperature(report, method.name, result)]
    lines += ["", *_render_methods(report)]
    recommended = report.recommended_k
    lines += [
        "",
        f"K is the target engine's max_draft_len, fixed at build: the spec has method {report.method}, "
        f"K = {report.spec_k}"
        + (
            "."
            if (report.method, report.spec_k) == (report.recommended_method, recommended)
            else f"; set speculative.method: {report.recommended_method} and speculative.num_draft_tokens: "
            f"{recommended} before `trt-spec build`."
        ),
        "'here' is this machine's measured speedup (not the GPU's); the GPU column is a projection "
        "(docs/gpu.md). Pass the report to plan, check and repo with --tuning.",
    ]
    if report.measured_schedule is not None:
        lines += ["", *report.measured_schedule.render(report.spec_k, report.max_batch_size)]
    return lines


def _render_temperature(report: TuningReport, name: str, result: TemperatureResult) -> list[str]:
    through = ", ".join(f"{value:.2f}" for value in result.accepted_through)
    lines = [
        f"{name}, temperature {result.temperature:g}: alpha {result.alpha:.3f}; accepted through positions 1..K "
        f"per step (at K {len(result.accepted_through)}): {through}"
        + (f"; the draft model ran {result.draft_share:.0%} of steps" if 0 < result.draft_share < 1 else ""),
        f"  {'K':>3} {'tokens/call':>11} {'from profile':>12} {'accept rate':>11} {'here':>7} "
        f"{'on ' + report.gpu.upper():>8}",
    ]
    measured = {row.k: row for row in result.rows}
    for k, projected in enumerate(result.projected_speedup, start=1):
        mark = "  <- best" if k == result.recommended_k else ""
        mark += "  (the spec's K)" if k == report.spec_k else ""
        row = measured.get(k)
        here = (
            f"{row.tokens_per_target_call:>11.2f} {row.profile_tokens_per_target_call:>12.2f} "
            f"{row.acceptance_rate:>11.3f} {row.measured_speedup:>6.2f}x"
            if row
            else f"{'-':>11} {result.profile.tokens_per_call(k):>12.2f} {'-':>11} {'-':>7}"
        )
        lines.append(f"  {k:>3} {here} {projected:>7.2f}x{mark}")
    lines.append(
        f"  best K = {result.recommended_k} (projected on {report.gpu.upper()} at batch 1, from the measured "
        f"profile); by requests in flight 1..{len(result.k_schedule)}: " + " ".join(map(str, result.k_schedule))
    )
    return lines


def _render_methods(report: TuningReport) -> list[str]:
    lines = [
        f"methods at temperature {report.methods[0].primary.temperature:g}, each at its best K "
        f"(projected on {report.gpu.upper()}; 'here' is the best K measured on this machine):"
    ]
    for method in report.methods:
        result = method.primary
        here = max(result.rows, key=lambda row: row.measured_speedup)
        mark = "  <- recommended" if method.name == report.recommended_method else ""
        lines.append(
            f"  {method.name:<14} K {result.recommended_k:>2}: x{result.best_speedup:.2f} on {report.gpu.upper()}, "
            f"alpha {result.alpha:.3f}; here x{here.measured_speedup:.2f} at K {here.k}{mark}"
        )
    return lines
