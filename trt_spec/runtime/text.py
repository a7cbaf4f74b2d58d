"""Streaming detokenization: token ids arriving step by step -> text deltas.

The deltas concatenate to the decoding of all tokens (the contract of streamed ``text_output``).
A byte-level BPE token can end inside a UTF-8 character; such text is held back until the
character is complete. Two forms of one rule: :func:`text_delta` for the stateless
postprocessing model (each response carries a window of tokens, see ``tensors.py``), and
:class:`IncrementalDetokenizer` for a caller that sees the whole stream (the in-process loop).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

INCOMPLETE_CHARACTER = "\ufffd"  # what decoding shows for a UTF-8 sequence cut short


def decode(tokenizer: Any, ids: Sequence[int]) -> str:
    # No clean-up: it rewrites text already streamed (" ." -> "."), which a stream cannot undo.
    return str(tokenizer.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False))


def settled(text: str) -> str:
    """``text`` without its last character if that may still change: an incomplete UTF-8
    sequence decodes to exactly one U+FFFD, and only the last one can become something else."""
    return text[:-1] if text.endswith(INCOMPLETE_CHARACTER) else text


def text_delta(tokenizer: Any, window_ids: Sequence[int], num_context_tokens: int, is_final: bool) -> str:
    """The new text of one response: ``window_ids[num_context_tokens:]`` are new tokens, the
    ones before them were covered by earlier responses."""
    if not 0 <= num_context_tokens <= len(window_ids):
        raise ValueError(f"num_context_tokens {num_context_tokens} is outside 0..{len(window_ids)}")
    before = settled(decode(tokenizer, window_ids[:num_context_tokens])) if num_context_tokens else ""
    after = decode(tokenizer, window_ids)
    if not is_final:
        after = settled(after)
    if not after.startswith(before):
        # Only a tokenizer whose decode is not prefix-stable gets here; send what is new.
        return after[len(os.path.commonprefix([before, after])) :]
    return after[len(before) :]


class IncrementalDetokenizer:
    """Feed it tokens with :meth:`push`; it returns only the text not returned before."""

    def __init__(self, tokenizer: Any):
        self._tokenizer = tokenizer
        self._tokens: list[int] = []
        self._emitted = ""

    @property
    def text(self) -> str:
        """All the text returned so far."""
        return self._emitted

    def push(self, tokens: Sequence[int]) -> str:
        """Add tokens; the new complete text (possibly empty)."""
        self._tokens.extend(tokens)
        text = self._decode()
        if text.endswith(INCOMPLETE_CHARACTER):
            return ""
        return self._advance(text)

    def flush(self) -> str:
        """The rest of the text at the end of the stream, incomplete characters included."""
        return self._advance(self._decode())

    def _decode(self) -> str:
        return decode(self._tokenizer, self._tokens)

    def _advance(self, text: str) -> str:
        # Byte-level decoding is a concatenation, so the text so far is a prefix of the new text.
        delta = text[len(self._emitted) :]
        self._emitted = text
        return delta
