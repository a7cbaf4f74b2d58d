"""Sampled speculative decoding through the tensorrtllm flavor is distributed as the target alone.

The demo pair with `acceptance: probabilistic`, its tensorrtllm-flavor repository served by the
real CPU Triton with the engine models in the TensorRT-LLM backend emulator, which verifies
drafts as TensorRT-LLM's external-draft-tokens layer does (q = softmax of the draft_logits it is
sent, p = the target's processed distribution). Two-token completions at temperature 0.7 with
top-k, top-p, a repetition and a presence penalty (and the default min_tokens 1: no EOS first):
each step drafts one token, so the first token always comes out of a
verification (accepted, or drawn from the residual) and the second from a verification or a plain
call. Their frequencies must match the target's exact two-token distribution within 6 sigma.
Sending the draft's raw logits instead of its processed distribution fails this test (seen: a
chi-square z-score of 29 against 1.3 with the fix).
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import DEMO_PAIR, serve_emulated, two_token_distribution

from trt_spec.client import SpecClient
from trt_spec.runtime.penalties import Penalties
from trt_spec.runtime.sampling import SamplingParams
from trt_spec.spec import parse_spec

pytest.importorskip("pytriton", reason="the CPU Triton server comes with nvidia-pytriton")

SAMPLING = SamplingParams(temperature=0.7, top_k=20, top_p=0.9)
PENALTIES = Penalties(repetition_penalty=1.3, presence_penalty=0.5, min_tokens=1)  # min_tokens: the default
PROMPT = "import "
NUM_REQUESTS = 1200
CLIENTS = 4
EOS = 0  # the demo tokenizer's <|endoftext|>


@pytest.fixture(scope="module")
def spec():
    return parse_spec(
        {
            "name": "pystdlib-prob",
            "target": {"model": str(DEMO_PAIR / "target")},
            "draft": {"model": str(DEMO_PAIR / "draft")},
            "speculative": {"num_draft_tokens": 4, "acceptance": "probabilistic"},
            "engine": {"max_batch_size": 8, "max_input_len": 512, "max_seq_len": 1024},
            "triton": {"flavor": "tensorrtllm"},
        }
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory, spec):
    running = serve_emulated(spec, tmp_path_factory.mktemp("prob"))
    try:
        yield running
    finally:
        running.stop()


def test_sampled_completions_follow_the_target_distribution(server):
    def run(indices: range) -> list[tuple[str, int, int]]:
        results = []
        with SpecClient(server.grpc_url) as client:
            for index in indices:
                events = list(
                    client.generate(
                        PROMPT,
                        max_tokens=2,
                        temperature=SAMPLING.temperature,
                        top_k=SAMPLING.top_k,
                        top_p=SAMPLING.top_p,
                        repetition_penalty=PENALTIES.repetition_penalty,
                        presence_penalty=PENALTIES.presence_penalty,
                        seed=index,
                    )
                )
                last = events[-1]
                results.append(
                    ("".join(e.text for e in events), last.total_draft_tokens, last.total_accepted_draft_tokens)
                )
        return results

    with ThreadPoolExecutor(CLIENTS) as pool:
        chunks = [range(start, NUM_REQUESTS, CLIENTS) for start in range(CLIENTS)]
        results = [result for chunk in pool.map(run, chunks) for result in chunk]
    drafted = sum(r[1] for r in results)
    accepted = sum(r[2] for r in results)
    assert drafted >= NUM_REQUESTS and 0 < accepted < drafted  # every request verified a draft

    expected = two_token_distribution(DEMO_PAIR / "target", PROMPT, SAMPLING, PENALTIES, EOS)
    counts = Counter(text for text, _, _ in results)
    unexpected = sum(count for text, count in counts.items() if text not in expected)
    assert unexpected <= 0.01 * NUM_REQUESTS, {t: c for t, c in counts.items() if t not in expected}
    for text, p in expected.items():
        if p < 0.01:
            continue
        sigma = (NUM_REQUESTS * p * (1 - p)) ** 0.5
        assert abs(counts[text] - NUM_REQUESTS * p) <= 6 * sigma, (text, counts[text], NUM_REQUESTS * p)
    # All bins at once: Pearson's chi-square over the completions expected >= 5 times (the rest
    # pooled), as a z-score by its normal approximation (mean df, variance 2 df).
    bins = [text for text, p in expected.items() if NUM_REQUESTS * p >= 5]
    observed = [counts[text] for text in bins] + [NUM_REQUESTS - sum(counts[text] for text in bins)]
    means = [NUM_REQUESTS * expected[text] for text in bins]
    means.append(NUM_REQUESTS - sum(means))
    chi_square = sum((o - m) ** 2 / m for o, m in zip(observed, means))
    df = len(means) - 1
    assert (chi_square - df) / (2 * df) ** 0.5 <= 6, (chi_square, df)
