"""In-process benchmark: speculative decoding on the PyTorch twin against plain decoding of the
target on the same engine and against Hugging Face assisted generation on the same models.

Every number of a report comes from one run: end-to-end tokens per second per configuration,
acceptance statistics, and the step times the cost model needs (t_1 and t_{K+1} of the target,
t_d of the draft). Requests are timed end to end (prefill included), every configuration once
per prompt and round in a rotating order, with a block of step timings after each round; all
figures are means over the whole run. A shared machine's speed drifts; interleaving makes every
configuration, and the cost model, see the same drift.

The K recommendation is Leviathan et al. 2023 (arXiv 2211.17192), Theorem 3.8: the K maximising
the expected walltime improvement (1 - alpha^(K+1)) / ((1 - alpha)(K c + 1)), c = t_d / t_1.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

import torch

from trt_spec.runtime.parameters import MAX_DRAFT_TOKENS
from trt_spec.runtime.loop import GenerationParams, RequestStats, expected_tokens_per_call
from trt_spec.twin import TwinPair

PROMPTS_RESOURCE = ("data", "prompts", "pystdlib_heldout.json")
DEFAULT_KS = (1, 2, 3, 4, 6, 8)
DEFAULT_TEMPERATURES = (0.0, 1.0)
QUICK_KS = (2, 4)
PROMPT_TOKENS = 64
MAX_NEW_TOKENS = 96
STEP_TIME_CALLS = 5  # timed calls (or speculative-step patterns) per shape after every round of requests

Progress = Callable[[str], None]


@dataclass(frozen=True)
class BenchConfig:
    ks: tuple[int, ...] = DEFAULT_KS
    temperatures: tuple[float, ...] = DEFAULT_TEMPERATURES
    num_prompts: int = 8
    prompt_tokens: int = PROMPT_TOKENS
    max_new_tokens: int = MAX_NEW_TOKENS
    repeats: int = 1
    hf_assisted: bool = True
    adaptive: bool = True  # also run adaptive K (largest K = max(ks))
    seed: int = 0

    @classmethod
    def quick(cls) -> BenchConfig:
        return cls(ks=QUICK_KS, num_prompts=3)


@dataclass
class StepTimes:
    """Seconds per forward pass, measured at a context of prompt + max_new_tokens / 2 tokens, in
    the access pattern of the decoding they model: t_1 in a run of target calls (plain decoding),
    t_d and t_{K+1} in rounds of K draft calls then one target call (one speculative step). So the
    CPU-cache cost of alternating two models is part of the step times, and what the cost model
    leaves out is the loop's own overhead."""

    target_1: float
    target_by_num_tokens: dict[int, float]  # K + 1 -> t_{K+1}
    draft_by_k: dict[int, float]  # K -> t_d

    @property
    def draft_1(self) -> float:
        """t_d averaged over the K measured."""
        return sum(self.draft_by_k.values()) / len(self.draft_by_k)

    @property
    def cost_ratio(self) -> float:
        """c = t_d / t_1."""
        return self.draft_1 / self.target_1


@dataclass(frozen=True)
class Recommendation:
    temperature: float
    alpha: float
    cost_ratio: float
    num_draft_tokens: int  # Theorem 3.8's optimum
    expected_speedup: float  # its walltime improvement factor
    cost_model_k: int | None  # the measured K with the best cost-model bound (t_(K+1) as measured)
    best_measured_k: int | None  # the fastest fixed K in this run


@dataclass
class BenchReport:
    rows: list[dict]
    step_times: StepTimes
    recommendations: list[Recommendation]
    config: BenchConfig
    runner: str
    threads: int
    seconds: float
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "rows": self.rows,
            "step_times": asdict(self.step_times),
            "recommendations": [asdict(r) for r in self.recommendations],
            "config": asdict(self.config),
            "runner": self.runner,
            "threads": self.threads,
            "seconds": self.seconds,
        }


# --- the cost model --------------------------------------------------------------------------


def theoretical_tokens_per_call(alpha: float, num_draft_tokens: int) -> float:
    """(1 - alpha^(K+1)) / (1 - alpha): expected tokens per target call at i.i.d. acceptance alpha."""
    return expected_tokens_per_call(alpha, num_draft_tokens)


def cost_model_speedup(alpha: float, num_draft_tokens: int, step_times: StepTimes) -> float:
    """E * t_1 / (K * t_d + t_{K+1}): the speedup over plain decoding if the loop cost nothing."""
    expected = theoretical_tokens_per_call(alpha, num_draft_tokens)
    t_draft = step_times.draft_by_k.get(num_draft_tokens, step_times.draft_1)
    step = num_draft_tokens * t_draft + step_times.target_by_num_tokens[num_draft_tokens + 1]
    return expected * step_times.target_1 / step


def theoretical_tokens_per_call_at_drafted(alpha: float, stats: RequestStats) -> float:
    """The theory for the draft lengths a run actually used: the mean over its steps of
    1 + alpha + ... + alpha^k_step. The last steps of a request draft fewer than K (never past
    max_new_tokens), which the fixed-K formula does not know."""
    if not stats.target_calls:
        return 0.0
    # sum over steps of sum_{j=1..k} alpha^j = sum over positions j of (steps drafting >= j) alpha^j
    drafted_terms = sum(count * alpha ** (position + 1) for position, count in enumerate(stats.drafted_by_position))
    return (stats.target_calls + drafted_terms) / stats.target_calls


def walltime_improvement(alpha: float, num_draft_tokens: int, cost_ratio: float) -> float:
    """Leviathan et al. Theorem 3.8: (1 - alpha^(K+1)) / ((1 - alpha)(K c + 1))."""
    return theoretical_tokens_per_call(alpha, num_draft_tokens) / (num_draft_tokens * cost_ratio + 1)


def recommend_num_draft_tokens(alpha: float, cost_ratio: float, max_k: int = MAX_DRAFT_TOKENS) -> int:
    """The K in 1..max_k that maximises :func:`walltime_improvement`."""
    return max(range(1, max_k + 1), key=lambda k: walltime_improvement(alpha, k, cost_ratio))


# --- prompts ---------------------------------------------------------------------------------


def load_prompt_texts() -> list[dict]:
    """The packaged benchmark prompts: held-out Python sources of the demo pair's domain."""
    path = resources.files("trt_spec").joinpath(*PROMPTS_RESOURCE)
    return json.loads(path.read_text())["prompts"]


def load_prompts(pair: TwinPair, num_prompts: int, prompt_tokens: int) -> list[list[int]]:
    """The first ``prompt_tokens`` tokens of the first ``num_prompts`` packaged prompts.

    Raises:
        ValueError: more prompts asked for than are packaged.
    """
    texts = load_prompt_texts()
    if not 1 <= num_prompts <= len(texts):
        raise ValueError(f"num_prompts must be in 1..{len(texts)}; got {num_prompts}")
    return [pair.encode(entry["text"])[:prompt_tokens] for entry in texts[:num_prompts]]


# --- the benchmark ---------------------------------------------------------------------------


@dataclass
class _Tally:
    """What one configuration accumulated over all its requests."""

    tokens: int = 0
    seconds: float = 0.0
    stats: RequestStats = field(default_factory=RequestStats)

    def add(self, tokens: int, seconds: float, stats: RequestStats | None) -> None:
        self.tokens += tokens
        self.seconds += seconds
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

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def run_local_bench(
    pair: TwinPair, config: BenchConfig = BenchConfig(), progress: Progress | None = None
) -> BenchReport:
    """Benchmark ``pair`` on the packaged prompts; see the module docstring for the method.

    Raises:
        ValueError: a K outside 1..16, or more prompts than are packaged.
    """
    say = progress or (lambda message: None)
    started = time.perf_counter()
    for k in config.ks:
        if not 1 <= k <= MAX_DRAFT_TOKENS:
            raise ValueError(f"each K must be in 1..{MAX_DRAFT_TOKENS}; got {k}")
    prompts = load_prompts(pair, config.num_prompts, config.prompt_tokens)
    say(f"{len(prompts)} prompts of {config.prompt_tokens} tokens, {config.max_new_tokens} new tokens each; "
        f"K {list(config.ks)}, temperature {list(config.temperatures)}, {config.repeats} run(s) each")
    # Step times are measured mid-generation: a prompt plus half a completion of context.
    half_completion = GenerationParams(max_new_tokens=config.max_new_tokens // 2, num_draft_tokens=0)
    contexts = [prompt + pair.generate(prompt, half_completion).run() for prompt in prompts]
    step_timer = _StepTimer(config.ks)

    tallies_by_temperature = {
        temperature: _run_temperature(pair, prompts, contexts, config, temperature, step_timer, say)
        for temperature in config.temperatures
    }
    step_times = step_timer.result()
    say(
        f"step times: target t_1 {step_times.target_1 * 1e3:.2f} ms, draft t_d {step_times.draft_1 * 1e3:.2f} ms "
        f"(c = {step_times.cost_ratio:.3f}), target t_(K+1) "
        + ", ".join(f"{n}: {t * 1e3:.2f}" for n, t in sorted(step_times.target_by_num_tokens.items()))
        + " ms"
    )

    rows: list[dict] = []
    recommendations: list[Recommendation] = []
    for temperature, tallies in tallies_by_temperature.items():
        baseline = tallies["plain"]
        temperature_rows = [
            _row(k, temperature, tallies, step_times)
            for k in config.ks
        ]
        if config.adaptive:
            temperature_rows.append(
                _adaptive_row(max(config.ks), temperature, tallies[("adaptive", max(config.ks))], baseline)
            )
        rows += temperature_rows
        recommendations.append(_recommend(temperature, tallies, config, step_times, temperature_rows))

    return BenchReport(
        rows=rows,
        step_times=step_times,
        recommendations=recommendations,
        config=config,
        runner=pair.target.runner_name,
        threads=torch.get_num_threads(),
        seconds=time.perf_counter() - started,
    )


class _StepTimer:
    """Times the engine calls the cost model needs, in blocks between rounds of requests, and
    averages them over the whole run: the machine conditions of the requests they are compared to."""

    def __init__(self, ks: Sequence[int]):
        self.ks = tuple(ks)
        self.seconds: dict[tuple, float] = {}
        self.calls: dict[tuple, int] = {}

    def measure(self, pair: TwinPair, context: list[int]) -> None:
        # Each call below recomputes exactly its last num_tokens positions: the cache holds the rest.
        pair.target.logits(context, 1)
        pair.draft.logits(context, 1)
        for _ in range(STEP_TIME_CALLS):
            self._time(("target", 1), pair.target.logits, context, 1)
        for k in self.ks:
            for _ in range(STEP_TIME_CALLS):
                for _ in range(k):
                    self._time(("draft", k), pair.draft.logits, context, 1)
                self._time(("target", k + 1), pair.target.logits, context, k + 1)

    def _time(self, key: tuple, logits, context: list[int], num_tokens: int) -> None:
        started = time.perf_counter()
        logits(context, num_tokens)
        self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - started
        self.calls[key] = self.calls.get(key, 0) + 1

    def result(self) -> StepTimes:
        mean = {key: self.seconds[key] / self.calls[key] for key in self.seconds}
        return StepTimes(
            target_1=mean[("target", 1)],
            target_by_num_tokens={k + 1: mean[("target", k + 1)] for k in self.ks},
            draft_by_k={k: mean[("draft", k)] for k in self.ks},
        )


def _run_temperature(pair, prompts, contexts, config, temperature, step_timer: _StepTimer, say) -> dict:
    """Every configuration on every prompt, ``repeats`` times, in a rotating order, with a block
    of step timings after each round: slow drifts of a shared machine hit all of them alike."""
    configurations: list = ["plain"] + [("spec", k) for k in config.ks]
    if config.adaptive:
        configurations.append(("adaptive", max(config.ks)))
    if config.hf_assisted:
        configurations += ["hf plain"] + [("hf", k) for k in config.ks]
    tallies = {name: _Tally() for name in configurations}
    for index, prompt in enumerate(prompts):
        seed = config.seed + index
        for repeat in range(config.repeats):
            shift = (index + repeat) % len(configurations)
            for name in configurations[shift:] + configurations[:shift]:
                tallies[name].add(*_run_one(pair, prompt, name, temperature, config.max_new_tokens, seed))
            step_timer.measure(pair, contexts[index])
        say(f"T={temperature:g} prompt {index + 1}/{len(prompts)} done; running tokens/s: "
            + ", ".join(f"{_label(name)} {tallies[name].tokens_per_s:.0f}" for name in configurations))
    return tallies


def _label(name) -> str:
    if isinstance(name, str):
        return name
    kind, k = name
    return {"spec": f"K={k}", "adaptive": f"adaptive<={k}", "hf": f"hf K={k}"}[kind]


def _run_one(pair: TwinPair, prompt, name, temperature: float, max_new_tokens: int, seed: int):
    """(tokens, seconds, stats or None) of one request."""
    if name == "hf plain" or (isinstance(name, tuple) and name[0] == "hf"):
        k = None if name == "hf plain" else name[1]
        tokens, seconds = hf_generate(pair, prompt, max_new_tokens, temperature, k, seed)
        return tokens, seconds, None
    num_draft_tokens = 0 if name == "plain" else name[1]
    params = GenerationParams(
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        num_draft_tokens=num_draft_tokens,
        adaptive_draft=name != "plain" and name[0] == "adaptive",
        eos_token_ids=pair.eos_token_ids,
    )
    pair.target.reset()
    pair.draft.reset()
    started = time.perf_counter()
    generation = pair.generate(prompt, params, seed=seed)
    output = generation.run()
    return len(output), time.perf_counter() - started, generation.stats


def hf_generate(
    pair: TwinPair,
    prompt: Sequence[int],
    max_new_tokens: int,
    temperature: float,
    num_draft_tokens: int | None,
    seed: int,
) -> tuple[int, float]:
    """Hugging Face ``generate`` on the pair's own models: (new tokens before EOS, seconds).

    With ``num_draft_tokens``, assisted generation with the draft as assistant, pinned as DESIGN.md
    says: ``num_assistant_tokens`` = K, schedule ``"constant"``, confidence threshold 0 (off).
    """
    target, draft = pair.target.model, pair.draft.model
    input_ids = torch.tensor([list(prompt)], device=pair.target.device)  # [1, prompt]
    kwargs = {
        "attention_mask": torch.ones_like(input_ids),
        "max_new_tokens": max_new_tokens,
        "eos_token_id": sorted(pair.eos_token_ids) or None,
        "pad_token_id": min(pair.eos_token_ids, default=0),
    }
    if temperature > 0:
        kwargs.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
    else:
        kwargs.update(do_sample=False)
    if num_draft_tokens is not None:
        assistant_config = draft.generation_config
        assistant_config.num_assistant_tokens = num_draft_tokens
        assistant_config.num_assistant_tokens_schedule = "constant"
        assistant_config.assistant_confidence_threshold = 0.0
        kwargs["assistant_model"] = draft
    torch.manual_seed(seed)
    with _quiet_transformers(), torch.inference_mode():
        started = time.perf_counter()
        output = target.generate(input_ids, **kwargs)
        seconds = time.perf_counter() - started
    new_tokens = output[0, input_ids.shape[1] :].tolist()
    for index, token in enumerate(new_tokens):
        if token in pair.eos_token_ids:
            new_tokens = new_tokens[:index]
            break
    return len(new_tokens), seconds


def _row(k: int, temperature: float, tallies: dict, step_times: StepTimes) -> dict:
    spec, baseline = tallies[("spec", k)], tallies["plain"]
    hf, hf_plain = tallies.get(("hf", k)), tallies.get("hf plain")
    stats = spec.stats
    theory = theoretical_tokens_per_call(stats.alpha, k)
    theory_at_drafted = theoretical_tokens_per_call_at_drafted(stats.alpha, stats)
    speedup = spec.tokens_per_s / baseline.tokens_per_s
    bound = cost_model_speedup(stats.alpha, k, step_times)
    return {
        "k": k,
        "temperature": temperature,
        "adaptive": False,
        "tokens_per_s": spec.tokens_per_s,
        "baseline_tokens_per_s": baseline.tokens_per_s,
        "speedup": speedup,
        "acceptance_rate": stats.acceptance_rate,
        "alpha": stats.alpha,
        "tokens_per_target_call": stats.tokens_per_target_call,
        "theoretical_tokens_per_target_call": theory,
        "hf_assisted_tokens_per_s": hf.tokens_per_s if hf else None,
        "cost_model_speedup": bound,
        # Beyond DESIGN.md's keys: how close to the models, and the peers' own baseline.
        "tokens_per_call_vs_theory": stats.tokens_per_target_call / theory,
        "theoretical_tokens_per_target_call_at_drafted": theory_at_drafted,
        "tokens_per_call_vs_theory_at_drafted": stats.tokens_per_target_call / theory_at_drafted,
        "speedup_vs_cost_model": speedup / bound,
        "t_1_ms": step_times.target_1 * 1e3,
        "t_d_ms": step_times.draft_by_k[k] * 1e3,
        "t_k_plus_1_ms": step_times.target_by_num_tokens[k + 1] * 1e3,
        "hf_plain_tokens_per_s": hf_plain.tokens_per_s if hf_plain else None,
        "acceptance_by_position": stats.acceptance_by_position,
        "target_calls": stats.target_calls,
        "tokens": spec.tokens,
    }


def _adaptive_row(max_k: int, temperature: float, spec: _Tally, baseline: _Tally) -> dict:
    stats = spec.stats
    return {
        "k": max_k,
        "temperature": temperature,
        "adaptive": True,
        "tokens_per_s": spec.tokens_per_s,
        "baseline_tokens_per_s": baseline.tokens_per_s,
        "speedup": spec.tokens_per_s / baseline.tokens_per_s,
        "acceptance_rate": stats.acceptance_rate,
        "alpha": stats.alpha,
        "tokens_per_target_call": stats.tokens_per_target_call,
        "theoretical_tokens_per_target_call": None,  # K varies from step to step
        "hf_assisted_tokens_per_s": None,
        "cost_model_speedup": None,
        "mean_k": stats.drafted_tokens / stats.iterations if stats.iterations else 0.0,
        "acceptance_by_position": stats.acceptance_by_position,
        "target_calls": stats.target_calls,
        "tokens": spec.tokens,
    }


def _recommend(temperature, tallies, config, step_times, rows) -> Recommendation:
    """Theorem 3.8's K at the alpha pooled over all K of this temperature, and, since t_(K+1)
    is not t_1 on every machine, the K whose cost-model bound is best with t_(K+1) as measured."""
    accepted = sum(tallies[("spec", k)].stats.accepted_tokens for k in config.ks)
    rejections = sum(tallies[("spec", k)].stats.rejections for k in config.ks)
    alpha = accepted / (accepted + rejections) if accepted + rejections else 0.0
    k = recommend_num_draft_tokens(alpha, step_times.cost_ratio)
    fixed = [row for row in rows if not row["adaptive"]]
    return Recommendation(
        temperature=temperature,
        alpha=alpha,
        cost_ratio=step_times.cost_ratio,
        num_draft_tokens=k,
        expected_speedup=walltime_improvement(alpha, k, step_times.cost_ratio),
        cost_model_k=max(config.ks, key=lambda k: cost_model_speedup(alpha, k, step_times)),
        best_measured_k=max(fixed, key=lambda row: row["tokens_per_s"])["k"] if fixed else None,
    )


# --- where an iteration's time goes ----------------------------------------------------------

PROFILE_CATEGORIES = (
    "drafting (draft forward passes)",
    "verification (target forward pass)",
    "sampling and acceptance maths",
    "cache management",
    "loop overhead (Python)",
)


@dataclass
class IterationProfile:
    num_draft_tokens: int
    temperature: float
    iterations: int
    milliseconds: dict[str, float]  # PROFILE_CATEGORIES -> ms per iteration

    @property
    def total_ms(self) -> float:
        return sum(self.milliseconds.values())


def profile_iterations(
    pair: TwinPair, num_draft_tokens: int, temperature: float, num_prompts: int = 4,
    prompt_tokens: int = PROMPT_TOKENS, max_new_tokens: int = MAX_NEW_TOKENS,
) -> IterationProfile:
    """Split the loop's time per iteration into drafting, verification, sampling, cache
    management and Python overhead, by timing the engines' forward passes and their ``logits``
    calls from outside. Prompts are prefilled first, so iterations are steady-state ones.
    """
    prompts = load_prompts(pair, num_prompts, prompt_tokens)
    timers = {"draft forward": 0.0, "target forward": 0.0, "engine calls": 0.0}
    inside = dict.fromkeys(timers, 0.0)  # what ran inside the requests, prefill excluded
    total_seconds = draft_seconds = verify_seconds = 0.0
    iterations = 0
    with _timed(pair.draft.runner, "forward", timers, "draft forward"), \
            _timed(pair.target.runner, "forward", timers, "target forward"), \
            _timed(pair.draft, "logits", timers, "engine calls"), \
            _timed(pair.target, "logits", timers, "engine calls"):
        for index, prompt in enumerate(prompts):
            params = GenerationParams(
                max_new_tokens=max_new_tokens, temperature=temperature, num_draft_tokens=num_draft_tokens,
                eos_token_ids=pair.eos_token_ids,
            )
            pair.target.logits(prompt, 1)  # prefill; the request then reuses the cached prompt
            pair.draft.logits(prompt, 1)
            before = dict(timers)
            started = time.perf_counter()
            generation = pair.generate(prompt, params, seed=index)
            generation.run()
            total_seconds += time.perf_counter() - started
            for key in timers:
                inside[key] += timers[key] - before[key]
            draft_seconds += generation.stats.draft_seconds
            verify_seconds += generation.stats.verify_seconds
            iterations += generation.stats.iterations
    engine_seconds = inside["engine calls"]
    forward_seconds = inside["draft forward"] + inside["target forward"]
    seconds = {
        PROFILE_CATEGORIES[0]: inside["draft forward"],
        PROFILE_CATEGORIES[1]: inside["target forward"],
        PROFILE_CATEGORIES[2]: draft_seconds + verify_seconds - engine_seconds,
        PROFILE_CATEGORIES[3]: engine_seconds - forward_seconds,
        PROFILE_CATEGORIES[4]: total_seconds - draft_seconds - verify_seconds,
    }
    return IterationProfile(
        num_draft_tokens=num_draft_tokens,
        temperature=temperature,
        iterations=iterations,
        milliseconds={name: value / iterations * 1e3 for name, value in seconds.items()},
    )


@contextmanager
def _timed(owner, method: str, timers: dict[str, float], key: str):
    """Accumulate the wall time of ``owner.method`` calls into ``timers[key]``; restore it after."""
    original = getattr(owner, method)

    def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            timers[key] += time.perf_counter() - started

    shadows_own_attribute = method in vars(owner)
    setattr(owner, method, timed)
    try:
        yield
    finally:
        if shadows_own_attribute:
            setattr(owner, method, original)
        else:
            delattr(owner, method)  # the class's method shows through again


# --- the plot --------------------------------------------------------------------------------


def write_plot(report: BenchReport, path: str | Path) -> Path:
    """Speedup and tokens per target call against K, with the theory overlaid, as a PNG.

    Raises:
        ImportError: matplotlib is not installed (``pip install trt-spec[bench]``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (speed_axis, calls_axis) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, temperature in enumerate(report.config.temperatures):
        rows = [r for r in report.rows if r["temperature"] == temperature and not r["adaptive"]]
        ks = [r["k"] for r in rows]
        color = colors[index % len(colors)]
        label = f"T={temperature:g}"
        speed_axis.plot(ks, [r["speedup"] for r in rows], "o-", color=color, label=f"{label} measured")
        speed_axis.plot(ks, [r["cost_model_speedup"] for r in rows], "--", color=color, label=f"{label} cost model")
        if all(r["hf_assisted_tokens_per_s"] and r.get("hf_plain_tokens_per_s") for r in rows):
            speed_axis.plot(
                ks, [r["hf_assisted_tokens_per_s"] / r["hf_plain_tokens_per_s"] for r in rows], "x:", color=color,
                label=f"{label} HF assisted (over HF plain)",
            )
        calls_axis.plot(ks, [r["tokens_per_target_call"] for r in rows], "o", color=color, label=f"{label} measured")
        calls_axis.plot(
            ks, [r["theoretical_tokens_per_target_call"] for r in rows], "-", color=color, alpha=0.6,
            label=f"{label} theory at each K's alpha",
        )
    speed_axis.axhline(1.0, color="grey", linewidth=0.8)
    speed_axis.set(xlabel="K (draft tokens)", ylabel="speedup over plain decoding", title="Wall-clock speedup")
    calls_axis.set(xlabel="K (draft tokens)", ylabel="tokens per target call", title="(1 - alpha^(K+1)) / (1 - alpha)")
    for axis in (speed_axis, calls_axis):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    figure.suptitle(f"trt-spec PyTorch twin ({report.runner} runner, {report.threads} threads)", fontsize=10)
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def _add_lists(left: list[int], right: list[int], width: int) -> list[int]:
    left = left + [0] * (width - len(left))
    right = right + [0] * (width - len(right))
    return [a + b for a, b in zip(left, right)]


@contextmanager
def _quiet_transformers():
    """transformers warns about generation flags on every call; the CLI's stderr is for progress."""
    from transformers.utils import logging

    previous = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(previous)
