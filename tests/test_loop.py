"""The loop against scripted drafters and verifiers: stopping inside a draft window, draft length,
statistics, streaming, and parameter checks. No model involved."""

from __future__ import annotations

import random

import pytest

from trt_spec.errors import GenerationParamsError
from trt_spec.runtime.loop import (
    AdaptiveDraftLength,
    Draft,
    Generation,
    GenerationParams,
    LoopState,
    StepCosts,
    call_seed,
    expected_tokens_per_call,
)

PROMPT = [1, 2, 3]
TRUTH = list(range(100, 160))  # what the (greedy) target continues the prompt with
WRONG = 999  # a token the target never emits
EOS = 7


class ScriptedDrafter:
    """Proposes the target's continuation, wrong at every position p with p % period == period - 1."""

    def __init__(self, truth=TRUTH, period: int = 4):
        self.truth, self.period = truth, period
        self.asked: list[int] = []
        self.produced_before: list[int] = []

    def propose(self, sequence, num_draft_tokens, sampling, generator) -> Draft:
        start = len(sequence) - len(PROMPT)
        self.asked.append(num_draft_tokens)
        self.produced_before.append(start)
        positions = range(start, start + num_draft_tokens)
        return Draft(tokens=[WRONG if p % self.period == self.period - 1 else self.truth[p] for p in positions])


class ScriptedVerifier:
    """A greedy target whose continuation is ``truth``."""

    def __init__(self, truth=TRUTH):
        self.truth = truth
        self.calls = 0

    def verify(self, sequence, draft, sampling, generator) -> list[int]:
        self.calls += 1
        start = len(sequence) - len(PROMPT)
        assert list(sequence[len(PROMPT) :]) == self.truth[:start], "the loop committed a wrong token"
        emitted = []
        for offset, token in enumerate(draft.tokens):
            if token != self.truth[start + offset]:
                break
            emitted.append(token)
        emitted.append(self.truth[start + len(emitted)])
        return emitted


def run(params: GenerationParams, truth=TRUTH, period: int = 4):
    drafter, verifier = ScriptedDrafter(truth, period), ScriptedVerifier(truth)
    generation = Generation(PROMPT, drafter if params.num_draft_tokens else None, verifier, params)
    steps = list(generation)
    return generation, steps, drafter, verifier


@pytest.mark.parametrize("k", [0, 1, 2, 3, 5, 8])
def test_output_is_the_target_continuation(k):
    generation, steps, _, verifier = run(GenerationParams(max_new_tokens=30, num_draft_tokens=k))
    assert generation.output == TRUTH[:30]
    assert [token for step in steps for token in step] == generation.output  # streaming adds up
    assert generation.finish_reason == "length"
    assert verifier.calls == generation.stats.target_calls == generation.stats.iterations == len(steps)


def test_plain_decoding_is_one_token_per_target_call():
    generation, steps, _, _ = run(GenerationParams(max_new_tokens=10, num_draft_tokens=0))
    assert steps == [[token] for token in TRUTH[:10]]
    assert generation.stats.drafted_tokens == 0 and generation.stats.tokens_per_target_call == 1.0


def test_eos_inside_a_draft_window_ends_generation_before_it():
    truth = TRUTH[:6] + [EOS] + TRUTH[7:]
    params = GenerationParams(max_new_tokens=30, num_draft_tokens=5, eos_token_ids=frozenset({EOS}))
    generation, steps, _, _ = run(params, truth=truth, period=100)  # drafts always right
    assert generation.output == truth[:6]
    assert generation.finish_reason == "eos"
    # Step 1 emits 6 tokens; step 2 accepts EOS first and stops: nothing more is streamed.
    assert len(steps) == 1 and generation.stats.iterations == 2


def test_max_tokens_inside_a_draft_window():
    params = GenerationParams(max_new_tokens=7, num_draft_tokens=5)
    generation, _, drafter, _ = run(params, period=100)
    assert generation.output == TRUTH[:7]
    assert generation.finish_reason == "length"
    # Step 1 drafts 5 and emits 6; step 2 may emit only 1 more, so it drafts nothing.
    assert drafter.asked == [5]
    assert generation.stats.target_calls == 2


def test_never_drafts_past_the_budget():
    params = GenerationParams(max_new_tokens=9, num_draft_tokens=4)
    generation, _, drafter, _ = run(params, period=3)
    for asked, produced in zip(drafter.asked, drafter.produced_before):
        assert 1 <= asked <= params.max_new_tokens - produced - 1
    assert generation.output == TRUTH[:9]


def test_stop_sequence_across_steps_is_emitted_then_stops():
    stop = tuple(TRUTH[3:6])
    params = GenerationParams(max_new_tokens=30, num_draft_tokens=1, stop_sequences=(stop,))
    generation, _, _, _ = run(params)
    assert generation.output == TRUTH[:6]
    assert generation.finish_reason == "stop"


def test_stats_count_drafts_acceptances_and_positions():
    # period 4: positions 3, 7, 11, ... are drafted wrong.
    generation, _, drafter, _ = run(GenerationParams(max_new_tokens=12, num_draft_tokens=3))
    stats = generation.stats
    # Step 1 at 0: drafts 100 101 102 (ok), bonus 103 -> 4 tokens. Step 2 at 4: 104 105 106 ok, +107.
    # Step 3 at 8: drafts 108 109 110 ok, would add 111 -> 12 tokens, done.
    assert drafter.asked == [3, 3, 3]
    assert stats.drafted_tokens == 9 and stats.accepted_tokens == 9 and stats.rejections == 0
    assert stats.acceptance_by_position == [1.0, 1.0, 1.0]
    assert stats.tokens_per_target_call == 4.0

    generation, _, _, _ = run(GenerationParams(max_new_tokens=12, num_draft_tokens=4))
    stats = generation.stats
    # K = 4: the 4th draft of steps 1 and 2 is wrong (accept 3, recover 1); step 3 at 8 may draft
    # only 3 (12 - 8 - 1), all right, plus the bonus.
    assert stats.accepted_tokens == 9 and stats.rejections == 2 and stats.drafted_tokens == 4 + 4 + 3
    assert stats.alpha == pytest.approx(9 / (9 + 2))
    assert stats.acceptance_rate == pytest.approx(9 / 11)
    assert stats.acceptance_by_position == [1.0, 1.0, 1.0, 0.0]


def test_a_malformed_verifier_answer_is_refused():
    class Liar(ScriptedVerifier):
        def verify(self, sequence, draft, sampling, generator):
            return [WRONG, WRONG] + draft.tokens  # more tokens than drafts + 1, not a prefix

    generation = Generation(PROMPT, ScriptedDrafter(), Liar(), GenerationParams(num_draft_tokens=2))
    with pytest.raises(ValueError, match="accepted prefix"):
        generation.run()


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"num_draft_tokens": 17}, "num_draft_tokens"),
        ({"num_draft_tokens": -1}, "num_draft_tokens"),
        ({"adaptive_draft": True, "num_draft_tokens": 0}, "adaptive"),
        ({"stop_sequences": ((),)}, "stop sequence"),
        ({"temperature": -1.0}, "temperature"),
    ],
)
def test_params_are_validated(kwargs, fragment):
    with pytest.raises(GenerationParamsError, match=fragment):
        GenerationParams(**kwargs)


def test_empty_prompt_and_missing_drafter_are_refused():
    with pytest.raises(GenerationParamsError, match="empty"):
        Generation([], ScriptedDrafter(), ScriptedVerifier(), GenerationParams())
    with pytest.raises(GenerationParamsError, match="drafter"):
        Generation(PROMPT, None, ScriptedVerifier(), GenerationParams(num_draft_tokens=2))


def test_expected_tokens_per_call():
    assert expected_tokens_per_call(0.5, 3) == pytest.approx((1 - 0.5**4) / 0.5)
    assert expected_tokens_per_call(1.0, 4) == 5
    assert expected_tokens_per_call(0.0, 4) == 1


def test_adaptive_draft_length_follows_acceptance():
    gpu_like = StepCosts(draft=0.1, verify_slope=0.0)
    always_right = AdaptiveDraftLength(max_draft_tokens=8, costs=gpu_like)
    for _ in range(20):
        k = always_right.next_num_draft_tokens()
        always_right.update(k, k)
    assert always_right.next_num_draft_tokens() == 8

    # A draft that is never right: down to plain decoding (K 0), probing with K 1 once in a while.
    always_wrong = AdaptiveDraftLength(max_draft_tokens=8, costs=gpu_like)
    chosen = []
    for _ in range(80):
        k = always_wrong.next_num_draft_tokens()
        chosen.append(k)
        if k:
            always_wrong.update(k, 0)
    steady = chosen[40:]
    assert steady.count(0) >= len(steady) * AdaptiveDraftLength.PROBE_EVERY // (AdaptiveDraftLength.PROBE_EVERY + 1)
    assert set(steady) == {0, AdaptiveDraftLength.PROBE_K}
    # Each rejected probe doubles the wait before the next, up to PROBE_EVERY_MAX.
    probes = [index for index, k in enumerate(chosen) if k == AdaptiveDraftLength.PROBE_K and chosen[index - 1] == 0]
    gaps = [later - earlier - 1 for earlier, later in zip(probes, probes[1:])]
    assert gaps == [min(32 * 2**i, AdaptiveDraftLength.PROBE_EVERY_MAX) for i in range(len(gaps))], gaps


def test_adaptive_k_comes_back_after_accepted_probes():
    gpu_like = StepCosts(draft=0.1, verify_slope=0.0)
    adaptive = AdaptiveDraftLength(max_draft_tokens=8, costs=gpu_like)
    for _ in range(60):  # collapse: every draft rejected
        k = adaptive.next_num_draft_tokens()
        if k:
            adaptive.update(k, 0)
    assert adaptive.next_num_draft_tokens() == 0
    steps_to_recover = 0
    while (k := adaptive.next_num_draft_tokens()) <= AdaptiveDraftLength.PROBE_K:
        steps_to_recover += 1
        if k:
            adaptive.update(k, k)  # the text turned predictable: every probe accepted
    # one wait for the first probe (backed off to at most PROBE_EVERY_MAX), then probes back to
    # back until K > 1 pays
    assert steps_to_recover <= AdaptiveDraftLength.PROBE_EVERY_MAX + 8, steps_to_recover


def test_adaptive_k_is_the_cost_models_best_and_depends_on_the_tokens_alone():
    # No clock is read: the same accept/reject history gives the same K sequence on any machine,
    # under any load (greedy output cannot depend on load: StepCosts says why).
    cpu = StepCosts(draft=0.08, verify_slope=0.3)
    history = [(4, 4), (4, 1), (2, 2), (3, 0), (2, 2), (3, 3), (4, 2)]

    def ks() -> list[int]:
        adaptive, chosen = AdaptiveDraftLength(max_draft_tokens=8, costs=cpu), []
        for _, accepted in history:
            k = adaptive.next_num_draft_tokens()
            chosen.append(k)
            adaptive.update(k, min(k, accepted))
        return chosen

    assert ks() == ks()
    adaptive = AdaptiveDraftLength(max_draft_tokens=8, costs=cpu)
    adaptive._accepted, adaptive._decided = 7.3, 10.0  # alpha 0.73, the wide pair's
    best = max(range(1, 9), key=lambda k: expected_tokens_per_call(0.73, k) / (k * 0.08 + 1 + 0.3 * k))
    assert adaptive.next_num_draft_tokens() == best == 2  # the wide pair's best fixed K on this CPU


def test_adaptive_generation_is_still_exact():
    params = GenerationParams(
        max_new_tokens=40, num_draft_tokens=6, adaptive_draft=True, step_costs=StepCosts(draft=0.1, verify_slope=0.0)
    )
    generation, _, drafter, _ = run(params, period=3)
    assert generation.output == TRUTH[:40]
    assert len(set(drafter.asked)) > 1  # K actually moved


def drive(controller: AdaptiveDraftLength, alpha: float = 0.8, steps: int = 80) -> float:
    """Feed a controller steps with i.i.d. acceptance ``alpha``; the mean K it chose over the second half."""
    rng = random.Random(0)
    chosen = []
    for _ in range(steps):
        k = controller.next_num_draft_tokens()
        chosen.append(k)
        accepted = 0
        while accepted < k and rng.random() < alpha:
            accepted += 1
        controller.update(k, accepted)
    return sum(chosen[steps // 2 :]) / (steps - steps // 2)


def test_adaptive_draft_length_accounts_for_verification_growing_with_k():
    # alpha 0.8, t_d = 0.1 t_1: a flat verification (a GPU's) wants long drafts (optimum K = 6);
    # one growing 0.4 t_1 per verified position (a slow CPU's) wants short ones (optimum K = 2).
    flat = drive(AdaptiveDraftLength(8, StepCosts(draft=0.1, verify_slope=0.0)))
    steep = drive(AdaptiveDraftLength(8, StepCosts(draft=0.1, verify_slope=0.4)))
    assert flat >= 4.5 and steep <= 3, (flat, steep)


class BernoulliVerifier:
    """Accepts each draft independently with probability alpha: the i.i.d. model of the theory."""

    def __init__(self, alpha: float, seed: int):
        self.alpha, self.rng = alpha, random.Random(seed)

    def verify(self, sequence, draft, sampling, generator) -> list[int]:
        accepted = 0
        while accepted < len(draft.tokens) and self.rng.random() < self.alpha:
            accepted += 1
        return draft.tokens[:accepted] + [5]


class ConstantDrafter:
    def propose(self, sequence, num_draft_tokens, sampling, generator) -> Draft:
        return Draft(tokens=[4] * num_draft_tokens)


@pytest.mark.parametrize("k, alpha", [(2, 0.6), (6, 0.72), (8, 0.9)])
def test_tokens_per_target_call_reach_the_theory_under_iid_acceptance(k, alpha):
    """Where acceptance is i.i.d., the loop delivers (1 - alpha^(K+1)) / (1 - alpha) per call:
    any shortfall on real text is the text's (correlated acceptance, short requests), not the loop's."""
    params = GenerationParams(max_new_tokens=30_000, num_draft_tokens=k)
    generation = Generation(PROMPT, ConstantDrafter(), BernoulliVerifier(alpha, seed=k), params)
    generation.run()
    stats = generation.stats
    assert stats.alpha == pytest.approx(alpha, abs=0.01)
    assert stats.tokens_per_target_call == pytest.approx(expected_tokens_per_call(stats.alpha, k), rel=0.01)


# --- the sans-I/O state, as the Triton loop model drives it -------------------------------------


def test_state_takes_a_target_answer_with_more_than_one_own_token():
    # TensorRT-LLM returns up to request_output_len tokens: the accepted drafts, then target tokens.
    state = LoopState(PROMPT, GenerationParams(max_new_tokens=20, num_draft_tokens=4))
    assert state.next_num_draft_tokens() == 4
    drafts = [TRUTH[0], TRUTH[1], WRONG, TRUTH[3]]
    new = state.commit(drafts, TRUTH[:5])  # 2 accepted, then 3 tokens of the target's own
    assert new == TRUTH[:5] and state.sequence == PROMPT + TRUTH[:5]
    assert state.stats.accepted_tokens == 2 and state.stats.drafted_tokens == 4 and state.stats.rejections == 1
    assert state.stats.target_calls == 1 and not state.finished


def test_state_clamps_k_and_stops_inside_the_answer():
    state = LoopState(PROMPT, GenerationParams(max_new_tokens=3, num_draft_tokens=4, eos_token_ids=frozenset({EOS})))
    assert state.next_num_draft_tokens() == 2  # 2 drafts + 1 target token = the whole budget
    assert state.commit(TRUTH[:2], TRUTH[:2] + [EOS]) == TRUTH[:2]
    assert state.finish_reason == "eos" and state.output == TRUTH[:2]
    with pytest.raises(RuntimeError, match="finished"):
        state.commit([], [1])


def test_state_plain_step_and_an_answer_with_no_own_token():
    state = LoopState(PROMPT, GenerationParams(max_new_tokens=10, num_draft_tokens=0))
    assert state.next_num_draft_tokens() == 0
    assert state.commit([], [TRUTH[0]]) == [TRUTH[0]] and state.stats.drafted_tokens == 0
    # Only accepted drafts and nothing of its own: the target ended the sequence (end_id left out).
    state = LoopState(PROMPT, GenerationParams(max_new_tokens=10, num_draft_tokens=2))
    assert state.commit(TRUTH[:2], TRUTH[:2]) == TRUTH[:2]
    assert state.finish_reason == "eos" and state.stats.accepted_tokens == 2


def test_state_counts_only_the_drafts_the_target_verified():
    # Two of four drafts verified (the executor discarded the rest), both accepted, and the
    # target's own token happens to equal the discarded third: not an end of sequence.
    state = LoopState(PROMPT, GenerationParams(max_new_tokens=20, num_draft_tokens=4))
    assert state.commit(TRUTH[:4], TRUTH[:3], num_verified=2) == TRUTH[:3]
    assert not state.finished
    assert state.stats.drafted_tokens == 2 and state.stats.accepted_tokens == 2 and state.stats.rejections == 0
    # The old reading of the same answer (all sent drafts verified) ends the request.
    old = LoopState(PROMPT, GenerationParams(max_new_tokens=20, num_draft_tokens=4))
    old.commit(TRUTH[:4], TRUTH[:3])
    assert old.finish_reason == "eos"
    # Verified drafts, all accepted, nothing of its own: the target did end the sequence.
    state = LoopState(PROMPT, GenerationParams(max_new_tokens=20, num_draft_tokens=4))
    state.commit(TRUTH[:4], TRUTH[:2], num_verified=2)
    assert state.finish_reason == "eos"
    with pytest.raises(ValueError, match="num_verified"):
        LoopState(PROMPT, GenerationParams()).commit(TRUTH[:2], TRUTH[:1], num_verified=3)


def test_state_with_every_draft_discarded_reads_a_plain_answer():
    # No draft left: the target decoded plainly up to len(drafts) + 1 = 5 tokens.
    state = LoopState(PROMPT, GenerationParams(max_new_tokens=20, num_draft_tokens=4))
    assert state.commit(TRUTH[:4], TRUTH[:5], num_verified=0) == TRUTH[:5]
    assert not state.finished and state.stats.drafted_tokens == 0
    # Fewer than it was asked for: it reached end_id.
    state = LoopState(PROMPT, GenerationParams(max_new_tokens=20, num_draft_tokens=4))
    assert state.commit(TRUTH[:4], TRUTH[:3], num_verified=0) == TRUTH[:3]
    assert state.finish_reason == "eos"


def test_call_seeds_are_distinct_and_reproducible():
    seeds = [call_seed(7, index) for index in range(1000)]
    assert len(set(seeds)) == 1000 and all(0 <= seed < 2**63 for seed in seeds)
    assert seeds == [call_seed(7, index) for index in range(1000)]
    assert call_seed(8, 0) != call_seed(7, 0)
