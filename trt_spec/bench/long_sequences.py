"""The long-sequence scenario on the demo pair: prompts near the spec's ``max_input_len`` that
generate until ``max_seq_len``, small enough to run on a CPU. ``tests/test_trtllm_long_sequences.py``
checks it against the target alone; ``scripts/emulated_load.py`` measures it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trt_spec.bench.prompts import load_prompt_texts
from trt_spec.runtime import methods
from trt_spec.spec import Spec, parse_spec

MAX_INPUT_LEN = 480
MAX_SEQ_LEN = 640
PROMPT_TOKENS = 450


def long_sequence_spec(pair_dir: str | Path, acceptance: str, method: str = "draft_target") -> Spec:
    """The tensorrtllm-flavor spec of the pair in ``pair_dir`` (``target/``, ``draft/``), K = 4,
    speculating by ``method`` (without a draft model for prompt lookup)."""
    pair = Path(pair_dir)
    draft = {"draft": {"model": str(pair / "draft")}} if methods.get(method).uses_draft_model else {}
    return parse_spec(
        {
            "name": f"long-{acceptance}-{method}".replace("_", "-"),
            "target": {"model": str(pair / "target")},
            **draft,
            "speculative": {"method": method, "num_draft_tokens": 4, "acceptance": acceptance},
            "engine": {"max_batch_size": 8, "max_input_len": MAX_INPUT_LEN, "max_seq_len": MAX_SEQ_LEN},
            "triton": {"flavor": "tensorrtllm"},
        }
    )


def long_prompts(tokenizer: Any, count: int) -> list[str]:
    """``count`` prompts of PROMPT_TOKENS tokens: three packaged Python sources (~250 tokens each)
    joined, cut at a token boundary.

    Raises:
        ValueError: more prompts than half the packaged sources, or joined sources too short.
    """
    sources = [entry["text"] for entry in load_prompt_texts()]
    half = len(sources) // 2
    if not 1 <= count <= half:
        raise ValueError(f"count must be in 1..{half}; got {count}")
    prompts = []
    for index in range(count):
        tokens = tokenizer("\n".join((sources[index], sources[index + half], sources[(index + 1) % half])))["input_ids"]
        if len(tokens) < PROMPT_TOKENS:
            raise ValueError(f"prompt {index} has {len(tokens)} tokens, fewer than {PROMPT_TOKENS}")
        prompts.append(tokenizer.decode(tokens[:PROMPT_TOKENS]))
    return prompts
