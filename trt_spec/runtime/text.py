"""Streaming detokenization: token ids arriving step by step -> text deltas.

The deltas concatenate to the decoding of all tokens (the contract of streamed ``text_output``).
A byte-level BPE token can end inside a UTF-8 character; such text is held back until the
character is complete.
"""

from __future__ import annotations

from collections.abc import Sequence

INCOMPLETE_CHARACTER = "\ufffd"  # what decoding shows for a UTF-8 sequence cut short


class IncrementalDetokenizer:
    """Feed it tokens with :meth:`push`; it returns only the text not returned before."""

    def __init__(self, tokenizer):
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
        return self._tokenizer.decode(self._tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def _advance(self, text: str) -> str:
        # Byte-level decoding is a concatenation, so the text so far is a prefix of the new text.
        delta = text[len(self._emitted) :]
        self._emitted = text
        return delta
