"""The projection (trt_spec/plan/projection.py) and the cost model it shares with the benchmark
(trt_spec/runtime/costs.py): its formulas by hand, the memory-bound regime and where it ends, the
same model fed this CPU's measured step costs against the speedup measured in the same run, and
the wide demo pair that `make demo` runs."""

from __future__ import annotations

import pytest
import torch
import yaml
from conftest import EXAMPLES
from test_twin import assert_same_greedy, reference_greedy

from trt_spec.bench.inprocess import BenchConfig, run_local_bench
from trt_spec.bench.rows import FixedRow
from trt_spec.checkpoints.config import ModelInfo
from trt_spec.gpus import GPUS
from trt_spec.plan import make_plan
from trt_spec.plan.projection import (
    ALLREDUCE_LATENCY_S,
    project_plan,
    roofline_step,
)
from trt_spec.runtime.costs import StepTimes, best_row, cost_model_rows
from trt_spec.runtime.loop import GenerationParams
from trt_spec.spec import load_spec, parse_spec
from trt_spec.twin import TwinPair

SMALL_PAIR = EXAMPLES / "pystdlib-pair"
WIDE_PAIR = EXAMPLES / "pystdlib-wide"
WIDE_NEW_TOKENS = 24  # the reference is one uncached forward pass per token: keep it short


def tiny_model(**overrides) -> ModelInfo:
    fields = dict(
        architecture="LlamaForCausalLM",
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        vocab_size=100,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        source="test",
    )
    return ModelInfo(**{**fields, **overrides})


# --- the cost model -----------------------------------------------------------------------------


def test_cost_model_rows_by_hand():
    """E = (1 - a^(K+1)) / (1 - a); speedup = E / (1 + K c + (r - 1)) = E t_1 / (K t_d + t_(K+1))."""
    times = StepTimes(target_1=10.0, target_by_num_tokens={2: 11.0, 4: 12.0}, draft_by_k={1: 1.0, 3: 2.0})
    rows = {row.k: row for row in cost_model_rows(0.5, times, [1, 3])}
    assert rows[1].tokens_per_target_call == pytest.approx(1.5)
    assert rows[3].tokens_per_target_call == pytest.approx((1 - 0.5**4) / 0.5)
    assert rows[1].draft_cost_ratio == pytest.approx(0.1) and rows[3].draft_cost_ratio == pytest.approx(0.2)
    assert rows[3].verify_cost_ratio == pytest.approx(1.2)
    assert rows[1].speedup == pytest.approx(1.5 / (1 + 0.1 + 0.1))
    assert rows[3].speedup == pytest.approx(1.875 * 10 / (3 * 2 + 12))
    assert best_row(rows.values()).k == 1


def test_best_row_prefers_the_smaller_k_on_a_tie():
    times = StepTimes(target_1=1.0, target_by_num_tokens={2: 1.0, 3: 1.0}, draft_by_k={1: 0.0, 2: 0.0})
    assert best_row(cost_model_rows(0.0, times, [2, 1])).k == 1


# --- one engine step on a GPU ----------------------------------------------------------------------


def test_step_cost_by_hand_at_tp_1():
    model, gpu = tiny_model(), GPUS["h100"]
    cost = roofline_step(model, tp_size=1, dtype="float16", gpu=gpu, num_tokens=3, context=100, batch=2)
    layer = 64 * 16 * (2 * 4 + 2 * 2) + 3 * 64 * 128  # attention + MLP
    streamed = 2 * (layer + 3 * 64) + 100 * 64  # two layers (with their norms) + lm_head; no embedding
    assert cost.weight_bytes == streamed * 2
    assert (
        cost.kv_bytes == (2 * 2 * 2 * 16 * 2) * 100 * 2
    )  # K and V x layers x KV heads x head size x bytes, x context x batch
    assert cost.flops == 2 * streamed * 6 + 4 * 2 * 4 * 16 * 100 * 6  # 6 = 3 tokens x batch 2
    assert cost.allreduce_s == 0
    assert cost.seconds(gpu) == pytest.approx((cost.weight_bytes + cost.kv_bytes) / 3.35e12)


def test_allreduce_formula_at_tp_4():
    """2 all-reduces per layer, each latency + 2 (tp - 1) / tp x tokens x hidden x bytes / NVLink."""
    model, gpu = tiny_model(num_heads=8, num_kv_heads=4), GPUS["h200"]
    cost = roofline_step(model, tp_size=4, dtype="bfloat16", gpu=gpu, num_tokens=5, context=10, batch=1)
    per_allreduce = ALLREDUCE_LATENCY_S + 2 * 3 / 4 * 5 * 64 * 2 / 450e9
    assert cost.allreduce_s == pytest.approx(2 * 2 * per_allreduce)


def test_verify_costs_one_step_while_memory_bound_and_not_past_the_ridge():
    spec = load_spec(EXAMPLES / "llama8b-1b-h200.yaml")
    the_plan = make_plan(spec)
    one = project_plan(the_plan, 0.7, batch=1)
    assert one.gpu.ridge_point == pytest.approx(989.4 / 4.8)
    assert all(row.verify_cost_ratio == pytest.approx(1.0) for row in one.rows)  # tp 1: no all-reduce bytes
    assert one.target.arithmetic_intensity < 2 and one.verify[8].arithmetic_intensity < 12
    assert 0.6 * one.gpu.ridge_point < one.memory_bound_tokens < one.gpu.ridge_point
    # 64 sequences of 256 tokens verifying 9 each = 576 tokens per step: compute-bound, verify
    # costs more. (At long contexts the batch's KV reads dominate instead: attention stays memory-bound.)
    wide = project_plan(the_plan, 0.7, batch=64, context=256)
    assert wide.verify[8].compute_s(wide.gpu) > wide.verify[8].memory_s(wide.gpu)
    assert wide.rows[-1].verify_cost_ratio > 2
    assert wide.recommended_k < one.recommended_k


def test_h200_bandwidth_shortens_every_memory_bound_step_alike():
    data = load_spec(EXAMPLES / "llama8b-1b-h200.yaml").model_dump()
    h200 = project_plan(make_plan(parse_spec(data)))
    data["engine"]["gpu"] = "h100"
    data["engine"].update(max_input_len=4096, max_seq_len=8192, max_batch_size=8)
    h100 = project_plan(make_plan(parse_spec(data)), context=h200.context)
    assert h100.step_times.target_1 / h200.step_times.target_1 == pytest.approx(4.8 / 3.35)
    assert [row.speedup for row in h100.rows] == pytest.approx([row.speedup for row in h200.rows])


def test_alpha_and_sizes_are_checked():
    the_plan = make_plan(load_spec(EXAMPLES / "llama8b-1b-h200.yaml"))
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="alpha"):
            project_plan(the_plan, bad)
    with pytest.raises(ValueError, match="at least 1"):
        project_plan(the_plan, 0.5, batch=0)
    assert project_plan(the_plan, 1.0).rows[-1].tokens_per_target_call == 9  # alpha 1: every draft accepted


# --- the same model fed this CPU's measured step costs ---------------------------------------------

# A shared 2-core machine: a burst of other work can spoil one run's timings (at a load average of
# 5-6 here, 7 of 8 single runs agreed within 15%), so a run may be repeated.
CPU_ATTEMPTS = 3
CPU_TOLERANCE = 0.15


@pytest.fixture
def one_thread():
    """One torch thread, as each engine model runs in Triton: steadier on a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_cost_model_fed_measured_step_costs_matches_the_measured_speedup(one_thread):
    """The cost model projection.py feeds with bytes over bandwidth, fed instead this CPU's t_1,
    t_(K+1), t_d and prefill times measured by the bench's in-process code and the run's own tokens
    per target call, predicts the speedup measured in the same run within 15% at its best K (the K
    the model picks). The prefill term matters here: 3 prompts x 32 tokens prefill once per ~12
    target calls, which the i.i.d. alpha figure alone (no prefill) overstates by 10-20%."""
    pair = TwinPair.from_dirs(SMALL_PAIR / "target", SMALL_PAIR / "draft")
    config = BenchConfig(
        ks=(1, 2, 3, 4),
        temperatures=(0.0,),
        num_prompts=3,
        max_new_tokens=32,
        repeats=4,  # rounds: each adds a block of step timings per prompt, for steadier means
        hf_assisted=False,
        adaptive=False,
    )
    seen = []
    for _ in range(CPU_ATTEMPTS):
        report = run_local_bench(pair, config)
        rows = [row for row in report.rows if isinstance(row, FixedRow)]
        best = max(rows, key=lambda row: row.cost_model_speedup)
        seen.append((best.k, round(best.speedup, 3), round(best.cost_model_speedup, 3)))
        if abs(best.speedup / best.cost_model_speedup - 1) <= CPU_TOLERANCE:
            return
    pytest.fail(f"(best K, measured, model) per attempt: {seen}; step times of the last: {report.step_times}")


def test_demo_summary_lines_explain_with_the_same_model():
    """The demo's two lines: the cost model fed this machine's step costs and the run's alpha, and
    the projection for the spec's GPU at that alpha."""
    from trt_spec.bench.demo import explain_here, explain_on_gpu

    times = StepTimes(target_1=0.0095, target_by_num_tokens={5: 0.0189}, draft_by_k={4: 0.0009})
    here = explain_here(1.13, 0.73, 4, times)
    assert "why x1.13" in here and "t_1 9.5 ms" in here and "t_5 18.9 ms (1.99 t_1)" in here
    assert "t_d 0.9 ms" in here and "alpha 0.73" in here
    assert f"x{times.speedup(0.73, 4):.2f}" in here
    the_plan = make_plan(load_spec(EXAMPLES / "pystdlib-wide.yaml"))
    gpu = explain_on_gpu(the_plan, 0.73, "examples/pystdlib-wide.yaml")
    projection = project_plan(the_plan, 0.73)
    assert gpu.startswith("  on H100 SXM (projection")
    assert f"K = 4 -> x{projection.rows[3].speedup:.2f}" in gpu and f"best K = {projection.recommended_k}" in gpu
    assert "trt-spec plan --spec examples/pystdlib-wide.yaml --alpha 0.73" in gpu


# --- the wide demo pair (make demo) ------------------------------------------------------------------


@pytest.fixture(scope="module")
def wide_pair():
    return TwinPair.from_dirs(WIDE_PAIR / "target", WIDE_PAIR / "draft")


def test_wide_pair_loads_and_plans():
    spec = load_spec(EXAMPLES / "pystdlib-wide.yaml")
    the_plan = make_plan(spec)
    assert the_plan.target.model.num_params == 21_600_768
    assert the_plan.draft.model.num_params == 1_411_712
    assert spec.target.local_dir(spec.source_dir) == WIDE_PAIR.resolve() / "target"
    assert spec.triton.flavor == "torch"


def test_wide_pair_greedy_equals_the_target_alone(wide_pair):
    from trt_spec.bench.prompts import load_prompts

    for prompt, k in zip(load_prompts(wide_pair, 2, 48), (4, 2)):
        reference, reference_logits = reference_greedy(wide_pair.target.model, prompt, WIDE_NEW_TOKENS)
        generation = wide_pair.generate(prompt, GenerationParams(max_new_tokens=WIDE_NEW_TOKENS, num_draft_tokens=k))
        assert_same_greedy(generation.run(), reference, reference_logits)
        assert generation.stats.accepted_tokens > 0


def test_projection_table_has_every_k():
    projection = project_plan(make_plan(load_spec(EXAMPLES / "pystdlib-wide.yaml")), 0.6, max_k=6)
    assert [row.k for row in projection.rows] == [1, 2, 3, 4, 5, 6]
    assert projection.best.speedup == max(row.speedup for row in projection.rows)
    assert projection.spec_k == 4 and projection.gpu.name == "H100 SXM"


def test_the_k_schedule_falls_with_requests_in_flight_and_stops_where_speculation_loses():
    from trt_spec.plan.projection import k_schedule, render_schedule

    data = yaml.safe_load((EXAMPLES / "llama70b-1b-4xh100.yaml").read_text())
    data["engine"]["max_batch_size"] = 256
    the_plan = make_plan(parse_spec(data, source_dir=EXAMPLES))
    steps = k_schedule(the_plan, 0.7, context=1024)
    assert [step.in_flight for step in steps] == list(range(1, 257))
    ks = [step.k for step in steps]
    assert ks == sorted(ks, reverse=True) and ks[0] > ks[-1] >= 1  # falls with load, capped by the built K
    assert ks[0] == project_plan(the_plan, 0.7, max_k=the_plan.spec.num_draft_tokens, context=1024).recommended_k
    # At a low acceptance no K beats plain decoding once many requests share a step.
    poor = k_schedule(the_plan, 0.15, context=1024)
    assert poor[-1].k == 0 and poor[-1].speedup == 1.0
    stop = next(step.in_flight for step in poor if step.k == 0)
    assert all(step.k == 0 for step in poor[stop - 1 :])
    text = "\n".join(render_schedule(poor, 0.15))
    assert f"speculation stops paying at {stop} requests in flight" in text and "K 0: plain decoding" in text


def test_plan_prints_the_k_schedule_and_its_json(tmp_path, monkeypatch):
    import json as json_module

    from click.testing import CliRunner

    from trt_spec.cli import main

    monkeypatch.chdir(tmp_path)
    spec = str(EXAMPLES / "llama70b-1b-4xh100.yaml")
    text = CliRunner().invoke(main, ["plan", "--spec", spec])
    assert text.exit_code == 0, text.output
    assert "K by requests in flight" in text.stdout and "in flight: K 5" in text.stdout
    data = json_module.loads(CliRunner().invoke(main, ["plan", "--spec", spec, "--json"]).stdout)
    assert [step["in_flight"] for step in data["k_schedule"]] == list(range(1, 9))
