"""The torch-flavor repository of the demo pair served by the real Triton server (the CPU build
bundled in nvidia-pytriton): the ensemble streams exactly the target's greedy output, serves
concurrent streams, reproduces seeded sampling, refuses bad requests alone, stops a cancelled
request, and publishes its metrics. One server for the whole module."""

from __future__ import annotations

import concurrent.futures
import json
import re
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import EXAMPLES, decode, greedy_reference, parsed_parameters

from trt_spec.bench.prompts import prompt_texts
from trt_spec.cli import main
from trt_spec.client import SpecClient
from trt_spec.errors import GenerationError
from trt_spec.repository.writer import write_repository
from trt_spec.runtime import tensors as T
from trt_spec.serving.server import TritonServer
from trt_spec.spec import load_spec

pytest.importorskip("pytriton", reason="the CPU Triton server comes with nvidia-pytriton")
grpcclient = pytest.importorskip("tritonclient.grpc")

NEW_TOKENS = 40


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    result = write_repository(load_spec(EXAMPLES / "pystdlib-demo.yaml"), root / "repo", "torch")
    # Triton waits exit_timeout_s for in-flight requests: with 30 s, a quick stop means none was
    # left behind, the cancelled one included.
    running = TritonServer(result.path, ready_timeout_s=300, exit_timeout_s=30).start()
    try:
        yield running
    finally:
        started = time.monotonic()
        running.stop()
    assert time.monotonic() - started < 20


@pytest.fixture(scope="module")
def prompts():
    return prompt_texts(8, 200)


def generate(server, prompt: str, **options):
    with SpecClient(server.grpc_url) as client:
        return list(client.generate(prompt, **options))


def metrics(server) -> dict[str, float]:
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        text = response.read().decode()
    return {
        line.rpartition(" ")[0]: float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line.startswith("trt_spec_")
    }


def metric(values: dict[str, float], prefix: str) -> float:
    return sum(value for name, value in values.items() if name.startswith(prefix))


# --- exactness ------------------------------------------------------------------------------------


@pytest.mark.parametrize("index", range(3))
def test_greedy_stream_equals_the_target_alone(server, target, prompts, index):
    reference = greedy_reference(target, prompts[index], NEW_TOKENS)
    events = generate(server, prompts[index], max_tokens=NEW_TOKENS)
    assert "".join(event.text for event in events) == decode(target, reference)
    last = events[-1]
    assert last.num_output_tokens == len(reference)  # token for token, not just the same text
    assert last.total_draft_tokens > 0 and last.total_accepted_draft_tokens > 0
    assert last.acceptance_rate == pytest.approx(last.total_accepted_draft_tokens / last.total_draft_tokens)
    assert last.num_target_calls < len(reference)  # drafts were accepted: fewer target calls than tokens
    assert len(events) > 1  # streamed, several responses


def test_plain_decoding_and_stream_false(server, target, prompts):
    reference = decode(target, greedy_reference(target, prompts[0], NEW_TOKENS))
    plain = generate(server, prompts[0], max_tokens=NEW_TOKENS, num_draft_tokens=0)
    assert "".join(event.text for event in plain) == reference
    assert plain[-1].total_draft_tokens == 0 and plain[-1].num_target_calls == plain[-1].num_output_tokens
    whole = generate(server, prompts[0], max_tokens=NEW_TOKENS, stream=False)
    assert len(whole) == 1 and whole[0].text == reference
    assert whole[0].num_output_tokens == plain[-1].num_output_tokens


def test_concurrent_streams_each_get_their_own_output(server, target, prompts):
    expected = [decode(target, greedy_reference(target, prompt, 32)) for prompt in prompts]
    outputs: list[str | None] = [None] * len(prompts)
    responses = [0] * len(prompts)
    first, last = [0.0] * len(prompts), [0.0] * len(prompts)

    def one(index: int) -> None:
        events = generate(server, prompts[index], max_tokens=32)
        outputs[index] = "".join(event.text for event in events)
        responses[index] = len(events)
        first[index], last[index] = events[0].arrival_s, events[-1].arrival_s

    before = metrics(server)
    threads = [threading.Thread(target=one, args=(index,)) for index in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert outputs == expected
    assert all(count > 1 for count in responses)
    # Served together, not one after another: most streams had started before any ended.
    assert sum(start < min(last) for start in first) >= len(prompts) // 2
    # ... and batched in flight: the engines' forward passes ran several requests each (the loops
    # alternate draft and target calls, so each engine sees a share of them at a time).
    time.sleep(0.5)  # the engine models count a step's requests after their responses
    after = metrics(server)
    for engine in (T.TARGET, T.DRAFT):

        def delta(name: str, engine: str = engine) -> float:
            series = f'{name}{{model="{engine}"}}'
            return metric(after, series) - metric(before, series)

        width = delta("trt_spec_engine_step_requests_total") / delta("trt_spec_engine_steps_total")
        assert width > 1.3, (engine, width)  # 1.0 when each request runs alone


def test_plain_requests_at_once_each_equal_the_target_alone(server, target, prompts):
    # Not streamed and num_draft_tokens 0: the loop asks the target for all the tokens in one call,
    # and the engine decodes the eight requests together, one forward pass per token for all.
    expected = [decode(target, greedy_reference(target, prompt, 32)) for prompt in prompts]
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        answers = list(
            pool.map(lambda p: generate(server, p, max_tokens=32, num_draft_tokens=0, stream=False), prompts)
        )
    assert ["".join(event.text for event in events) for events in answers] == expected
    assert all(events[-1].num_target_calls == 1 for events in answers)


def test_seeded_sampling_is_reproducible(server, prompts):
    def sample(seed: int) -> str:
        return "".join(e.text for e in generate(server, prompts[1], max_tokens=24, temperature=1.0, seed=seed))

    first = sample(11)
    assert sample(11) == first
    assert any(sample(seed) != first for seed in (12, 13, 14))


def test_stop_word_ends_the_completion(server, target, prompts):
    reference = greedy_reference(target, prompts[2], NEW_TOKENS)
    tokenizer = target[1]
    index = next(
        i
        for i in range(3, len(reference))
        if tokenizer(decode(target, [reference[i]]), add_special_tokens=False)["input_ids"] == [reference[i]]
        and reference[i] not in reference[:i]
    )
    stop = decode(target, [reference[index]])
    events = generate(server, prompts[2], max_tokens=NEW_TOKENS, stop_words=[stop])
    assert "".join(event.text for event in events) == decode(target, reference[: index + 1])


# --- bad requests, cancellation, metrics ----------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "options", "message"),
    [
        ("x", {"max_tokens": 0}, "max_tokens must be >= 1; got 0"),
        ("x", {"max_tokens": 4, "num_draft_tokens": 9}, "max_draft_len 4; got 9"),
        ("", {"max_tokens": 4}, "text_input is empty"),
        ("x = 1\n" * 200, {"max_tokens": 4}, "over the engine's max_input_len 512"),
        ("x", {"max_tokens": 4, "top_p": 0.0}, "top_p must be in (0, 1]"),
    ],
)
def test_bad_request_gets_one_clear_error_and_the_server_keeps_serving(server, prompt, options, message):
    with pytest.raises(GenerationError) as caught:
        generate(server, prompt, **options)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value) and "Traceback" not in str(caught.value)
    assert generate(server, "def f():\n", max_tokens=4)[-1].num_output_tokens == 4


def test_wrong_dtype_is_refused_by_triton(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    text = grpcclient.InferInput("text_input", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"x"]], dtype=object))
    tokens = grpcclient.InferInput("max_tokens", [1, 1], "FP32")
    tokens.set_data_from_numpy(np.array([[4.0]], dtype=np.float32))
    answers = []
    client.start_stream(callback=lambda result=None, error=None: answers.append((result, error)))
    client.async_stream_infer(T.ENSEMBLE, [text, tokens])  # the ensemble is decoupled: streaming API
    deadline = time.monotonic() + 30
    while not answers and time.monotonic() < deadline:
        time.sleep(0.05)
    client.stop_stream()
    assert answers and answers[0][1] is not None
    assert "max_tokens" in answers[0][1].message() and "FP32" in answers[0][1].message()
    assert generate(server, "def f():\n", max_tokens=2)[-1].num_output_tokens == 2


def test_cancelled_stream_stops_drafting(server, prompts):
    before = metrics(server)
    with SpecClient(server.grpc_url) as client:
        stream = client.generate(prompts[3], max_tokens=900, num_draft_tokens=1)
        seen = [next(stream), next(stream)]
        stream.close()  # the client leaves: the request is cancelled on the server
    assert seen[-1].num_output_tokens < 20
    deadline = time.monotonic() + 30
    while metric(metrics(server), 'trt_spec_loop_requests_total{model="spec_loop",outcome="cancelled"}') <= metric(
        before, 'trt_spec_loop_requests_total{model="spec_loop",outcome="cancelled"}'
    ):
        assert time.monotonic() < deadline, "the loop model never saw the cancellation"
        time.sleep(0.1)
    after = metrics(server)
    generated = metric(after, "trt_spec_loop_output_tokens_total") - metric(before, "trt_spec_loop_output_tokens_total")
    assert generated < 200  # stopped long before its 900 tokens
    assert generate(server, "def f():\n", max_tokens=4)[-1].num_output_tokens == 4


def test_metrics_on_the_metrics_port(server, prompts):
    generate(server, prompts[0], max_tokens=16)
    values = metrics(server)
    for name in (
        "trt_spec_loop_iterations_total",
        "trt_spec_loop_target_calls_total",
        "trt_spec_loop_draft_tokens_total",
        "trt_spec_loop_accepted_draft_tokens_total",
        "trt_spec_loop_output_tokens_total",
        "trt_spec_engine_execute_seconds_total",
    ):
        assert metric(values, name) > 0, name
    assert 0 < metric(values, "trt_spec_loop_acceptance_rate") <= 1
    assert metric(values, "trt_spec_loop_tokens_per_target_call") >= 1
    assert metric(values, 'trt_spec_loop_requests_total{model="spec_loop",outcome="finished"}') >= 1


# --- the CLI against the server ------------------------------------------------------------------


def test_cli_generate_over_grpc(server, target, prompts):
    result = CliRunner().invoke(main, ["generate", "--url", server.grpc_url, "--max-tokens", "24", prompts[0]])
    assert result.exit_code == 0, result.output
    assert result.stdout == decode(target, greedy_reference(target, prompts[0], 24)) + "\n"
    assert re.search(r"24 tokens in .* target calls .*acceptance_rate", result.stderr)


def test_cli_generate_reports_an_unreachable_server():
    from trt_spec.serving.server import free_port

    result = CliRunner().invoke(main, ["generate", "--url", f"127.0.0.1:{free_port()}", "x"])
    assert result.exit_code == 1 and "no Triton server answers" in result.stderr


def test_cli_bench_over_grpc_on_the_users_prompts(server):
    # The served tokenizer (the repository's copy) counts the dataset's prompts; the prompts sent are
    # the dataset's (their first-token acceptance differs from the packaged prompts' run below).
    dataset = Path(__file__).parent / "data" / "workloads" / "python_prompts.jsonl"
    tokenizer = server.repo / "spec_preprocessing" / "1" / "tokenizer"
    args = ["bench", "--url", server.grpc_url, "--metrics-url", server.metrics_url, "--dataset", str(dataset)]
    args += ["--tokenizer", str(tokenizer), "--prompts", "3", "--max-tokens", "12", "--concurrency", "2", "--json"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "workload: 3 prompts from" in result.stderr and "(plain, 8 records, seed 0)" in result.stderr
    rows = json.loads(result.stdout)
    assert [row["concurrency"] for row in rows] == [1, 2]
    assert all(0 < row["alpha"] <= 1 and row["tokens_per_target_call"] >= 1 for row in rows)


def test_tune_measures_the_torch_flavors_k_schedule_through_the_server(server, tmp_path):
    # tune --url: each K against plain decoding at each load; repo --tuning writes the schedule into
    # the torch flavor's loop, plan --tuning prints it.
    from trt_spec.plan.tuning import load_tuning
    from trt_spec.repository.configs import read_config
    from trt_spec.runtime.parameters import LoopParameters

    spec_path = EXAMPLES / "pystdlib-demo.yaml"
    report_path = tmp_path / "tuning.json"
    args = ["tune", "--spec", str(spec_path), "--url", server.grpc_url, "--in-flight", "3", "-k", "1", "-k", "2"]
    args += ["--prompts", "3", "--max-tokens", "12", "--threads", "1", "-o", str(report_path)]
    args += ["--method", "draft_target"]  # the spec's own; every method is measured in tests/test_tuning.py
    args += ["--no-stream"]  # as a non-streaming client asks: plain decoding many tokens a call
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    report = load_tuning(report_path)
    measured = report.measured_schedule
    assert measured is not None and measured.url == server.grpc_url and measured.stream is False
    # K 1 and 2 asked, and the spec's K 4 (the loop's default), at 1 and 3 requests in flight.
    assert [(p.in_flight, sorted(p.speedups)) for p in measured.points] == [(1, [1, 2, 4]), (3, [1, 2, 4])]
    assert all(speedup > 0 for p in measured.points for speedup in p.speedups.values())
    assert "K by requests in flight, measured through" in result.stdout
    print("\n" + "\n".join(measured.render(4, 8)))

    out = tmp_path / "repo"
    args = ["repo", "--spec", str(spec_path), "--flavor", "torch", "-o", str(out), "--tuning", str(report_path)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    loop = parsed_parameters(LoopParameters, read_config(out / T.LOOP / "config.pbtxt"))
    alone, loaded = (point.best_k for point in measured.points)
    if alone == 0:  # no K paid alone: the spec's K stays alone, and 3 in flight gets what it measured
        assert loop.schedule == (() if loaded == 4 else (4, 4) + (loaded,) * 6)
    else:
        assert len(loop.schedule) == 8 and loop.schedule[:2] == (4, 4)  # the spec's K until 3 in flight
        assert set(loop.schedule[2:]) == {4 if loaded >= alone else loaded}
        assert "note: the loop runs K" in result.stdout
    plan = CliRunner().invoke(main, ["plan", "--spec", str(spec_path), "--tuning", str(report_path), "--json"])
    assert json.loads(plan.stdout)["measured_loop_k_schedule"] == list(loop.schedule)


def test_cli_bench_over_grpc(server):
    result = CliRunner().invoke(
        main,
        [
            "bench",
            "--url",
            server.grpc_url,
            "--metrics-url",
            server.metrics_url,
            "--prompts",
            "2",
            "--max-tokens",
            "12",
            "--concurrency",
            "2",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    keys = {
        "k",
        "temperature",
        "tokens_per_s",
        "baseline_tokens_per_s",
        "speedup",
        "acceptance_rate",
        "alpha",
        "tokens_per_target_call",
        "theoretical_tokens_per_target_call",
        "hf_assisted_tokens_per_s",
        "cost_model_speedup",
        "ttft_ms",
        "itl_ms",
        "concurrency",
    }
    assert [row["concurrency"] for row in rows] == [1, 2]
    for row in rows:
        assert keys <= set(row) and row["k"] == 4
        assert row["tokens_per_s"] > 0 and row["baseline_tokens_per_s"] > 0 and row["ttft_ms"] > 0
        assert 0 < row["alpha"] < 1 and row["hf_assisted_tokens_per_s"] is None
    assert rows[0]["loop_overhead_ms_per_iteration"] > 0 and rows[0]["engine_time_source"] == "trt_spec"
    own, transport = rows[0]["loop_own_ms_per_iteration"], rows[0]["bls_transport_ms_per_iteration"]
    assert own > 0 and transport > 0
    assert own + transport == pytest.approx(rows[0]["loop_overhead_ms_per_iteration"])


def test_demo_runs_end_to_end_and_leaves_nothing_behind():
    import subprocess
    import sys

    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "trt-spec"),
            "demo",
            "--spec",
            str(EXAMPLES / "pystdlib-demo.yaml"),
            "--max-tokens",
            "8",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    for step in ("== check", "== plan", "== repo", "== serve", "== generate", "== summary", "== stop"):
        assert step in result.stdout, step
    assert re.search(r"speculative: \d+ tokens/s, acceptance 0\.\d+", result.stdout)
    assert "speedup x" in result.stdout
    workdir = Path(re.search(r"torch flavor in (\S+)/model_repo", result.stdout).group(1))
    assert workdir.name.startswith("trt-spec-demo-") and not workdir.exists()  # nothing left behind
