"""The maths of one verification step: pure functions, no model, no state.

Vocabulary (Leviathan et al. 2023, arXiv 2211.17192, Algorithm 1; Chen et al. 2023,
arXiv 2302.01318), used by every name in this package:

- *draft tokens* x_1..x_K: proposed by the draft model, x_i drawn from its distribution q_i;
- the target scores the prefix plus all K drafts in one pass, giving p_1..p_{K+1};
- an *accepted* token: draft token x_i kept with probability min(1, p_i(x_i) / q_i(x_i));
- a *recovered* token: at the first rejection, one token drawn from the residual
  norm(max(0, p_i - q_i)) instead of x_i;
- a *bonus* token: when all K drafts are accepted, one token drawn from p_{K+1}.

The *emitted* tokens of a step, the accepted prefix then one recovered or bonus token (1..K+1
of them), are distributed exactly as tokens sampled one at a time from the target. Greedy decoding
(temperature 0) is the limit: accept while the draft token is the target's argmax, then emit the
target's argmax. Without the draft's distributions, :func:`token_match_verify` keeps exactness at a
lower acceptance. Which of the three a step runs is decided in one place, :func:`verify_drafts`,
for every caller (the torch flavor's target engine, and through it the in-process loop).

Temperature, top-k and top-p are applied by :func:`probabilities` identically to both models, so
the output follows the *processed* target distribution. Temperature scales as TensorRT-LLM's
kernels do (:func:`~trt_spec.runtime.penalties.scale_temperature`); penalties, ``min_tokens`` and
bad words (:mod:`trt_spec.runtime.penalties`) adjust the scores before top-k and top-p
(:func:`filtered_softmax`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from trt_spec.runtime.errors import GenerationParamsError
from trt_spec.runtime.penalties import scale_temperature

GREEDY_TEMPERATURE = 0.0
NO_TOP_K = 0  # top_k = 0 keeps the whole vocabulary
NO_TOP_P = 1.0  # top_p = 1 keeps the whole vocabulary


@dataclass(frozen=True)
class SamplingParams:
    """How a distribution is drawn from logits; the same for the draft and the target.

    Raises:
        GenerationParamsError: temperature < 0, top_k < 0, or top_p outside (0, 1].
    """

    temperature: float = GREEDY_TEMPERATURE
    top_k: int = NO_TOP_K
    top_p: float = NO_TOP_P

    def __post_init__(self) -> None:
        # Chained comparisons are false for NaN, so these also refuse NaN and the infinities.
        if not 0 <= self.temperature < float("inf"):
            raise GenerationParamsError(
                f"temperature must be a finite number >= 0 (0 = greedy); got {self.temperature}"
            )
        if self.top_k < 0:
            raise GenerationParamsError(f"top_k must be >= 0 (0 = no limit); got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise GenerationParamsError(f"top_p must be in (0, 1] (1 = no limit); got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == GREEDY_TEMPERATURE


def probabilities(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """Logits ``[N, V]`` -> float32 probabilities ``[N, V]`` after temperature, top-k and top-p.

    Raises:
        ValueError: for greedy sampling, which has no distribution (use the argmax).
    """
    if sampling.greedy:
        raise ValueError("greedy sampling has no distribution; take the argmax of the logits")
    return filtered_softmax(scale_temperature(logits, sampling.temperature), sampling)


def filtered_softmax(scores: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """Scores ``[N, V]`` already scaled by the temperature (and adjusted) -> float32 probabilities
    ``[N, V]`` after top-k and top-p. Top-p keeps the smallest set of most likely tokens whose
    mass reaches ``top_p`` (at least one)."""
    scores = scores.float()
    vocab_size = scores.shape[-1]
    if sampling.top_k != NO_TOP_K and sampling.top_k < vocab_size:
        kth_largest = torch.topk(scores, sampling.top_k, dim=-1).values[..., -1:]  # [N, 1]
        scores = scores.masked_fill(scores < kth_largest, float("-inf"))
    if sampling.top_p < NO_TOP_P:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)  # [N, V]
        sorted_probs = sorted_scores.softmax(dim=-1)
        # Mass strictly before each token; the most likely token has 0 < top_p, so one always stays.
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # [N, V]
        drop_sorted = mass_before >= sampling.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
        scores = scores.masked_fill(drop, float("-inf"))
    return scores.softmax(dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of ``probs`` ``[N, V]`` (rows need not be normalised) -> ``[N]`` int64.

    Inverse-CDF sampling with one uniform per row, the CDF in float64 (on a CPU it is several
    times cheaper than ``torch.multinomial`` over a vocabulary, and as exact).
    """
    cdf = probs.double().cumsum(dim=-1)  # [N, V]
    total = cdf[:, -1:].contiguous()  # [N, 1]
    uniform = torch.rand(total.shape, generator=generator, dtype=torch.float64, device=probs.device)  # [N, 1]
    chosen = torch.searchsorted(cdf, uniform * total, right=True)  # first token whose CDF exceeds u
    # u * total < total unless rounding reaches it; then take the last token that has mass.
    last_with_mass = torch.searchsorted(cdf, total)  # [N, 1]
    return torch.minimum(chosen, last_with_mass).squeeze(-1)


def greedy_verify(draft_tokens: Sequence[int], target_logits: torch.Tensor) -> list[int]:
    """Greedy verification: the accepted drafts, then the target's argmax at the first mismatch.

    ``target_logits`` is ``[K + 1, V]``: row i scores the position of draft token i; row K the
    position after the last draft. Returns 1..K+1 tokens.

    Raises:
        ValueError: the shapes do not fit together, or a draft token id is outside [0, V).
    """
    _check_target_rows(len(draft_tokens), target_logits)
    _check_draft_ids(draft_tokens, target_logits.shape[-1])
    target_choice = target_logits.argmax(dim=-1).tolist()  # [K + 1]
    emitted: list[int] = []
    for draft_token, target_token in zip(draft_tokens, target_choice):
        if draft_token != target_token:
            break
        emitted.append(draft_token)
    emitted.append(target_choice[len(emitted)])  # recovered, or bonus when all K matched
    return emitted


def token_match_verify(
    draft_tokens: Sequence[int], target_probs: torch.Tensor, generator: torch.Generator | None = None
) -> list[int]:
    """Verification without the draft's distributions (TensorRT-LLM's acceptance by token ids).

    One token t_i is drawn from each target distribution p_1..p_{K+1}; draft i is accepted while
    it equals t_i, and the first t_i that differs (or t_{K+1}, the bonus) ends the step. Every
    emitted token is drawn from the target's distribution at its position, so the output is
    distributed exactly as the target's; acceptance is lower than :func:`rejection_sample`'s
    (sum_x p(x)^2 per position instead of sum_x min(p(x), q(x))). At temperature 0 it is
    :func:`greedy_verify`. Randomness used: one draw by :func:`sample` for all K + 1 rows.

    ``target_probs`` is ``[K + 1, V]``; returns 1..K+1 tokens.

    Raises:
        ValueError: the shapes do not fit together, or a draft token id is outside [0, V).
    """
    _check_target_rows(len(draft_tokens), target_probs)
    _check_draft_ids(draft_tokens, target_probs.shape[-1])
    target_choice = sample(target_probs, generator).tolist()  # [K + 1]
    emitted: list[int] = []
    for draft_token, target_token in zip(draft_tokens, target_choice):
        if draft_token != target_token:
            break
        emitted.append(draft_token)
    emitted.append(target_choice[len(emitted)])
    return emitted


def rejection_sample(
    draft_tokens: Sequence[int] | torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
) -> list[int]:
    """Exact speculative sampling of one step: the accepted drafts, then a recovered or bonus token.

    Args:
        draft_tokens: ``[K]`` the drafted token ids.
        draft_probs: ``[K, V]`` the distributions the drafts were drawn from (q_1..q_K).
        target_probs: ``[K + 1, V]`` the target's distributions (p_1..p_{K+1}).
        generator: the source of randomness; ``None`` uses torch's global generator.

    Computes in float32 (float64 if given). A draft token with q = 0 is rejected; the residual is
    normalised only where it has mass, so nothing divides by zero.
    Randomness used, in order: K uniforms, then one draw by :func:`sample`.

    Returns:
        The emitted tokens, 1..K+1 of them.

    Raises:
        ValueError: when the shapes do not fit together, or a draft token id is outside [0, V)
            (a negative one would otherwise index from the end of the vocabulary).
    """
    dtype = torch.promote_types(target_probs.dtype, torch.float32)
    target = target_probs.to(dtype)  # [K + 1, V]
    draft = draft_probs.to(dtype)  # [K, V]
    tokens = torch.as_tensor(draft_tokens, dtype=torch.long, device=target.device)  # [K]
    num_drafts = tokens.shape[0]
    _check_target_rows(num_drafts, target)
    _check_draft_ids(draft_tokens, target.shape[-1])
    if draft.shape != (num_drafts, target.shape[-1]):
        raise ValueError(f"draft_probs must be [K, V] = [{num_drafts}, {target.shape[-1]}]; got {list(draft.shape)}")

    positions = torch.arange(num_drafts, device=target.device)
    target_of_draft = target[positions, tokens]  # [K] p_i(x_i)
    draft_of_draft = draft[positions, tokens]  # [K] q_i(x_i)
    uniform = torch.rand(num_drafts, generator=generator, dtype=dtype, device=target.device)  # [K]
    # u < p/q, written without dividing; q = 0 (a token the draft could not have drawn) rejects.
    accepted = ((uniform * draft_of_draft < target_of_draft) & (draft_of_draft > 0)).tolist()  # [K]
    num_accepted = accepted.index(False) if False in accepted else num_drafts
    emitted = tokens[:num_accepted].tolist()

    if num_accepted == num_drafts:
        emitted.append(int(sample(target[num_drafts : num_drafts + 1], generator)))  # bonus
        return emitted
    residual = residual_distribution(target[num_accepted], draft[num_accepted])  # [V]
    emitted.append(int(sample(residual[None], generator)))  # recovered
    return emitted


def verify_drafts(
    sampling: SamplingParams,
    draft_tokens: Sequence[int],
    target_scores: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> list[int]:
    """One verification step, the method chosen from what is given: the one place that decides.

    - greedy ``sampling``: :func:`greedy_verify` (the argmax of the scores);
    - sampled, with the draft's distributions: :func:`rejection_sample`;
    - sampled, without them: :func:`token_match_verify`.

    Args:
        sampling: the request's temperature, top-k and top-p, the same for both models.
        draft_tokens: ``[K]`` the drafted token ids (K = 0: one token from the target).
        target_scores: ``[K + 1, V]`` the target's scores, already scaled by the temperature and
            adjusted (:func:`~trt_spec.runtime.penalties.adjusted_scores`); top-k and top-p are
            applied here (:func:`filtered_softmax`).
        draft_probs: ``[K, V]`` the distributions the drafts were drawn from, or ``None``.
        generator: the source of randomness (greedy draws nothing).

    Returns:
        The accepted drafts, then one recovered or bonus token: 1..K+1 tokens.

    Raises:
        ValueError: the shapes do not fit together, or a draft token id is outside [0, V).
    """
    if sampling.greedy:
        return greedy_verify(draft_tokens, target_scores)
    target_probs = filtered_softmax(target_scores, sampling)  # [K + 1, V]
    if draft_probs is not None:
        return rejection_sample(draft_tokens, draft_probs, target_probs, generator)
    return token_match_verify(draft_tokens, target_probs, generator)


def residual_distribution(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)) over the last dimension: where a recovered token is drawn from.

    With beta = sum(min(p, q)), min(p, q) + (1 - beta) * residual = p: accepting with min(1, p/q)
    and recovering from the residual emits exactly p. Where p <= q everywhere (p = q up to rounding,
    so a rejection has probability ~0) the residual is undefined and p itself is returned; nothing
    is ever divided by zero.
    """
    residual = (target_probs - draft_probs).clamp_min(0)  # [..., V]
    mass = residual.sum(dim=-1, keepdim=True)  # [..., 1]
    return torch.where(mass > 0, residual / mass.clamp_min(torch.finfo(mass.dtype).tiny), target_probs)


def _check_target_rows(num_drafts: int, target: torch.Tensor) -> None:
    if target.dim() != 2 or target.shape[0] != num_drafts + 1:
        raise ValueError(f"target rows must be [K + 1, V] with K = {num_drafts}; got {list(target.shape)}")


def first_outside_vocabulary(tokens: Sequence[int] | torch.Tensor, vocab_size: int) -> tuple[int, int] | None:
    """``(position, id)`` of the first token id outside ``[0, vocab_size)``, or ``None`` when all are in it.

    Every step runs it: the common case costs one min and one max over the K ids.
    """
    ids = tokens.tolist() if isinstance(tokens, torch.Tensor) else tokens
    if len(ids) == 0 or (min(ids) >= 0 and max(ids) < vocab_size):
        return None
    return next((position, int(token)) for position, token in enumerate(ids) if not 0 <= token < vocab_size)


def _check_draft_ids(draft_tokens: Sequence[int] | torch.Tensor, vocab_size: int) -> None:
    """Refuse a draft token id outside ``[0, V)``: a negative one would read token V + id's row."""
    outside = first_outside_vocabulary(draft_tokens, vocab_size)
    if outside is not None:
        position, token = outside
        raise ValueError(f"draft token {token} at position {position} is outside the vocabulary [0, {vocab_size})")
