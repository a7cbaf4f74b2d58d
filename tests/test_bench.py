"""The benchmark's arithmetic, its K recommendation and its packaged prompts."""

from __future__ import annotations

import json

import pytest
from conftest import DEMO_PAIR

from trt_spec.bench.prompts import load_prompt_texts
from trt_spec.runtime.costs import (
    StepCosts,
    StepTimes,
    expected_tokens_per_call,
    recommend_num_draft_tokens,
    speedup,
)


@pytest.mark.parametrize("k, expected", [(2, 1.94), (4, 2.26), (6, 2.38), (8, 2.42)])
def test_theory_matches_the_demo_pairs_provenance(k, expected):
    # PROVENANCE.json: theoretical tokens per target call at greedy alpha 0.59.
    assert expected_tokens_per_call(0.59, k) == pytest.approx(expected, abs=0.005)


def test_the_speedup_at_a_flat_verify_is_theorem_3_8():
    alpha, k, c = 0.7, 3, 0.1
    theorem = (1 - alpha ** (k + 1)) / ((1 - alpha) * (k * c + 1))
    assert StepCosts(draft=c, verify_slope=0.0).speedup(alpha, k) == pytest.approx(theorem)
    assert speedup(k, c, 1.0, expected_tokens_per_call(alpha, k)) == pytest.approx(theorem)


def test_recommendation():
    # Leviathan et al. Figure 3: cheap drafts and high alpha want long drafts, costly ones short.
    assert recommend_num_draft_tokens(0.9, 0.01, 16) >= 10
    assert recommend_num_draft_tokens(0.6, 0.5, 16) == 1
    k = recommend_num_draft_tokens(0.7, 0.1, 16)
    flat = StepCosts(draft=0.1, verify_slope=0.0)
    assert all(flat.speedup(0.7, k) >= flat.speedup(0.7, j) for j in range(1, 17))


def test_cost_model_speedup():
    times = StepTimes(target_1=0.010, target_by_num_tokens={5: 0.012}, draft_by_k={4: 0.001})
    expected = expected_tokens_per_call(0.6, 4) * 0.010 / (4 * 0.001 + 0.012)
    assert times.speedup(0.6, 4) == pytest.approx(expected)
    assert times.cost_ratio == pytest.approx(0.1)


def test_run_cost_model_counts_prefill_and_the_runs_own_calls():
    times = StepTimes(
        target_1=0.010, target_by_num_tokens={5: 0.012}, draft_by_k={4: 0.001}, target_prefill=0.05, draft_prefill=0.01
    )
    # 2 requests of 60 tokens in 20 target calls: plain 2 prefills + 118 steps; speculative 2 prefills
    # of both models, 3 more drafts in each first step, then 18 full steps of 4 drafts + a 5-token verify.
    plain = 2 * 0.05 + 118 * 0.010
    spec = 2 * (0.05 + 0.01) + 2 * 3 * 0.001 + 18 * (4 * 0.001 + 0.012)
    assert times.run_speedup(4, tokens=120, target_calls=20, requests=2) == pytest.approx(plain / spec)
    # Without prefills it is the step model at the run's tokens per call (up to each request's first step).
    bare = StepTimes(target_1=0.010, target_by_num_tokens={5: 0.012}, draft_by_k={4: 0.001})
    assert bare.run_speedup(4, tokens=3000, target_calls=1000, requests=1) == pytest.approx(
        3 * 0.010 / (4 * 0.001 + 0.012), rel=2e-3
    )


def test_prompts_come_from_held_out_files():
    held_out = set(json.loads((DEMO_PAIR / "PROVENANCE.json").read_text())["held_out_files"])
    prompts = load_prompt_texts()
    assert len(prompts) >= 8
    assert all(entry["file"] in held_out and len(entry["text"]) >= 400 for entry in prompts)
    assert len({entry["file"] for entry in prompts}) == len(prompts)


def test_theory_at_drafted_lengths():
    from trt_spec.bench.rows import theoretical_tokens_per_call_at_drafted
    from trt_spec.runtime.loop import RequestStats

    stats = RequestStats()
    stats.record(num_drafted=3, num_accepted=3, draft_seconds=0, verify_seconds=0)
    stats.record(num_drafted=1, num_accepted=0, draft_seconds=0, verify_seconds=0)  # a capped last step
    alpha = 0.5
    expected = (expected_tokens_per_call(alpha, 3) + expected_tokens_per_call(alpha, 1)) / 2
    assert theoretical_tokens_per_call_at_drafted(alpha, stats) == pytest.approx(expected)


def test_loop_breakdown_splits_the_overhead_from_metric_deltas():
    from trt_spec.bench.server import loop_breakdown

    loop = '{model="spec_loop"}'
    before = {
        f"trt_spec_loop_iterations_total{loop}": 10.0,
        f"trt_spec_loop_iteration_seconds_total{loop}": 1.0,
        f"trt_spec_loop_engine_wait_seconds_total{loop}": 0.9,
        'trt_spec_engine_execute_seconds_total{model="tensorrt_llm"}': 0.5,
        'trt_spec_engine_execute_seconds_total{model="tensorrt_llm_draft"}': 0.2,
    }
    after = dict(before)
    after[f"trt_spec_loop_iterations_total{loop}"] += 100  # 100 iterations of 20 ms:
    after[f"trt_spec_loop_iteration_seconds_total{loop}"] += 2.0
    after[f"trt_spec_loop_engine_wait_seconds_total{loop}"] += 1.9  # 19 ms awaiting engines,
    after['trt_spec_engine_execute_seconds_total{model="tensorrt_llm"}'] += 1.2  # 16 ms of it computing
    after['trt_spec_engine_execute_seconds_total{model="tensorrt_llm_draft"}'] += 0.4
    breakdown = loop_breakdown(before, after)
    assert breakdown.iterations == 100 and breakdown.engine_source == "trt_spec"
    assert breakdown.iteration_ms == pytest.approx(20.0) and breakdown.engine_ms == pytest.approx(16.0)
    assert breakdown.overhead_ms == pytest.approx(4.0)
    assert breakdown.loop_own_ms == pytest.approx(1.0) and breakdown.transport_ms == pytest.approx(3.0)
    assert loop_breakdown(before, before) is None and loop_breakdown(None, after) is None


# --- the rows of `trt-spec bench --json` ---------------------------------------------------------

CONTRACT_KEYS = [
    "k",
    "temperature",
    "adaptive",
    "method",
    "tokens_per_s",
    "baseline_tokens_per_s",
    "speedup",
    "acceptance_rate",
    "alpha",
    "tokens_per_target_call",
    "theoretical_tokens_per_target_call",
    "hf_assisted_tokens_per_s",
    "cost_model_speedup",
]


def _tally_with_stats(tokens: int, seconds: float, steps: list[tuple[int, int]]):
    from trt_spec.bench.rows import Tally
    from trt_spec.runtime.loop import RequestStats

    stats = RequestStats()
    for drafted, accepted in steps:
        stats.record(num_drafted=drafted, num_accepted=accepted, draft_seconds=0, verify_seconds=0)
    stats.emitted_tokens = tokens
    tally = Tally()
    tally.add(tokens, seconds, stats)
    return tally


def test_in_process_rows_to_json_have_exactly_todays_keys():
    from trt_spec.bench.rows import AdaptiveRow, FixedRow, Tally

    times = StepTimes(target_1=0.010, target_by_num_tokens={3: 0.012}, draft_by_k={2: 0.001})
    spec = _tally_with_stats(12, 1.0, [(2, 2), (2, 1), (2, 0), (1, 1)])
    plain, hf, hf_plain = Tally(), Tally(), Tally()
    plain.add(12, 2.0)
    hf.add(12, 3.0)
    hf_plain.add(12, 4.0)
    fixed = FixedRow.measure(2, 0.0, spec, plain, times, hf=hf, hf_plain=hf_plain).to_json()
    assert list(fixed) == CONTRACT_KEYS + [
        "tokens_per_call_vs_theory",
        "theoretical_tokens_per_target_call_at_drafted",
        "tokens_per_call_vs_theory_at_drafted",
        "speedup_vs_cost_model",
        "t_1_ms",
        "t_d_ms",
        "t_k_plus_1_ms",
        "hf_plain_tokens_per_s",
        "acceptance_by_position",
        "target_calls",
        "drafted_by_source",
        "accepted_by_source",
        "tokens",
    ]
    assert fixed["drafted_by_source"] == {"draft_model": 7} and fixed["accepted_by_source"] == {"draft_model": 4}
    assert fixed["adaptive"] is False and fixed["speedup"] == pytest.approx(2.0)
    assert fixed["alpha"] == pytest.approx(4 / 6) and fixed["acceptance_rate"] == pytest.approx(4 / 7)
    assert fixed["hf_assisted_tokens_per_s"] == pytest.approx(4.0)
    assert fixed["hf_plain_tokens_per_s"] == pytest.approx(3.0)
    assert fixed["t_1_ms"] == pytest.approx(10.0) and fixed["acceptance_by_position"] == pytest.approx([3 / 4, 1 / 3])
    assert json.loads(json.dumps(fixed)) == fixed

    adaptive = AdaptiveRow.measure(2, 1.0, spec, plain).to_json()
    assert list(adaptive) == CONTRACT_KEYS + ["mean_k", "acceptance_by_position", "target_calls", "tokens"]
    assert adaptive["adaptive"] is True and adaptive["mean_k"] == pytest.approx(7 / 4)
    assert adaptive["theoretical_tokens_per_target_call"] is None and adaptive["cost_model_speedup"] is None


def test_server_rows_to_json_have_exactly_todays_keys():
    from trt_spec.bench.rows import InprocessComparison, LoopBreakdown, RequestResult, ServerRow, Tally

    def result(tokens: int, ttft_s: float, itl_s: float | None) -> RequestResult:
        return RequestResult(
            tokens=tokens, seconds=1.0, ttft_s=ttft_s, itl_s=itl_s, drafted=8, accepted=4, target_calls=4
        )

    spec, plain = Tally(), Tally()
    spec.add_results([result(10, 0.02, 0.004), result(10, 0.04, None)], 2.0)
    plain.add_results([result(10, 0.01, 0.005)], 1.0)
    head = CONTRACT_KEYS[:4] + ["concurrency"] + CONTRACT_KEYS[4:]
    tail = ["ttft_ms", "itl_ms", "baseline_ttft_ms", "baseline_itl_ms", "requests", "tokens"]
    bare = ServerRow.measure(4, 0.0, 2, spec, plain, alpha=None).to_json()
    assert list(bare) == head + tail
    assert bare["tokens_per_s"] == pytest.approx(10.0) and bare["speedup"] == pytest.approx(1.0)
    assert bare["ttft_ms"] == pytest.approx(30.0) and bare["itl_ms"] == pytest.approx(4.0)
    assert bare["acceptance_rate"] == pytest.approx(0.5) and bare["tokens_per_target_call"] == pytest.approx(2.5)
    assert bare["alpha"] is None and bare["theoretical_tokens_per_target_call"] is None

    loop = LoopBreakdown(
        iterations=10,
        iteration_ms=2.0,
        engine_ms=1.5,
        overhead_ms=0.5,
        engine_source="trt_spec",
        loop_own_ms=0.1,
        transport_ms=0.4,
    )
    inprocess = InprocessComparison(tokens_per_s=5.0, server_vs_inprocess=2.0, same_tokens=True)
    full = ServerRow.measure(4, 0.0, 1, spec, plain, 0.5, loop, inprocess).to_json()
    assert list(full) == head + tail + [
        "loop_iteration_ms",
        "engine_ms_per_iteration",
        "loop_overhead_ms_per_iteration",
        "engine_time_source",
        "loop_own_ms_per_iteration",
        "bls_transport_ms_per_iteration",
        "inprocess_tokens_per_s",
        "server_vs_inprocess",
        "inprocess_same_tokens",
    ]
    assert full["theoretical_tokens_per_target_call"] == pytest.approx(expected_tokens_per_call(0.5, 4))
