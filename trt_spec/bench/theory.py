"""The theory a benchmark is compared with: pure formulas, no measuring.

alpha is the per-position acceptance (accepted / (accepted + rejections)), K the draft length,
t_1 a one-token target call, t_{K+1} a (K + 1)-token target call, t_d a one-token draft call and
c = t_d / t_1. The K recommendation is Leviathan et al. 2023 (arXiv 2211.17192), Theorem 3.8.

The cost model is one, with two feeds: step times measured on this machine (``bench``), or
projected from bytes over bandwidth on the spec's GPU (``trt_spec.projection``, ``plan``). With
r = t_{K+1} / t_1 its speedup E * t_1 / (K t_d + t_{K+1}) is E / (1 + K c + (r - 1)).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from trt_spec.runtime.costs import expected_tokens_per_call
from trt_spec.runtime.loop import RequestStats
from trt_spec.runtime.parameters import MAX_DRAFT_TOKENS


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
    target_prefill: float = 0.0  # a prompt's first target call (bench: its packaged prompts)
    draft_prefill: float = 0.0  # the same prompt's first draft call

    @property
    def draft_1(self) -> float:
        """t_d averaged over the K measured."""
        return sum(self.draft_by_k.values()) / len(self.draft_by_k)

    def draft_at(self, num_draft_tokens: int) -> float:
        """t_d as measured in rounds of K drafts, or the mean over the K measured."""
        return self.draft_by_k.get(num_draft_tokens, self.draft_1)

    @property
    def cost_ratio(self) -> float:
        """c = t_d / t_1."""
        return self.draft_1 / self.target_1


def theoretical_tokens_per_call(alpha: float, num_draft_tokens: int) -> float:
    """(1 - alpha^(K+1)) / (1 - alpha): expected tokens per target call at i.i.d. acceptance alpha."""
    return expected_tokens_per_call(alpha, num_draft_tokens)


def theoretical_tokens_per_call_at_drafted(alpha: float, stats: RequestStats) -> float:
    """The theory for the draft lengths a run actually used: the mean over its steps of
    1 + alpha + ... + alpha^k_step. The last steps of a request draft fewer than K (never past
    max_new_tokens), which the fixed-K formula does not know."""
    if not stats.target_calls:
        return 0.0
    # sum over steps of sum_{j=1..k} alpha^j = sum over positions j of (steps drafting >= j) alpha^j
    drafted_terms = sum(count * alpha ** (position + 1) for position, count in enumerate(stats.drafted_by_position))
    return (stats.target_calls + drafted_terms) / stats.target_calls


def cost_model_speedup(alpha: float, num_draft_tokens: int, step_times: StepTimes) -> float:
    """E * t_1 / (K * t_d + t_{K+1}): the speedup over plain decoding if the loop cost nothing."""
    expected = theoretical_tokens_per_call(alpha, num_draft_tokens)
    t_draft = step_times.draft_at(num_draft_tokens)
    step = num_draft_tokens * t_draft + step_times.target_by_num_tokens[num_draft_tokens + 1]
    return expected * step_times.target_1 / step


def run_cost_model_speedup(k: int, step_times: StepTimes, tokens: int, target_calls: int, requests: int) -> float:
    """The cost model fed one run's own counts: what plain decoding of ``tokens`` tokens costs in
    target calls over what the speculative run's ``target_calls`` cost in draft and target calls,
    each of the ``requests`` prefilling its prompt (what ``bench`` times, end to end), i.e. the
    speedup the run would have shown had the loop cost nothing besides its engine calls. Its tokens
    per target call are the run's, not alpha's i.i.d. theory (the theory column compares those).

    plain = R P_t + (N - R) t_1 (the first token comes with the prefill);
    spec  = R (P_t + P_d) + R (K - 1) t_d + (C - R)(K t_d + t_{K+1}) (a request's first step drafts
    after the draft's prefill and verifies within the target's).
    """
    t_draft = step_times.draft_at(k)
    prefill = requests * step_times.target_prefill
    plain = prefill + (tokens - requests) * step_times.target_1
    spec = (
        prefill
        + requests * (step_times.draft_prefill + (k - 1) * t_draft)
        + (target_calls - requests) * (k * t_draft + step_times.target_by_num_tokens[k + 1])
    )
    return plain / spec


def walltime_improvement(alpha: float, num_draft_tokens: int, cost_ratio: float) -> float:
    """Leviathan et al. Theorem 3.8: (1 - alpha^(K+1)) / ((1 - alpha)(K c + 1))."""
    return theoretical_tokens_per_call(alpha, num_draft_tokens) / (num_draft_tokens * cost_ratio + 1)


def recommend_num_draft_tokens(alpha: float, cost_ratio: float, max_k: int = MAX_DRAFT_TOKENS) -> int:
    """The K in 1..max_k that maximises :func:`walltime_improvement`."""
    return max(range(1, max_k + 1), key=lambda k: walltime_improvement(alpha, k, cost_ratio))


@dataclass(frozen=True)
class CostModelRow:
    """The cost model at one K (ratios are of seconds, so unitless)."""

    k: int
    tokens_per_target_call: float  # E = (1 - alpha^(K+1)) / (1 - alpha)
    draft_cost_ratio: float  # c = t_d / t_1
    verify_cost_ratio: float  # r = t_(K+1) / t_1
    speedup: float  # E / (K c + r), over plain decoding


def cost_model_rows(alpha: float, step_times: StepTimes, ks: Iterable[int]) -> list[CostModelRow]:
    """:func:`cost_model_speedup` and its parts for each K in ``ks`` (each needs its t_(K+1))."""
    rows = []
    for k in ks:
        t_draft = step_times.draft_at(k)
        rows.append(
            CostModelRow(
                k=k,
                tokens_per_target_call=theoretical_tokens_per_call(alpha, k),
                draft_cost_ratio=t_draft / step_times.target_1,
                verify_cost_ratio=step_times.target_by_num_tokens[k + 1] / step_times.target_1,
                speedup=cost_model_speedup(alpha, k, step_times),
            )
        )
    return rows


def best_row(rows: Iterable[CostModelRow]) -> CostModelRow:
    """The row with the largest speedup; the smallest such K on a tie."""
    return max(sorted(rows, key=lambda row: row.k), key=lambda row: row.speedup)
