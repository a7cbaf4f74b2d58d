"""``trt-spec download``, ``check`` and ``convert``: the two Hugging Face checkpoints of a spec."""

from __future__ import annotations

import json
import sys

import click

from trt_spec.cli.common import read_spec, read_tuning, spec_option, spec_route, tuning_option
from trt_spec.layout import lock_path
from trt_spec.plan.memory import format_bytes
from trt_spec.runtime.tensors import ROLES

_STATUS_STYLE = {"ok": ("ok", "green"), "warn": ("warn", "yellow"), "fatal": ("FATAL", "red")}


@click.command()
@spec_option
@click.option(
    "--no-progress", is_flag=True, help="Hide download progress bars (or set HF_HUB_DISABLE_PROGRESS_BARS=1)."
)
def download(spec_path: str, no_progress: bool) -> None:
    """Fetch target and draft from the Hugging Face Hub and pin their commits in the lock file.

    \b
    Only configs, tokenizer files and *.safetensors are fetched; interrupted downloads resume.
    A local directory as model is used in place. Gated repos (e.g. meta-llama) need their
    licence accepted on the Hub and HF_TOKEN set; HF_HUB_OFFLINE=1 uses the cache only.

    \b
    Example:
      HF_TOKEN=hf_... trt-spec download --spec examples/llama8b-1b-h200.yaml
    """
    from trt_spec.checkpoints.download import download as download_checkpoints

    spec = read_spec(spec_path)
    for snapshot in download_checkpoints(spec, progress=not no_progress):
        where = "local directory" if snapshot.commit is None else f"{snapshot.revision} = {snapshot.commit[:12]}"
        click.echo(
            f"{snapshot.role:<7} {snapshot.model} ({where}): {len(snapshot.files)} files, "
            f"{format_bytes(snapshot.total_bytes)}  {snapshot.path}"
        )
    click.echo(f"lock    {lock_path(spec)}")


@click.command()
@spec_option
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
@tuning_option
@click.pass_context
def check(ctx: click.Context, spec_path: str, as_json: bool, tuning_path: str | None) -> None:
    """Check the pair before any GPU time is spent; exit 1 when anything is fatal.

    \b
    Identical tokenizers (token ids, merges, normalizer, special tokens), vocab sizes,
    supported architectures, draft smaller than target, positions for max_seq_len, tensor
    parallel splits, dtype, and the memory plan; with --tuning, a warning when the spec's K is
    not the one the report recommends.

    \b
    Example:
      trt-spec check --spec examples/pystdlib-demo.yaml
      trt-spec check --spec examples/pystdlib-demo.yaml --tuning tuning.json
    """
    from trt_spec.plan.check import check_pair

    spec = read_spec(spec_path)
    report = check_pair(spec, read_tuning(tuning_path, spec), spec_route(spec))
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        width = max(len(row.check) for row in report.rows)
        for row in report.rows:
            label, colour = _STATUS_STYLE[row.status]
            click.echo(f"{row.check:<{width}}  {click.style(f'{label:<5}', fg=colour)}  {row.detail}")
        if report.ok:
            click.echo(f"\nthe pair is fit to build ({len(report.warnings)} warning(s))")
        else:
            click.echo(f"\n{len(report.fatal)} fatal problem(s): fix them before building", err=True)
    if not report.ok:
        ctx.exit(1)


@click.command()
@spec_option
@click.option("--role", type=click.Choice(["target", "draft", "both"]), default="both", show_default=True)
@click.option("--force", is_flag=True, help="Convert even when the inputs are unchanged.")
def convert(spec_path: str, role: str, force: bool) -> None:
    """Convert the Hugging Face checkpoints to TensorRT-LLM checkpoints (on CPU).

    Writes config.json and rank<N>.safetensors per tp rank under
    <checkpoints>/<name>/<role>/trtllm/; skipped when nothing changed.

    \b
    Example:
      trt-spec convert --spec examples/pystdlib-demo.yaml --role target
    """
    from trt_spec.engines.convert import convert_checkpoint

    spec = read_spec(spec_path)
    stderr = sys.stderr  # the converter redirects the libraries' output; progress stays here
    for each in ROLES if role == "both" else (role,):
        result = convert_checkpoint(spec, each, force=force, progress=lambda line: click.echo(line, file=stderr))
        state = "up to date" if result.skipped else f"converted in {result.duration_s:.1f} s"
        click.echo(f"{each:<7} {state} (tp {result.tp_size}, {result.dtype})  {result.output_dir}")


commands = [download, check, convert]
