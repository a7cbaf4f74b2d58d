"""Penalties, min_tokens, bad words, embedding bias and log probs under speculative decoding.

Two claims, each checked so that it can fail:
1. :func:`adjusted_scores` does what TensorRT-LLM's penalty and ban-words kernels do (a per-token
   reference written from the kernels' loops, on random inputs);
2. with them, speculative output is the target's own: greedy output equals an independent
   target-alone loop (and differs from the output without them), sampled two-token completions
   follow the target's exact distribution (chi-square), and the log probabilities returned are the
   target's. The loop runs over in-process twin engines here; ``test_trtllm_clients.py`` and
   ``test_trtllm_emulated.py`` repeat the greedy claim through the real Triton server.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import numpy as np
import pytest
import torch
from conftest import chi_square_z
from test_twin import PROMPT, early_exit_draft, tiny_llama
from test_twin_engine import LocalEngines, loop_inputs, loop_parameters, twin_engines

from trt_spec.errors import GenerationParamsError
from trt_spec.runtime import bls
from trt_spec.runtime import tensors as T
from trt_spec.runtime.penalties import ENGINE_MIN_TOKENS, Penalties, adjusted_scores, scale_temperature
from trt_spec.runtime.sampling import SamplingParams, filtered_softmax

PENALTIES = Penalties(
    repetition_penalty=1.6,
    presence_penalty=0.7,
    frequency_penalty=0.4,
    min_tokens=3,
    bad_words=((17,), (42, 8)),  # 17 anywhere; 8 right after 42
    embedding_bias=((23, 1.5), (61, -2.0)),
)
END_ID = 1


@pytest.fixture(scope="module")
def models():
    target = tiny_llama(2, seed=0)
    return target, early_exit_draft(target)


# --- 1. the kernels' arithmetic ------------------------------------------------------------------


def kernel_reference(logits, temperature, penalties, context, row_tokens, end_id):
    """batchApplyPenalty then ban_bad_words, one row and one vocabulary entry at a time."""
    rows, vocab = logits.shape
    out = torch.empty(rows, vocab)
    bias = [0.0] * vocab
    for token, weight in penalties.embedding_bias:
        bias[token] += weight
    for row in range(rows):
        history = [*context, *row_tokens[:row]]
        for token in range(vocab):
            z = float(logits[row, token]) + bias[token]
            if temperature != 1.0:
                z *= 1.0 / (temperature + 1e-6)
            count = history.count(token)
            if count > 0:
                z = z * penalties.repetition_penalty if z < 0 else z / penalties.repetition_penalty
                z -= penalties.presence_penalty
                z -= penalties.frequency_penalty * count
            out[row, token] = z
        if row < penalties.min_tokens:
            out[row, end_id] = float("-inf")
        for word in penalties.bad_words:
            prefix = list(word[:-1])
            if (not prefix or history[len(history) - len(prefix) :] == prefix) and 0 < word[-1] < vocab:
                out[row, word[-1]] = float("-inf")
    return out


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1e-45])
@pytest.mark.parametrize("seed", range(4))
def test_adjusted_scores_follow_the_kernels(seed, temperature):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(5, 64, generator=generator) * 3
    context = torch.randint(0, 64, (20,), generator=generator).tolist() + [42]
    drafts = [8, 17, 17, 5]
    expected = kernel_reference(logits, temperature, PENALTIES, context, drafts, END_ID)
    got = adjusted_scores(logits, temperature, PENALTIES, context, drafts, END_ID)
    assert torch.isfinite(got[torch.isfinite(expected)]).all()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)
    assert (got[:, 17] == float("-inf")).all() and got[0, 8] == float("-inf")  # bad words
    assert (got[:3, END_ID] == float("-inf")).all() and torch.isfinite(got[3:, END_ID]).all()  # min_tokens


def test_neutral_penalties_leave_the_temperature_scaled_logits():
    logits = torch.randn(3, 10)
    got = adjusted_scores(logits, 0.5, Penalties(), [1, 2, 3], [4, 5])
    torch.testing.assert_close(got, scale_temperature(logits, 0.5))
    assert torch.equal(scale_temperature(logits, 1.0), logits)  # T = 1: unscaled, as the kernel skips it


def test_token_zero_is_never_banned_as_the_kernel_tests_0_lt_token():
    scores = adjusted_scores(torch.zeros(1, 8), 1.0, Penalties(bad_words=((0,), (3,))), [2])
    assert scores[0, 0] == 0 and scores[0, 3] == float("-inf")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"repetition_penalty": 0.0}, "repetition_penalty must be between 0.01 and 100"),
        ({"repetition_penalty": 1e-45}, "repetition_penalty must be between 0.01 and 100"),
        ({"repetition_penalty": float("inf")}, "repetition_penalty must be between"),
        ({"presence_penalty": float("nan")}, "presence_penalty must be between -100 and 100"),
        ({"frequency_penalty": float("-inf")}, "frequency_penalty must be between"),
        ({"min_tokens": -1}, "min_tokens must be >= 0"),
        ({"bad_words": ((),)}, "a bad word is empty"),
        ({"embedding_bias": ((3, float("nan")),)}, "embedding_bias_weights must be between"),
    ],
)
def test_bad_values_are_refused_by_name(kwargs, message):
    with pytest.raises(GenerationParamsError, match=message):
        Penalties(**kwargs)


def test_min_tokens_left_for_a_call():
    assert PENALTIES.after(0).min_tokens == 3 and PENALTIES.after(2).min_tokens == 1
    assert PENALTIES.after(7).min_tokens == 0 and PENALTIES.after(7).bad_words == PENALTIES.bad_words


# --- 2. speculative output is the target's own ----------------------------------------------------


def penalised_inputs(prompt, penalties: Penalties = PENALTIES, **options) -> dict[str, np.ndarray]:
    inputs = loop_inputs(prompt, end_id=END_ID, min_tokens=penalties.min_tokens, **options)
    flat = [token for word in penalties.bad_words for token in word]
    ends = list(np.cumsum([len(word) for word in penalties.bad_words])) if flat else []
    width = max(1, len(flat))
    inputs[T.BAD_WORDS_LIST.name] = np.array(
        [[flat + [0] * (width - len(flat)), ends + [-1] * (width - len(ends))]], dtype=np.int32
    )
    bias = penalties.bias_vector(64).numpy() if penalties.embedding_bias else np.zeros(0, np.float32)
    inputs[T.EMBEDDING_BIAS.name] = bias.reshape(1, -1)
    inputs[T.ENGINE_REPETITION_PENALTY.name] = np.array([[penalties.repetition_penalty]], dtype=np.float32)
    inputs[T.ENGINE_PRESENCE_PENALTY.name] = np.array([[penalties.presence_penalty]], dtype=np.float32)
    inputs[T.ENGINE_FREQUENCY_PENALTY.name] = np.array([[penalties.frequency_penalty]], dtype=np.float32)
    return inputs


def run(models, inputs, *, use_draft_logits=False, log_probs=None):
    settings = loop_parameters(use_draft_logits=use_draft_logits)
    request = bls.read_loop_request(inputs, settings)
    engines = LocalEngines(*twin_engines(models))
    state = asyncio.run(bls.run_loop(request, settings, engines, log_probs=log_probs))
    return state, engines


def target_alone(model, prompt, num_tokens, penalties, temperature=1.0):
    """Greedy decoding of the HF target with the adjustments, one full forward pass per token."""
    tokens: list[int] = list(prompt)
    with torch.inference_mode():
        for step in range(num_tokens):
            logits = model(torch.tensor([tokens])).logits[0, -1:]
            scores = adjusted_scores(logits, temperature, penalties.after(step), tokens, (), END_ID)
            token = int(scores.argmax())
            if token == END_ID:
                break
            tokens.append(token)
    return tokens[len(prompt) :]


PROMPTS = [PROMPT, [42, 8, 42, 3, 3, 3], [7, 7, 7, 7, 7, 7, 7, 7, 7]]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_with_penalties_is_the_target_alone(models, prompt):
    state, engines = run(models, penalised_inputs(prompt, max_tokens=20))
    reference = target_alone(models[0], prompt, 20, PENALTIES)
    assert state.output == reference
    assert state.stats.drafted_tokens > 0  # the drafts were verified, not skipped
    plain, _ = run(models, penalised_inputs(prompt, Penalties(), max_tokens=20))
    assert plain.output != reference  # the penalties change the output: this test can fail
    assert 17 not in state.output and all(a != 42 or b != 8 for a, b in zip([*prompt, *state.output], state.output))
    assert all(int(call[1][T.ENGINE_MIN_TOKENS.name][0, 0]) >= 0 for call in engines.calls)


def test_every_engine_call_gets_what_is_left_of_min_tokens(models):
    # TensorRT-LLM's default min_tokens is 1 per request: absent, end_id could never be the first
    # token of a call. The loop sends each call its share explicitly, 0 once the minimum is met.
    state, engines = run(models, penalised_inputs(PROMPT, Penalties(min_tokens=5), max_tokens=12))
    for _model, inputs in engines.calls:
        generated = inputs[T.INPUT_IDS.name].shape[1] - len(PROMPT)
        assert int(inputs[T.ENGINE_MIN_TOKENS.name][0, 0]) == max(0, 5 - generated)
    assert ENGINE_MIN_TOKENS == 1


def test_min_tokens_holds_end_id_back(models):
    # The end_id the target prefers first: greedy stops at once without min_tokens, not with it.
    with torch.inference_mode():
        first = int(models[0](torch.tensor([PROMPT])).logits[0, -1].argmax())
    inputs = penalised_inputs(PROMPT, Penalties(), max_tokens=10)
    inputs[T.END_ID.name] = np.array([[first]], dtype=np.int32)
    stopped, _ = run(models, inputs)
    assert stopped.output == [] and stopped.finish_reason == "eos"
    inputs[T.ENGINE_MIN_TOKENS.name] = np.array([[4]], dtype=np.int32)
    held, _ = run(models, inputs)
    assert len(held.output) >= 4 and first not in held.output[:4]


SAMPLED = SamplingParams(temperature=0.9, top_k=12, top_p=0.95)
SAMPLED_PENALTIES = Penalties(repetition_penalty=1.5, presence_penalty=0.8, frequency_penalty=0.3, bad_words=((9,),))


def exact_two_token_distribution(model, prompt) -> dict[tuple[int, ...], float]:
    def next_probs(tokens: list[int], step: int) -> torch.Tensor:
        with torch.inference_mode():
            logits = model(torch.tensor([tokens])).logits[0, -1:]
        scores = adjusted_scores(logits, SAMPLED.temperature, SAMPLED_PENALTIES.after(step), tokens, (), END_ID)
        return filtered_softmax(scores, SAMPLED)[0]

    distribution: Counter[tuple[int, ...]] = Counter()
    first = next_probs(prompt, 0)
    for x1 in first.nonzero().flatten().tolist():
        if x1 == END_ID:
            distribution[()] += float(first[x1])
            continue
        second = next_probs([*prompt, x1], 1)
        for x2 in second.nonzero().flatten().tolist():
            distribution[(x1,) if x2 == END_ID else (x1, x2)] += float(first[x1] * second[x2])
    return dict(distribution)


# The draft's four favourite tokens after [42, 8, 42, 3, 3, 3], twice: the penalties move the draft's
# distribution by a total variation of 0.65 here, so a q sent without them fails this test.
SAMPLED_PROMPT = [42, 8, 42, 3, 3, 3, 20, 14, 35, 13, 20, 14, 35, 13]


def test_sampled_completions_with_penalties_follow_the_target_distribution(models):
    prompt, num = SAMPLED_PROMPT, 1200
    counts: Counter[tuple[int, ...]] = Counter()
    drafted = accepted = 0
    options = {"temperature": SAMPLED.temperature, "top_k": SAMPLED.top_k, "top_p": SAMPLED.top_p, "k": 1}
    for seed in range(num):
        inputs = penalised_inputs(prompt, SAMPLED_PENALTIES, max_tokens=2, seed=seed, **options)
        state, _ = run(models, inputs, use_draft_logits=True)
        counts[tuple(state.output)] += 1
        drafted += state.stats.drafted_tokens
        accepted += state.stats.accepted_tokens
    assert drafted >= num and 0 < accepted < drafted
    expected = exact_two_token_distribution(models[0], prompt)
    assert sum(c for completion, c in counts.items() if completion not in expected) == 0
    assert chi_square_z(counts, expected, num) <= 6


def test_draft_logits_sent_are_the_drafts_penalised_distribution(models):
    # q as the target receives it (softmax of draft_logits) must be what the draft engine drew from.
    inputs = penalised_inputs(PROMPTS[1], SAMPLED_PENALTIES, max_tokens=6, seed=3, temperature=0.9, top_k=12, k=4)
    request = bls.read_loop_request(inputs, loop_parameters(use_draft_logits=True))
    sequence = request.prompt
    drafts = [3, 42, 8]
    _, draft = models
    with torch.inference_mode():
        raw = draft(torch.tensor([sequence + drafts])).logits[0, len(sequence) - 1 :]  # [4, V]
    sent = torch.from_numpy(bls.draft_distribution_logits(raw[:3].numpy(), request, sequence, drafts))
    for row in range(3):
        context = sequence + drafts[:row]
        scores = adjusted_scores(raw[row : row + 1], 0.9, request.penalties.after(row), context, (), END_ID)
        torch.testing.assert_close(sent[row].softmax(-1), filtered_softmax(scores, request.params.sampling)[0])


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_log_probs_are_the_targets(models, temperature):
    log_probs: list[float] = []
    options = {"seed": 5, "temperature": temperature, "top_k": 0 if temperature == 0 else 20}
    inputs = penalised_inputs(PROMPT, max_tokens=12, return_log_probs=True, **options)
    state, engines = run(models, inputs, use_draft_logits=True, log_probs=log_probs)
    assert len(log_probs) == len(state.output) > 0
    tokens = [*PROMPT, *state.output]
    with torch.inference_mode():
        logits = models[0](torch.tensor([tokens])).logits[0, len(PROMPT) - 1 : -1]  # [n, V]
    scale = 1.0 if temperature == 0 else temperature
    scores = adjusted_scores(logits, scale, PENALTIES, PROMPT, state.output, END_ID)
    expected = scores.log_softmax(-1)[torch.arange(len(state.output)), torch.tensor(state.output)]
    torch.testing.assert_close(torch.tensor(log_probs), expected, rtol=1e-4, atol=1e-4)
    request = bls.read_loop_request(inputs, loop_parameters(use_draft_logits=True))
    arrays = bls.response_arrays(state, state.output, 0, True, 0, request, log_probs)
    assert arrays[T.OUTPUT_LOG_PROBS.name].shape == (1, 1, len(state.output))
    assert arrays[T.CUM_LOG_PROBS.name][0, 0] == pytest.approx(sum(log_probs), rel=1e-5)
