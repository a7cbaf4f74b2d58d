"""The benchmark's arithmetic, its K recommendation and its packaged prompts."""

from __future__ import annotations

import json

import pytest

from trt_spec.bench.inprocess import (
    StepTimes,
    cost_model_speedup,
    load_prompt_texts,
    recommend_num_draft_tokens,
    theoretical_tokens_per_call,
    walltime_improvement,
)

from conftest import DEMO_PAIR


@pytest.mark.parametrize("k, expected", [(2, 1.94), (4, 2.26), (6, 2.38), (8, 2.42)])
def test_theory_matches_the_demo_pairs_provenance(k, expected):
    # PROVENANCE.json: theoretical tokens per target call at greedy alpha 0.59.
    assert theoretical_tokens_per_call(0.59, k) == pytest.approx(expected, abs=0.005)


def test_walltime_improvement_is_theorem_3_8():
    alpha, k, c = 0.7, 3, 0.1
    assert walltime_improvement(alpha, k, c) == pytest.approx((1 - alpha ** (k + 1)) / ((1 - alpha) * (k * c + 1)))


def test_recommendation():
    # Leviathan et al. Figure 3: cheap drafts and high alpha want long drafts, costly ones short.
    assert recommend_num_draft_tokens(0.9, 0.01) >= 10
    assert recommend_num_draft_tokens(0.6, 0.5) == 1
    k = recommend_num_draft_tokens(0.7, 0.1)
    assert all(walltime_improvement(0.7, k, 0.1) >= walltime_improvement(0.7, j, 0.1) for j in range(1, 17))


def test_cost_model_speedup():
    times = StepTimes(target_1=0.010, target_by_num_tokens={5: 0.012}, draft_by_k={4: 0.001})
    expected = theoretical_tokens_per_call(0.6, 4) * 0.010 / (4 * 0.001 + 0.012)
    assert cost_model_speedup(0.6, 4, times) == pytest.approx(expected)
    assert times.cost_ratio == pytest.approx(0.1)


def test_prompts_come_from_held_out_files():
    held_out = set(json.loads((DEMO_PAIR / "PROVENANCE.json").read_text())["held_out_files"])
    prompts = load_prompt_texts()
    assert len(prompts) >= 8
    assert all(entry["file"] in held_out and len(entry["text"]) >= 400 for entry in prompts)
    assert len({entry["file"] for entry in prompts}) == len(prompts)


def test_theory_at_drafted_lengths():
    from trt_spec.bench.inprocess import theoretical_tokens_per_call_at_drafted
    from trt_spec.runtime.loop import RequestStats

    stats = RequestStats()
    stats.record(num_drafted=3, num_accepted=3, draft_seconds=0, verify_seconds=0)
    stats.record(num_drafted=1, num_accepted=0, draft_seconds=0, verify_seconds=0)  # a capped last step
    alpha = 0.5
    expected = (theoretical_tokens_per_call(alpha, 3) + theoretical_tokens_per_call(alpha, 1)) / 2
    assert theoretical_tokens_per_call_at_drafted(alpha, stats) == pytest.approx(expected)


def test_loop_breakdown_splits_the_overhead_from_metric_deltas():
    from trt_spec.bench.server import loop_breakdown

    loop = '{model="tensorrt_llm_bls"}'
    before = {f"trt_spec_loop_iterations_total{loop}": 10.0, f"trt_spec_loop_iteration_seconds_total{loop}": 1.0,
              f"trt_spec_loop_engine_wait_seconds_total{loop}": 0.9,
              'trt_spec_engine_execute_seconds_total{model="tensorrt_llm"}': 0.5,
              'trt_spec_engine_execute_seconds_total{model="tensorrt_llm_draft"}': 0.2}
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
