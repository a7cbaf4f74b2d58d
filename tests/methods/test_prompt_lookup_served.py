"""A prompt-lookup spec (no draft model) served by the real CPU Triton, in the torch flavor and in the
tensorrtllm flavor with its engine models in the TensorRT-LLM backend emulator (the target engine
gets the lookup's drafts as ``draft_input_ids``, and for sampled requests their point mass as
one-hot ``draft_logits``): greedy output equals the target alone on 10 prompts and on 8 concurrent
streams, sampled output follows the target's distribution."""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import DEMO_PAIR, chi_square_z, decode, greedy_reference, serve_emulated, two_token_distribution

from trt_spec.bench.prompts import prompt_texts
from trt_spec.client import SpecClient
from trt_spec.repository.writer import write_repository
from trt_spec.runtime import tensors as T
from trt_spec.runtime.penalties import Penalties
from trt_spec.runtime.sampling import SamplingParams
from trt_spec.serving.metrics import samples, scrape
from trt_spec.serving.server import TritonServer
from trt_spec.spec import parse_spec

pytest.importorskip("pytriton", reason="the CPU Triton server comes with nvidia-pytriton")

NEW_TOKENS = 32
COPY_PROMPT = (
    "def read_text(path):\n    with open(path) as f:\n        return f.read()\n\n\n"
    "def read_bytes(path):\n    with open(path, 'rb') as f:\n"
)
SAMPLING = SamplingParams(temperature=0.8, top_k=30)
PENALTIES = Penalties(min_tokens=1)  # the ensemble's default
SAMPLED_PROMPT = "import os\nimport"  # the lookup proposes " os" after "import"
NUM_SAMPLED = 600


def lookup_spec(flavor: str):
    return parse_spec(
        {
            "name": f"lookup-{flavor}",
            "target": {"model": str(DEMO_PAIR / "target")},
            # probabilistic: the tensorrtllm flavor's engines take draft_logits (the lookup's point mass)
            "speculative": {"method": "prompt_lookup", "num_draft_tokens": 4, "acceptance": "probabilistic"},
            "engine": {"max_batch_size": 8, "max_input_len": 512, "max_seq_len": 1008},
            "triton": {"flavor": flavor},
        }
    )


@pytest.fixture(scope="module", params=["torch", "tensorrtllm"])
def server(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"lookup-{request.param}")
    spec = lookup_spec(request.param)
    if request.param == "torch":
        repo = write_repository(spec, root / "repo", "torch").path
        assert not (repo / T.DRAFT).exists()
        running = TritonServer(repo, ready_timeout_s=300).start()
    else:
        running = serve_emulated(spec, root)
    try:
        yield running
    finally:
        running.stop()


def generate(server, prompt: str, **options):
    with SpecClient(server.grpc_url) as client:
        return list(client.generate(prompt, **options))


def test_greedy_equals_the_target_alone_on_ten_prompts(server, target):
    prompts = [COPY_PROMPT, *prompt_texts(9, 200)]
    before = drafts_by_source(server)
    drafted = accepted = 0
    for prompt in prompts:
        events = generate(server, prompt, max_tokens=NEW_TOKENS)
        assert "".join(event.text for event in events) == decode(target, greedy_reference(target, prompt, NEW_TOKENS))
        last = events[-1]
        drafted += last.total_draft_tokens
        accepted += last.total_accepted_draft_tokens
        # Every draft is the lookup's: the per-request split says so.
        assert (last.total_lookup_draft_tokens, last.total_accepted_lookup_draft_tokens) == (
            last.total_draft_tokens,
            last.total_accepted_draft_tokens,
        )
    assert drafted > 0 and accepted > 0  # the lookup drafted, and the target kept some
    # The metrics port counts them by source (updated off the loop's path: wait for the last).
    deadline = time.monotonic() + 10
    while (after := drafts_by_source(server))[("drafted", "prompt_lookup")] - before[
        ("drafted", "prompt_lookup")
    ] < drafted and time.monotonic() < deadline:
        time.sleep(0.1)
    assert after[("drafted", "prompt_lookup")] - before[("drafted", "prompt_lookup")] == drafted
    assert after[("accepted", "prompt_lookup")] - before[("accepted", "prompt_lookup")] == accepted
    assert after[("drafted", "draft_model")] == before[("drafted", "draft_model")]  # no draft model here


BY_SOURCE = {
    "trt_spec_loop_draft_tokens_by_source_total": "drafted",
    "trt_spec_loop_accepted_draft_tokens_by_source_total": "accepted",
}


def drafts_by_source(server) -> Counter:
    """The loop's by-source counters: ("drafted" | "accepted", source) -> tokens."""
    deadline = time.monotonic() + 30  # Triton starts its metrics server after the HTTP one
    while True:
        try:
            text = scrape(server.metrics_url)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    counts: Counter = Counter()
    for sample in samples(text):
        if sample.name in BY_SOURCE:
            counts[(BY_SOURCE[sample.name], sample.label("source"))] += int(sample.value)
    return counts


def test_eight_concurrent_streams_each_equal_the_target_alone(server, target):
    prompts = [COPY_PROMPT, *prompt_texts(7, 200)]
    expected = [decode(target, greedy_reference(target, prompt, NEW_TOKENS)) for prompt in prompts]
    with ThreadPoolExecutor(len(prompts)) as pool:
        outputs = list(pool.map(lambda p: "".join(e.text for e in generate(server, p, max_tokens=NEW_TOKENS)), prompts))
    assert outputs == expected


def test_sampled_output_follows_the_target_distribution(server):
    def run(indices: range) -> list[tuple[str, int]]:
        results = []
        with SpecClient(server.grpc_url) as client:
            for index in indices:
                events = list(
                    client.generate(
                        SAMPLED_PROMPT,
                        max_tokens=2,
                        temperature=SAMPLING.temperature,
                        top_k=SAMPLING.top_k,
                        seed=index,
                    )
                )
                results.append(("".join(e.text for e in events), events[-1].total_draft_tokens))
        return results

    with ThreadPoolExecutor(4) as pool:
        results = [r for chunk in pool.map(run, [range(s, NUM_SAMPLED, 4) for s in range(4)]) for r in chunk]
    assert sum(drafted for _, drafted in results) >= NUM_SAMPLED  # every request verified a lookup draft
    expected = two_token_distribution(DEMO_PAIR / "target", SAMPLED_PROMPT, SAMPLING, PENALTIES, 0)
    assert chi_square_z(Counter(text for text, _ in results), expected, NUM_SAMPLED) <= 6


def test_bench_over_the_server_labels_its_rows_with_the_servers_method(server):
    """bench --url: the lookup's speculation against plain decoding on the same server, rows marked
    with the method the server's loop model runs."""
    from trt_spec.bench.server import ServerBenchConfig, run_server_bench

    config = ServerBenchConfig(
        ks=(4,), temperatures=(0.0,), concurrency=(2,), num_prompts=2, max_new_tokens=16, prompts=(COPY_PROMPT,) * 2
    )
    rows = run_server_bench(server.grpc_url, config, metrics_url=server.metrics_url).rows
    assert [(row.method, row.k, row.concurrency) for row in rows] == [("prompt_lookup", 4, 1), ("prompt_lookup", 4, 2)]
    assert all(row.speedup is not None and row.acceptance_rate > 0 for row in rows)
    assert rows[0].to_json()["method"] == "prompt_lookup"
