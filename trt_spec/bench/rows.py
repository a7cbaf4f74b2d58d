"""What a benchmark reports: the tally of one configuration's requests, and the typed result rows
made from tallies (in-process: a fixed K or adaptive K; through a server: one K, temperature and
concurrency).

Each row's ``to_json()`` is a row of ``trt-spec bench --json``. Every row has the keys docs/commands.md
lists for ``bench``: ``k``, ``temperature``, ``adaptive``, ``tokens_per_s``,
``baseline_tokens_per_s``, ``speedup``, ``acceptance_rate`` (accepted / drafted), ``alpha``
(accepted / (accepted + rejections)), ``tokens_per_target_call``,
``theoretical_tokens_per_target_call``, ``hf_assisted_tokens_per_s`` and ``cost_model_speedup``
(null where not measured); the rest are each kind's own.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, overload

from trt_spec.runtime.costs import StepTimes, expected_tokens_per_call
from trt_spec.runtime.loop import RequestStats
from trt_spec.runtime.methods import DEFAULT_METHOD


def theoretical_tokens_per_call_at_drafted(alpha: float, stats: RequestStats) -> float:
    """The theory for the draft lengths a run actually used: the mean over its steps of
    1 + alpha + ... + alpha^k_step. The last steps of a request draft fewer than K (never past
    max_new_tokens), which the fixed-K formula does not know."""
    if not stats.target_calls:
        return 0.0
    # sum over steps of sum_{j=1..k} alpha^j = sum over positions j of (steps drafting >= j) alpha^j
    drafted_terms = sum(count * alpha ** (position + 1) for position, count in enumerate(stats.drafted_by_position))
    return (stats.target_calls + drafted_terms) / stats.target_calls


Progress = Callable[[str], None]  # where a benchmark reports what it is doing, one line at a time


# --- what requests accumulate ------------------------------------------------------------------


@dataclass
class RequestResult:
    """One request, timed from outside (through a server, or the in-process loop it is compared to)."""

    tokens: int
    seconds: float
    ttft_s: float
    itl_s: float | None  # None when everything came in one response
    drafted: int
    accepted: int
    target_calls: int
    text: str = ""


@dataclass
class Tally:
    """What one configuration accumulated over all its requests: tokens and wall seconds, plus the
    loop's own counters (in-process) or each request's timings (through a server)."""

    tokens: int = 0
    seconds: float = 0.0  # summed per request, or per batch of concurrent requests
    requests: int = 0
    stats: RequestStats = field(default_factory=RequestStats)
    results: list[RequestResult] = field(default_factory=list)

    def add(self, tokens: int, seconds: float, stats: RequestStats | None = None) -> None:
        """One in-process request; ``stats`` is None for a run without the loop's counters (HF)."""
        self.tokens += tokens
        self.seconds += seconds
        self.requests += 1
        if stats is not None:
            total = self.stats
            total.iterations += stats.iterations
            total.target_calls += stats.target_calls
            total.emitted_tokens += stats.emitted_tokens
            total.drafted_tokens += stats.drafted_tokens
            total.accepted_tokens += stats.accepted_tokens
            total.rejections += stats.rejections
            width = max(len(total.drafted_by_position), len(stats.drafted_by_position))
            total.drafted_by_position = _add_lists(total.drafted_by_position, stats.drafted_by_position, width)
            total.accepted_by_position = _add_lists(total.accepted_by_position, stats.accepted_by_position, width)
            for mine, theirs in (
                (total.drafted_by_source, stats.drafted_by_source),
                (total.accepted_by_source, stats.accepted_by_source),
                (total.steps_by_source, stats.steps_by_source),
            ):
                for source, count in theirs.items():
                    mine[source] = mine.get(source, 0) + count

    def add_results(self, results: Sequence[RequestResult], seconds: float) -> None:
        """Requests timed from outside, which took ``seconds`` of wall time together."""
        self.results += results
        self.tokens += sum(result.tokens for result in results)
        self.seconds += seconds
        self.requests += len(results)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def _add_lists(left: list[int], right: list[int], width: int) -> list[int]:
    left = left + [0] * (width - len(left))
    right = right + [0] * (width - len(right))
    return [a + b for a, b in zip(left, right)]


def _median(values: Iterable[float | None]) -> float | None:
    """The median of the values that are not None; None when there are none."""
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


@overload
def _ms(seconds: float) -> float: ...
@overload
def _ms(seconds: float | None) -> float | None: ...
def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


# --- rows ----------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Row:
    """What every row reports."""

    adaptive: ClassVar[bool] = False  # True: K chosen step by step, up to ``k``

    k: int
    temperature: float
    tokens_per_s: float
    baseline_tokens_per_s: float  # plain decoding of the target, in the same run
    speedup: float | None
    acceptance_rate: float
    alpha: float | None  # None over a server whose metrics cannot be read
    tokens_per_target_call: float
    theoretical_tokens_per_target_call: float | None
    hf_assisted_tokens_per_s: float | None = None
    cost_model_speedup: float | None = None
    tokens: int
    method: str = DEFAULT_METHOD  # where the drafts came from (speculative.method)

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError

    def _head(self) -> dict[str, Any]:
        return {"k": self.k, "temperature": self.temperature, "adaptive": self.adaptive, "method": self.method}

    def _measured(self) -> dict[str, Any]:
        return {
            "tokens_per_s": self.tokens_per_s,
            "baseline_tokens_per_s": self.baseline_tokens_per_s,
            "speedup": self.speedup,
            "acceptance_rate": self.acceptance_rate,
            "alpha": self.alpha,
            "tokens_per_target_call": self.tokens_per_target_call,
            "theoretical_tokens_per_target_call": self.theoretical_tokens_per_target_call,
            "hf_assisted_tokens_per_s": self.hf_assisted_tokens_per_s,
            "cost_model_speedup": self.cost_model_speedup,
        }


@dataclass(frozen=True, kw_only=True)
class FixedRow(Row):
    """In-process, K drafts every step: against the theory, the cost model and HF assisted generation."""

    speedup: float
    alpha: float
    theoretical_tokens_per_target_call: float
    cost_model_speedup: float
    theoretical_tokens_per_target_call_at_drafted: float
    t_1_ms: float
    t_d_ms: float
    t_k_plus_1_ms: float
    hf_plain_tokens_per_s: float | None  # HF's own plain decoding, the baseline of its assisted generation
    acceptance_by_position: tuple[float, ...]
    # Per position: accepted / all steps (acceptance_by_position divides by the steps that drafted
    # there; a prompt-lookup step without a match drafts nothing). E = 1 + their sum, exactly.
    accepted_through_per_step: tuple[float, ...]
    target_calls: int
    drafted_by_source: dict[str, int]  # methods.SOURCES -> drafted tokens
    accepted_by_source: dict[str, int]
    steps_by_source: dict[str, int]  # methods.SOURCES -> steps that drafted from it

    @classmethod
    def measure(
        cls,
        k: int,
        temperature: float,
        spec: Tally,
        baseline: Tally,
        step_times: StepTimes,
        hf: Tally | None = None,
        hf_plain: Tally | None = None,
        method: str = DEFAULT_METHOD,
    ) -> FixedRow:
        stats = spec.stats
        return cls(
            method=method,
            k=k,
            temperature=temperature,
            tokens_per_s=spec.tokens_per_s,
            baseline_tokens_per_s=baseline.tokens_per_s,
            speedup=spec.tokens_per_s / baseline.tokens_per_s,
            acceptance_rate=stats.acceptance_rate,
            alpha=stats.alpha,
            tokens_per_target_call=stats.tokens_per_target_call,
            theoretical_tokens_per_target_call=expected_tokens_per_call(stats.alpha, k),
            hf_assisted_tokens_per_s=hf.tokens_per_s if hf else None,
            cost_model_speedup=step_times.run_speedup(k, spec.tokens, stats.target_calls, spec.requests),
            theoretical_tokens_per_target_call_at_drafted=theoretical_tokens_per_call_at_drafted(stats.alpha, stats),
            t_1_ms=_ms(step_times.target_1),
            t_d_ms=_ms(step_times.draft_by_k[k]),
            t_k_plus_1_ms=_ms(step_times.target_by_num_tokens[k + 1]),
            hf_plain_tokens_per_s=hf_plain.tokens_per_s if hf_plain else None,
            acceptance_by_position=tuple(stats.acceptance_by_position),
            accepted_through_per_step=tuple(
                accepted / stats.target_calls if stats.target_calls else 0.0 for accepted in stats.accepted_by_position
            ),
            target_calls=stats.target_calls,
            drafted_by_source=dict(stats.drafted_by_source),
            accepted_by_source=dict(stats.accepted_by_source),
            steps_by_source=dict(stats.steps_by_source),
            tokens=spec.tokens,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            **self._head(),
            **self._measured(),
            # Beyond the common keys: how close to the models, and the peers' own baseline.
            "tokens_per_call_vs_theory": self.tokens_per_target_call / self.theoretical_tokens_per_target_call,
            "theoretical_tokens_per_target_call_at_drafted": self.theoretical_tokens_per_target_call_at_drafted,
            "tokens_per_call_vs_theory_at_drafted": (
                self.tokens_per_target_call / self.theoretical_tokens_per_target_call_at_drafted
            ),
            "speedup_vs_cost_model": self.speedup / self.cost_model_speedup,
            "t_1_ms": self.t_1_ms,
            "t_d_ms": self.t_d_ms,
            "t_k_plus_1_ms": self.t_k_plus_1_ms,
            "hf_plain_tokens_per_s": self.hf_plain_tokens_per_s,
            "acceptance_by_position": list(self.acceptance_by_position),
            "target_calls": self.target_calls,
            "drafted_by_source": self.drafted_by_source,
            "accepted_by_source": self.accepted_by_source,
            "tokens": self.tokens,
        }


@dataclass(frozen=True, kw_only=True)
class AdaptiveRow(Row):
    """In-process, K chosen every step up to ``k``: no fixed-K theory, cost model or HF peer."""

    adaptive: ClassVar[bool] = True

    alpha: float
    mean_k: float  # drafted tokens per step
    acceptance_by_position: tuple[float, ...]
    target_calls: int

    @classmethod
    def measure(
        cls, max_k: int, temperature: float, spec: Tally, baseline: Tally, method: str = DEFAULT_METHOD
    ) -> AdaptiveRow:
        stats = spec.stats
        return cls(
            method=method,
            k=max_k,
            temperature=temperature,
            tokens_per_s=spec.tokens_per_s,
            baseline_tokens_per_s=baseline.tokens_per_s,
            speedup=spec.tokens_per_s / baseline.tokens_per_s,
            acceptance_rate=stats.acceptance_rate,
            alpha=stats.alpha,
            tokens_per_target_call=stats.tokens_per_target_call,
            theoretical_tokens_per_target_call=None,  # K varies from step to step
            mean_k=stats.drafted_tokens / stats.iterations if stats.iterations else 0.0,
            acceptance_by_position=tuple(stats.acceptance_by_position),
            target_calls=stats.target_calls,
            tokens=spec.tokens,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            **self._head(),
            **self._measured(),
            "mean_k": self.mean_k,
            "acceptance_by_position": list(self.acceptance_by_position),
            "target_calls": self.target_calls,
            "tokens": self.tokens,
        }


@dataclass(frozen=True)
class LoopBreakdown:
    """Per iteration of the loop model, from metric deltas over a concurrency-1 run."""

    iterations: int
    iteration_ms: float  # the loop model's wall time per iteration
    engine_ms: float  # the engine models' own time inside execute, per iteration
    overhead_ms: float  # everything else: BLS round trips, copies, bookkeeping, responses
    engine_source: str  # "trt_spec" (the torch flavor's own timers) or "triton" (compute_infer)
    # The overhead in two parts: the loop model's own work between engine calls (bookkeeping,
    # building requests, handing responses to its sender), and the BLS transport (the engine
    # calls' wall time minus the engine models' own time: IPC, Triton's scheduling, copies).
    loop_own_ms: float = 0.0
    transport_ms: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "loop_iteration_ms": self.iteration_ms,
            "engine_ms_per_iteration": self.engine_ms,
            "loop_overhead_ms_per_iteration": self.overhead_ms,
            "engine_time_source": self.engine_source,
            "loop_own_ms_per_iteration": self.loop_own_ms,
            "bls_transport_ms_per_iteration": self.transport_ms,
        }


@dataclass(frozen=True)
class InprocessComparison:
    """The in-process loop on the same prompts as a server's concurrency-1 run."""

    tokens_per_s: float
    server_vs_inprocess: float | None  # the server's tokens/s over the in-process loop's
    same_tokens: bool | None  # greedy: did both produce the same text; None when sampled

    def to_json(self) -> dict[str, Any]:
        return {
            "inprocess_tokens_per_s": self.tokens_per_s,
            "server_vs_inprocess": self.server_vs_inprocess,
            "inprocess_same_tokens": self.same_tokens,
        }


@dataclass(frozen=True, kw_only=True)
class ServerRow(Row):
    """Through a server, against plain decoding (``num_draft_tokens`` 0) on the same server."""

    concurrency: int
    ttft_ms: float | None  # median over requests: first response minus send
    itl_ms: float | None  # median over requests: (last - first response) / tokens after the first
    baseline_ttft_ms: float | None
    baseline_itl_ms: float | None
    requests: int
    loop: LoopBreakdown | None = None  # at concurrency 1, when the metrics can be read
    inprocess: InprocessComparison | None = None  # at concurrency 1, with a twin pair

    @classmethod
    def measure(
        cls,
        k: int,
        temperature: float,
        concurrency: int,
        spec: Tally,
        plain: Tally,
        alpha: float | None,
        loop: LoopBreakdown | None = None,
        inprocess: InprocessComparison | None = None,
    ) -> ServerRow:
        drafted = sum(r.drafted for r in spec.results)
        accepted = sum(r.accepted for r in spec.results)
        calls = sum(r.target_calls for r in spec.results)
        return cls(
            k=k,
            temperature=temperature,
            concurrency=concurrency,
            tokens_per_s=spec.tokens_per_s,
            baseline_tokens_per_s=plain.tokens_per_s,
            speedup=spec.tokens_per_s / plain.tokens_per_s if plain.tokens_per_s else None,
            acceptance_rate=accepted / drafted if drafted else 0.0,
            alpha=alpha,
            tokens_per_target_call=spec.tokens / calls if calls else 0.0,
            theoretical_tokens_per_target_call=expected_tokens_per_call(alpha, k) if alpha is not None else None,
            ttft_ms=_ms(_median(r.ttft_s for r in spec.results)),
            itl_ms=_ms(_median(r.itl_s for r in spec.results)),
            baseline_ttft_ms=_ms(_median(r.ttft_s for r in plain.results)),
            baseline_itl_ms=_ms(_median(r.itl_s for r in plain.results)),
            requests=len(spec.results),
            tokens=spec.tokens,
            loop=loop,
            inprocess=inprocess,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            **self._head(),
            "concurrency": self.concurrency,
            **self._measured(),
            "ttft_ms": self.ttft_ms,
            "itl_ms": self.itl_ms,
            "baseline_ttft_ms": self.baseline_ttft_ms,
            "baseline_itl_ms": self.baseline_itl_ms,
            "requests": self.requests,
            "tokens": self.tokens,
            **(self.loop.to_json() if self.loop is not None else {}),
            **(self.inprocess.to_json() if self.inprocess is not None else {}),
        }
