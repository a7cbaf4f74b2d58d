"""Draft token ids outside the vocabulary [0, V) are refused with a message naming the id, its
position and V: by each verification function (a negative id would otherwise index from the end of
the vocabulary, and V past it), and by the torch flavor's target engine before its forward pass."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from test_twin import PROMPT, VOCAB
from test_twin_engine import engine_request, models, twin_engines  # noqa: F401 - models is a fixture

from trt_spec.runtime.sampling import (
    SamplingParams,
    greedy_verify,
    rejection_sample,
    token_match_verify,
    verify_drafts,
)
from trt_spec.runtime.twin_engine import EngineRequestError

V = 16
EDGE = V - 1


def one_hot_rows(tokens: list[int]) -> torch.Tensor:
    rows = torch.zeros(len(tokens), V)
    rows[torch.arange(len(tokens)), torch.tensor(tokens)] = 1.0
    return rows  # [len(tokens), V]


# Each verification, called with drafts [EDGE, bad] where the target puts all its mass (or its
# argmax) on EDGE, then on 3: the valid edge id is accepted, the bad one refused.
def call_greedy(drafts):
    return greedy_verify(drafts, one_hot_rows([EDGE, 3, 3]))


def call_token_match(drafts):
    return token_match_verify(drafts, one_hot_rows([EDGE, 3, 3]), torch.Generator().manual_seed(0))


def call_rejection(drafts):
    draft_probs = one_hot_rows([EDGE, 3])
    return rejection_sample(drafts, draft_probs, one_hot_rows([EDGE, 3, 3]), torch.Generator().manual_seed(0))


def call_rejection_tensor(drafts):
    return call_rejection(torch.tensor(drafts))


def call_verify_drafts_sampled(drafts):
    scores = one_hot_rows([EDGE, 3, 3]).log()  # -inf off the one-hot: the softmax gives it back
    return verify_drafts(SamplingParams(temperature=1.0), drafts, scores, None, torch.Generator().manual_seed(0))


VERIFIERS = {
    "greedy_verify": call_greedy,
    "token_match_verify": call_token_match,
    "rejection_sample": call_rejection,
    "rejection_sample_tensor": call_rejection_tensor,
    "verify_drafts_sampled": call_verify_drafts_sampled,
}


@pytest.mark.parametrize("bad", [-1, V, V + 100, -V])
@pytest.mark.parametrize("verify", VERIFIERS.values(), ids=VERIFIERS.keys())
def test_verification_refuses_draft_ids_outside_the_vocabulary(verify, bad):
    assert verify([EDGE, 3]) == [EDGE, 3, 3]  # the edge id V - 1 is a token like any other
    expected = f"draft token {bad} at position 1 is outside the vocabulary [0, {V})"
    with pytest.raises(ValueError, match=re.escape(expected)):
        verify([EDGE, bad])


@pytest.mark.parametrize("verify", VERIFIERS.values(), ids=VERIFIERS.keys())
def test_the_first_draft_id_outside_is_named(verify):
    with pytest.raises(ValueError, match=re.escape(f"draft token -1 at position 0 is outside the vocabulary [0, {V})")):
        verify([-1, V])


def test_the_target_engine_refuses_draft_input_ids_outside_the_vocabulary(models):  # noqa: F811
    target, _ = twin_engines(models)
    assert target.vocab_size == VOCAB
    for drafts, message in (
        ([3, -1], f"draft_input_ids[1] = -1 is outside the engine's vocabulary [0, {VOCAB})"),
        ([VOCAB, 3], f"draft_input_ids[0] = {VOCAB} is outside the engine's vocabulary [0, {VOCAB})"),
    ):
        inputs = engine_request(PROMPT, 2, draft_input_ids=np.array([drafts], dtype=np.int32))
        with pytest.raises(EngineRequestError, match=re.escape(message)) as caught:
            target.execute(inputs)
        assert "\n" not in str(caught.value)
    # The edge id V - 1 is verified as any other draft.
    outputs = target.execute(engine_request(PROMPT, 2, draft_input_ids=np.array([[VOCAB - 1]], dtype=np.int32)))
    assert 1 <= outputs["output_ids"].shape[-1] <= 2
