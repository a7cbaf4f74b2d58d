"""The packaged benchmark prompts: held-out Python sources of the demo pair's domain, and the
shape of a benchmark request (prompt length, new tokens)."""

from __future__ import annotations

import json
from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trt_spec.twin import TwinPair

PROMPTS_RESOURCE = ("data", "prompts", "pystdlib_heldout.json")
PROMPT_TOKENS = 64  # in-process: the first tokens of each prompt
PROMPT_CHARS = 240  # through a server: ~64 tokens of Python source with the demo tokenizer
MAX_NEW_TOKENS = 96


def load_prompt_texts() -> list[dict]:
    """The packaged benchmark prompts, each ``{"file": ..., "text": ...}``."""
    path = resources.files("trt_spec")
    for part in PROMPTS_RESOURCE:  # one part a call: Python 3.10's Traversable.joinpath takes one
        path = path.joinpath(part)
    return json.loads(path.read_text())["prompts"]


def _first_texts(num_prompts: int) -> list[str]:
    """The texts of the first ``num_prompts`` packaged prompts.

    Raises:
        ValueError: more prompts asked for than are packaged.
    """
    texts = load_prompt_texts()
    if not 1 <= num_prompts <= len(texts):
        raise ValueError(f"num_prompts must be in 1..{len(texts)}; got {num_prompts}")
    return [entry["text"] for entry in texts[:num_prompts]]


def load_prompts(pair: TwinPair, num_prompts: int, prompt_tokens: int) -> list[list[int]]:
    """The first ``prompt_tokens`` tokens of the first ``num_prompts`` packaged prompts.

    Raises:
        ValueError: more prompts asked for than are packaged.
    """
    return [pair.encode(text)[:prompt_tokens] for text in _first_texts(num_prompts)]


def prompt_texts(num_prompts: int, prompt_chars: int) -> list[str]:
    """The first ``num_prompts`` packaged prompts, each cut to ``prompt_chars`` characters at a line end.

    Raises:
        ValueError: more prompts asked for than are packaged.
    """
    cut = []
    for text in _first_texts(num_prompts):
        text = text[:prompt_chars]
        end = text.rfind("\n")
        cut.append(text[: end + 1] if end > prompt_chars // 2 else text)
    return cut
