"""Stage 5, run: decoding and external-draft-tokens verification, pure functions over logits.

Penalties, ``min_tokens``, bad words and the embedding bias are applied as the penalty and
ban-words layers do, per position (:mod:`trt_spec.runtime.penalties` cites the kernels), with
``min_tokens`` 1 when a request sends none.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from trt_spec.runtime.penalties import ENGINE_DEFAULT_PENALTIES, NEUTRAL_TEMPERATURE, Penalties, adjusted_scores
from trt_spec.runtime.sampling import SamplingParams, filtered_softmax, greedy_verify, residual_distribution, sample

# --- decoding and verification: pure functions over logits ------------------------------------


def ends_with_stop_word(sequence: Sequence[int], stop_words: Sequence[Sequence[int]]) -> bool:
    """A stop word at the end of ``sequence`` (prompt included: upstream's stop criteria look at the
    whole output ids; unconfirmed for words reaching into the prompt)."""
    return any(len(sequence) >= len(word) and tuple(sequence[-len(word) :]) == tuple(word) for word in stop_words)


def decode_tokens(
    next_logits: Callable[[list[int]], torch.Tensor],
    prompt: Sequence[int],
    max_new_tokens: int,
    sampling: SamplingParams,
    *,
    end_id: int | None,
    stop_words: Sequence[Sequence[int]] = (),
    generator: torch.Generator | None = None,
    penalties: Penalties = ENGINE_DEFAULT_PENALTIES,
    temperature: float = NEUTRAL_TEMPERATURE,
) -> tuple[list[int], list[torch.Tensor]]:
    """Up to ``max_new_tokens`` tokens, one at a time: the argmax (greedy) or a draw after top-k
    and top-p, of the penalty and ban-words layers' scores (``adjusted_scores`` at ``temperature``,
    the one sent or 1). Stops after a stop word (kept) or at ``end_id`` (left out); ``end_id``
    None never stops. Returns the tokens and each step's raw logits ``[V]`` (the end_id step's
    included).
    """
    # Source: NVIDIA/TensorRT-LLM@b35ac1b64368513d215c57d2ed01d62d910df8da:cpp/tensorrt_llm/batch_manager/createNewDecoderRequests.cpp CreateNewDecoderRequests::createDecoderRequests (endId.value_or(-1): no end_id, no EOS stop)
    sequence, tokens, step_logits = list(prompt), [], []
    for step in range(max_new_tokens):
        logits = next_logits(sequence)  # [V]
        step_logits.append(logits)
        scores = adjusted_scores(logits[None], temperature, penalties.after(step), sequence, (), end_id)  # [1, V]
        if sampling.greedy:
            token = int(scores.argmax())
        else:
            token = int(sample(filtered_softmax(scores, sampling), generator))
        if token == end_id:  # not in the output (unconfirmed for a sampled EOS; confirmed for drafts)
            break
        tokens.append(token)
        sequence.append(token)
        if ends_with_stop_word(sequence, stop_words):
            break
    return tokens, step_logits


def verify_drafts(
    draft_tokens: Sequence[int],
    target_logits: torch.Tensor,
    sampling: SamplingParams,
    *,
    draft_probs: torch.Tensor | None = None,
    threshold: float | None = None,
    generator: torch.Generator | None = None,
    context: Sequence[int] = (),
    end_id: int | None = None,
    penalties: Penalties = ENGINE_DEFAULT_PENALTIES,
    temperature: float = NEUTRAL_TEMPERATURE,
) -> list[int]:
    """One external-draft-tokens step: the accepted drafts, then one recovered or bonus token.

    ``target_logits`` ``[K + 1, V]``: the target's raw logits at each draft's position and after
    the last, adjusted per position by the penalty and ban-words layers (row i after ``context``
    and the drafts before it, as the decoder runs one sub-step per draft). Greedy: argmax
    matching. Sampled: p = top-k/top-p softmax of those scores; with ``draft_probs`` ``[K, V]``
    (softmax of the draft_logits sent) by :func:`accept_by_probability`, without by
    :func:`accept_by_token_match`.
    """
    # Source: NVIDIA/TensorRT-LLM@1d263f15a979ef2902c60de3f6238bcc0952bb29:cpp/tensorrt_llm/layers/externalDraftTokensLayer.cpp ExternalDraftTokensLayer::forwardAsync
    scores = adjusted_scores(target_logits, temperature, penalties, context, draft_tokens, end_id)  # [K + 1, V]
    if sampling.greedy:
        return greedy_verify(draft_tokens, scores)
    target_probs = filtered_softmax(scores, sampling)  # [K + 1, V]
    if draft_probs is None:
        return accept_by_token_match(draft_tokens, target_probs, generator)
    return accept_by_probability(draft_tokens, draft_probs, target_probs, threshold, generator)


def accept_by_probability(
    draft_tokens: Sequence[int],
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    threshold: float | None = None,
    generator: torch.Generator | None = None,
) -> list[int]:
    """Accept draft i iff p_i(d) > u * q_i(d), u ~ U(0, 1) (``threshold`` instead when given);
    at the first rejection a token from norm(max(0, p_i - q_i)); after K acceptances one from p_K.

    Unlike :func:`~trt_spec.runtime.sampling.rejection_sample`, a draft with q = 0 is accepted
    whenever p > 0, as the kernel's comparison does.
    """
    # Source: NVIDIA/TensorRT-LLM@2931b93fa41bf8b6d23a6e266ffc17810a5966ef:cpp/tensorrt_llm/kernels/speculativeDecoding/externalDraftTokensKernels.cu acceptDraftTokensKernel
    emitted: list[int] = []
    for position, token in enumerate(draft_tokens):
        u = threshold if threshold is not None else float(torch.rand((), generator=generator, dtype=torch.float64))
        if float(target_probs[position, token]) > u * float(draft_probs[position, token]):
            emitted.append(int(token))
            continue
        residual = residual_distribution(target_probs[position].double(), draft_probs[position].double())
        emitted.append(int(sample(residual[None], generator)))
        return emitted
    emitted.append(int(sample(target_probs[len(draft_tokens)][None], generator)))  # bonus
    return emitted


def accept_by_token_match(
    draft_tokens: Sequence[int], target_probs: torch.Tensor, generator: torch.Generator | None = None
) -> list[int]:
    """Without draft logits: t_i ~ p_i, draft i accepted iff t_i == d_i; after a rejection a FRESH
    draw from p_i is emitted (not t_i); after K acceptances one draw from p_K.

    This is the kernel code path as read (the residual correction runs only with draft logits, and
    the multinomial sampling that follows redraws from the uncorrected p_i). For sampled requests
    it is biased toward the draft: P(out = d) = p(d) * (2 - p(d)). Our reading; no upstream test
    confirms it. Greedy requests never get here (argmax matching is exact).
    """
    # Source: NVIDIA/TensorRT-LLM@2931b93fa41bf8b6d23a6e266ffc17810a5966ef:cpp/tensorrt_llm/kernels/speculativeDecoding/externalDraftTokensKernels.cu acceptDraftTokensKernel
    # Source: NVIDIA/TensorRT-LLM@1d263f15a979ef2902c60de3f6238bcc0952bb29:cpp/tensorrt_llm/layers/externalDraftTokensLayer.cpp ExternalDraftTokensLayer::multinomialSampling
    emitted: list[int] = []
    for position, token in enumerate(draft_tokens):
        row = target_probs[position][None]
        if int(sample(row, generator)) == token:
            emitted.append(int(token))
            continue
        emitted.append(int(sample(row, generator)))  # fresh draw (biased, see the docstring)
        return emitted
    emitted.append(int(sample(target_probs[len(draft_tokens)][None], generator)))  # bonus
    return emitted


def truncate_at_stop(
    prompt: Sequence[int], emitted: Sequence[int], end_id: int | None, stop_words: Sequence[Sequence[int]]
) -> list[int]:
    """A verification step's tokens up to end_id (left out) or through a stop word (kept)."""
    # Source: NVIDIA/TensorRT-LLM@2931b93fa41bf8b6d23a6e266ffc17810a5966ef:cpp/tensorrt_llm/kernels/speculativeDecoding/externalDraftTokensKernels.cu forwardAcceptedTokensKernel ("Do not increase seq len when EOS is generated")
    kept: list[int] = []
    for token in emitted:
        if token == end_id:
            break
        kept.append(token)
        if ends_with_stop_word([*prompt, *kept], stop_words):  # per token: unconfirmed for drafts
            break
    return kept
