"""``serve`` on a repository whose own server is not Triton: the llmapi route's ``trtllm-serve``, run
on the PyTorch twin behind the OpenAI endpoint that server opens.

The route is read as trtllm-serve reads it (:meth:`~trt_spec.repository.flavors.Flavor.twin_route`,
:mod:`trt_spec.repository.llmapi_twin`); from it a torch-flavor repository is written into a
temporary directory (:func:`twin_repository`) and served by Triton, internal to ``serve`` (on
127.0.0.1), with the OpenAI endpoint on the route's port (trtllm-serve's 8000 unless ``--openai-port``)
under the route's model name. What trtllm-serve exposes and this endpoint answers
(NVIDIA/TensorRT-LLM ``tensorrt_llm/serve/openai_server.py`` @00057725d9a6591f033e44f31c219e2426827bb7,
``register_routes``):

- ``/v1/completions``, ``/v1/chat/completions`` (streaming or not), ``/v1/models``, ``/health``: the
  endpoint's own (:mod:`trt_spec.serving.openai`);
- ``/metrics``: upstream's ``get_iteration_stats``, a JSON list of the executor's iteration statistics
  queued since the last call (``generator.get_stats_async``), empty unless the options set
  ``enable_iter_perf_stats`` (default false). Here (:class:`IterationStats`): with it, one entry for the
  loop's work finished since the last call, from Triton's metrics (the loop model's counters), in
  upstream's keys (``iter``, ``iterLatencyMS``, ``numCompletedRequests``, ``specDecodingStats``); the
  loop has no batch iterations, so an entry sums request steps rather than reporting one executor
  iteration, and the KV-cache, memory and batching fields are absent;
- not here: ``/prometheus/metrics`` (upstream mounts it only with ``return_perf_metrics``),
  ``/version``, ``/health_generate``, ``/perf_metrics``, ``/v1/responses`` and the RL endpoints.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trt_spec.repository.twin_routes import TwinRoute
from trt_spec.repository.writer import write_repository
from trt_spec.serving.metrics import samples, scrape
from trt_spec.serving.options import ServeOptions

TWIN_DIR = "twin"  # the twin repository's folder in the work directory
INTERNAL_HOST = "127.0.0.1"  # Triton behind the twin: trtllm-serve opens no port but its OpenAI one
METRICS_PATH = "/metrics"

# The loop model's counters on Triton's metrics port (runtime/models/spec_loop/model.py, LoopMetrics).
_COUNTERS = {
    "iterations": "trt_spec_loop_iterations_total",
    "target_calls": "trt_spec_loop_target_calls_total",
    "draft_tokens": "trt_spec_loop_draft_tokens_total",
    "accepted": "trt_spec_loop_accepted_draft_tokens_total",
    "output_tokens": "trt_spec_loop_output_tokens_total",
    "loop_seconds": "trt_spec_loop_iteration_seconds_total",
}
_FINISHED = ("trt_spec_loop_requests_total", "finished")

AddRoutes = Callable[[Any, Any], None]  # (the FastAPI app, the TritonServer): routes beyond the endpoint's own


@dataclass(frozen=True)
class TwinServing:
    """What ``serve`` runs for a twin route: the repository, the options it runs with, the extra routes."""

    repo: Path
    options: ServeOptions
    add_routes: AddRoutes


def twin_repository(route: TwinRoute, workdir: Path) -> Path:
    """Write the torch-flavor twin of ``route`` into ``workdir``; returns its path.

    Sampled drafts are verified as the route does: with the draft's logits (rejection sampling, the
    torch flavor's default), or by token matching, where the loop model is told to send no logits
    and to speculate anyway (``LoopParameters.sampled_token_match``: the twin's token matching is
    exact, as 1.3+'s), and preprocessing refuses a request's ``use_draft_logits``.

    Raises:
        RepositoryError: the repository cannot be written (e.g. no tokenizer files).
        NotDownloadedError: a checkpoint named by a Hub id that has not been downloaded.
    """
    token_match = route.sampled_verification == "token_match"
    return write_repository(route.spec, Path(workdir) / TWIN_DIR, "torch", sampled_token_match=token_match).path


def twin_serving(route: TwinRoute, options: ServeOptions, workdir: Path, say: Callable[[str], None]) -> TwinServing:
    """Write the twin into ``workdir`` and the options ``serve`` runs it with: the OpenAI endpoint on
    the route's port and model name unless given; Triton on 127.0.0.1 (internal)."""
    for note in route.notes:
        say(f"note: {note}")
    repo = twin_repository(route, workdir)
    say(
        f"note: {route.server} is emulated: the PyTorch twin of its models runs in Triton behind the OpenAI "
        f"endpoint ({', '.join(('/v1/completions', '/v1/chat/completions', '/v1/models', '/health', METRICS_PATH))})"
    )
    served = dataclasses.replace(
        options,
        host=INTERNAL_HOST,
        openai_port=options.openai_port or route.port,
        openai_model_name=options.openai_model_name or route.model_name,
    )
    return TwinServing(repo, served, lambda app, triton: add_routes(app, triton.metrics_url, route.iteration_stats))


def add_routes(app: Any, metrics_url: str, iteration_stats: bool) -> None:
    """trtllm-serve's ``/metrics`` on the endpoint's app (:class:`IterationStats`)."""
    stats = IterationStats(metrics_url, enabled=iteration_stats)

    async def metrics() -> list[dict[str, Any]]:
        return await asyncio.to_thread(stats.read)

    app.add_api_route(METRICS_PATH, metrics, methods=["GET"])


class IterationStats:
    """trtllm-serve's ``/metrics`` answer from Triton's metrics: a list with one entry for the loop's
    work finished since the previous call (none when nothing finished), or always empty when
    ``enabled`` is false (upstream without ``enable_iter_perf_stats``).

    An entry, in upstream's keys: ``timestamp``; ``iter``, the loop iterations so far;
    ``iterLatencyMS``, their mean duration since the last call; ``numCompletedRequests``; and
    ``specDecodingStats`` with ``numDraftTokens``, ``numAcceptedTokens``, ``numRequestsWithDraftTokens``
    (request steps: one target call each) and ``acceptanceLength`` (tokens per target call).
    Counted when a request ends (the loop model records its totals then)."""

    def __init__(self, metrics_url: str, *, enabled: bool):
        self.metrics_url = metrics_url
        self.enabled = enabled
        self.last: dict[str, float] = {}

    def scrape(self) -> dict[str, float]:
        """The loop model's counters now (0 for those not yet reported)."""
        return loop_counters(scrape(self.metrics_url))

    def read(self) -> list[dict[str, Any]]:
        if not self.enabled:
            return []
        now = self.scrape()
        delta = {key: value - self.last.get(key, 0.0) for key, value in now.items()}
        self.last = now
        steps = delta["iterations"]
        if steps <= 0:
            return []
        calls = delta["target_calls"]
        return [
            {
                "timestamp": time.strftime("%m-%d-%Y %H:%M:%S"),
                "iter": int(now["iterations"]),
                "iterLatencyMS": 1000.0 * delta["loop_seconds"] / steps,
                "numCompletedRequests": int(delta["finished"]),
                "specDecodingStats": {
                    "numDraftTokens": int(delta["draft_tokens"]),
                    "numAcceptedTokens": int(delta["accepted"]),
                    "numRequestsWithDraftTokens": int(calls),
                    "acceptanceLength": delta["output_tokens"] / calls if calls else 0.0,
                },
            }
        ]


def loop_counters(text: str) -> dict[str, float]:
    """The loop model's counters (summed over label sets) and finished requests, from Prometheus text."""
    names = {name: key for key, name in _COUNTERS.items()}
    totals = dict.fromkeys((*_COUNTERS, "finished"), 0.0)
    for sample in samples(text):
        if sample.name in names:
            totals[names[sample.name]] += sample.value
        elif sample.name == _FINISHED[0] and sample.label("outcome") == _FINISHED[1]:
            totals["finished"] += sample.value
    return totals
