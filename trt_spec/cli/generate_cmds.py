"""``generate``: stream one completion through the speculative loop.

Two ways to run, chosen once for ``generate`` and ``bench``: ``--url HOST:PORT`` (the default,
127.0.0.1:8001) talks to a Triton server running the repository over gRPC; ``--local --spec F``
runs the loop in-process on the spec's Hugging Face checkpoints (the PyTorch twin: the torch
flavor's engine models called directly, so greedy output, EOS and ``min_tokens`` are the server's).
"""

from __future__ import annotations

import sys
import time

import click

from trt_spec.cli.common import choose_mode, load_twin, mode_options
from trt_spec.runtime.methods import PROMPT_LOOKUP
from trt_spec.runtime.parameters import MAX_DRAFT_TOKENS


@click.command()
@click.argument("prompt")
@mode_options
@click.option(
    "--max-tokens", type=click.IntRange(min=1), default=128, show_default=True, help="Stop after this many new tokens."
)
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy.")
@click.option("--top-k", type=int, default=0, show_default=True, help="0 = the whole vocabulary.")
@click.option("--top-p", type=float, default=1.0, show_default=True, help="1 = the whole vocabulary.")
@click.option(
    "-k",
    "--num-draft-tokens",
    type=click.IntRange(0, MAX_DRAFT_TOKENS),
    default=None,
    help="K, draft tokens per step; default: the spec's (the server's); 0 = plain target decoding.",
)
@click.option(
    "--adaptive/--fixed",
    default=None,
    help="Choose K each step from the running acceptance and step times, up to K "
    "(`trt-spec bench` measures both); --fixed drafts K every step. Default: adaptive "
    "with --local, the repository's default with --url.",
)
@click.option("--seed", type=int, default=None, help="Seed the sampling (temperature > 0).")
@click.option(
    "--stop", "stop_texts", multiple=True, metavar="TEXT", help="Stop after this text (tokenized; repeatable)."
)
def generate(
    prompt,
    url,
    local,
    spec_path,
    device,
    runner,
    max_tokens,
    temperature,
    top_k,
    top_p,
    num_draft_tokens,
    adaptive,
    seed,
    stop_texts,
) -> None:
    """Stream a completion of PROMPT ('-' reads stdin) to stdout; acceptance stats to stderr.

    Verification is exact whatever the spec's `acceptance`: greedy at temperature 0; above it,
    rejection sampling with the draft's distributions (in-process; on a server whose
    acceptance is `probabilistic`), else token matching.

    \b
    Examples:
      trt-spec generate --url 127.0.0.1:8001 --max-tokens 64 "def read_config(path):"
      trt-spec generate --local --spec demo.yaml --max-tokens 64 "def read_config(path):"
    """
    url, spec = choose_mode(url, local, spec_path)
    if prompt == "-":
        prompt = sys.stdin.read()
    if url is not None:
        _generate_remote(
            url,
            prompt,
            max_tokens=max_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            num_draft_tokens=num_draft_tokens,
            adaptive_draft=adaptive,
            seed=seed,
            stop_words=list(stop_texts),
        )
        return
    _generate_local(
        spec,
        device,
        runner,
        prompt,
        max_tokens,
        temperature,
        top_k,
        top_p,
        num_draft_tokens,
        True if adaptive is None else adaptive,
        seed,
        stop_texts,
    )


def _generate_remote(url: str, prompt: str, **options) -> None:
    from trt_spec.client import SpecClient

    started = time.perf_counter()
    last = None
    with SpecClient(url) as client:
        for event in client.generate(prompt, **options):
            click.echo(event.text, nl=False)
            sys.stdout.flush()
            last = event
    click.echo()
    sys.stdout.flush()
    seconds = time.perf_counter() - started
    if last is not None:
        click.echo(format_remote_stats(last, seconds), err=True)


def format_remote_stats(event, seconds: float) -> str:
    calls = max(event.num_target_calls, 1)
    return (
        f"{event.num_output_tokens} tokens in {seconds:.2f} s ({event.num_output_tokens / max(seconds, 1e-9):.1f} tokens/s); "
        f"{event.num_target_calls} target calls ({event.num_output_tokens / calls:.2f} tokens each), drafted "
        f"{event.total_draft_tokens}, accepted {event.total_accepted_draft_tokens} "
        f"(acceptance_rate {event.acceptance_rate:.3f})"
        + _by_source(
            event.total_draft_tokens,
            event.total_accepted_draft_tokens,
            event.total_lookup_draft_tokens,
            event.total_accepted_lookup_draft_tokens,
        )
    )


def _by_source(drafted: int, accepted: int, lookup_drafted: int, lookup_accepted: int) -> str:
    """Where the drafts came from, when prompt lookup proposed any."""
    if not lookup_drafted:
        return ""
    return (
        f"; prompt lookup drafted {lookup_drafted}, accepted {lookup_accepted}; draft model drafted "
        f"{drafted - lookup_drafted}, accepted {accepted - lookup_accepted}"
    )


def _generate_local(
    spec, device, runner, prompt, max_tokens, temperature, top_k, top_p, num_draft_tokens, adaptive, seed, stop_texts
) -> None:
    from trt_spec.runtime.loop import GenerationParams
    from trt_spec.runtime.text import IncrementalDetokenizer

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
        step_costs=pair.step_costs(),
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
        + _by_source(
            stats.drafted_tokens,
            stats.accepted_tokens,
            stats.drafted_by_source.get(PROMPT_LOOKUP, 0),
            stats.accepted_by_source.get(PROMPT_LOOKUP, 0),
        )
    )


commands = [generate]
