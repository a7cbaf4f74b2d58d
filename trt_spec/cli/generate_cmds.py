"""``generate``: stream one completion through the speculative loop.

Two ways to run, chosen once for ``generate`` and ``bench``: ``--local --spec F`` runs the loop
in-process on the spec's Hugging Face checkpoints (the PyTorch twin); ``--url HOST:PORT`` talks to
a Triton server (not available yet).
"""

from __future__ import annotations

import sys
import time

import click

from trt_spec.cli.common import read_spec
from trt_spec.spec import MAX_DRAFT_TOKENS, Spec

DEVICES = ("auto", "cpu", "cuda")


def mode_options(command):
    """``--url`` | ``--local --spec F`` and the engine options of the local mode."""
    options = [
        click.option("--url", metavar="HOST:PORT", default=None,
                     help="A Triton server running the deployment (not available yet)."),
        click.option("--local", is_flag=True,
                     help="Run in-process on the spec's checkpoints (the PyTorch twin)."),
        click.option("--spec", "spec_path", type=click.Path(dir_okay=False), default=None,
                     help="The deployment spec (YAML); needed with --local."),
        click.option("--device", type=click.Choice(DEVICES), default="auto", show_default=True,
                     help="--local: where the models run (auto: CUDA when present)."),
        click.option("--runner", type=click.Choice(("auto", "llama", "hf")), default="auto", show_default=True,
                     help="--local: the forward pass: a lean Llama one (auto, for Llama models) or "
                          "Hugging Face's own (hf)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def local_spec(url: str | None, local: bool, spec_path: str | None) -> Spec:
    """The spec of a ``--local`` run; fails early, naming the alternative, for anything else."""
    if url and local:
        raise click.UsageError("--url and --local are alternatives; pass one of them")
    if not local:
        raise click.UsageError(
            "--url (a Triton server) is not available yet; run in-process with --local --spec FILE"
        )
    if spec_path is None:
        raise click.UsageError("--local needs --spec FILE (the deployment spec naming both checkpoints)")
    return read_spec(spec_path)


def load_twin(spec: Spec, device: str, runner: str):
    from trt_spec.speculative.twin import TwinPair

    return TwinPair.from_spec(spec, device=None if device == "auto" else device, runner=runner)


@click.command()
@click.argument("prompt")
@mode_options
@click.option("--max-tokens", type=click.IntRange(min=1), default=128, show_default=True,
              help="Stop after this many new tokens.")
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy.")
@click.option("--top-k", type=int, default=0, show_default=True, help="0 = the whole vocabulary.")
@click.option("--top-p", type=float, default=1.0, show_default=True, help="1 = the whole vocabulary.")
@click.option("-k", "--num-draft-tokens", type=click.IntRange(0, MAX_DRAFT_TOKENS), default=None,
              help="K, draft tokens per step; default: the spec's; 0 = plain target decoding.")
@click.option("--adaptive/--fixed", default=True, show_default=True,
              help="Choose K each step from the running acceptance and step times, up to K "
                   "(`trt-spec bench` measures both); --fixed drafts K every step.")
@click.option("--seed", type=int, default=None, help="Seed the sampling (temperature > 0).")
@click.option("--stop", "stop_texts", multiple=True, metavar="TEXT",
              help="Stop after this text (tokenized; repeatable).")
def generate(prompt, url, local, spec_path, device, runner, max_tokens, temperature, top_k, top_p,
             num_draft_tokens, adaptive, seed, stop_texts) -> None:
    """Stream a completion of PROMPT ('-' reads stdin) to stdout; acceptance stats to stderr.

    With --local, verification is exact whatever the spec's `acceptance`: greedy at temperature
    0, rejection sampling above it.

    \b
    Example:
      trt-spec generate --local --spec demo.yaml --max-tokens 64 "def read_config(path):"
    """
    from trt_spec.speculative.loop import GenerationParams
    from trt_spec.text import IncrementalDetokenizer

    spec = local_spec(url, local, spec_path)
    if prompt == "-":
        prompt = sys.stdin.read()
    pair = load_twin(spec, device, runner)
    k = spec.num_draft_tokens if num_draft_tokens is None else num_draft_tokens
    params = GenerationParams(
        max_new_tokens=max_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        num_draft_tokens=k,
        adaptive_draft=adaptive and k > 0,
        eos_token_ids=pair.eos_token_ids,
        stop_sequences=tuple(tuple(pair.encode(text)) for text in stop_texts),
    )
    generation = pair.generate(pair.encode(prompt), params, seed=seed)
    detokenizer = IncrementalDetokenizer(pair.tokenizer)
    started = time.perf_counter()
    for tokens in generation:
        click.echo(detokenizer.push(tokens), nl=False)
        sys.stdout.flush()
    click.echo(detokenizer.flush())
    sys.stdout.flush()  # the completion before the stats, when both go to one terminal
    seconds = time.perf_counter() - started
    click.echo(format_stats(generation, seconds), err=True)


def format_stats(generation, seconds: float) -> str:
    stats = generation.stats
    by_position = " ".join(f"{rate:.2f}" for rate in stats.acceptance_by_position) or "-"
    return (
        f"{stats.emitted_tokens} tokens in {seconds:.2f} s ({stats.emitted_tokens / max(seconds, 1e-9):.1f} tokens/s), "
        f"finish: {generation.finish_reason}; {stats.target_calls} target calls "
        f"({stats.tokens_per_target_call:.2f} tokens each), drafted {stats.drafted_tokens}, accepted "
        f"{stats.accepted_tokens} (acceptance_rate {stats.acceptance_rate:.3f}, alpha {stats.alpha:.3f}); "
        f"acceptance by draft position: {by_position}"
    )


commands = [generate]
