"""Long sequences and concurrent load on the tensorrtllm flavor, through the real (CPU) Triton
server with its engine models in the TensorRT-LLM backend emulator: prompts near the spec's
``max_input_len`` generating until ``max_seq_len``, alone and eight at once, on a greedy spec and
a probabilistic one, and a prompt-lookup spec without a draft model (probabilistic: sampled lookup
drafts reach the target as one-hot draft_logits; the spec keeps the suite fast: max_seq_len 640,
the demo pair).

Each loop iteration resends the whole sequence, so the engines are built with an input limit of
``max_seq_len - 1`` (``plan.engine_max_input_len``); concurrent calls reach the emulated executor
together, whose scheduler discards drafts under load, and the loop counts only the drafts the
target reports it verified. One server per spec."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import DEMO_PAIR, decode, greedy_reference, serve_emulated

from trt_spec.bench.long_sequences import MAX_INPUT_LEN, MAX_SEQ_LEN, long_sequence_spec
from trt_spec.bench.long_sequences import long_prompts as long_sequence_prompts
from trt_spec.client import SpecClient
from trt_spec.errors import GenerationError

pytest.importorskip("pytriton", reason="the CPU Triton server comes with nvidia-pytriton")

CONCURRENT = 8


# (acceptance, speculative.method) of each served spec
SPECS = {
    "greedy": ("greedy", "draft_target"),
    "probabilistic": ("probabilistic", "draft_target"),
    "lookup": ("probabilistic", "prompt_lookup"),
}


@pytest.fixture(scope="module", params=list(SPECS))
def server(request, tmp_path_factory):
    acceptance, method = SPECS[request.param]
    spec = long_sequence_spec(DEMO_PAIR, acceptance, method)
    running = serve_emulated(spec, tmp_path_factory.mktemp(request.param))
    try:
        yield acceptance, running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def long_prompts(target) -> list[str]:
    return long_sequence_prompts(target[1], CONCURRENT)


def room(target, prompt: str) -> int:
    """max_tokens that takes the request to max_seq_len exactly."""
    return MAX_SEQ_LEN - len(target[1](prompt)["input_ids"])


def generate(server, prompt: str, max_tokens: int, **options):
    with SpecClient(server.grpc_url, timeout_s=600) as client:
        events = list(client.generate(prompt, max_tokens=max_tokens, **options))
    return "".join(event.text for event in events), events[-1]


def test_a_prompt_near_max_input_len_generates_to_max_seq_len_as_the_target_alone(server, target, long_prompts):
    _, running = server
    prompt = long_prompts[0]
    assert len(target[1](prompt)["input_ids"]) > 0.9 * MAX_INPUT_LEN
    max_tokens = room(target, prompt)
    reference = greedy_reference(target, prompt, max_tokens)
    assert len(reference) == max_tokens, "the target alone ends before max_seq_len: pick another prompt"
    text, last = generate(running, prompt, max_tokens)
    assert last.num_output_tokens == max_tokens  # finished for "length", not cut short
    assert text == decode(target, reference)


def test_eight_long_requests_at_once_each_equal_their_lone_run(server, target, long_prompts):
    _, running = server
    cases = [(prompt, room(target, prompt)) for prompt in long_prompts]
    with ThreadPoolExecutor(CONCURRENT) as pool:
        answers = list(pool.map(lambda case: generate(running, *case), cases))
    for (prompt, max_tokens), (text, last) in zip(cases, answers):
        reference = greedy_reference(target, prompt, max_tokens)
        assert last.num_output_tokens == len(reference), "a request ended early"
        assert text == decode(target, reference)
    # The load was real: the emulated scheduler discarded drafts (upstream's debug line, logged).
    assert "Discarding" in running.log_path.read_text()


def test_sampled_long_requests_at_once_all_finish(server, target, long_prompts):
    acceptance, running = server
    cases = [(prompt, room(target, prompt)) for prompt in long_prompts[:4]]
    with ThreadPoolExecutor(len(cases)) as pool:
        answers = list(pool.map(lambda case: generate(running, *case, temperature=0.8, seed=len(case[0])), cases))
    for (_, max_tokens), (text, last) in zip(cases, answers):
        assert 0 < last.num_output_tokens <= max_tokens and text
        if acceptance == "probabilistic":
            assert last.total_draft_tokens > 0  # sampled requests speculate with the drafts' distributions


def test_log_probs_are_refused_clearly_when_the_engines_have_no_generation_logits(server, target, long_prompts):
    acceptance, running = server
    if acceptance == "probabilistic":
        _, last = generate(running, long_prompts[0][:200], 8, return_log_probs=True)
        assert len(last.log_probs) > 0
        return
    with pytest.raises(GenerationError, match=r"speculative\.acceptance: probabilistic"):
        generate(running, long_prompts[0][:200], 8, return_log_probs=True)
