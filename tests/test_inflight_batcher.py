"""In-flight batching of the torch engine models: requests in flight together run in one forward
pass per step, within max_batch_size and max_num_tokens, and each computes exactly what it
computes alone (greedy tokens, sampled tokens from its own generator, logits)."""

from __future__ import annotations

import threading

import pytest
import torch
from test_twin import PROMPT, VOCAB, tiny_llama

from trt_spec.runtime.inflight_batcher import InflightBatcher
from trt_spec.runtime.sampling import SamplingParams
from trt_spec.runtime.torch_engine import TorchCausalLM
from trt_spec.runtime.twin_engine import EngineRequest, EngineRequestError, TwinEngine

K = 4
MAX_SEQ_LEN = 120


@pytest.fixture(scope="module")
def target():
    return tiny_llama(2, seed=0)


def engine(model, runner: str = "llama", slots: int = 4, gemm_dtype: torch.dtype | None = None) -> TwinEngine:
    return TwinEngine(
        TorchCausalLM(model, runner=runner, gemm_dtype=gemm_dtype),
        "target",
        max_draft_len=K,
        max_seq_len=MAX_SEQ_LEN,
        cache_slots=slots,
    )


def request(prompt, output_len, *, drafts=(), sampled=False, seed=None, logits=False) -> EngineRequest:
    return EngineRequest(
        sequence=list(prompt),
        request_output_len=output_len,
        draft_tokens=list(drafts),
        draft_logits=None,
        end_id=None,
        sampling=SamplingParams(temperature=0.9, top_k=20) if sampled else SamplingParams(),
        seed=seed,
        return_generation_logits=logits,
        exclude_input_in_output=True,
        stop_sequences=(),
    )


def generator(seed: int | None) -> torch.Generator | None:
    return None if seed is None else torch.Generator().manual_seed(seed)


def mixed_requests() -> list[tuple[EngineRequest, int | None]]:
    """What concurrent loops send: long and short contexts, plain decodes, K + 1 verifications
    (resending their prefix), greedy and sampled, some sharing a prompt."""
    long_prompt = [(7 * i + 3) % VOCAB for i in range(70)]
    out = []
    for index in range(12):
        prompt = (long_prompt if index % 3 == 0 else PROMPT * (1 + index % 4))[: 20 + 5 * index]
        sampled = index % 2 == 1
        seed = 100 + index if sampled else None
        if index % 4 == 2:
            out.append((request(prompt, K + 1, drafts=[(index + j) % VOCAB for j in range(K)], logits=True), seed))
        else:
            out.append((request(prompt, 6 + index % 5, sampled=sampled, seed=seed, logits=True), seed))
    return out


def alone(model, runner, req, seed, gemm_dtype=None):
    return engine(model, runner, gemm_dtype=gemm_dtype).run(req, generator(seed))


@pytest.mark.parametrize(
    "runner, gemm",
    [("llama", None), ("hf", None), ("llama", "bfloat16 onednn"), ("llama", "bfloat16 blas")],
)
def test_batched_requests_compute_what_they_compute_alone(target, runner, gemm, monkeypatch):
    from trt_spec.runtime import torch_engine

    gemm_dtype = None
    if gemm is not None:  # the spec's engine.dtype bfloat16 (torch_engine.compute_dtypes), on either kernel
        monkeypatch.setattr(torch_engine._Linear, "ONEDNN_MIN_ELEMENTS", 0 if "onednn" in gemm else 1 << 62)
        gemm_dtype = torch.bfloat16
    requests = mixed_requests()
    expected = [alone(target, runner, req, seed, gemm_dtype) for req, seed in requests]
    batched = engine(target, runner, gemm_dtype=gemm_dtype)
    if gemm == "bfloat16 onednn" and not torch_engine._onednn_suits(torch.zeros(1, 1), torch.bfloat16):
        pytest.skip("this torch build has no oneDNN bfloat16 prepacked linear")
    batcher = InflightBatcher(batched, max_batch_size=4, max_num_tokens=32)
    answers: dict[int, object] = {}
    for index, (req, seed) in enumerate(requests):
        batcher.submit(
            req, generator(seed), lambda answer, error, index=index: answers.__setitem__(index, (answer, error))
        )
    while batcher.busy:
        batcher.step()
    for index, want in enumerate(expected):
        answer, error = answers[index]
        assert error is None
        assert answer.tokens == want.tokens, index
        # bfloat16 on oneDNN: bit for bit (torch_engine._Linear; the float32 MKL path sums rows apart)
        tolerance = 0.0 if gemm == "bfloat16 onednn" else 1e-5
        for got_row, want_row in zip(answer.logits, want.logits):
            torch.testing.assert_close(got_row, want_row, rtol=0, atol=tolerance)
    stats = batcher.stats
    assert stats.widest == 4  # max_batch_size in flight, and no more
    lone_steps = sum(len(want.tokens) if not req.draft_tokens else 1 for (req, _), want in zip(requests, expected))
    assert stats.steps < lone_steps / 2  # requests shared steps
    assert stats.rows <= stats.steps * 32  # max_num_tokens per step


def test_long_contexts_are_chunked_within_max_num_tokens(target):
    prompt = [(5 * i + 1) % VOCAB for i in range(90)]
    batched = engine(target)
    batcher = InflightBatcher(batched, max_batch_size=2, max_num_tokens=16)
    got = []
    batcher.submit(request(prompt, 3), None, lambda answer, error: got.append(answer))
    steps = 0
    while batcher.busy:
        batcher.step()
        steps += 1
    assert got[0].tokens == alone(target, "llama", request(prompt, 3), None).tokens
    assert steps >= 90 // 16 + 2  # ceil(89/16) chunks, then the decode steps


def test_a_refused_request_fails_alone(target):
    batcher = InflightBatcher(engine(target), max_batch_size=4, max_num_tokens=64)
    results = []
    good = request(PROMPT, 5)
    bad = request(PROMPT, 5, drafts=[VOCAB + 3])  # outside the vocabulary
    too_long = request(PROMPT, MAX_SEQ_LEN)
    for req in (good, bad, too_long, good):
        batcher.submit(req, None, lambda answer, error: results.append((answer, error)))
    while batcher.busy:
        batcher.step()
    errors = [error for _, error in results if error is not None]
    assert len(errors) == 2 and all(isinstance(error, EngineRequestError) for error in errors)
    assert "outside the engine's vocabulary" in str(errors[0]) and "max_seq_len" in str(errors[1])
    tokens = [answer.tokens for answer, error in results if error is None]
    assert tokens == [alone(target, "llama", good, None).tokens] * 2


def test_requests_from_threads_join_steps_in_flight(target):
    requests = mixed_requests()[:8]
    expected = [alone(target, "llama", req, seed).tokens for req, seed in requests]
    batcher = InflightBatcher(engine(target, slots=8), max_batch_size=8, max_num_tokens=256)
    batcher.start()
    results: dict[int, list[int]] = {}
    finished = threading.Event()

    def done(index, answer, error):
        results[index] = answer.tokens if error is None else [repr(error)]
        if len(results) == len(requests):
            finished.set()

    threads = [
        threading.Thread(target=batcher.submit, args=(req, generator(seed), lambda a, e, i=i: done(i, a, e)))
        for i, (req, seed) in enumerate(requests)
    ]
    for thread in threads:
        thread.start()
    assert finished.wait(60)
    batcher.close()
    assert [results[i] for i in range(len(requests))] == expected
    assert batcher.stats.widest > 1


def test_limits_are_checked(target):
    with pytest.raises(ValueError, match="exceeds the engine's 4 KV cache slots"):
        InflightBatcher(engine(target), max_batch_size=5, max_num_tokens=64)
    with pytest.raises(ValueError, match="must be >= 1"):
        InflightBatcher(engine(target), max_batch_size=1, max_num_tokens=0)
