"""``bench``: speculative vs plain decoding, in-process (vs Hugging Face assisted generation too) or
through a Triton server (time to first token, inter-token latency, concurrency)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from trt_spec.cli.common import DEMO_SPEC, choose_mode, dataset_options, load_dataset_workload, load_twin, mode_options
from trt_spec.runtime import methods
from trt_spec.runtime.parameters import MAX_DRAFT_TOKENS

if TYPE_CHECKING:
    from trt_spec.bench.inprocess import BenchReport
    from trt_spec.bench.profile import IterationProfile
    from trt_spec.bench.rows import ServerRow


@click.command()
@mode_options
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON (progress stays on stderr).")
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write speedup and tokens per target call against K to this PNG.",
)
@click.option(
    "-k",
    "--num-draft-tokens",
    "ks",
    type=click.IntRange(1, MAX_DRAFT_TOKENS),
    multiple=True,
    help="K values to measure (repeatable); default 1 2 3 4 6 8.",
)
@click.option(
    "--temperature",
    "temperatures",
    type=click.FloatRange(min=0),
    multiple=True,
    help="Temperatures to measure (repeatable); default 0 and 1.",
)
@click.option(
    "--prompts",
    "num_prompts",
    type=click.IntRange(min=1),
    default=None,
    help="How many prompts to use (packaged, or sampled from --dataset); default 8.",
)
@click.option("--max-tokens", type=click.IntRange(min=2), default=None, help="New tokens per request; default 96.")
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    default=None,
    help="Rounds over the prompts (more rounds, steadier means). Default 1.",
)
@click.option("--quick", is_flag=True, help="3 prompts, K 2 and 4, one run each: a smoke test in ~30 s.")
@click.option("--no-hf", is_flag=True, help="Skip Hugging Face assisted generation.")
@click.option("--no-adaptive", is_flag=True, help="Skip the adaptive-K runs.")
@click.option(
    "--method",
    "method_names",
    multiple=True,
    type=click.Choice(methods.names()),
    help="--local: speculation methods to put side by side (repeatable); default the spec's. A method with a "
    "draft model needs a spec with a draft section.",
)
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=None,
    help="torch CPU threads (default: torch's choice); 1 is steadiest on a shared machine.",
)
@click.option(
    "--profile",
    is_flag=True,
    help="Instead: where one iteration's time goes, for each K (default: the spec's) and temperature.",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    multiple=True,
    help="--url: requests in flight in the later runs (repeatable, e.g. --concurrency 8 --concurrency 32; "
    "the first run is one at a time). Default 4.",
)
@click.option(
    "--metrics-url",
    default=None,
    metavar="URL",
    help="--url: the server's Prometheus endpoint (default http://HOST:8002/metrics) for alpha and "
    "the loop's time per iteration.",
)
@click.option(
    "--stream/--no-stream",
    default=True,
    help="--url: streamed requests (default), or requests for one final response, as a non-streaming "
    "client sends them (plain decoding then takes many tokens per target call).",
)
@dataset_options
@click.option(
    "--tokenizer",
    "tokenizer_dir",
    type=click.Path(file_okay=False, exists=True),
    default=None,
    help="--dataset through a server without --spec: the served tokenizer (e.g. model_repo/spec_preprocessing/1/tokenizer).",
)
@click.option(
    "--tuning",
    "tuning_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="--local: a `trt-spec tune` report; adaptive K starts from its measured acceptance and step costs.",
)
def bench(
    url,
    local,
    spec_path,
    device,
    runner,
    as_json,
    plot_path,
    ks,
    temperatures,
    num_prompts,
    max_tokens,
    repeats,
    quick,
    no_hf,
    no_adaptive,
    method_names,
    threads,
    profile,
    concurrency,
    metrics_url,
    stream,
    dataset,
    dataset_column,
    dataset_split,
    seed,
    tokenizer_dir,
    tuning_path,
) -> None:
    """Measure tokens/s, acceptance and tokens per target call against plain decoding.

    Prompts are Python sources held out of the demo pair's training (packaged with trt-spec), or
    a seeded sample of your own (--dataset): acceptance depends on the task, so measure it on yours.
    In-process (--local): a table, the cost-model bound, and the K that Leviathan et al.'s
    Theorem 3.8 recommends; without --spec, the demo pair examples/pystdlib-wide.yaml (in a
    clone). Through a server (--url): speculative vs num_draft_tokens 0 on the same server at
    concurrency 1 and N, with time to first token and inter-token latency; with --spec as well,
    the in-process loop runs the same prompts for comparison.

    \b
    Examples:
      trt-spec bench --local                                   # the wide demo pair
      trt-spec bench --local --spec demo.yaml --plot bench.png
      trt-spec bench --url 127.0.0.1:8001 --concurrency 8 --json
      trt-spec bench --url 127.0.0.1:8001 --spec examples/pystdlib-wide.yaml   # + in-process
      trt-spec bench --local --spec demo.yaml --dataset chats.jsonl --prompts 16
    """
    import dataclasses

    import torch

    from trt_spec.bench.inprocess import BenchConfig, run_local_bench
    from trt_spec.bench.plot import write_plot
    from trt_spec.bench.profile import profile_iterations
    from trt_spec.plan.tuning import load_tuning

    if local and spec_path is None and DEMO_SPEC.is_file():
        spec_path = str(DEMO_SPEC)
    url, spec = choose_mode(url, local, spec_path, spec_with_url=True)
    if plot_path:
        try:
            import matplotlib  # noqa: F401  (fail now, not after minutes of measuring)
        except ImportError:
            raise click.UsageError("--plot needs matplotlib: pip install 'trt-spec[bench]'") from None
    if threads:
        torch.set_num_threads(threads)
    if dataset is None and (dataset_column or tokenizer_dir):
        raise click.UsageError("--dataset-column and --tokenizer go with --dataset SOURCE")

    def workload_of(tokenizer):
        return load_dataset_workload(
            dataset, tokenizer, spec, num_prompts=num_prompts, column=dataset_column, split=dataset_split, seed=seed
        )

    if url is not None:
        if profile or quick or repeats or no_hf or no_adaptive or tuning_path or method_names:
            raise click.UsageError(
                "--profile, --quick, --repeats, --no-hf, --no-adaptive, --method and --tuning are for --local runs "
                "(a server's adaptive K reads the report through `trt-spec repo --tuning`)"
            )
        workload = None
        if dataset is not None:
            if tokenizer_dir is None and spec is None:
                raise click.UsageError("--dataset through a server needs the tokenizer: --tokenizer DIR or --spec FILE")
            workload = workload_of(_tokenizer(tokenizer_dir, spec))
        _bench_server(
            url,
            spec,
            device,
            runner,
            as_json,
            plot_path,
            ks,
            temperatures,
            num_prompts,
            max_tokens,
            concurrency,
            metrics_url,
            tuple(prompt.text for prompt in workload.prompts) if workload else None,
            stream=stream,
        )
        return
    config = BenchConfig.quick() if quick else BenchConfig()
    overrides = {
        "ks": tuple(sorted(set(ks))) or None,
        "temperatures": tuple(temperatures) or None,
        "num_prompts": num_prompts,
        "max_new_tokens": max_tokens,
        "repeats": repeats,
    }
    config = dataclasses.replace(
        config,
        **{key: value for key, value in overrides.items() if value is not None},
        hf_assisted=not no_hf,
        adaptive=not no_adaptive,
        methods=tuple(method_names),
    )
    if spec is None:  # choose_mode gives a spec whenever it gives no url
        raise click.UsageError("--local needs --spec FILE (the deployment spec naming both checkpoints)")
    if tuning_path is not None:
        tuning = load_tuning(tuning_path, spec)
        config = dataclasses.replace(config, step_costs=tuning.measured_step_costs())
    pair = load_twin(spec, device, runner)
    if dataset is not None:
        workload = workload_of(pair.tokenizer)
        config = dataclasses.replace(config, prompts=tuple(tuple(prompt.tokens) for prompt in workload.prompts))
    if profile:
        for temperature in config.temperatures:
            for k in ks or (spec.num_draft_tokens,):
                result = profile_iterations(
                    pair,
                    k,
                    temperature,
                    num_prompts=min(config.num_prompts, 4),
                    prompt_tokens=config.prompt_tokens,
                    max_new_tokens=config.max_new_tokens,
                )
                click.echo(format_profile(result))
        return
    try:
        report = run_local_bench(pair, config, progress=lambda line: click.echo(line, err=True))
    except ValueError as exc:  # a method the spec's models cannot run
        raise click.UsageError(str(exc)) from None
    if plot_path:
        write_plot(report, plot_path)
        click.echo(f"wrote {plot_path}", err=True)
    if as_json:
        click.echo(json.dumps([row.to_json() for row in report.rows], indent=1))
        click.echo(format_recommendations(report), err=True)
    else:
        click.echo(format_table(report))
        click.echo(format_recommendations(report))


def _tokenizer(tokenizer_dir, spec):
    """The tokenizer at ``tokenizer_dir``, else the spec's target's (no weights loaded)."""
    from transformers import AutoTokenizer

    from trt_spec.repository.writer import hf_checkpoint_dir

    return AutoTokenizer.from_pretrained(str(tokenizer_dir or hf_checkpoint_dir(spec, "target")))


def _bench_server(
    url,
    spec,
    device,
    runner,
    as_json,
    plot_path,
    ks,
    temperatures,
    num_prompts,
    max_tokens,
    concurrency,
    metrics_url,
    prompts=None,
    stream=True,
) -> None:
    from trt_spec.bench.plot import write_server_plot
    from trt_spec.bench.server import ServerBenchConfig, run_server_bench

    config = ServerBenchConfig(
        ks=tuple(sorted(set(ks))) or None,
        temperatures=tuple(temperatures) or (0.0,),
        concurrency=tuple(concurrency) or ServerBenchConfig.concurrency,
        num_prompts=num_prompts or ServerBenchConfig.num_prompts,
        max_new_tokens=max_tokens or ServerBenchConfig.max_new_tokens,
        prompts=prompts,
        stream=stream,
    )
    host = url.rsplit(":", 1)[0]
    pair = load_twin(spec, device, runner) if spec is not None else None
    report = run_server_bench(
        url,
        config,
        metrics_url=metrics_url or f"http://{host}:8002/metrics",
        pair=pair,
        progress=lambda line: click.echo(line, err=True),
    )
    for note in report.notes:
        click.echo(f"note: {note}", err=True)
    if plot_path:
        write_server_plot(report.rows, plot_path)
        click.echo(f"wrote {plot_path}", err=True)
    if as_json:
        click.echo(json.dumps([row.to_json() for row in report.rows], indent=1))
    else:
        click.echo(format_server_table(report.rows))


def format_server_table(rows: list[ServerRow]) -> str:
    header = (
        f"{'K':>3} {'T':>4} {'conc':>4} {'tok/s':>7} {'plain':>7} {'speedup':>7} {'acc.rate':>8} {'alpha':>6} "
        f"{'tok/call':>8} {'TTFT ms':>8} {'ITL ms':>7} {'in-proc':>7} {'ratio':>6} {'ovh ms':>6} {'own':>5} "
        f"{'BLS':>5}"
    )
    lines = [header]
    for row in rows:
        inprocess, loop = row.inprocess, row.loop
        lines.append(
            f"{row.k:>3} {row.temperature:>4g} {row.concurrency:>4} {row.tokens_per_s:>7.1f} "
            f"{row.baseline_tokens_per_s:>7.1f} {_number(row.speedup, 7, 3)} {row.acceptance_rate:>8.3f} "
            f"{_number(row.alpha, 6, 3)} {row.tokens_per_target_call:>8.2f} {_number(row.ttft_ms, 8, 1)} "
            f"{_number(row.itl_ms, 7, 2)} {_number(inprocess.tokens_per_s if inprocess else None, 7, 1)} "
            f"{_number(inprocess.server_vs_inprocess if inprocess else None, 6, 3)} "
            f"{_number(loop.overhead_ms if loop else None, 6, 2)} "
            f"{_number(loop.loop_own_ms if loop else None, 5, 2)} {_number(loop.transport_ms if loop else None, 5, 2)}"
        )
    lines += [
        "",
        "plain: the same server with num_draft_tokens 0; in-proc: the in-process loop on the same prompts "
        "(--spec); ovh ms: the loop model's time per iteration outside the engine models (metrics), split "
        "into its own work between engine calls (own) and the BLS calls' transport (BLS).",
    ]
    return "\n".join(lines)


def format_table(report: BenchReport) -> str:
    header = (
        f"{'method':<13} {'K':>3} {'T':>4} {'tok/s':>7} {'plain':>7} {'speedup':>7} {'bound':>6} {'HF asst':>7} "
        f"{'acc.rate':>8} {'alpha':>6} {'tok/call':>8} {'theory':>6}"
    )
    lines = [header]
    for row in report.rows:
        k = f"{row.k}a" if row.adaptive else str(row.k)
        lines.append(
            f"{row.method:<13} {k:>3} {row.temperature:>4g} {row.tokens_per_s:>7.1f} {row.baseline_tokens_per_s:>7.1f} "
            f"{row.speedup:>7.3f} {_number(row.cost_model_speedup, 6, 3)} "
            f"{_number(row.hf_assisted_tokens_per_s, 7, 1)} {row.acceptance_rate:>8.3f} {row.alpha:>6.3f} "
            f"{row.tokens_per_target_call:>8.2f} {_number(row.theoretical_tokens_per_target_call, 6, 2)}"
        )
    times = report.step_times
    lines += [
        "",
        f"K = 'Na': adaptive K up to N. bound: the cost model fed the run's tokens per target call "
        f"(E t_1 / (K t_d + t_(K+1)), prefills included): the speedup if the loop cost nothing but its "
        f"engine calls; t_1 {times.target_1 * 1e3:.2f} ms, t_d {times.draft_1 * 1e3:.2f} ms, t_(K+1) "
        + " ".join(f"{n}:{t * 1e3:.2f}" for n, t in sorted(times.target_by_num_tokens.items()))
        + f" ms, prefill of a prompt {times.target_prefill * 1e3:.1f} ms (target) {times.draft_prefill * 1e3:.1f} ms"
        f" (draft); {report.runner} runner, {report.threads} threads, {report.seconds:.0f} s",
    ]
    return "\n".join(lines)


def format_recommendations(report: BenchReport) -> str:
    lines = []
    for rec in report.recommendations:
        lines.append(
            f"{rec.method} T={rec.temperature:g}: alpha {rec.alpha:.3f}, c = t_d/t_1 {rec.cost_ratio:.3f} -> recommended K = "
            f"{rec.num_draft_tokens} (Leviathan et al. Thm 3.8, expected {rec.expected_speedup:.2f}x if "
            f"t_(K+1) = t_1); with t_(K+1) as measured the cost model prefers K = {rec.cost_model_k}; "
            f"fastest measured K = {rec.best_measured_k}"
        )
    return "\n".join(lines)


def format_profile(result: IterationProfile) -> str:
    lines = [
        f"K={result.num_draft_tokens} T={result.temperature:g}: {result.total_ms:.3f} ms per iteration "
        f"({result.iterations} iterations)"
    ]
    for name, milliseconds in result.milliseconds.items():
        lines.append(f"  {name:<38} {milliseconds:8.3f} ms  {100 * milliseconds / result.total_ms:5.1f}%")
    return "\n".join(lines)


def _number(value: float | None, width: int, decimals: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.{decimals}f}"


commands = [bench]
