"""The cost model of speculative decoding, the one the whole tool uses: pure arithmetic, standard
library only (the repository writer and the loop model import it without torch).

alpha is the per-position acceptance (accepted / (accepted + rejections)), K the draft length,
t_1 a one-token target call, t_{K+1} a (K + 1)-token target call, t_d a one-token draft call,
c = t_d / t_1 and r = t_{K+1} / t_1. A speculative step costs K t_d + t_{K+1} and yields
E(alpha, K) = 1 + alpha + ... + alpha^K tokens on average, so the speedup over plain decoding is

    E / (K c + r)                                                      (:func:`speedup`)

with an optional prefill term for whole requests. Leviathan et al. 2023 (arXiv 2211.17192),
Theorem 3.8, is the case r = 1.

Its feeds, by name:

- :class:`StepTimes`: seconds per call, *measured* on this machine (``bench``) or *projected* on
  the spec's GPU from bytes over bandwidth (``trt_spec.plan.projection``, ``plan``);
- :class:`StepCosts`: a deployment's *fixed* costs relative to t_1, what adaptive K weighs
  acceptance against (derived from step times, or from the two models' parameter counts).

Acceptance comes as one alpha (i.i.d. per position: the E above) or as an
:class:`AcceptanceProfile` measured on the user's prompts (``trt-spec tune``): the fraction of
steps whose first i drafts were all accepted, per position i, which gives E(K) without assuming
that acceptance is the same at every position (it falls with position: the draft's later guesses
condition on its own earlier ones).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from trt_spec.runtime.errors import GenerationParamsError


def expected_tokens_per_call(alpha: float, num_draft_tokens: int) -> float:
    """E = (1 - alpha^(K+1)) / (1 - alpha), written as the sum 1 + alpha + ... + alpha^K (no 0/0 at 1)."""
    return sum(alpha**power for power in range(num_draft_tokens + 1))


@dataclass(frozen=True)
class AcceptanceProfile:
    """Acceptance measured per draft position: ``accepted_through[i - 1]`` = the fraction of the
    steps that drafted position i whose drafts 1..i were all accepted (vLLM's per-position
    acceptance; :attr:`trt_spec.runtime.loop.RequestStats.acceptance_by_position`), measured at K =
    len(accepted_through) drafts per step. ``alpha`` is the same run's per-position acceptance
    accepted / (accepted + rejections), for what wants one number.

    Raises:
        ValueError: an empty profile, a fraction outside [0, 1], or one above the position before
            it (all of 1..i accepted is never likelier than all of 1..i-1).
    """

    accepted_through: tuple[float, ...]
    alpha: float

    def __post_init__(self) -> None:
        values = self.accepted_through
        if not values:
            raise ValueError("an acceptance profile needs at least one position")
        if not all(0 <= value <= 1 for value in (*values, self.alpha)):
            raise ValueError(f"acceptance fractions must be in [0, 1]; got {list(values)}, alpha {self.alpha}")
        if any(later > earlier + 1e-9 for earlier, later in zip(values, values[1:])):
            raise ValueError(f"acceptance through position i cannot exceed that through i - 1; got {list(values)}")

    @classmethod
    def measured(cls, accepted_through: Sequence[float], alpha: float) -> AcceptanceProfile:
        """From a run's per-position fractions, made monotone (a later position's fraction over
        fewer steps, near the end of a generation, can come out a hair above the one before)."""
        monotone: list[float] = []
        for value in accepted_through:
            monotone.append(min(value, monotone[-1]) if monotone else value)
        return cls(tuple(monotone), alpha)

    @property
    def max_k(self) -> int:
        return len(self.accepted_through)

    def tokens_per_call(self, num_draft_tokens: int) -> float:
        """E(K) = 1 + the sum over positions 1..K of the fraction accepted through each: the
        expected tokens of a step of K drafts (the target's own token, plus each accepted draft).

        Raises:
            ValueError: K above the K the profile was measured at.
        """
        if num_draft_tokens > self.max_k:
            raise ValueError(f"the acceptance profile was measured up to K = {self.max_k}; got K = {num_draft_tokens}")
        return 1 + sum(self.accepted_through[:num_draft_tokens])


Acceptance = float | AcceptanceProfile  # one i.i.d. alpha, or a measured profile


def tokens_per_call(acceptance: Acceptance, num_draft_tokens: int) -> float:
    """E at K from either kind of acceptance."""
    if isinstance(acceptance, AcceptanceProfile):
        return acceptance.tokens_per_call(num_draft_tokens)
    return expected_tokens_per_call(acceptance, num_draft_tokens)


def alpha_of(acceptance: Acceptance) -> float:
    """The one-number acceptance: alpha itself, or a profile's measured alpha."""
    return acceptance.alpha if isinstance(acceptance, AcceptanceProfile) else acceptance


def speedup(
    num_draft_tokens: int,
    draft: float,
    verify: float,
    tokens_per_call: float,
    *,
    requests_per_call: float = 0.0,
    target_prefill: float = 0.0,
    draft_prefill: float = 0.0,
) -> float:
    """The speedup over plain decoding of K drafts per target call, all costs relative to t_1:
    ``draft`` = t_d / t_1, ``verify`` = t_{K+1} / t_1, ``tokens_per_call`` = E.

    Without the prefill term (``requests_per_call`` 0) it is E / (K c + r). With it, per target call
    a fraction ``requests_per_call`` = R / C of the calls starts a request, which prefills its
    prompt (``target_prefill`` = P_t / t_1, ``draft_prefill`` = P_d / t_1):

        plain = R P_t + (N - R) t_1              (the first token comes with the prefill)
        spec  = R (P_t + P_d) + R (K - 1) t_d + (C - R)(K t_d + t_{K+1})

    (a request's first step drafts after the draft's prefill and verifies within the target's),
    divided through by C t_1, with N = E C."""
    k, share = num_draft_tokens, requests_per_call
    plain = share * target_prefill + (tokens_per_call - share)
    spec = share * (target_prefill + draft_prefill + (k - 1) * draft) + (1 - share) * (k * draft + verify)
    return plain / spec


@dataclass(frozen=True)
class StepCosts:
    """A deployment's step costs relative to one target step t_1, fixed for the deployment: what
    adaptive K weighs acceptance against. ``draft`` = t_d / t_1; ``verify_slope`` = what each
    verified position adds, (t_{K+1} - t_1) / (K t_1): near 0 on a GPU (a decode step is
    memory-bound), and about as small for the PyTorch twin on a CPU (measured: ``CPU_VERIFY_SLOPE``).

    Fixed rather than measured per request on purpose: K chosen from step times measured under
    load would run other K sequences, so other verification widths, and in floating point a
    near-tie between the target's two best tokens could then come out differently. With fixed
    costs, K depends on the tokens alone, so one request always gives the same tokens.

    ``prior_alpha``: the acceptance adaptive K starts each request from, measured on the user's
    prompts (``trt-spec tune``); ``None``: an uninformed start (0.5, weighed as two decisions).
    ``prior_profile``: the same run's acceptance per draft position (``AcceptanceProfile``'s
    ``accepted_through``); with it, E(K) at a request's running acceptance is the profile's shape
    tilted to it (:meth:`tokens_per_call`) rather than the i.i.d. 1 + alpha + ... + alpha^K.

    Raises:
        GenerationParamsError: a cost that is negative or not finite, or a profile without a prior
            or not a valid profile.
    """

    draft: float
    verify_slope: float
    prior_alpha: float | None = None
    prior_profile: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not (0 <= self.draft < float("inf") and 0 <= self.verify_slope < float("inf")):
            raise GenerationParamsError(
                f"step costs must be finite and >= 0; got draft {self.draft}, verify_slope {self.verify_slope}"
            )
        if self.prior_alpha is not None and not 0 <= self.prior_alpha <= 1:
            raise GenerationParamsError(f"prior_alpha must be in [0, 1]; got {self.prior_alpha}")
        if self.prior_profile:
            if not self.prior_alpha:
                raise GenerationParamsError("prior_profile needs the prior_alpha it was measured with (above 0)")
            try:
                AcceptanceProfile(self.prior_profile, self.prior_alpha)
            except ValueError as exc:
                raise GenerationParamsError(f"prior_profile: {exc}") from None

    @classmethod
    def from_parameters(cls, draft_params: float, target_params: float, verify_slope: float) -> StepCosts:
        """t_d / t_1 as the draft's streamed parameters over the target's (a decode step reads every
        weight once; embeddings left out: a step reads only its tokens' rows)."""
        return cls(draft=draft_params / target_params, verify_slope=verify_slope)

    def tokens_per_call(self, alpha: float, num_draft_tokens: int) -> float:
        """E at K for a request whose running acceptance is ``alpha``. With a measured profile: each
        position's conditional acceptance (accepted through i over through i - 1; past the profile,
        its last) times alpha / ``prior_alpha``, at most 1, so at the prior E is the profile's own
        E(K); on code the draft's later guesses hold better than alpha^i says (a run of tokens is
        either guessed or not), which the i.i.d. form misses. Without: 1 + alpha + ... + alpha^K."""
        if not self.prior_profile or not self.prior_alpha:
            return expected_tokens_per_call(alpha, num_draft_tokens)
        tilt = alpha / self.prior_alpha
        through = (1.0, *self.prior_profile)
        total = running = 1.0
        for position in range(1, num_draft_tokens + 1):
            index = min(position, len(through) - 1)
            conditional = through[index] / through[index - 1] if through[index - 1] else 0.0
            running *= min(1.0, conditional * tilt)
            total += running
        return total

    def speedup(self, alpha: float, num_draft_tokens: int) -> float:
        """:func:`speedup` of K drafts at acceptance alpha, with r = 1 + K x ``verify_slope``."""
        k = num_draft_tokens
        return speedup(k, self.draft, 1 + k * self.verify_slope, self.tokens_per_call(alpha, k))


# The PyTorch twin on a CPU with its oneDNN projections (torch_engine._Linear; bench --local, wide
# demo pair, 2 threads: t_5 = 1.03 t_1, t_7 = 1.12 t_1, so each verified position adds ~0.02 t_1;
# on MKL's kernels it was ~0.3). t_d / t_1 measured 0.10-0.12 there, its parameter ratio 0.046.
CPU_VERIFY_SLOPE = 0.02
DEFAULT_STEP_COSTS = StepCosts(draft=0.1, verify_slope=CPU_VERIFY_SLOPE)


@dataclass
class StepTimes:
    """Seconds per forward pass. Measured (``bench``): at a context of prompt + max_new_tokens / 2
    tokens, in the access pattern of the decoding they model: t_1 in a run of target calls (plain
    decoding), t_d and t_{K+1} in rounds of K draft calls then one target call (one speculative
    step), so the CPU-cache cost of alternating two models is part of the step times and what the
    cost model leaves out is the loop's own overhead. Projected (``plan``): the roofline of each
    step on the spec's GPU."""

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
        """c = t_d / t_1 (t_d averaged over the K measured)."""
        return self.draft_1 / self.target_1

    def draft_ratio(self, num_draft_tokens: int) -> float:
        """c at K: t_d (as timed in rounds of K drafts) / t_1."""
        return self.draft_at(num_draft_tokens) / self.target_1

    def verify_ratio(self, num_draft_tokens: int) -> float:
        """r = t_{K+1} / t_1."""
        return self.target_by_num_tokens[num_draft_tokens + 1] / self.target_1

    def step_costs(self, num_draft_tokens: int) -> StepCosts:
        """Adaptive K's fixed costs from these times: c averaged over K, and the verify slope at K."""
        k = num_draft_tokens
        slope = (self.target_by_num_tokens[k + 1] - self.target_1) / (k * self.target_1)
        return StepCosts(draft=self.cost_ratio, verify_slope=max(0.0, slope))

    def speedup(self, acceptance: Acceptance, num_draft_tokens: int) -> float:
        """:func:`speedup` fed these times at ``acceptance`` (an i.i.d. alpha or a measured profile):
        E t_1 / (K t_d + t_{K+1}), the speedup over plain decoding if the loop cost nothing."""
        k = num_draft_tokens
        return speedup(k, self.draft_ratio(k), self.verify_ratio(k), tokens_per_call(acceptance, k))

    def run_speedup(self, num_draft_tokens: int, tokens: int, target_calls: int, requests: int) -> float:
        """:func:`speedup` fed one run's own counts: ``tokens`` generated in ``target_calls`` by
        ``requests`` requests, each prefilling its prompt (what ``bench`` times, end to end); what the
        run would have shown had the loop cost nothing besides its engine calls. Its tokens per target
        call are the run's, not alpha's i.i.d. theory."""
        k = num_draft_tokens
        return speedup(
            k,
            self.draft_ratio(k),
            self.verify_ratio(k),
            tokens / target_calls,
            requests_per_call=requests / target_calls,
            target_prefill=self.target_prefill / self.target_1,
            draft_prefill=self.draft_prefill / self.target_1,
        )


@dataclass(frozen=True)
class CostModelRow:
    """The cost model at one K (ratios are of seconds, so unitless)."""

    k: int
    tokens_per_target_call: float  # E: (1 - alpha^(K+1)) / (1 - alpha), or from a measured profile
    draft_cost_ratio: float  # c = t_d / t_1
    verify_cost_ratio: float  # r = t_(K+1) / t_1
    speedup: float  # E / (K c + r), over plain decoding


def cost_model_rows(acceptance: Acceptance, step_times: StepTimes, ks: Iterable[int]) -> list[CostModelRow]:
    """:meth:`StepTimes.speedup` and its parts for each K in ``ks`` (each needs its t_(K+1))."""
    return [
        CostModelRow(
            k=k,
            tokens_per_target_call=tokens_per_call(acceptance, k),
            draft_cost_ratio=step_times.draft_ratio(k),
            verify_cost_ratio=step_times.verify_ratio(k),
            speedup=step_times.speedup(acceptance, k),
        )
        for k in ks
    ]


def best_row(rows: Iterable[CostModelRow]) -> CostModelRow:
    """The row with the largest speedup; the smallest such K on a tie."""
    return max(sorted(rows, key=lambda row: row.k), key=lambda row: row.speedup)


def recommend_num_draft_tokens(alpha: float, cost_ratio: float, max_k: int) -> int:
    """The K in 1..max_k with the largest :func:`speedup` at r = 1 (Leviathan et al., Theorem 3.8)."""
    costs = StepCosts(draft=cost_ratio, verify_slope=0.0)
    return max(range(1, max_k + 1), key=lambda k: costs.speedup(alpha, k))
