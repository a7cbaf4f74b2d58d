"""Where one iteration of the in-process loop spends its time (``trt-spec bench --profile``).

The loop itself only times its two halves (a request's ``RequestStats.draft_seconds`` and
``verify_seconds``: the drafter's and the verifier's calls to the engine models, sampling
included). Splitting them further, into the models' forward passes, the engines' cache management
around them and the sampling and acceptance maths (with the engine models' handling of each
call), needs the time of every engine ``logits`` call and of every runner ``forward`` call, which
nothing records. :func:`profile_iterations` therefore wraps those methods of the pair's own
objects with timers (``_timed``) for the duration of the profile and restores them after,
leaving ``trt_spec/runtime/`` untouched: that package is copied into every model repository and
serves requests there, so it carries no profiling hooks, and the code profiled is the code that
serves.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from trt_spec.bench.prompts import MAX_NEW_TOKENS, PROMPT_TOKENS, load_prompts
from trt_spec.runtime.loop import GenerationParams
from trt_spec.twin import TwinPair

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
    pair: TwinPair,
    num_draft_tokens: int,
    temperature: float,
    num_prompts: int = 4,
    prompt_tokens: int = PROMPT_TOKENS,
    max_new_tokens: int = MAX_NEW_TOKENS,
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
    draft = pair.draft_model  # raises for a pair without one: this profile splits the draft's time
    with (
        _timed(draft.runner, "forward", timers, "draft forward"),
        _timed(pair.target.runner, "forward", timers, "target forward"),
        _timed(draft, "logits", timers, "engine calls"),
        _timed(pair.target, "logits", timers, "engine calls"),
    ):
        for index, prompt in enumerate(prompts):
            params = GenerationParams(
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                num_draft_tokens=num_draft_tokens,
                eos_token_ids=pair.eos_token_ids,
            )
            pair.target.logits(prompt, 1)  # prefill; the request then reuses the cached prompt
            draft.logits(prompt, 1)
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
def _timed(owner: object, method: str, timers: dict[str, float], key: str) -> Iterator[None]:
    """Accumulate the wall time of ``owner.method`` calls into ``timers[key]``; restore it after."""
    original = getattr(owner, method)

    def timed(*args: Any, **kwargs: Any) -> Any:
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
