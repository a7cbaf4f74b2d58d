"""What TensorRT-LLM's decoding layers do to an engine's raw logits before a token is drawn.

Speculative output is distributed as the target's only if the draft's distribution q and the
target's p are computed exactly as the engines compute them, so this is written from TensorRT-LLM's
kernels, in their order:

1. **embedding bias**: ``z + bias`` (a bias per vocabulary entry);
2. **temperature**: ``× 1 / (T + 1e-6)``, skipped when T = 1 (greedy requests send no temperature,
   so T = 1: penalties act on unscaled logits before the argmax);
3. for every token already in the sequence (prompt and generated tokens alike, ``c`` times):
   **repetition** ``z < 0 ? z × r : z / r``, then **presence** ``z − p``, then **frequency**
   ``z − f × c``;
4. **min_tokens**: ``end_id`` masked while fewer than ``min_tokens`` tokens have been generated
   (by this engine call: the loop sends each call what is left of the request's minimum);
5. **bad words**: a single-token bad word is always masked; the last token of a longer one is
   masked when the sequence (prompt included) ends with the rest of it. Token id 0 is never
   masked (the kernel's ``0 < banned_token`` test).

Steps 1-4: ``cpp/tensorrt_llm/kernels/penaltyKernels.cu`` ``batchApplyPenalty`` (NVIDIA/TensorRT-LLM
@249d93d); the defaults (temperature 1, repetition 1, presence 0, frequency 0, min length 1):
``cpp/tensorrt_llm/layers/defaultDecodingParams.h`` (@1020a8d); step 5:
``cpp/tensorrt_llm/kernels/banBadWords.cu`` ``ban_bad_words`` (@23bc5b7). The engines run the
penalty layer, then the ban-words layer, then sampling or external-draft verification
(``layers/layersFactory.h``), so top-k and top-p see the adjusted scores.

Each row of a ``[N, V]`` block is adjusted for its own position: row i of a call over
``context`` and ``row_tokens`` sees ``context + row_tokens[:i]`` and ``i`` generated tokens, as
the engines' per-position decoding of external draft tokens does. Standard library and torch only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from trt_spec.runtime.errors import GenerationParamsError

NEUTRAL_TEMPERATURE = 1.0
TEMPERATURE_EPSILON = 1e-6  # penaltyKernels.cu: invTemperature = 1 / (temperature + 1e-6)
ENGINE_MIN_TOKENS = 1  # TensorRT-LLM's min length when a request sends none (defaultDecodingParams.h)
# Ranges that keep every adjusted logit finite and meaningful in float32 (TensorRT-LLM checks only
# repetition_penalty > 0: 1e-45 would divide logits into infinities, and the softmax into NaN).
REPETITION_PENALTY_RANGE = (0.01, 100.0)
MAX_ADDITIVE_PENALTY = 100.0  # |presence_penalty|, |frequency_penalty|
MAX_BIAS_WEIGHT = 1e4  # |embedding_bias_weights|
MASKED = float("-inf")


def scale_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """float32 logits × 1/(T + 1e-6), as TensorRT-LLM's penalty kernel scales them; T = 1 unscaled.

    Finite for every T >= 0 (T = 0 multiplies by 1e6), so a tiny temperature cannot overflow."""
    scores = logits.float()
    if temperature == NEUTRAL_TEMPERATURE:
        return scores
    return scores * (1.0 / (temperature + TEMPERATURE_EPSILON))


@dataclass(frozen=True)
class Penalties:
    """A request's logit adjustments besides temperature (module docstring), the same for the
    draft and the target.

    ``min_tokens`` counts from where the adjustment starts: the request's minimum at the request
    level, what is left of it in an engine call (:meth:`after`). ``bad_words``: token sequences.
    ``embedding_bias``: ``(token, weight)`` pairs (a token may repeat: weights add up).

    Raises:
        GenerationParamsError: a penalty or bias weight outside its range (the constants above),
            min_tokens < 0, or an empty bad word.
    """

    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_tokens: int = 0
    bad_words: tuple[tuple[int, ...], ...] = ()
    embedding_bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        low, high = REPETITION_PENALTY_RANGE
        if not low <= self.repetition_penalty <= high:  # false for NaN too
            raise GenerationParamsError(
                f"repetition_penalty must be between {low:g} and {high:g} (1 = none); got {self.repetition_penalty}"
            )
        for name, value in (("presence", self.presence_penalty), ("frequency", self.frequency_penalty)):
            if not abs(value) <= MAX_ADDITIVE_PENALTY:
                raise GenerationParamsError(
                    f"{name}_penalty must be between -{MAX_ADDITIVE_PENALTY:g} and {MAX_ADDITIVE_PENALTY:g} "
                    f"(0 = none); got {value}"
                )
        if self.min_tokens < 0:
            raise GenerationParamsError(f"min_tokens must be >= 0; got {self.min_tokens}")
        if any(len(word) == 0 for word in self.bad_words):
            raise GenerationParamsError("a bad word is empty")
        if any(not abs(weight) <= MAX_BIAS_WEIGHT for _, weight in self.embedding_bias):
            raise GenerationParamsError(
                f"embedding_bias_weights must be between -{MAX_BIAS_WEIGHT:g} and {MAX_BIAS_WEIGHT:g}, "
                "each token's summed weights too"
            )

    @property
    def counts_occurrences(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def neutral(self) -> bool:
        """Nothing to adjust (min_tokens 0, no penalty, no bad word, no bias)."""
        return not (self.counts_occurrences or self.min_tokens or self.bad_words or self.embedding_bias)

    def after(self, num_generated: int) -> Penalties:
        """These penalties for an engine call that starts after ``num_generated`` tokens: what is
        left of ``min_tokens``."""
        left = max(0, self.min_tokens - num_generated)
        return self if left == self.min_tokens else replace(self, min_tokens=left)

    def bias_vector(self, vocab_size: int) -> torch.Tensor:
        """``embedding_bias`` as a dense float32 ``[V]``."""
        bias = torch.zeros(vocab_size, dtype=torch.float32)
        for token, weight in self.embedding_bias:
            bias[token] += weight
        return bias


NO_PENALTIES = Penalties()
ENGINE_DEFAULT_PENALTIES = Penalties(min_tokens=ENGINE_MIN_TOKENS)  # what an engine request without them gets


def adjusted_scores(
    logits: torch.Tensor,
    temperature: float,
    penalties: Penalties,
    context: Sequence[int],
    row_tokens: Sequence[int] = (),
    end_id: int | None = None,
) -> torch.Tensor:
    """Raw logits ``[N, V]`` -> the scores TensorRT-LLM samples from (float32 ``[N, V]``), before
    top-k and top-p. ``temperature``: 1 for greedy. Row i continues ``context + row_tokens[:i]``
    after i tokens of this call (``row_tokens`` needs at least N - 1 entries)."""
    num_rows, vocab_size = logits.shape
    scores = logits.float()
    if penalties.embedding_bias:
        scores = scores + penalties.bias_vector(vocab_size)
    scores = scale_temperature(scores, temperature)
    if penalties.neutral:
        return scores
    scores = scores.clone()
    if penalties.counts_occurrences:
        scores = _occurrence_penalties(scores, penalties, context, row_tokens)
    if end_id is not None and 0 <= end_id < vocab_size:
        masked_rows = min(num_rows, penalties.min_tokens)  # row i has i generated tokens
        scores[:masked_rows, end_id] = MASKED
    for row in range(num_rows) if penalties.bad_words else ():
        for token in banned_tokens(penalties.bad_words, [*context, *row_tokens[:row]]):
            if 0 < token < vocab_size:
                scores[row, token] = MASKED
    return scores


def _occurrence_penalties(
    scores: torch.Tensor, penalties: Penalties, context: Sequence[int], row_tokens: Sequence[int]
) -> torch.Tensor:
    num_rows, vocab_size = scores.shape
    seen = torch.tensor([t for t in context if 0 <= t < vocab_size], dtype=torch.long)
    counts = torch.bincount(seen, minlength=vocab_size).expand(num_rows, vocab_size).clone()  # [N, V]
    for row in range(1, num_rows):
        counts[row:, row_tokens[row - 1]] += 1  # row i has seen row_tokens[:i] too
    present = counts > 0
    if penalties.repetition_penalty != 1.0:
        penalised = torch.where(
            scores < 0, scores * penalties.repetition_penalty, scores / penalties.repetition_penalty
        )
        scores = torch.where(present, penalised, scores)
    if penalties.presence_penalty != 0.0:
        scores = scores - present.float() * penalties.presence_penalty
    if penalties.frequency_penalty != 0.0:
        scores = scores - counts.float() * penalties.frequency_penalty
    return scores


def banned_tokens(bad_words: Sequence[Sequence[int]], sequence: Sequence[int]) -> list[int]:
    """The tokens the bad words forbid next after ``sequence``."""
    banned = []
    for word in bad_words:
        prefix = word[:-1]
        if not prefix or (
            len(sequence) >= len(prefix) and list(sequence[len(sequence) - len(prefix) :]) == list(prefix)
        ):
            banned.append(int(word[-1]))
    return banned
