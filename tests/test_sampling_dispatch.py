"""The one verification dispatch (sampling.verify_drafts): greedy, rejection sampling or token
matching, chosen from the sampling parameters and whether the draft's distribution is given; the
served target engine and the in-process verifier both reach it."""

from __future__ import annotations

import pytest
import torch
from test_twin import PROMPT, early_exit_draft, tiny_llama

from trt_spec.runtime import twin_engine
from trt_spec.runtime.loop import Generation, GenerationParams
from trt_spec.runtime.penalties import scale_temperature
from trt_spec.runtime.sampling import (
    SamplingParams,
    filtered_softmax,
    greedy_verify,
    rejection_sample,
    token_match_verify,
    verify_drafts,
)
from trt_spec.runtime.torch_engine import TorchCausalLM
from trt_spec.twin import TorchDrafter, TorchVerifier, TwinPair

VOCAB = 16
DRAFTS = [3, 7, 1]
SAMPLED = SamplingParams(temperature=0.9, top_k=12)


def scores(seed: int = 0) -> torch.Tensor:
    raw = torch.randn(len(DRAFTS) + 1, VOCAB, generator=torch.Generator().manual_seed(seed)) * 2  # [K + 1, V]
    return scale_temperature(raw, SAMPLED.temperature)


def test_greedy_is_the_argmax_and_draws_nothing():
    target = scores()
    generator = torch.Generator().manual_seed(1)
    state = generator.get_state()
    assert verify_drafts(SamplingParams(), DRAFTS, target, None, generator) == greedy_verify(DRAFTS, target)
    # A draft distribution changes nothing at temperature 0.
    draft_probs = torch.full((len(DRAFTS), VOCAB), 1 / VOCAB)
    assert verify_drafts(SamplingParams(), DRAFTS, target, draft_probs, generator) == greedy_verify(DRAFTS, target)
    assert torch.equal(generator.get_state(), state)


@pytest.mark.parametrize("seed", range(5))
def test_sampled_with_the_draft_distribution_is_rejection_sampling(seed):
    target = scores(seed)
    draft_probs = torch.rand(len(DRAFTS), VOCAB, generator=torch.Generator().manual_seed(100 + seed)).softmax(-1)
    expected = rejection_sample(
        DRAFTS, draft_probs, filtered_softmax(target, SAMPLED), torch.Generator().manual_seed(seed)
    )
    assert verify_drafts(SAMPLED, DRAFTS, target, draft_probs, torch.Generator().manual_seed(seed)) == expected


@pytest.mark.parametrize("seed", range(5))
def test_sampled_without_the_draft_distribution_is_token_matching(seed):
    target = scores(seed)
    expected = token_match_verify(DRAFTS, filtered_softmax(target, SAMPLED), torch.Generator().manual_seed(seed))
    assert verify_drafts(SAMPLED, DRAFTS, target, None, torch.Generator().manual_seed(seed)) == expected


def test_an_empty_draft_is_one_target_token():
    target = scores()[:1]
    assert verify_drafts(SamplingParams(), [], target) == [int(target.argmax())]
    token = verify_drafts(SAMPLED, [], target, None, torch.Generator().manual_seed(0))
    assert len(token) == 1 and filtered_softmax(target, SAMPLED)[0, token[0]] > 0


@pytest.fixture(scope="module")
def models():
    target = tiny_llama(2, seed=0)
    return target, early_exit_draft(target)


@pytest.mark.parametrize(
    ("temperature", "with_probs", "method"),
    [(0.0, True, "greedy"), (1.0, True, "rejection"), (1.0, False, "token match")],
)
def test_the_in_process_verifier_reaches_the_engine_models_dispatch(
    models, monkeypatch, temperature, with_probs, method
):
    """TwinPair's verifier is the target engine model's code: every step goes through
    TwinEngine.run and the one dispatch, with the draft's distribution when the drafter gave it."""
    seen = []

    def spy(sampling, draft_tokens, target_scores, draft_probs=None, generator=None):
        seen.append("greedy" if sampling.greedy else "rejection" if draft_probs is not None else "token match")
        return verify_drafts(sampling, draft_tokens, target_scores, draft_probs, generator)

    monkeypatch.setattr(twin_engine, "verify_drafts", spy)
    target, draft = models
    params = GenerationParams(max_new_tokens=10, num_draft_tokens=3, temperature=temperature)
    generator = torch.Generator().manual_seed(0)
    if with_probs:
        pair = TwinPair(TorchCausalLM(target), TorchCausalLM(draft), tokenizer=None, eos_token_ids=frozenset())
        assert pair.target_engine.pool.engine_for(PROMPT) is pair.target  # the pair's own KV cache
        generation = pair.generate(PROMPT, params, seed=0)
    else:

        class NoDistribution(TorchDrafter):  # a drafter that gives its tokens only
            def propose(self, *args):
                proposed = super().propose(*args)
                return type(proposed)(tokens=proposed.tokens)

        generation = Generation(
            PROMPT, NoDistribution(TorchCausalLM(draft)), TorchVerifier(TorchCausalLM(target)), params, generator
        )
    output = generation.run()
    assert len(output) == 10 and seen and set(seen) == {method}
    assert len(seen) == generation.stats.drafted_by_position[0]  # every step with drafts (the last may have none)
