"""What both preprocessing models (ours and TensorRT-LLM's interface) do with a tokenizer: the
prompt byte bound that refuses a huge prompt before it is decoded or tokenized, TensorRT-LLM's
word-list format, and its embedding bias.

numpy only (and the tokenizer handed in): this module runs inside Triton's python-backend stub.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

# A tokenizer's normalizer (NFKC, lowercasing, whitespace clean-up) may map more input bytes to a
# token than the token decodes to; NFKC's largest expansion the other way is 18x for one character
# (U+FDFA), the other way round (many bytes to few) a few x. The byte bound allows this much.
NORMALIZATION_MARGIN = 4


# Stop words, bad words and embedding-bias words: each string costs a tokenizer call, so a
# request's lists are bounded before any is tokenized (100,000 of them took ~7 s and held up
# every other request).
MAX_WORDS = 256
MAX_WORD_BYTES = 1024


class PromptTooLarge(ValueError):
    """A prompt over the byte bound; the message names the input, its size and the fix."""


class WordListTooLarge(ValueError):
    """A word list over :data:`MAX_WORDS` entries or a word over :data:`MAX_WORD_BYTES` bytes."""


def check_word_list(words: object, name: str) -> None:
    """Refuse a word-list input (an array of strings or bytes) that is too long, before any use.

    Raises:
        WordListTooLarge: naming ``name``, the count or size, and the limit.
    """
    values = list(np.asarray(words, dtype=object).reshape(-1))
    if len(values) > MAX_WORDS:
        raise WordListTooLarge(f"{name} has {len(values)} entries; at most {MAX_WORDS} are allowed")
    for value in values:
        size = len(value) if isinstance(value, bytes) else len(str(value).encode("utf-8", "surrogatepass"))
        if size > MAX_WORD_BYTES:
            raise WordListTooLarge(f"{name} holds a {size}-byte entry; each may have at most {MAX_WORD_BYTES} bytes")


def max_prompt_bytes(tokenizer: Any, max_input_len: int) -> int:
    """Bytes of UTF-8 text that ``max_input_len`` tokens can cover at most: no token decodes to
    more than the longest token's bytes (special tokens included), times the normalisation
    margin. A prompt over this many bytes is over ``max_input_len`` tokens without tokenizing it."""
    longest = max((len(tokenizer.decode([token]).encode("utf-8")) for token in range(len(tokenizer))), default=1)
    return max_input_len * max(1, longest) * NORMALIZATION_MARGIN


def check_prompt_size(value: object, max_bytes: int, max_input_len: int, name: str) -> None:
    """Refuse a prompt of more than ``max_bytes`` bytes before decoding or tokenizing it.

    Raises:
        PromptTooLarge: naming ``name``, the size, the limit and the fix.
    """
    size = len(value) if isinstance(value, bytes) else len(str(value).encode("utf-8"))
    if size > max_bytes:
        raise PromptTooLarge(
            f"{name} is {size} bytes, more than the engine's max_input_len of {max_input_len} tokens can hold "
            f"(at most {max_bytes} bytes with this tokenizer); shorten the prompt"
        )


def word_list(words: Sequence[Sequence[int]]) -> np.ndarray:
    """TensorRT-LLM's ``[2, L]`` stop/bad-word format: flat ids; end offsets padded with -1
    (``L`` >= 1: no words = ``[[0], [-1]]``)."""
    flat = [token for word in words for token in word]
    offsets = list(np.cumsum([len(word) for word in words])) if words else []
    width = max(1, len(flat))
    ids = flat + [0] * (width - len(flat))
    ends = offsets + [-1] * (width - len(offsets))
    return np.array([ids, ends], dtype=np.int32)


def stack_word_lists(lists: Sequence[np.ndarray]) -> np.ndarray:
    """One ``[2, L]`` list per prompt -> ``[N, 2, max L]``: ids padded with 0, offsets with -1, as
    TensorRT-LLM's preprocessing pads them."""
    width = max(array.shape[1] for array in lists)
    return np.stack(
        [
            np.stack(
                [
                    np.pad(array[0], (0, width - array.shape[1]), constant_values=0),
                    np.pad(array[1], (0, width - array.shape[1]), constant_values=-1),
                ]
            )
            for array in lists
        ]
    ).astype(np.int32)


def embedding_bias(tokenizer: Any, words: Iterable[str], weights: Iterable[float], vocab_size: int) -> np.ndarray:
    """``[V]`` float32: each word's weight added at every one of its tokens, the word encoded with
    the tokenizer's defaults (special tokens included), as TensorRT-LLM's preprocessing does
    (``triton_backend/all_models/inflight_batcher_llm/preprocessing/1/model.py``, ``_get_embedding_bias``)."""
    bias = np.zeros(vocab_size, dtype=np.float64)
    for word, weight in zip(words, weights):
        for token in tokenizer(word, add_special_tokens=True).input_ids:
            if 0 <= token < bias.size:
                bias[token] += float(weight)
    return bias.astype(np.float32)
