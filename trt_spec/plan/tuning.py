"""The tuning report: acceptance measured on the user's own prompts (``trt-spec tune``) for every
speculation method the spec's checkpoints can run, read by ``plan`` (the projection from the
measured profile instead of an assumed alpha), ``check`` (a warning when the spec's method or K is
off the recommendation) and ``repo`` (adaptive K starts from the measured acceptance; the torch
flavor's step costs as measured).

A report is read for one method at a time: ``load_tuning(path, spec)`` selects the spec's
(:meth:`TuningReport.for_method`), so a report tuned on a hybrid spec serves a prompt-lookup spec
of the same target too. The recommended method is the one projected fastest on the spec's GPU
(:func:`recommend_method`).

A report is JSON, written once by ``trt_spec.bench.tuning`` and validated here on every read
(pydantic), so a hand-edited or truncated file fails with the field that is wrong. It records
what it was measured on: the pair (checked against the spec that reads it), the workload, the
machine, the temperatures.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from trt_spec.errors import SpecError
from trt_spec.plan.projection import ScheduleStep, loop_schedule
from trt_spec.runtime.costs import AcceptanceProfile, StepCosts
from trt_spec.runtime.methods import get as get_method
from trt_spec.spec import Spec

REPORT_VERSION = 2  # 2: one result per method (``methods``), ``recommended_method``
# Methods projected within this fraction of the fastest count as equal, and the one with fewer
# engines is recommended: a draft engine costs GPU memory and a build, and a tie does not pay for it.
METHOD_TIE = 0.01


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LengthSummary(_Strict):
    min: int
    median: float
    max: int


class KRow(_Strict):
    """One K at one temperature: measured in-process on the spec's checkpoints, and projected."""

    k: int = Field(ge=1)
    tokens_per_target_call: float = Field(ge=1)  # measured at this K
    profile_tokens_per_target_call: float = Field(ge=1)  # E(K) from the profile measured at the largest K
    acceptance_rate: float = Field(ge=0, le=1)  # accepted / drafted (TensorRT-LLM's)
    alpha: float = Field(ge=0, le=1)
    accepted_through: list[float]  # per position 1..K, measured at this K
    measured_speedup: float = Field(gt=0)  # on the machine that tuned (CPU: not the GPU's figure)


class TemperatureResult(_Strict):
    temperature: float = Field(ge=0)
    alpha: float = Field(ge=0, le=1)  # at the largest K measured
    accepted_through: list[float] = Field(min_length=1)  # the profile, at the largest K measured
    rows: list[KRow] = Field(min_length=1)  # the K that were run
    # On the spec's GPU at batch 1 from the profile, for every K = 1 .. len(accepted_through).
    projected_speedup: list[float] = Field(min_length=1)
    recommended_k: int = Field(ge=1)  # the best projected K
    k_schedule: list[int]  # the best K per requests in flight 1..max_batch_size (0: plain decoding)
    # The fraction of steps the draft engine ran, which the projection charges t_d for: 1 for a
    # draft model, 0 for prompt lookup (host-side), hybrid's measured share (lookup had no match).
    draft_share: float = Field(default=1.0, ge=0, le=1)

    @model_validator(mode="after")
    def _consistent(self) -> TemperatureResult:
        if len(self.projected_speedup) != len(self.accepted_through):
            raise ValueError("projected_speedup needs one value per position of accepted_through")
        if not 1 <= self.recommended_k <= len(self.projected_speedup):
            raise ValueError(f"recommended_k {self.recommended_k} is outside 1..{len(self.projected_speedup)}")
        return self

    @property
    def profile(self) -> AcceptanceProfile:
        return AcceptanceProfile(tuple(self.accepted_through), self.alpha)

    def projected_at(self, k: int) -> float | None:
        return self.projected_speedup[k - 1] if 1 <= k <= len(self.projected_speedup) else None

    @property
    def best_speedup(self) -> float:
        """The projected speedup at the recommended K."""
        return self.projected_speedup[self.recommended_k - 1]


class MeasuredStepCosts(_Strict):
    """Step costs measured in the same run, relative to t_1 (the torch flavor's adaptive K)."""

    draft: float = Field(ge=0)  # t_d / t_1
    verify_slope: float = Field(ge=0)  # (t_(K+1) - t_1) / (K t_1) at the largest K


class SchedulePoint(_Strict):
    """One load measured through the server: speculative decoding at each K against plain decoding
    (``num_draft_tokens`` 0) with ``in_flight`` requests streaming at once."""

    in_flight: int = Field(ge=1)
    speedups: dict[int, float] = Field(min_length=1)  # K -> tokens/s over plain decoding at this load

    @property
    def best_k(self) -> int:
        """The K with the largest speedup (the smallest on a tie); 0 where none beats plain decoding."""
        k = min(self.speedups, key=lambda k: (-self.speedups[k], k))
        return k if self.speedups[k] > 1 else 0


class MethodResult(_Strict):
    """One speculation method measured on the workload: per temperature, and its step costs."""

    name: str  # a trt_spec.runtime.methods name
    temperatures: list[TemperatureResult] = Field(min_length=1)
    step_costs: MeasuredStepCosts

    @property
    def primary(self) -> TemperatureResult:
        return self.temperatures[0]


def recommend_method(results: list[MethodResult]) -> str:
    """The method projected fastest at its best K at the traffic's temperature (the first); among
    those within :data:`METHOD_TIE` of it, the one deploying fewer engines, then the first listed."""
    best = max(result.primary.best_speedup for result in results)
    close = [result for result in results if result.primary.best_speedup >= best * (1 - METHOD_TIE)]
    return min(close, key=lambda result: len(get_method(result.name).roles)).name


class MeasuredSchedule(_Strict):
    """The best K by requests in flight, measured through a running server of the spec's repository
    (``trt-spec tune --url``): for a flavor that runs on the machine that tuned (the torch flavor),
    whose costs under load no projection describes. On a CPU the draft and target engine models
    run in processes of their own, so under load one request's drafting overlaps another's
    verification, which plain decoding (the target alone) cannot use."""

    url: str
    method: str  # the served spec's method the schedule was measured with
    temperature: float = Field(ge=0)
    prompts: int = Field(ge=1)
    max_new_tokens: int = Field(ge=1)
    points: list[SchedulePoint] = Field(min_length=1)
    stream: bool = True  # measured with streamed requests (false: one final response each)

    @model_validator(mode="after")
    def _from_one_up(self) -> MeasuredSchedule:
        loads = [point.in_flight for point in self.points]
        if loads[0] != 1 or loads != sorted(set(loads)):
            raise ValueError(f"points must start at 1 request in flight and increase; got {loads}")
        return self

    def loop_schedule(self, spec_k: int, max_batch_size: int) -> tuple[int, ...]:
        """What the loop model runs for 1..``max_batch_size`` requests in flight, by the rule of the
        projected schedule (:func:`~trt_spec.plan.projection.loop_schedule`) applied to the measured
        best K per load: the spec's K while load leaves it where it is for one request, the measured
        best (at most the spec's K, the engine's max_draft_len) where load lowers it, 0 where plain
        decoding was faster.

        Where no K beat plain decoding for one request, K alone stays the spec's (the user's call,
        which ``check --tuning`` questions), and loads measured to favour plain decoding or a
        smaller K still get it: one request's figure is the noisiest of the measurement, and the
        loads' are what a server under load runs; () where nothing measured lowers it."""
        steps = []
        for in_flight in range(1, max_batch_size + 1):
            point = [point for point in self.points if point.in_flight <= in_flight][-1]
            k = point.best_k or (spec_k if point.in_flight == 1 else 0)
            steps.append(ScheduleStep(in_flight, k, point.speedups.get(k, 1.0)))
        runs = loop_schedule(steps, spec_k)
        if self.points[0].best_k == 0 and all(k == spec_k for k in runs):
            return ()
        return runs

    def render(self, spec_k: int, max_batch_size: int) -> list[str]:
        lines = [
            f"K by requests in flight, measured through {self.url} (tokens/s over plain decoding at the same load; "
            f"{self.prompts} prompts x {self.max_new_tokens} tokens, temperature {self.temperature:g}):"
        ]
        for point in self.points:
            cells = "  ".join(f"K {k}: x{speedup:.2f}" for k, speedup in sorted(point.speedups.items()))
            best = point.best_k
            lines.append(
                f"  {point.in_flight:>4} in flight: {cells}  -> " + (f"K {best}" if best else "plain decoding")
            )
        runs = self.loop_schedule(spec_k, max_batch_size)
        lines.append(
            f"  the loop model (torch flavor, repo --tuning) runs K {' '.join(map(str, runs))} for 1..{len(runs)} in flight"
            if runs
            else f"  the loop keeps the spec's K {spec_k} at any load (no load measured lowers it)"
        )
        return lines


class Workload(_Strict):
    source: str  # the --dataset, or "packaged prompts"
    prompts: int = Field(ge=1)
    prompt_tokens: LengthSummary
    max_new_tokens: int = Field(ge=1)


class TuningReport(_Strict):
    """What ``trt-spec tune`` measured; see the module docstring."""

    version: int
    spec_name: str
    target: str  # the spec's target.model
    draft: str | None  # the spec's draft.model; None for a method without a draft model
    # The method the properties below give figures for: the tuned spec's as written; on reading,
    # the reading spec's (load_tuning, for_method).
    method: str
    spec_k: int  # the spec's num_draft_tokens when tuned
    gpu: str  # the spec's engine.gpu, which the projection is for
    created: str  # ISO 8601
    machine: str  # where the acceptance was measured (it does not depend on it; speed does)
    runner: str
    workload: Workload
    methods: list[MethodResult] = Field(min_length=1)  # every method tried
    recommended_method: str  # recommend_method(methods)
    recommended_k: int = Field(ge=1)  # the recommended method's best K at the traffic's temperature
    measured_schedule: MeasuredSchedule | None = None  # with --url

    @model_validator(mode="after")
    def _consistent(self) -> TuningReport:
        if self.version != REPORT_VERSION:
            raise ValueError(f"version {self.version} is not {REPORT_VERSION}; re-run trt-spec tune")
        names = [result.name for result in self.methods]
        if len(set(names)) != len(names):
            raise ValueError(f"methods are listed more than once: {names}")
        for name in (self.method, self.recommended_method):
            if name not in names:
                raise ValueError(f"method {name!r} has no result; the report measured {', '.join(names)}")
        best = self.methods[names.index(self.recommended_method)].primary.recommended_k
        if self.recommended_k != best:
            raise ValueError(f"recommended_k {self.recommended_k} is not {self.recommended_method}'s best K {best}")
        return self

    def result_of(self, name: str) -> MethodResult:
        """The figures measured for the method called ``name``.

        Raises:
            SpecError: the report has none (names what it has and the fix).
        """
        for result in self.methods:
            if result.name == name:
                return result
        raise SpecError(
            f"the tuning report measured {', '.join(result.name for result in self.methods)}, not speculative.method "
            f"{name}; run `trt-spec tune` on a spec with method {name} (a spec with a draft section measures "
            "every method)"
        )

    def for_method(self, name: str) -> TuningReport:
        """The same report read for the method called ``name`` (see :meth:`result_of`)."""
        self.result_of(name)
        return self.model_copy(update={"method": name})

    @property
    def temperatures(self) -> list[TemperatureResult]:
        """The method's results per temperature."""
        return self.result_of(self.method).temperatures

    @property
    def step_costs(self) -> MeasuredStepCosts:
        return self.result_of(self.method).step_costs

    @property
    def primary(self) -> TemperatureResult:
        """The first temperature tuned: the traffic's, which the recommendation is for."""
        return self.temperatures[0]

    @property
    def acceptance(self) -> AcceptanceProfile:
        return self.primary.profile

    @property
    def best_k(self) -> int:
        """The method's best projected K (``recommended_k`` is the recommended method's)."""
        return self.primary.recommended_k

    @property
    def max_batch_size(self) -> int:
        """The spec's max_batch_size when tuned (its projected schedule covers 1..it)."""
        return len(self.primary.k_schedule)

    def loop_schedule(self, spec: Spec) -> tuple[int, ...] | None:
        """The loop's K by requests in flight measured through a server (``tune --url``); None when
        none was measured."""
        if self.measured_schedule is None or self.measured_schedule.method != spec.speculative.method:
            return None
        return self.measured_schedule.loop_schedule(spec.num_draft_tokens, spec.engine.max_batch_size)

    def measured_step_costs(self) -> StepCosts:
        """The costs measured on the machine that tuned, with the measured alpha and profile as the prior."""
        return StepCosts(
            self.step_costs.draft,
            self.step_costs.verify_slope,
            prior_alpha=self.primary.alpha,
            prior_profile=tuple(self.primary.accepted_through),
        )

    def check_matches(self, spec: Spec) -> None:
        """Raises SpecError when the report was measured on other checkpoints than the spec's (the
        same target, and the same draft where the spec has one), or not for the spec's method."""
        draft = spec.draft.model if spec.draft else None
        if self.target != spec.target.model or (draft is not None and draft != self.draft):
            raise SpecError(
                f"the tuning report is for target {self.target!r} with draft {self.draft!r}, not the spec's "
                f"{spec.target.model!r} with {draft!r}; run `trt-spec tune --spec` on this spec"
            )
        self.result_of(spec.speculative.method)

    def warnings(self, spec: Spec) -> list[str]:
        """What ``check`` and ``plan`` say about the spec against this report (read for the
        spec's method)."""
        found = []
        if spec.speculative.method != self.recommended_method:
            ours, best = self.primary, self.result_of(self.recommended_method).primary
            needs = (
                " (it needs a draft section)"
                if spec.draft is None and get_method(self.recommended_method).uses_draft_model
                else ""
            )
            found.append(
                f"speculative.method is {spec.speculative.method} (x{ours.best_speedup:.2f} projected at its best K "
                f"{ours.recommended_k}) but the tuning report recommends {self.recommended_method} "
                f"(x{best.best_speedup:.2f} at K {best.recommended_k} on {self.gpu.upper()}, acceptance measured on "
                f"{self.workload.source}); set speculative.method: {self.recommended_method}{needs}"
            )
        if spec.num_draft_tokens != self.best_k:
            result = self.primary
            at_spec = result.projected_at(spec.num_draft_tokens)
            projected = f" (x{at_spec:.2f})" if at_spec is not None else ""
            found.append(
                f"speculative.num_draft_tokens is {spec.num_draft_tokens}{projected} but the tuning report "
                f"recommends K = {self.best_k} for {self.method} (x{result.best_speedup:.2f} projected on "
                f"{self.gpu.upper()} at temperature {result.temperature:g}, acceptance measured on "
                f"{self.workload.source}); K is the target engine's max_draft_len, fixed at build: set it "
                "before `trt-spec build`"
            )
        if self.gpu != spec.engine.gpu:
            found.append(
                f"the tuning report projected for {self.gpu.upper()}, the spec builds for "
                f"{spec.engine.gpu.upper()}; re-run trt-spec tune to project for it"
            )
        return found


def load_tuning(path: str | Path, spec: Spec | None = None) -> TuningReport:
    """Read and validate a report (and check it is for ``spec``'s pair, when given).

    Raises:
        SpecError: a missing, unreadable or invalid file, or a report for another pair.
    """
    path = Path(path)
    try:
        report = TuningReport.model_validate_json(path.read_text())
    except FileNotFoundError:
        raise SpecError(
            f"tuning report {path} does not exist; write it with `trt-spec tune --spec F -o {path}`"
        ) from None
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(the file)"
        raise SpecError(f"tuning report {path}: {where}: {first['msg']}; re-run trt-spec tune") from None
    except (OSError, ValueError) as error:
        raise SpecError(f"tuning report {path} cannot be read: {error}") from None
    if spec is not None:
        report.check_matches(spec)
        report = report.for_method(spec.speculative.method)
    return report


def report_json(report: TuningReport) -> str:
    return json.dumps(report.model_dump(mode="json"), indent=2) + "\n"
