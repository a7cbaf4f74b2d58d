"""The benchmark through a running server: speculative vs plain decoding (``num_draft_tokens`` 0)
on the same server, at concurrency 1 and N, over gRPC streaming.

Per configuration (K, temperature, concurrency) every packaged prompt is sent, speculative and
plain interleaved prompt by prompt (at concurrency N, in alternating batches), so a shared
machine's drift hits both alike. Reported per row (:class:`~trt_spec.bench.rows.ServerRow`), with
the keys docs/clients.md lists for ``bench --url``: tokens per second (all tokens / wall time), time
to first token and inter-token latency (medians over requests: first response minus send; (last -
first response) / tokens after the first response), acceptance, tokens per target call.

From the server's metrics port (when reachable) come ``alpha`` (accepted / (accepted +
rejections)) and, at concurrency 1, where an iteration's time goes: the loop model's wall time
per iteration minus the engine models' own time inside ``execute`` is the loop's overhead (BLS
round trips, tensor copies, bookkeeping, streaming a response).

With a :class:`~trt_spec.twin.TwinPair` (``--spec``) the in-process loop runs the same
prompts at concurrency 1 too, interleaved with the server's requests, for the ratio of the two.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trt_spec.bench.prompts import MAX_NEW_TOKENS, PROMPT_CHARS, prompt_texts
from trt_spec.bench.rows import InprocessComparison, LoopBreakdown, Progress, RequestResult, ServerRow, Tally
from trt_spec.client import SpecClient, StreamEvent
from trt_spec.errors import GenerationError
from trt_spec.runtime import tensors as T
from trt_spec.runtime.methods import DEFAULT_METHOD
from trt_spec.runtime.parameters import LoopParameters, PreprocessingParameters
from trt_spec.serving.metrics import samples, scrape

if TYPE_CHECKING:
    from trt_spec.twin import TwinPair

DEFAULT_CONCURRENCY = 4


@dataclass(frozen=True)
class ServerBenchConfig:
    ks: tuple[int, ...] | None = None  # None: the server's default K
    temperatures: tuple[float, ...] = (0.0,)
    concurrency: tuple[int, ...] = (DEFAULT_CONCURRENCY,)  # besides 1
    num_prompts: int = 8
    prompt_chars: int = PROMPT_CHARS
    max_new_tokens: int = MAX_NEW_TOKENS
    seed: int = 0
    prompts: tuple[str, ...] | None = None  # the user's prompts (bench/dataset.py) instead of the packaged ones
    # False: each request asks for one final response (a non-streaming client), so the loop may
    # decode plain tokens many to a target call (bls.plain_call_len); TTFT is then the whole request.
    stream: bool = True


@dataclass
class ServerReport:
    rows: list[ServerRow]
    notes: list[str] = field(default_factory=list)


def run_request(client: SpecClient, prompt: str, **options: Any) -> RequestResult:
    """One streamed request, timed."""
    started = time.perf_counter()
    events: list[StreamEvent] = list(client.generate(prompt, **options))
    seconds = time.perf_counter() - started
    if not events:
        raise GenerationError("the server sent no response with outputs")
    last, first = events[-1], events[0]
    after_first = last.num_output_tokens - first.num_output_tokens
    itl = (last.arrival_s - first.arrival_s) / after_first if after_first > 0 else None
    return RequestResult(
        tokens=last.num_output_tokens,
        seconds=seconds,
        ttft_s=first.arrival_s - started,
        itl_s=itl,
        drafted=last.total_draft_tokens,
        accepted=last.total_accepted_draft_tokens,
        target_calls=last.num_target_calls,
        text="".join(event.text for event in events),
    )


# --- the server's metrics ----------------------------------------------------------------------


def read_metrics(url: str | None) -> dict[str, float] | None:
    """trt-spec's own counters (and Triton's per-model ones) from a metrics endpoint; None when
    it cannot be read."""
    if not url:
        return None
    try:
        text = scrape(url)
    except (urllib.error.URLError, OSError):
        return None
    wanted = ("trt_spec_", "nv_inference_compute_infer_duration_us")
    return {sample.series: sample.value for sample in samples(text) if sample.name.startswith(wanted)}


def settled_metrics(
    url: str | None, before: dict[str, float], requests: int = 1, timeout_s: float = 5.0
) -> dict[str, float] | None:
    """The metrics once the loop model has recorded ``requests`` more requests than in
    ``before`` (it records a request after sending its last response, so a client can see the
    end of a request before its metrics)."""
    deadline = time.monotonic() + timeout_s
    target = _metric_sum(before, "trt_spec_loop_requests_total") + requests
    while True:
        values = read_metrics(url)
        recorded = values is None or _metric_sum(values, "trt_spec_loop_requests_total") >= target
        if recorded or time.monotonic() > deadline:
            return values
        time.sleep(0.01)


def _metric_sum(delta: dict[str, float], prefix: str) -> float:
    return sum(value for name, value in delta.items() if name.startswith(prefix))


def _delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Each metric of ``after`` minus its value in ``before`` (0 where it was absent)."""
    return {name: after[name] - before.get(name, 0.0) for name in after}


def loop_breakdown(before: dict[str, float] | None, after: dict[str, float] | None) -> LoopBreakdown | None:
    if before is None or after is None:
        return None
    delta = _delta(before, after)
    iterations = int(_metric_sum(delta, "trt_spec_loop_iterations_total"))
    if iterations <= 0:
        return None
    loop_seconds = _metric_sum(delta, "trt_spec_loop_iteration_seconds_total")
    wait_seconds = _metric_sum(delta, "trt_spec_loop_engine_wait_seconds_total")
    engine_seconds = _metric_sum(delta, "trt_spec_engine_execute_seconds_total")
    source = "trt_spec"
    if not any(name.startswith("trt_spec_engine_execute_seconds_total") for name in after):
        # tensorrtllm flavor: Triton's own compute time of the engine models (it includes the
        # backend's queueing of the request, so the overhead is a lower bound).
        source = "triton"
        engine_seconds = (
            sum(
                value
                for name, value in delta.items()
                if name.startswith("nv_inference_compute_infer_duration_us")
                and (f'"{T.TARGET}"' in name or f'"{T.DRAFT}"' in name)
            )
            / 1e6
        )
    return LoopBreakdown(
        iterations=iterations,
        iteration_ms=loop_seconds / iterations * 1e3,
        engine_ms=engine_seconds / iterations * 1e3,
        overhead_ms=(loop_seconds - engine_seconds) / iterations * 1e3,
        engine_source=source,
        loop_own_ms=(loop_seconds - wait_seconds) / iterations * 1e3,
        transport_ms=(wait_seconds - engine_seconds) / iterations * 1e3,
    )


def run_alpha(before: dict[str, float] | None, after: dict[str, float] | None) -> float | None:
    """alpha = accepted / (accepted + rejections) between two reads of the metrics; None when
    unreadable or nothing was drafted."""
    if before is None or after is None:
        return None
    delta = _delta(before, after)
    accepted = _metric_sum(delta, "trt_spec_loop_accepted_draft_tokens_total")
    rejections = _metric_sum(delta, "trt_spec_loop_rejections_total")
    return accepted / (accepted + rejections) if accepted + rejections else None


# --- the runs ------------------------------------------------------------------------------------


class _Clients:
    """One gRPC stream (SpecClient) per concurrent request."""

    def __init__(self, url: str, count: int):
        self.clients = [SpecClient(url) for _ in range(count)]

    def close(self) -> None:
        for client in self.clients:
            client.close()

    def run_batch(
        self, prompts: Sequence[str], options: dict[str, Any], concurrency: int
    ) -> tuple[list[RequestResult], float]:
        """All ``prompts``, at most ``concurrency`` in flight; (results, wall seconds)."""
        results: list[RequestResult | None] = [None] * len(prompts)
        errors: list[BaseException] = []
        next_index = iter(range(len(prompts)))
        lock = threading.Lock()

        def worker(client: SpecClient) -> None:
            while True:
                with lock:
                    index = next(next_index, None)
                if index is None or errors:
                    return
                try:
                    results[index] = run_request(client, prompts[index], **options)
                except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                    errors.append(exc)
                    return

        threads = [
            threading.Thread(target=worker, args=(client,), daemon=True) for client in self.clients[:concurrency]
        ]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        seconds = time.perf_counter() - started
        if errors:
            raise errors[0]
        return [r for r in results if r is not None], seconds


def server_default_k(url: str) -> int:
    """The repository's default K (preprocessing's ``default_num_draft_tokens``)."""
    import tritonclient.grpc as grpcclient

    try:
        config = grpcclient.InferenceServerClient(url).get_model_config(T.PREPROCESSING, as_json=True)
    except Exception as exc:  # noqa: BLE001
        from trt_spec.client import _client_error

        raise _client_error(exc, url) from None
    return PreprocessingParameters.from_config(config["config"]).default_num_draft_tokens


def server_method(url: str) -> str:
    """The speculation method the server's loop model runs (its ``method`` parameter); the default
    method where the server has no loop model of ours to ask."""
    import tritonclient.grpc as grpcclient

    try:
        config = grpcclient.InferenceServerClient(url).get_model_config(T.LOOP, as_json=True)["config"]
        return LoopParameters.from_config(config).method
    except Exception:  # noqa: BLE001 - no loop model (another repository): its rows keep the default
        return DEFAULT_METHOD


def run_server_bench(
    url: str,
    config: ServerBenchConfig = ServerBenchConfig(),
    *,
    metrics_url: str | None = None,
    pair: TwinPair | None = None,
    progress: Progress | None = None,
) -> ServerReport:
    """Benchmark the server at ``url``: a row per temperature, K and concurrency.

    ``pair``: a :class:`~trt_spec.twin.TwinPair` of the same checkpoints; the
    in-process loop then runs the same prompts (concurrency 1) for comparison.

    Raises:
        ServerUnreachable, GenerationError: the server cannot be reached or fails a request.
    """
    say = progress or (lambda message: None)
    prompts = list(config.prompts) if config.prompts else prompt_texts(config.num_prompts, config.prompt_chars)
    ks = config.ks or (server_default_k(url),)
    method = server_method(url)
    concurrencies = sorted({1, *config.concurrency})
    # Concurrent runs send the prompts round-robin until the largest concurrency is filled, the
    # same requests at every concurrency, so their tokens/s compare.
    batch = [prompts[index % len(prompts)] for index in range(max(len(prompts), concurrencies[-1]))]
    report = ServerReport(rows=[])
    clients = _Clients(url, max(concurrencies))
    try:
        warm = clients.clients[0]
        run_request(warm, prompts[0], max_tokens=8)  # first-request costs (allocations, caches)
        for temperature in config.temperatures:
            for k in ks:
                for concurrency in concurrencies:
                    requests = prompts if concurrency == 1 else batch
                    row = _run_config(clients, requests, k, temperature, concurrency, config, metrics_url, pair, say)
                    report.rows.append(dataclasses.replace(row, method=method))
    finally:
        clients.close()
    if read_metrics(metrics_url) is None:
        report.notes.append(f"no metrics at {metrics_url}: alpha and the loop's time per iteration are not reported")
    return report


def _run_config(
    clients: _Clients,
    prompts: list[str],
    k: int,
    temperature: float,
    concurrency: int,
    config: ServerBenchConfig,
    metrics_url: str | None,
    pair: TwinPair | None,
    say: Progress,
) -> ServerRow:
    base = {T.MAX_TOKENS.name: config.max_new_tokens, T.TEMPERATURE.name: temperature, T.STREAM.name: config.stream}
    spec_tally, plain_tally, local_tally = Tally(), Tally(), Tally()
    seeds = [config.seed + index for index in range(len(prompts))]
    breakdown = alpha = None
    if concurrency == 1:
        client = clients.clients[0]
        before = None
        for index, prompt in enumerate(prompts):
            options = {**base, T.SEED.name: seeds[index]} if temperature > 0 else dict(base)
            # Rotate the order: a slow drift of a shared machine hits every configuration alike.
            runs = [("spec", k), ("plain", 0)] + ([("local", k)] if pair is not None else [])
            shift = index % len(runs)
            for name, num_draft_tokens in runs[shift:] + runs[:shift]:
                if name == "local":
                    if pair is None:  # a "local" run is only listed with a twin pair
                        raise RuntimeError("a local run without a twin pair")
                    result = _run_local(pair, prompt, num_draft_tokens, options)
                    local_tally.add_results([result], result.seconds)
                    continue
                tally = spec_tally if name == "spec" else plain_tally
                if name == "spec":
                    snapshot = read_metrics(metrics_url)
                result = run_request(client, prompt, num_draft_tokens=num_draft_tokens, **options)
                if name == "spec" and snapshot is not None:
                    later = settled_metrics(metrics_url, snapshot)
                    if later is not None:
                        before = _accumulate(before, snapshot, later)
                tally.add_results([result], result.seconds)
        if before is not None:
            breakdown = loop_breakdown({}, before)
            alpha = run_alpha({}, before)
    else:
        batches = [("spec", k), ("plain", 0)]
        for round_index in range(2):
            for name, num_draft_tokens in batches if round_index == 0 else batches[::-1]:
                tally = spec_tally if name == "spec" else plain_tally
                options = {**base, T.NUM_DRAFT_TOKENS.name: num_draft_tokens}
                if temperature > 0:
                    options[T.SEED.name] = config.seed + round_index
                snapshot = read_metrics(metrics_url) if name == "spec" else None
                results, seconds = clients.run_batch(prompts, options, concurrency)
                if snapshot is not None:
                    later = settled_metrics(metrics_url, snapshot, len(prompts))
                    alpha = run_alpha(snapshot, later) if alpha is None else alpha
                tally.add_results(results, seconds)
    inprocess = None
    if local_tally.results:
        local = local_tally.tokens_per_s
        inprocess = InprocessComparison(
            tokens_per_s=local,
            server_vs_inprocess=spec_tally.tokens_per_s / local if local else None,
            same_tokens=_same_tokens(spec_tally, local_tally, temperature),
        )
    row = ServerRow.measure(k, temperature, concurrency, spec_tally, plain_tally, alpha, breakdown, inprocess)
    say(
        f"K={k} T={temperature:g} concurrency {concurrency}: {row.tokens_per_s:.1f} tok/s vs plain "
        f"{row.baseline_tokens_per_s:.1f} (x{row.speedup:.2f}), acceptance {row.acceptance_rate:.3f}"
        + (
            f", in-process {inprocess.tokens_per_s:.1f} tok/s (server/in-process {inprocess.server_vs_inprocess:.3f})"
            if inprocess is not None
            else ""
        )
        + (
            f", loop overhead {breakdown.overhead_ms:.2f} ms of {breakdown.iteration_ms:.2f} ms per iteration"
            f" (own work {breakdown.loop_own_ms:.2f}, BLS transport {breakdown.transport_ms:.2f})"
            if breakdown is not None
            else ""
        )
    )
    return row


def _accumulate(total: dict[str, float] | None, before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Sum of metric deltas over the measured (speculative) requests only."""
    total = dict(total or {})
    for name, value in after.items():
        total[name] = total.get(name, 0.0) + value - before.get(name, 0.0)
    return total


def _same_tokens(server: Tally, local: Tally, temperature: float) -> bool | None:
    if temperature > 0:
        return None  # sampled: the same distribution, not the same tokens
    return [r.text for r in server.results] == [r.text for r in local.results]


def _run_local(pair: TwinPair, prompt: str, num_draft_tokens: int, options: dict[str, Any]) -> RequestResult:
    from trt_spec.runtime.loop import GenerationParams
    from trt_spec.runtime.text import IncrementalDetokenizer

    pair.target.reset()
    if pair.draft is not None:
        pair.draft.reset()
    tokenizer: Any = pair.tokenizer  # a transformers tokenizer (untyped)
    ids = list(tokenizer(prompt).input_ids)  # as preprocessing encodes it
    params = GenerationParams(
        max_new_tokens=options[T.MAX_TOKENS.name],
        temperature=options[T.TEMPERATURE.name],
        num_draft_tokens=num_draft_tokens,
        eos_token_ids=pair.eos_token_ids,
    )
    detokenizer = IncrementalDetokenizer(pair.tokenizer)
    started = time.perf_counter()
    generation = pair.generate(ids, params, seed=options.get(T.SEED.name))
    first = None
    text = []
    for tokens in generation:
        first = first or time.perf_counter()
        text.append(detokenizer.push(tokens))
    seconds = time.perf_counter() - started
    text.append(detokenizer.flush())
    stats = generation.stats
    return RequestResult(
        tokens=len(generation.output),
        seconds=seconds,
        ttft_s=(first or started) - started,
        itl_s=None,
        drafted=stats.drafted_tokens,
        accepted=stats.accepted_tokens,
        target_calls=stats.target_calls,
        text="".join(text),
    )
