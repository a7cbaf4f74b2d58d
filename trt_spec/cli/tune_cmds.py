"""``tune``: acceptance measured on your prompts, K recommended for the spec's GPU, a report that
``plan``, ``check``, ``repo`` and ``bench --local`` read (``--tuning``)."""

from __future__ import annotations

import click

from trt_spec import atomic
from trt_spec.cli.common import DEVICES, dataset_options, load_dataset_workload, load_twin, read_spec, spec_option
from trt_spec.runtime import methods
from trt_spec.runtime.parameters import MAX_DRAFT_TOKENS


@click.command()
@spec_option
@dataset_options
@click.option(
    "-k",
    "--num-draft-tokens",
    "ks",
    type=click.IntRange(1, MAX_DRAFT_TOKENS),
    multiple=True,
    help="K values to run (repeatable); default 1 2 3 4 6 8. The largest gives the acceptance profile.",
)
@click.option(
    "--temperature",
    "temperatures",
    type=click.FloatRange(min=0),
    multiple=True,
    help="Temperatures to measure (repeatable); default 0. The first is your traffic's: the recommendation is for it.",
)
@click.option(
    "--method",
    "method_names",
    multiple=True,
    type=click.Choice(methods.names()),
    help="Speculation methods to measure (repeatable); default every one the spec's checkpoints run (with a "
    "draft section: all; without: prompt_lookup). The spec's own is always measured.",
)
@click.option(
    "--prompts",
    "num_prompts",
    type=click.IntRange(min=1),
    default=None,
    help="How many prompts (packaged, or sampled from --dataset); default 8.",
)
@click.option("--max-tokens", type=click.IntRange(min=2), default=96, show_default=True, help="New tokens per request.")
@click.option("--repeats", type=click.IntRange(min=1), default=1, show_default=True, help="Rounds over the prompts.")
@click.option(
    "--threads", type=click.IntRange(min=1), default=None, help="torch CPU threads (default: torch's choice)."
)
@click.option("--device", type=click.Choice(DEVICES), default="auto", show_default=True, help="Where the models run.")
@click.option(
    "--runner",
    type=click.Choice(("auto", "llama", "hf")),
    default="auto",
    show_default=True,
    help="The forward pass: a lean Llama one (auto, for Llama models) or Hugging Face's own (hf).",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    default=None,
    help="Where to write the report (JSON) [default: tuning-<spec name>.json].",
)
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None, help="Also write a PNG.")
@click.option(
    "--url",
    default=None,
    metavar="HOST:PORT",
    help="Also measure the best K by requests in flight through this running server of the spec's repository "
    "(gRPC; the torch flavor's K schedule, which repo --tuning writes).",
)
@click.option(
    "--in-flight",
    "loads",
    type=click.IntRange(min=1),
    multiple=True,
    help="--url: requests in flight to measure (repeatable); default 1 4 8. One at a time is always measured.",
)
@click.option(
    "--stream/--no-stream",
    default=True,
    help="--url: streamed requests (default), or requests for one final response, as a non-streaming "
    "client sends them (plain decoding then takes many tokens per target call).",
)
def tune(
    spec_path,
    dataset,
    dataset_column,
    dataset_split,
    seed,
    ks,
    temperatures,
    method_names,
    num_prompts,
    max_tokens,
    repeats,
    threads,
    device,
    runner,
    output,
    plot_path,
    url,
    loads,
    stream,
) -> None:
    """Tune the method and K to your traffic: measure every speculation method the spec's
    checkpoints can run (acceptance per draft position, tokens per target call, step costs) on your
    prompts with the spec's own checkpoints (in-process: CPU, or CUDA where present), project the
    speedup per method and K on the spec's GPU from those measured profiles, and recommend the
    method and K (`recommended_method`, `recommended_k` in the report).

    K is the target engine's max_draft_len, fixed at build, so tune before `trt-spec build`. The
    report feeds `plan --tuning` (the projection and the K schedule by requests in flight),
    `check --tuning` (a warning when the spec's method or K is off the recommendation) and
    `repo --tuning` (adaptive K starts from the measured acceptance). A report tuned on a spec with a
    draft section serves a spec of the same target with any method it measured.

    With --url, the best K is also measured through a running server of the spec's repository at
    each number of requests in flight (--in-flight), against plain decoding at the same load: the
    torch flavor's K schedule, which `repo --tuning` writes into the loop model.

    \b
    Examples:
      trt-spec tune --spec examples/pystdlib-demo.yaml
      trt-spec tune --spec examples/pystdlib-wide.yaml --dataset examples/copy-heavy.jsonl
      trt-spec tune --spec spec.yaml --dataset chats.jsonl --prompts 32 -o tuning.json --plot tuning.png
      trt-spec tune --spec spec.yaml --dataset my-org/support-chats --dataset-split test --temperature 0.7
      trt-spec tune --spec examples/pystdlib-demo.yaml --url 127.0.0.1:8001 --in-flight 1 --in-flight 8
    """
    import torch

    from trt_spec.bench.plot import write_tuning_plot
    from trt_spec.bench.prompts import PROMPT_CHARS, prompt_texts
    from trt_spec.bench.server import server_default_k
    from trt_spec.bench.tuning import (
        DEFAULT_KS,
        DEFAULT_LOADS,
        DEFAULT_TEMPERATURES,
        measure_schedule,
        render_report,
        run_tuning,
    )
    from trt_spec.plan import make_plan
    from trt_spec.plan.tuning import report_json

    if dataset is None and dataset_column:
        raise click.UsageError("--dataset-column goes with --dataset SOURCE")
    if loads and url is None:
        raise click.UsageError("--in-flight goes with --url HOST:PORT (a running server of the spec's repository)")
    if not stream and url is None:
        raise click.UsageError("--no-stream goes with --url HOST:PORT (a running server of the spec's repository)")
    spec = read_spec(spec_path)
    for name in method_names:
        if methods.get(name).uses_draft_model and spec.draft is None:
            raise click.UsageError(
                f"--method {name} needs a draft model and the spec has no draft section; tune a spec with one "
                "(it measures every method) or leave --method out"
            )
    plan = make_plan(spec)
    if url is not None:  # now, not after minutes of measuring in-process
        served_k = server_default_k(url)
        if served_k != spec.num_draft_tokens:
            raise click.UsageError(
                f"the server at {url} serves K = {served_k} (its default num_draft_tokens), the spec has K = "
                f"{spec.num_draft_tokens}: serve this spec's repository (trt-spec repo --spec {spec_path})"
            )
    if plot_path:
        try:
            import matplotlib  # noqa: F401  (fail now, not after minutes of measuring)
        except ImportError:
            raise click.UsageError("--plot needs matplotlib: pip install 'trt-spec[bench]'") from None
    if threads:
        torch.set_num_threads(threads)
    pair = load_twin(spec, device, runner)
    prompts, source, texts = None, "packaged prompts", None
    if dataset is not None:
        workload = load_dataset_workload(
            dataset,
            pair.tokenizer,
            spec,
            num_prompts=num_prompts,
            column=dataset_column,
            split=dataset_split,
            seed=seed,
        )
        prompts, source = [prompt.tokens for prompt in workload.prompts], dataset
        texts = [prompt.text for prompt in workload.prompts]
    report = run_tuning(
        plan,
        pair,
        prompts=prompts,
        source=source,
        ks=ks or DEFAULT_KS,
        temperatures=temperatures or DEFAULT_TEMPERATURES,
        method_names=method_names,
        num_prompts=num_prompts or 8,
        max_new_tokens=max_tokens,
        repeats=repeats,
        progress=lambda line: click.echo(line, err=True),
    )
    if url is not None:
        schedule = measure_schedule(
            url,
            texts or prompt_texts(num_prompts or 8, PROMPT_CHARS),
            # The server's engines take K up to the spec's (max_draft_len); the spec's K is the loop's default.
            ks=sorted({k for k in ks or DEFAULT_KS if k <= spec.num_draft_tokens} | {spec.num_draft_tokens}),
            method=spec.speculative.method,
            loads=loads or DEFAULT_LOADS,
            temperature=report.primary.temperature,
            max_new_tokens=max_tokens,
            progress=lambda line: click.echo(line, err=True),
            stream=stream,
        )
        report = report.model_copy(update={"measured_schedule": schedule})
    path = output or f"tuning-{spec.name}.json"
    atomic.write_text(path, report_json(report))
    click.echo("\n".join(render_report(report)))
    click.echo(f"wrote {path}")
    if plot_path:
        write_tuning_plot(report, plot_path)
        click.echo(f"wrote {plot_path}")


commands = [tune]
