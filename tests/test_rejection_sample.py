"""The verification maths: scenarios from hand-made distributions, the analytic identity, an
optimised-vs-reference check, and statistical tests that the emitted tokens follow the target.

Statistical bounds are 6 sigma per bin with fixed seeds; each statistical test also runs a sampler
with the residual replaced by p (the classic bug) and asserts that the same check catches it.
"""

from __future__ import annotations

import math

import pytest
import torch

from trt_spec.errors import GenerationParamsError
from trt_spec.runtime import sampling
from trt_spec.runtime.sampling import (
    SamplingParams,
    greedy_verify,
    probabilities,
    rejection_sample,
    residual_distribution,
    sample,
)

VOCAB = 8
NUM_DRAFTS = 3
NUM_TRIALS = 8_000
SIGMAS = 6.0


def random_distributions(rows: int, seed: int, sharpness: float = 1.5) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, VOCAB, generator=generator) * sharpness).softmax(dim=-1)  # [rows, V]


def one_hot(token: int, vocab: int = VOCAB) -> torch.Tensor:
    row = torch.zeros(vocab)
    row[token] = 1.0
    return row


# --- scenarios -------------------------------------------------------------------------------


def test_perfect_match_accepts_all_then_draws_the_bonus():
    drafts = [2, 5, 1]
    draft_probs = torch.stack([one_hot(t) for t in drafts])  # [3, V]
    target_probs = torch.cat([draft_probs, one_hot(7)[None]])  # [4, V]
    assert rejection_sample(drafts, draft_probs, target_probs) == [2, 5, 1, 7]


def test_early_mismatch_recovers_from_the_residual():
    drafts = [2, 5]
    draft_probs = torch.stack([one_hot(2), one_hot(5)])
    target_probs = torch.stack([one_hot(4), one_hot(5), one_hot(6)])  # p_1(2) = 0: must reject
    assert rejection_sample(drafts, draft_probs, target_probs) == [4]


def test_empty_draft_is_one_token_from_the_target():
    target_probs = one_hot(3)[None]  # [1, V]
    assert rejection_sample([], torch.zeros(0, VOCAB), target_probs) == [3]


def test_a_draft_token_with_zero_draft_probability_is_rejected():
    # q(x) = 0 yet x was "drafted": reject even though p(x) = 1.
    draft_probs = one_hot(1)[None]
    target_probs = torch.stack([one_hot(0), one_hot(6)])
    assert rejection_sample([0], draft_probs, target_probs) == [0]  # recovered, not accepted
    generator = torch.Generator().manual_seed(0)
    assert rejection_sample(torch.tensor([0]), draft_probs, target_probs, generator) == [0]


def test_identical_distributions_never_reject():
    probs = random_distributions(NUM_DRAFTS + 1, seed=1)
    generator = torch.Generator().manual_seed(0)
    for _ in range(200):
        drafts = sample(probs[:NUM_DRAFTS], generator).tolist()
        emitted = rejection_sample(drafts, probs[:NUM_DRAFTS], probs, generator)
        assert emitted[:NUM_DRAFTS] == drafts and len(emitted) == NUM_DRAFTS + 1


def test_shape_errors_raise_value_error():
    with pytest.raises(ValueError, match=r"\[K \+ 1, V\]"):
        rejection_sample([1, 2], torch.zeros(2, VOCAB), torch.zeros(2, VOCAB))
    with pytest.raises(ValueError, match="draft_probs"):
        rejection_sample([1, 2], torch.zeros(1, VOCAB), torch.zeros(3, VOCAB))


def test_greedy_verify_scenarios():
    target = torch.stack([one_hot(t) for t in (4, 5, 6, 7)])  # argmax 4, 5, 6, 7
    assert greedy_verify([4, 5, 6], target) == [4, 5, 6, 7]  # all accepted + bonus
    assert greedy_verify([4, 9 % VOCAB, 6], target) == [4, 5]  # mismatch at 1: target's choice
    assert greedy_verify([0, 5, 6], target) == [4]  # mismatch at 0
    assert greedy_verify([], target[:1]) == [4]  # plain decoding
    with pytest.raises(ValueError):
        greedy_verify([4, 5], target)


# --- logits processing -----------------------------------------------------------------------


def test_probabilities_temperature_top_k_top_p():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    assert torch.allclose(probabilities(logits, SamplingParams(temperature=1.0)), logits.softmax(-1))
    assert torch.allclose(probabilities(logits, SamplingParams(temperature=0.5)), (logits * 2).softmax(-1))

    top2 = probabilities(logits, SamplingParams(temperature=1.0, top_k=2))[0]
    assert (top2[2:] == 0).all() and torch.allclose(top2[:2], logits[0, :2].softmax(-1))

    full = logits.softmax(-1)[0]  # [0.636, 0.234, 0.086, 0.032, 0.012]
    kept = probabilities(logits, SamplingParams(temperature=1.0, top_p=0.8))[0]
    assert (kept[:2] > 0).all() and (kept[2:] == 0).all()  # 0.636 < 0.8 <= 0.636 + 0.234
    assert torch.allclose(kept[:2], full[:2] / full[:2].sum())
    tiny = probabilities(logits, SamplingParams(temperature=1.0, top_p=1e-6))[0]
    assert tiny[0] == 1.0  # the most likely token always stays


def test_probabilities_refuses_greedy():
    with pytest.raises(ValueError, match="argmax"):
        probabilities(torch.zeros(1, 3), SamplingParams())


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"temperature": float("nan")}, "temperature"),
    ],
)
def test_sampling_params_validation(kwargs, fragment):
    with pytest.raises(GenerationParamsError, match=fragment):
        SamplingParams(**kwargs)


def test_sample_never_draws_a_zero_probability_token():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]])
    generator = torch.Generator().manual_seed(0)
    drawn = {int(sample(probs, generator)) for _ in range(500)}
    assert drawn == {1, 3}


# --- the analytic identity -------------------------------------------------------------------


def assert_identity(target: torch.Tensor, draft: torch.Tensor, atol: float = 1e-12) -> None:
    """min(p, q) + (1 - sum min(p, q)) * residual = p."""
    target64, draft64 = target.double(), draft.double()
    overlap = torch.minimum(target64, draft64)
    residual = residual_distribution(target64, draft64)
    reconstructed = overlap + (1 - overlap.sum(-1, keepdim=True)) * residual
    assert torch.allclose(reconstructed, target64, atol=atol)
    assert torch.isfinite(residual_distribution(target.float(), draft.float())).all()


@pytest.mark.parametrize("seed", range(5))
def test_identity_random(seed):
    assert_identity(random_distributions(4, seed), random_distributions(4, seed + 100))


def test_identity_edge_cases():
    p = random_distributions(1, seed=7)[0]
    assert_identity(p, p)  # p = q: residual undefined, weight 0
    assert_identity(one_hot(0), one_hot(1))  # disjoint supports: residual = p
    assert_identity(p, one_hot(3))  # one-hot draft
    assert_identity(one_hot(3), p)  # one-hot target
    half = random_distributions(2, seed=8).half()  # fp16 inputs: rows sum to 1 only within fp16 rounding
    assert_identity(half[0], half[1], atol=2e-3)
    assert torch.equal(residual_distribution(p, p), p)


def test_fp16_inputs_are_computed_in_float32():
    target = random_distributions(NUM_DRAFTS + 1, seed=3).half()
    draft = random_distributions(NUM_DRAFTS, seed=4).half()
    generator = torch.Generator().manual_seed(0)
    emitted = rejection_sample([1, 2, 3], draft, target, generator)
    assert 1 <= len(emitted) <= NUM_DRAFTS + 1


# --- optimised path vs a plain reference -----------------------------------------------------


def reference_rejection_sample(draft_tokens, draft_probs, target_probs, generator) -> list[int]:
    """Leviathan et al. Algorithm 1 written position by position; same random stream."""
    uniform = torch.rand(len(draft_tokens), generator=generator)
    emitted = []
    for position, token in enumerate(draft_tokens):
        p, q = float(target_probs[position, token]), float(draft_probs[position, token])
        if q > 0 and uniform[position] < min(1.0, p / q):
            emitted.append(token)
            continue
        residual = (target_probs[position] - draft_probs[position]).clamp_min(0)
        emitted.append(int(sample((residual / residual.sum())[None], generator)))
        return emitted
    emitted.append(int(sample(target_probs[len(draft_tokens)][None], generator)))
    return emitted


def test_matches_the_reference_implementation():
    mismatches = 0
    for seed in range(300):
        target = random_distributions(NUM_DRAFTS + 1, seed=seed)
        draft = random_distributions(NUM_DRAFTS, seed=seed + 1000)
        drafts = sample(draft, torch.Generator().manual_seed(seed)).tolist()
        fast = rejection_sample(drafts, draft, target, torch.Generator().manual_seed(seed))
        slow = reference_rejection_sample(drafts, draft, target, torch.Generator().manual_seed(seed))
        mismatches += fast != slow
    assert mismatches == 0


# --- statistics ------------------------------------------------------------------------------


def run_trials(target: torch.Tensor, draft: torch.Tensor, seed: int) -> list[list[int]]:
    """NUM_TRIALS verification steps, drafts drawn from q, position by position."""
    generator = torch.Generator().manual_seed(seed)
    drafts = torch.multinomial(draft, NUM_TRIALS, replacement=True, generator=generator).T.tolist()  # [N, K]
    return [rejection_sample(tokens, draft, target, generator) for tokens in drafts]


def max_sigma(counts: list[int], expected: torch.Tensor) -> float:
    """The largest deviation of a histogram from ``expected`` (probabilities), in sigmas."""
    total = sum(counts)
    worst = 0.0
    for count, prob in zip(counts, expected.tolist()):
        sigma = math.sqrt(max(prob * (1 - prob), 1e-12) / total)
        worst = max(worst, abs(count / total - prob) / sigma)
    return worst


def histogram(tokens: list[int]) -> list[int]:
    counts = [0] * VOCAB
    for token in tokens:
        counts[token] += 1
    return counts


def distribution_deviations(target: torch.Tensor, draft: torch.Tensor, seed: int) -> dict[str, float]:
    steps = run_trials(target, draft, seed)
    overlap = torch.minimum(target[:NUM_DRAFTS], draft).sum(-1).tolist()  # beta_i, [K]
    # P(n accepted) = beta_0 ... beta_{n-1} (1 - beta_n); all K: prod beta.
    length_law = []
    for accepted in range(NUM_DRAFTS + 1):
        prob = math.prod(overlap[:accepted])
        length_law.append(prob * (1 - overlap[accepted]) if accepted < NUM_DRAFTS else prob)
    length_counts = [0] * (NUM_DRAFTS + 1)
    for emitted in steps:
        length_counts[len(emitted) - 1] += 1
    return {
        "first ~ p_0": max_sigma(histogram([e[0] for e in steps]), target[0]),
        "second ~ p_1 given position 0 accepted": max_sigma(histogram([e[1] for e in steps if len(e) >= 2]), target[1]),
        "bonus ~ p_K": max_sigma(histogram([e[-1] for e in steps if len(e) == NUM_DRAFTS + 1]), target[NUM_DRAFTS]),
        "length ~ acceptance law": max_sigma(length_counts, torch.tensor(length_law)),
    }


@pytest.fixture(scope="module")
def pair_distributions():
    # Overlaps 0.66, 0.44, 0.49: every branch is common (~14% of steps reach the bonus), and the
    # residual differs from p enough that the bug below shows at > 12 sigma.
    return random_distributions(NUM_DRAFTS + 1, seed=11, sharpness=0.8), random_distributions(
        NUM_DRAFTS, seed=12, sharpness=0.8
    )


def test_emitted_tokens_follow_the_target(pair_distributions):
    target, draft = pair_distributions
    deviations = distribution_deviations(target, draft, seed=0)
    assert max(deviations.values()) < SIGMAS, deviations


def test_the_statistics_catch_a_sampler_without_the_residual(pair_distributions, monkeypatch):
    """The same check must fail for the classic bug: recovering from p instead of the residual."""
    monkeypatch.setattr(sampling, "residual_distribution", lambda target, draft: target)
    target, draft = pair_distributions
    deviations = distribution_deviations(target, draft, seed=0)
    assert deviations["first ~ p_0"] > SIGMAS, deviations
    assert deviations["second ~ p_1 given position 0 accepted"] > SIGMAS, deviations


def test_processed_distributions_are_followed():
    """Top-k/top-p applied to both sides: output follows the processed target distribution."""
    params = SamplingParams(temperature=0.8, top_k=6, top_p=0.9)
    target = probabilities(torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(21)) * 2, params)
    draft = probabilities(torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(22)) * 2, params)
    steps = run_trials(target, draft, seed=1)
    assert all(target[0, e[0]] > 0 for e in steps)  # never a token the processing removed
    assert max_sigma(histogram([e[0] for e in steps]), target[0]) < SIGMAS
