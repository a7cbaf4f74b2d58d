"""The draft -> verify loop, written once against a small protocol.

A :class:`Drafter` proposes draft tokens; a :class:`Verifier` returns the tokens a step emits
(vocabulary in :mod:`trt_spec.runtime.sampling`). The loop owns everything around them:
stopping at ``max_new_tokens``, EOS or a stop sequence even inside a draft window, the draft
length per step (fixed, or adaptive), and the per-request statistics.

That logic is one sans-I/O object, :class:`LoopState`, driven two ways: :class:`Generation`
iterates it synchronously over an in-process drafter and verifier (the PyTorch twin,
:mod:`trt_spec.twin`, calling the torch flavor's engine models directly); the Triton loop model
(:mod:`trt_spec.runtime.bls`) awaits the two engine models instead. Both sides receive the whole
committed sequence on every call, as TensorRT-LLM's engines do (with KV-cache reuse they
recompute only what they have not seen); in Triton the verifier is the target engine doing the
acceptance itself (``draft_input_ids`` in, accepted tokens plus one out).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from trt_spec.runtime.costs import DEFAULT_STEP_COSTS, StepCosts, expected_tokens_per_call  # noqa: F401 - part of this API
from trt_spec.runtime.errors import GenerationParamsError
from trt_spec.runtime.methods import DRAFT_MODEL
from trt_spec.runtime.parameters import MAX_DRAFT_TOKENS
from trt_spec.runtime.sampling import NO_TOP_K, NO_TOP_P, SamplingParams

PLAIN_DECODING = 0  # num_draft_tokens = 0: the target alone, one token per call


@dataclass(frozen=True)
class Draft:
    """What a drafter proposes for one step.

    ``tokens`` ``[k]``; ``probs`` ``[k, V]`` the processed distributions they were drawn from
    (``None`` when greedy, or when the drafter does not give them: a sampled step then verifies by
    token matching, :func:`~trt_spec.runtime.sampling.verify_drafts`).
    """

    tokens: list[int]
    probs: torch.Tensor | None = None
    source: str = ""  # where the drafts came from (methods.SOURCES); "" = the draft model


NO_DRAFT = Draft(tokens=[])


class Drafter(Protocol):
    def propose(
        self,
        sequence: Sequence[int],
        num_draft_tokens: int,
        sampling: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        """Up to ``num_draft_tokens`` (>= 1) tokens continuing ``sequence``."""


class Verifier(Protocol):
    def verify(
        self,
        sequence: Sequence[int],
        draft: Draft,
        sampling: SamplingParams,
        generator: torch.Generator | None,
    ) -> list[int]:
        """One target call: the accepted prefix of ``draft.tokens``, then one recovered or bonus
        token (1..k+1 tokens). An empty draft is plain decoding: one token from the target."""


@dataclass(frozen=True)
class GenerationParams:
    """One request's parameters.

    ``num_draft_tokens`` is K (0 = plain target decoding); with ``adaptive_draft`` it is the
    largest K the loop may choose. EOS ends generation and is not emitted; a stop sequence ends
    it and is emitted (as TensorRT-LLM does with ``end_id`` and ``stop_words``).

    Raises:
        GenerationParamsError: a value out of range.
    """

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = NO_TOP_K
    top_p: float = NO_TOP_P
    num_draft_tokens: int = 4
    adaptive_draft: bool = False
    eos_token_ids: frozenset[int] = frozenset()
    stop_sequences: tuple[tuple[int, ...], ...] = ()
    step_costs: StepCosts | None = None  # adaptive K's fixed costs; None: DEFAULT_STEP_COSTS

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise GenerationParamsError(f"max_new_tokens must be >= 1; got {self.max_new_tokens}")
        if not PLAIN_DECODING <= self.num_draft_tokens <= MAX_DRAFT_TOKENS:
            raise GenerationParamsError(
                f"num_draft_tokens must be in 0..{MAX_DRAFT_TOKENS} (0 = plain target decoding); "
                f"got {self.num_draft_tokens}"
            )
        if self.adaptive_draft and self.num_draft_tokens == PLAIN_DECODING:
            raise GenerationParamsError("adaptive_draft needs num_draft_tokens >= 1 (its largest K)")
        if any(len(stop) == 0 for stop in self.stop_sequences):
            raise GenerationParamsError("a stop sequence is empty")
        SamplingParams(self.temperature, self.top_k, self.top_p)  # raises on a bad value

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p)


@dataclass
class RequestStats:
    """Running totals of one request, complete after every step.

    *drafted* counts proposed tokens, *accepted* the drafts the target kept, *rejections* the steps
    that ended on a recovered token. ``acceptance_rate`` is TensorRT-LLM's accepted / drafted;
    ``alpha`` the per-position acceptance accepted / (accepted + rejections), which is what
    (1 - alpha^(K+1)) / (1 - alpha) expects. Prefill is not a target call.
    """

    iterations: int = 0
    target_calls: int = 0
    emitted_tokens: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    rejections: int = 0
    drafted_by_position: list[int] = field(default_factory=list)  # [K_max]
    accepted_by_position: list[int] = field(default_factory=list)  # [K_max]
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    # By where the drafts came from (methods.SOURCES: the draft model, prompt lookup)
    drafted_by_source: dict[str, int] = field(default_factory=dict)
    accepted_by_source: dict[str, int] = field(default_factory=dict)
    steps_by_source: dict[str, int] = field(default_factory=dict)  # steps that drafted, by source

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def alpha(self) -> float:
        decided = self.accepted_tokens + self.rejections
        return self.accepted_tokens / decided if decided else 0.0

    @property
    def tokens_per_target_call(self) -> float:
        return self.emitted_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        """Per draft position i: the fraction of steps that proposed draft i and had it accepted
        (which needs every draft before it accepted too), as vLLM reports it."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted_by_position, self.drafted_by_position)]

    def record(
        self, num_drafted: int, num_accepted: int, draft_seconds: float, verify_seconds: float, source: str = ""
    ) -> None:
        self.iterations += 1
        if num_drafted:
            source = source or DRAFT_MODEL
            self.drafted_by_source[source] = self.drafted_by_source.get(source, 0) + num_drafted
            self.accepted_by_source[source] = self.accepted_by_source.get(source, 0) + num_accepted
            self.steps_by_source[source] = self.steps_by_source.get(source, 0) + 1
        self.target_calls += 1
        self.drafted_tokens += num_drafted
        self.accepted_tokens += num_accepted
        self.rejections += num_accepted < num_drafted
        grow = num_drafted - len(self.drafted_by_position)
        if grow > 0:
            self.drafted_by_position += [0] * grow
            self.accepted_by_position += [0] * grow
        for position in range(num_drafted):
            self.drafted_by_position[position] += 1
        for position in range(num_accepted):
            self.accepted_by_position[position] += 1
        self.draft_seconds += draft_seconds
        self.verify_seconds += verify_seconds


class AdaptiveDraftLength:
    """Chooses K each step to maximise expected tokens per second at the running acceptance.

    Tokens per second of K is E(alpha, K) / (K t_d + t_{K+1}) (Leviathan et al. 2023, section
    3.4; E from the measured profile where the costs carry one, :meth:`StepCosts.tokens_per_call`),
    with the deployment's fixed :class:`StepCosts`; alpha is an exponential moving average
    of this request's accept/reject decisions, so K follows the local acceptance rate and depends
    on the tokens alone.

    K 0 (plain decoding, speedup 1 by definition) is a choice too: where no K is expected to beat
    plain decoding (a draft that never agrees, a high temperature) the request stops paying for
    drafts. Without drafts alpha is not observed, so the request then *probes*: one step of K 1 (the
    cheapest observation) after :data:`PROBE_EVERY` plain steps, and again at once after a probe
    that was accepted, so that a request whose text turned predictable is back to speculating within a
    few steps. Each rejected probe doubles the wait before the next, up to :data:`PROBE_EVERY_MAX`,
    so one that stays unpredictable pays a probe's extra cost (t_d, what one more verified position
    adds, and the draft catching up on the tokens it skipped, relative to a target step) on one step
    in PROBE_EVERY_MAX + 1 once it has failed a few.
    """

    SMOOTHING = 0.9  # weight of the past in the moving average (~10 steps of memory)
    PRIOR_DECISIONS = 2.0  # uninformed: alpha starts as 1 accepted + 1 rejected pseudo-observation
    # Informed (costs.prior_alpha, measured on the user's prompts): the prior weighs what the
    # moving average holds in steady state, as if the request had already run that long at it.
    MEASURED_PRIOR_DECISIONS = 1 / (1 - SMOOTHING)
    # With the measured profile too (costs.prior_profile): a longer memory and a heavier prior, so
    # that a few rejections do not move K off the profile's best. Chosen by measurement (wide pair,
    # bench --local, docs/measurements.md): the profile with 0.9 and 10 or 40 decisions, or 0.95 and
    # 20, chose K as the i.i.d. form does (2.61 tokens per target call); 0.95 and 40, 2.88.
    PROFILE_SMOOTHING = 0.95
    PROFILE_PRIOR_DECISIONS = 40.0
    # Plain steps before a probe: PROBE_EVERY after drafting stopped, doubling after each rejected
    # probe up to PROBE_EVERY_MAX. A probe costs the draft step, one verified position and the
    # draft's catch-up over the skipped tokens: ~0.4 of a target step on the wide pair's twin
    # (t_d 0.15 t_1, verify slope 0.12 t_1; docs/measurements.md). A fixed 16 measured x0.89-0.95
    # of plain decoding with a draft that never agrees (96-token requests, 2-core VM); the backoff
    # keeps a collapsed request at 0.4 / 65 < 1% once it has failed three probes, and a request
    # whose text turns predictable is noticed within 64 tokens (16 at first).
    PROBE_EVERY = 16
    PROBE_EVERY_MAX = 64
    PROBE_K = 1

    def __init__(self, max_draft_tokens: int, costs: StepCosts = DEFAULT_STEP_COSTS):
        self.max_draft_tokens = max_draft_tokens
        self.costs = costs
        self.smoothing = self.PROFILE_SMOOTHING if costs.prior_profile else self.SMOOTHING
        if costs.prior_alpha is None:
            self._accepted, self._decided = self.PRIOR_DECISIONS / 2, self.PRIOR_DECISIONS
        else:
            self._decided = self.PROFILE_PRIOR_DECISIONS if costs.prior_profile else self.MEASURED_PRIOR_DECISIONS
            self._accepted = costs.prior_alpha * self._decided
        self._plain_steps = 0  # plain steps chosen since the last step with drafts
        self._probe_accepted = False  # the last step with drafts was a probe that was accepted
        self._probe_wait = self.PROBE_EVERY  # plain steps before the next probe
        self._probing = False  # the step chosen last is a probe

    @property
    def alpha(self) -> float:
        return self._accepted / self._decided

    def next_num_draft_tokens(self) -> int:
        alpha = self.alpha
        best = max(range(1, self.max_draft_tokens + 1), key=lambda k: self.costs.speedup(alpha, k))
        self._probing = False
        if self.costs.speedup(alpha, best) > 1.0:
            self._plain_steps = 0
            self._probe_wait = self.PROBE_EVERY
            return best
        if self._probe_accepted or self._plain_steps >= self._probe_wait:
            self._plain_steps = 0
            self._probing = True
            return self.PROBE_K
        self._plain_steps += 1
        return PLAIN_DECODING

    def update(self, num_drafted: int, num_accepted: int) -> None:
        self._probe_accepted = num_drafted == self.PROBE_K and num_accepted == num_drafted
        if self._probing and num_drafted:
            accepted = num_accepted == num_drafted
            self._probe_wait = self.PROBE_EVERY if accepted else min(2 * self._probe_wait, self.PROBE_EVERY_MAX)
        decay = self.smoothing
        self._accepted = decay * self._accepted + num_accepted
        self._decided = decay * self._decided + num_accepted + (num_accepted < num_drafted)


def call_seed(request_seed: int, call_index: int) -> int:
    """The seed of one engine call of a request: distinct per call, reproducible per request.

    Reusing one seed for every call would correlate the uniforms of successive steps (the same
    draws decide every step's acceptance), which breaks exactness; hashing (seed, call index)
    makes the calls' random streams independent. Below 2**63, so any int64 or uint64 takes it.
    """
    digest = hashlib.blake2b(f"{request_seed}:{call_index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


PREFIX_CHECK_TAIL = 64  # tokens compared one by one; a rejection changes only the last K + 1


def common_prefix_length(left: Sequence[int], right: Sequence[int]) -> int:
    """How many leading tokens two sequences share.

    Sequences compared here (a cache against a request, drafts against an answer) usually differ
    only in their last few tokens, so the head is compared in one slice comparison and only the
    tail token by token (5-7x faster on thousands of tokens).
    """
    limit = min(len(left), len(right))
    start = max(0, limit - PREFIX_CHECK_TAIL)
    if list(left[:start]) != list(right[:start]):
        start = 0  # a different sequence altogether
    index = start
    while index < limit and left[index] == right[index]:
        index += 1
    return index


class LoopState:
    """The loop's logic for one request, without I/O: what to ask for next, what an answer commits.

    A driver repeats: ``k = state.next_num_draft_tokens()``; draft ``k`` tokens continuing
    ``state.sequence`` (skip when 0); have the target verify them; ``state.commit(...)``; until
    ``state.finished``. :class:`Generation` drives it synchronously in-process; the Triton loop
    model (``trt_spec.runtime.bls``) drives it with async calls to the engine models.

    The target's answer to ``k`` drafts is taken in TensorRT-LLM's form: the accepted drafts
    then one *or more* tokens of the target's own (its external-draft-tokens mode returns up to
    ``request_output_len`` tokens). The number accepted is the longest common prefix of answer
    and drafts, within the drafts the target verified; that is exact also for rejection sampling,
    since a recovered token never equals the draft it replaces (the residual has no mass there).
    An answer with no token of its own after the accepted drafts means the target ended the
    sequence (TensorRT-LLM leaves ``end_id`` out of its output): the request finishes with
    ``"eos"``.

    The target may verify fewer drafts than it was sent: TensorRT-LLM's scheduler discards the
    tail of a request's drafts that does not fit its step (``fitDraftTokens``, with chunked
    context), and ``LlmRequest::validate`` those past ``max_input_len``. Then an answer made only
    of drafts is ambiguous: after j verified drafts, all accepted, the target's own token may
    equal the discarded draft j. So the driver passes ``num_verified``, the drafts the target
    reports it verified (its ``total_draft_tokens``), and only an answer with no token past them
    is an end of sequence. ``None``: all of them (an engine that never discards drafts). A
    target left with none decodes as a plain request up to the ``len(drafts) + 1`` tokens the
    loop asks for, so there an answer shorter than that is the end of the sequence; the same holds
    for a step sent without drafts, which may ask for several tokens (``plain_len``: plain
    decoding in one call, as the loop model does for requests that need no step-by-step answer).

    Attributes: ``sequence`` (prompt + output, what both models condition on), ``output``,
    ``stats`` (:class:`RequestStats`), ``finish_reason`` (``"length"``, ``"eos"``, ``"stop"``,
    or ``None`` while running).

    Raises (constructor):
        GenerationParamsError: the prompt is empty.
    """

    def __init__(self, prompt: Sequence[int], params: GenerationParams):
        if len(prompt) == 0:
            raise GenerationParamsError("the prompt is empty; speculative decoding continues a prefix")
        self.prompt = list(prompt)
        self.params = params
        self.sequence: list[int] = list(prompt)
        self.output: list[int] = []
        self.stats = RequestStats()
        self.finish_reason: str | None = None
        costs = params.step_costs or DEFAULT_STEP_COSTS
        self._adaptive = AdaptiveDraftLength(params.num_draft_tokens, costs) if params.adaptive_draft else None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def next_num_draft_tokens(self, cap: int | None = None) -> int:
        """K for the next step (0 = a plain target call): the fixed or adaptive choice, at most
        ``cap`` (the loop model's K schedule under load; ``None``: no cap), clamped so that the step
        (K drafts + 1 target token) never passes ``max_new_tokens``."""
        wanted = self._adaptive.next_num_draft_tokens() if self._adaptive else self.params.num_draft_tokens
        if cap is not None:
            wanted = min(wanted, cap)
        return max(0, min(wanted, self.params.max_new_tokens - len(self.output) - 1))

    def commit(
        self,
        draft_tokens: Sequence[int],
        emitted: Sequence[int],
        draft_seconds: float = 0.0,
        verify_seconds: float = 0.0,
        num_verified: int | None = None,
        source: str = "",
        plain_len: int = 1,
    ) -> list[int]:
        """Take one step's answer: ``emitted`` (the target's tokens) for ``draft_tokens``, of
        which the target verified the first ``num_verified`` (``None``: all; class docstring);
        ``source``: where the drafts came from (``methods.SOURCES``; "" = the draft model);
        ``plain_len``: the tokens a step without drafts asked the target for (its
        ``request_output_len``): an answer shorter than that, with no EOS or stop sequence in
        it, is the target ending the sequence.

        Records the step's statistics, appends tokens to the output up to the first EOS (not
        emitted), stop sequence (emitted) or ``max_new_tokens``, and returns the tokens kept.

        Raises:
            RuntimeError: the request has already finished.
            ValueError: ``num_verified`` is not in 0..len(draft_tokens), or ``plain_len`` < 1.
        """
        if self.finished:
            raise RuntimeError(f"the request has finished ({self.finish_reason}); nothing more to commit")
        draft_tokens, emitted = list(draft_tokens), list(emitted)
        # A target whose drafts were all discarded decodes up to len(drafts) + 1 tokens plainly.
        plain_answer_len = len(draft_tokens) + 1 if num_verified == 0 and draft_tokens else None
        if not draft_tokens:
            if plain_len < 1:
                raise ValueError(f"plain_len must be >= 1; got {plain_len}")
            plain_answer_len = plain_len
        if num_verified is not None:
            if not 0 <= num_verified <= len(draft_tokens):
                raise ValueError(
                    f"num_verified must be in 0..{len(draft_tokens)} (the drafts sent); got {num_verified}"
                )
            draft_tokens = draft_tokens[:num_verified]  # the rest were discarded unseen
        num_accepted = common_prefix_length(draft_tokens, emitted)
        self.stats.record(len(draft_tokens), num_accepted, draft_seconds, verify_seconds, source)
        if self._adaptive and draft_tokens:  # a step without drafts observes no acceptance
            self._adaptive.update(len(draft_tokens), num_accepted)

        params = self.params
        kept: list[int] = []
        for token in emitted:
            if token in params.eos_token_ids:
                self.finish_reason = "eos"
                break
            kept.append(token)
            self.output.append(token)
            if _ends_with_stop(self.output, params.stop_sequences):
                self.finish_reason = "stop"
                break
            if len(self.output) == params.max_new_tokens:
                self.finish_reason = "length"
                break
        if plain_answer_len is not None:
            ended = len(emitted) < plain_answer_len
        else:
            ended = num_accepted == len(emitted)
        if self.finish_reason is None and ended:
            self.finish_reason = "eos"  # the target ended the sequence (see the class docstring)
        self.sequence += kept
        self.stats.emitted_tokens += len(kept)
        return kept


class Generation:
    """One request in flight: iterate it for the tokens each step emits (streaming).

    A synchronous driver of :class:`LoopState` over a :class:`Drafter` and a :class:`Verifier`.
    After (or during) iteration: ``output`` (all emitted tokens), ``stats`` (:class:`RequestStats`),
    ``finish_reason`` (``"length"``, ``"eos"`` or ``"stop"``; ``None`` while running).
    """

    def __init__(
        self,
        prompt: Sequence[int],
        drafter: Drafter | None,
        verifier: Verifier,
        params: GenerationParams,
        generator: torch.Generator | None = None,
    ):
        self.state = LoopState(prompt, params)
        if drafter is None and params.num_draft_tokens != PLAIN_DECODING:
            raise GenerationParamsError("num_draft_tokens > 0 needs a drafter")
        self._drafter = drafter
        self._verifier = verifier
        self._generator = generator
        self._steps = self._run()

    @property
    def prompt(self) -> list[int]:
        return self.state.prompt

    @property
    def params(self) -> GenerationParams:
        return self.state.params

    @property
    def output(self) -> list[int]:
        return self.state.output

    @property
    def stats(self) -> RequestStats:
        return self.state.stats

    @property
    def finish_reason(self) -> str | None:
        return self.state.finish_reason

    def __iter__(self) -> Iterator[list[int]]:
        return self._steps

    def __next__(self) -> list[int]:
        return next(self._steps)

    def run(self) -> list[int]:
        """Consume the whole stream; the emitted tokens."""
        for _ in self._steps:
            pass
        return self.output

    def _run(self) -> Iterator[list[int]]:
        state, sampling = self.state, self.params.sampling
        while not state.finished:
            num_draft_tokens = state.next_num_draft_tokens()
            started = time.perf_counter()
            if num_draft_tokens > 0:
                assert self._drafter is not None  # __init__: no drafter only with num_draft_tokens 0
                draft = self._drafter.propose(state.sequence, num_draft_tokens, sampling, self._generator)
            else:
                draft = NO_DRAFT
            drafted = time.perf_counter()
            emitted = self._verifier.verify(state.sequence, draft, sampling, self._generator)
            verified = time.perf_counter()
            _check_emitted(draft, emitted)
            new_tokens = state.commit(draft.tokens, emitted, drafted - started, verified - drafted, source=draft.source)
            if new_tokens:
                yield new_tokens


def _check_emitted(draft: Draft, emitted: list[int]) -> None:
    """An in-process :class:`Verifier` answers exactly the accepted drafts plus one token."""
    num_accepted = len(emitted) - 1
    if not 0 <= num_accepted <= len(draft.tokens) or emitted[:num_accepted] != draft.tokens[:num_accepted]:
        raise ValueError(
            f"the verifier must return an accepted prefix of the {len(draft.tokens)} drafts plus one "
            f"token; drafts {draft.tokens}, got {emitted}"
        )


def _ends_with_stop(output: list[int], stop_sequences: tuple[tuple[int, ...], ...]) -> bool:
    return any(len(output) >= len(stop) and tuple(output[-len(stop) :]) == stop for stop in stop_sequences)
