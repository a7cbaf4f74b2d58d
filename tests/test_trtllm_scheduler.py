"""TensorRT-LLM 1.2.x's executor scheduling as the emulator models it (trt_spec/runtime/
trtllm_scheduler.py): admission, token budgets, first-come-first-served chunking and
``fitDraftTokens``, each case worked by hand from the upstream code the module cites."""

from __future__ import annotations

import pytest

from trt_spec.runtime.trtllm_scheduler import SchedulerLimits, SchedulingError, StepRequest, schedule

K = 4


def limits(**changes) -> SchedulerLimits:
    values = dict(max_batch_size=8, max_num_tokens=256, tokens_per_block=16, chunked_context=True)
    return SchedulerLimits(**{**values, **changes})


def target(prompt_len: int, drafts: int = K, reused: int = 0) -> StepRequest:
    return StepRequest(prompt_len=prompt_len, num_draft_tokens=drafts, reused_len=reused, max_new_tokens=drafts + 1)


def test_contexts_that_fit_keep_every_draft():
    outcome = schedule([target(100), target(100)], limits())  # 208 tokens <= 256
    assert outcome.kept_drafts == [K, K] and outcome.steps == 1


def test_a_lone_request_keeps_its_drafts_whatever_its_length_mod_the_block():
    for length in (16, 17, 30, 31, 32, 200):
        assert schedule([target(length)], limits()).kept_drafts == [K], length


def test_when_contexts_do_not_fit_a_last_chunk_keeps_only_the_drafts_its_block_has_room_for():
    # 3 x 70 + 3 x 4 = 222 <= 256 fits; a fourth makes 296: chunking, then fitDraftTokens.
    # FCFS: 70, 70, 70 (whole: last chunks), then 256 - 210 = 46 -> floored to 32 (not last).
    # Each last chunk: 70 % 16 = 6, room 10 in its block, of the 256 - (210 + 32) = 14 left, and
    # each takes its whole room: the first 10 (keeps 4), the second the last 4 (keeps 4), the third
    # none (keeps 0); the fourth runs its remaining 38 tokens in the next step and keeps its drafts.
    outcome = schedule([target(70), target(70), target(70), target(70)], limits())
    assert outcome.kept_drafts == [K, K, 0, K]
    # Block-aligned contexts have no room left in their block: every draft goes.
    outcome = schedule([target(64), target(64), target(64), target(64), target(64)], limits())
    assert outcome.kept_drafts[:3] == [0, 0, 0]
    # 62 % 16 = 14: room for 2 of the 4.
    outcome = schedule([target(62)] * 4 + [target(62)], limits())
    assert outcome.kept_drafts[0] == 2 and outcome.discarded[0] == 2


def test_the_step_capacity_left_after_the_chunks_bounds_the_drafts():
    # 2 x 120 = 240 of 256; then a third: 16 left, floored to 16 (a block). Capacity left: 0.
    outcome = schedule([target(120), target(120), target(120)], limits())
    assert outcome.kept_drafts[:2] == [0, 0]


def test_a_context_longer_than_max_num_tokens_is_chunked_and_keeps_its_drafts_in_its_last_step():
    # 600 tokens, 256 a step: chunks of 256, 256 (floored), then 88 + 4 drafts alone.
    outcome = schedule([target(600)], limits())
    assert outcome.kept_drafts == [K] and outcome.steps == 3


def test_reuse_found_at_allocation_ends_the_context_in_its_first_step():
    # The scheduler sees 600 tokens; 595 are cached, so the first chunk (256) reaches the end.
    outcome = schedule([target(600, reused=595)], limits())
    assert outcome.kept_drafts == [K] and outcome.steps == 1


def test_max_batch_size_admits_the_first_requests_and_the_rest_wait():
    outcome = schedule([target(10)] * 5, limits(max_batch_size=2))
    assert outcome.kept_drafts == [K] * 5 and outcome.steps == 3


def test_a_request_left_without_drafts_decodes_its_request_output_len():
    # All drafts of the first three discarded (block-aligned, no room): each then decodes K + 1
    # tokens, one step each after the context.
    outcome = schedule([target(64)] * 5, limits())
    assert outcome.kept_drafts[:3] == [0, 0, 0]
    assert outcome.steps >= 1 + K


def test_generation_requests_cost_one_token_and_decode_to_their_length():
    plain = StepRequest(prompt_len=10, max_new_tokens=6)
    outcome = schedule([plain, plain], limits())
    assert outcome.kept_drafts == [0, 0] and outcome.steps == 6  # one context step, five generation steps


def test_without_chunked_context_a_context_over_the_limit_fails_the_step():
    with pytest.raises(SchedulingError, match=r"The number of context tokens \(300\) exceeds the limit value \(256\)"):
        schedule([target(296), target(10)], limits(chunked_context=False))
    # Under the limit, contexts that do not fit the step wait (no drafts discarded).
    outcome = schedule([target(200), target(200)], limits(chunked_context=False))
    assert outcome.kept_drafts == [K, K] and outcome.steps == 2


def test_limits_are_positive():
    with pytest.raises(ValueError):
        limits(tokens_per_block=0)
