"""In-process benchmark: speculative decoding on the PyTorch twin against plain decoding of the
target on the same engine and against Hugging Face assisted generation on the same models.

Every number of a report comes from one run: end-to-end tokens per second per configuration,
acceptance statistics, and the step times the cost model needs (t_1 and t_{K+1} of the target,
t_d of the draft, both models' prefill of a prompt). Requests are timed end to end (prefill included), every configuration once
per prompt and round in a rotating order, with a block of step timings after each round; all
figures are means over the whole run. A shared machine's speed drifts; interleaving makes every
configuration, and the cost model, see the same drift.

The K recommendation is Leviathan et al. 2023 (arXiv 2211.17192), Theorem 3.8: the K maximising
the expected walltime improvement (1 - alpha^(K+1)) / ((1 - alpha)(K c + 1)), c = t_d / t_1.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch

from trt_spec.bench.prompts import MAX_NEW_TOKENS, PROMPT_TOKENS, load_prompts
from trt_spec.bench.rows import AdaptiveRow, FixedRow, Progress, Tally
from trt_spec.runtime import methods
from trt_spec.runtime.costs import StepCosts, StepTimes, recommend_num_draft_tokens
from trt_spec.runtime.loop import GenerationParams, RequestStats
from trt_spec.runtime.methods.prompt_lookup import ngram_proposal
from trt_spec.runtime.parameters import MAX_DRAFT_TOKENS
from trt_spec.twin import TwinPair

DEFAULT_KS = (1, 2, 3, 4, 6, 8)
DEFAULT_TEMPERATURES = (0.0, 1.0)
QUICK_KS = (2, 4)
STEP_TIME_CALLS = 5  # timed calls (or speculative-step patterns) per shape after every round of requests

# A configuration of a run: "plain", "hf plain", (kind, K, method) with kind "spec" or "adaptive" and
# method a speculation method's name, or ("hf", K, "draft_target").
Configuration = str | tuple[str, int, str]


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
    # The user's prompts (token ids; bench/dataset.py) instead of the packaged ones.
    prompts: tuple[tuple[int, ...], ...] | None = None
    # Adaptive K's fixed costs and prior (a tuning report's); None: timed in the same run before the first request.
    step_costs: StepCosts | None = None
    # The speculation methods to put side by side (trt_spec.runtime.methods); () = the pair's own.
    methods: tuple[str, ...] = ()

    @classmethod
    def quick(cls) -> BenchConfig:
        return cls(ks=QUICK_KS, num_prompts=3)


@dataclass(frozen=True)
class Recommendation:
    method: str
    temperature: float
    alpha: float
    cost_ratio: float
    num_draft_tokens: int  # Theorem 3.8's optimum
    expected_speedup: float  # its walltime improvement factor
    cost_model_k: int | None  # the measured K with the best cost-model bound (t_(K+1) as measured)
    best_measured_k: int | None  # the fastest fixed K in this run


@dataclass
class BenchReport:
    rows: list[FixedRow | AdaptiveRow]
    step_times: StepTimes  # the first method's
    step_times_by_method: dict[str, StepTimes]
    recommendations: list[Recommendation]
    config: BenchConfig
    runner: str
    threads: int
    seconds: float


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
    pairs = method_pairs(pair, config.methods)
    if pair.draft is None and config.hf_assisted:
        config = replace(config, hf_assisted=False)  # assisted generation needs the draft model
    if config.prompts:
        prompts = [list(prompt) for prompt in config.prompts]
        shape = f"{len(prompts)} prompts of {min(map(len, prompts))}-{max(map(len, prompts))} tokens"
    else:
        prompts = load_prompts(pair, config.num_prompts, config.prompt_tokens)
        shape = f"{len(prompts)} prompts of {config.prompt_tokens} tokens"
    say(
        f"{shape}, {config.max_new_tokens} new tokens each; "
        f"K {list(config.ks)}, temperature {list(config.temperatures)}, {config.repeats} run(s) each"
    )
    # Step times are measured mid-generation: a prompt plus half a completion of context.
    half_completion = GenerationParams(max_new_tokens=config.max_new_tokens // 2, num_draft_tokens=0)
    contexts = [prompt + pair.generate(prompt, half_completion).run() for prompt in prompts]
    step_timer = _StepTimer(config.ks, pairs[next(iter(pairs))].lookup)
    # Adaptive K weighs acceptance against this machine's step costs: a tuning report's, else a
    # block of step timings taken now, before any request (the pair's parameter ratio and the fixed
    # CPU verify slope can be off by 2x on a given machine, and a draft that never agrees then
    # keeps drafting for several steps before K falls to 0).
    adaptive_costs: dict[str, StepCosts] = {}
    if config.adaptive:
        step_timer.measure(pair, prompts[0], contexts[0])
        largest = max(config.ks)
        for name, method_pair in pairs.items():
            costs = step_timer.result(method_pair.method).step_costs(largest)
            adaptive_costs[name] = config.step_costs or costs

    tallies_by_temperature = {
        temperature: _run_temperature(pairs, prompts, contexts, config, temperature, step_timer, say, adaptive_costs)
        for temperature in config.temperatures
    }
    times_by_method = {name: step_timer.result(methods.get(name)) for name in pairs}
    step_times = times_by_method[next(iter(pairs))]
    say(
        f"step times: target t_1 {step_times.target_1 * 1e3:.2f} ms, draft t_d {step_times.draft_1 * 1e3:.2f} ms "
        f"(c = {step_times.cost_ratio:.3f}), target t_(K+1) "
        + ", ".join(f"{n}: {t * 1e3:.2f}" for n, t in sorted(step_times.target_by_num_tokens.items()))
        + " ms"
    )

    rows: list[FixedRow | AdaptiveRow] = []
    recommendations: list[Recommendation] = []
    for temperature, tallies in tallies_by_temperature.items():
        baseline = tallies["plain"]
        for name in pairs:
            temperature_rows: list[FixedRow | AdaptiveRow] = [
                FixedRow.measure(
                    k,
                    temperature,
                    tallies[("spec", k, name)],
                    baseline,
                    times_by_method[name],
                    hf=tallies.get(("hf", k, name)),
                    hf_plain=tallies.get("hf plain") if ("hf", k, name) in tallies else None,
                    method=name,
                )
                for k in config.ks
            ]
            if config.adaptive:
                max_k = max(config.ks)
                temperature_rows.append(
                    AdaptiveRow.measure(max_k, temperature, tallies[("adaptive", max_k, name)], baseline, method=name)
                )
            rows += temperature_rows
            recommendations.append(
                _recommend(temperature, tallies, config, times_by_method[name], temperature_rows, name)
            )

    return BenchReport(
        rows=rows,
        step_times=step_times,
        step_times_by_method=times_by_method,
        recommendations=recommendations,
        config=config,
        runner=pair.target.runner_name,
        threads=torch.get_num_threads(),
        seconds=time.perf_counter() - started,
    )


class _StepTimer:
    """Times the engine calls the cost model needs, in blocks between rounds of requests, and
    averages them over the whole run: the machine conditions of the requests they are compared to."""

    def __init__(self, ks: Sequence[int], lookup: methods.LookupParams = methods.DEFAULT_LOOKUP):
        self.ks = tuple(ks)
        self.lookup = lookup
        self.seconds: dict[tuple[str, int], float] = {}
        self.calls: dict[tuple[str, int], int] = {}

    def measure(self, pair: TwinPair, prompt: list[int], context: list[int]) -> None:
        """One block of timings; a pair without a draft model times only the target and the lookup."""
        draft = pair.draft
        pair.target.reset()
        self._time(("target prefill", 0), pair.target.logits, prompt, 1)
        if draft is not None:
            draft.reset()
            self._time(("draft prefill", 0), draft.logits, prompt, 1)
        # Each call below recomputes exactly its last num_tokens positions: the cache holds the rest.
        pair.target.logits(context, 1)
        if draft is not None:
            draft.logits(context, 1)
        for _ in range(STEP_TIME_CALLS):
            self._time(("target", 1), pair.target.logits, context, 1)
        for k in self.ks:
            for _ in range(STEP_TIME_CALLS):
                if draft is not None:
                    for _ in range(k):
                        self._time(("draft", k), draft.logits, context, 1)
                self._time(("lookup", k), self._lookup, context, k)
                self._time(("target", k + 1), pair.target.logits, context, k + 1)

    def _lookup(self, context: list[int], num_draft_tokens: int) -> list[int]:
        return ngram_proposal(context, num_draft_tokens, self.lookup.min_ngram, self.lookup.max_ngram)

    def _time(
        self, key: tuple[str, int], logits: Callable[[list[int], int], object], context: list[int], num_tokens: int
    ) -> None:
        started = time.perf_counter()
        logits(context, num_tokens)
        self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - started
        self.calls[key] = self.calls.get(key, 0) + 1

    def result(self, method: methods.Method) -> StepTimes:
        """The step times of ``method``: t_d is the draft model's (hybrid's too: an upper bound on
        its mix of lookup and model steps), or the lookup's where the method has no draft model."""
        mean = {key: self.seconds[key] / self.calls[key] for key in self.seconds}
        drafter = "draft" if method.uses_draft_model else "lookup"
        return StepTimes(
            target_1=mean[("target", 1)],
            target_by_num_tokens={k + 1: mean[("target", k + 1)] for k in self.ks},
            draft_by_k={k: mean[(drafter, k)] for k in self.ks},
            target_prefill=mean[("target prefill", 0)],
            draft_prefill=mean[("draft prefill", 0)] if method.uses_draft_model else 0.0,
        )


def method_pairs(pair: TwinPair, names: Sequence[str]) -> dict[str, TwinPair]:
    """The pair drafting by each named method (the pair's own first when ``names`` is empty).

    Raises:
        ValueError: an unknown method, or one that needs a draft model the pair has not loaded.
    """
    chosen = list(dict.fromkeys(names)) or [pair.method.name]
    pairs = {}
    for name in chosen:
        method = methods.get(name)
        if method.uses_draft_model and pair.draft is None:
            raise ValueError(
                f"method {name} needs a draft model and the spec has none; compare it on a spec with a draft section"
            )
        pairs[name] = pair.with_method(method)
    return pairs


def _run_temperature(
    pairs: dict[str, TwinPair],
    prompts: list[list[int]],
    contexts: list[list[int]],
    config: BenchConfig,
    temperature: float,
    step_timer: _StepTimer,
    say: Progress,
    adaptive_costs: dict[str, StepCosts],
) -> dict[Configuration, Tally]:
    """Every configuration on every prompt, ``repeats`` times, in a rotating order, with a block
    of step timings after each round: slow drifts of a shared machine hit all of them alike."""
    configurations: list[Configuration] = ["plain"]
    for method in pairs:
        configurations += [("spec", k, method) for k in config.ks]
        if config.adaptive:
            configurations.append(("adaptive", max(config.ks), method))
    with_draft = [method for method, pair in pairs.items() if pair.method.uses_draft_model]
    if config.hf_assisted and with_draft:  # HF assisted generation with the draft model as assistant
        configurations += ["hf plain"] + [("hf", k, with_draft[0]) for k in config.ks]
    pair = next(iter(pairs.values()))
    tallies = {name: Tally() for name in configurations}
    for index, prompt in enumerate(prompts):
        seed = config.seed + index
        for repeat in range(config.repeats):
            shift = (index + repeat) % len(configurations)
            for name in configurations[shift:] + configurations[:shift]:
                runner = pairs[name[2]] if isinstance(name, tuple) else pair
                costs = adaptive_costs.get(name[2]) if isinstance(name, tuple) else None
                tallies[name].add(*_run_one(runner, prompt, name, temperature, config.max_new_tokens, seed, costs))
            step_timer.measure(pair, prompt, contexts[index])
        say(
            f"T={temperature:g} prompt {index + 1}/{len(prompts)} done; running tokens/s: "
            + ", ".join(f"{_label(name)} {tallies[name].tokens_per_s:.0f}" for name in configurations)
        )
    return tallies


def _label(name: Configuration) -> str:
    if isinstance(name, str):
        return name
    kind, k, method = name
    label = {"spec": f"K={k}", "adaptive": f"adaptive<={k}", "hf": f"hf K={k}"}[kind]
    return label if kind == "hf" else f"{method} {label}"


def _run_one(
    pair: TwinPair,
    prompt: list[int],
    name: Configuration,
    temperature: float,
    max_new_tokens: int,
    seed: int,
    step_costs: StepCosts | None = None,
) -> tuple[int, float, RequestStats | None]:
    """(tokens, seconds, stats or None) of one request."""
    kind, num_draft_tokens = (name, 0) if isinstance(name, str) else name[:2]
    if kind in ("hf plain", "hf"):
        k = None if kind == "hf plain" else num_draft_tokens
        tokens, seconds = hf_generate(pair, prompt, max_new_tokens, temperature, k, seed)
        return tokens, seconds, None
    params = GenerationParams(
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        num_draft_tokens=num_draft_tokens,
        adaptive_draft=kind == "adaptive",
        eos_token_ids=pair.eos_token_ids,
        step_costs=step_costs or pair.step_costs(),
    )
    pair.target.reset()
    if pair.draft is not None:
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

    With ``num_draft_tokens``, assisted generation with the draft as assistant, pinned to K drafts
    every step like the fixed-K runs it is compared with: ``num_assistant_tokens`` = K, schedule
    ``"constant"``, confidence threshold 0 (off).
    """
    # transformers models: generate() and generation_config are theirs, beyond torch.nn.Module's types
    target: Any = pair.target.model
    draft: Any = pair.draft_model.model
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


def _recommend(
    temperature: float,
    tallies: dict[Configuration, Tally],
    config: BenchConfig,
    step_times: StepTimes,
    rows: list[FixedRow | AdaptiveRow],
    method: str,
) -> Recommendation:
    """Theorem 3.8's K at the alpha pooled over all K of this temperature, and, since t_(K+1)
    is not t_1 on every machine, the K whose cost-model bound is best with t_(K+1) as measured."""
    accepted = sum(tallies[("spec", k, method)].stats.accepted_tokens for k in config.ks)
    rejections = sum(tallies[("spec", k, method)].stats.rejections for k in config.ks)
    alpha = accepted / (accepted + rejections) if accepted + rejections else 0.0
    k = recommend_num_draft_tokens(alpha, step_times.cost_ratio, MAX_DRAFT_TOKENS)
    fixed = [row for row in rows if not row.adaptive]
    return Recommendation(
        method=method,
        temperature=temperature,
        alpha=alpha,
        cost_ratio=step_times.cost_ratio,
        num_draft_tokens=k,
        expected_speedup=StepCosts(draft=step_times.cost_ratio, verify_slope=0.0).speedup(alpha, k),
        cost_model_k=max(config.ks, key=lambda k: step_times.speedup(alpha, k)),
        best_measured_k=max(fixed, key=lambda row: row.tokens_per_s).k if fixed else None,
    )


@contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers warns about generation flags on every call; the CLI's stderr is for progress."""
    from transformers.utils import logging

    previous = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(previous)
