"""Speculation methods: where a step's draft tokens come from, as a registry.

A method is one module of this package that defines ``METHOD`` (a :class:`Method`): pure data
(which engines and checkpoints it needs) and one rule, :meth:`Method.propose`, that says which
drafts the request's own context gives. Both loop drivers (the Triton loop model,
:func:`trt_spec.runtime.bls.run_loop`, and the in-process :class:`~trt_spec.runtime.loop.Generation`)
call it once per step; when it gives none they ask the draft model, if the method has one:

    proposal = method.propose(sequence, k, lookup) or <the draft model's k tokens>

so a method adds no branch to either loop. Verification is the same for every method
(:func:`~trt_spec.runtime.sampling.verify_drafts`): a draft without distributions (prompt lookup)
is a point mass, and rejection sampling against a point mass is exact (``prompt_lookup.py``).

The spec names the method (``speculative.method``); :func:`get` and :func:`names` are what the spec,
the plan, the repository writer and the loop model ask. Adding a method is one module here plus its
tests in ``tests/methods/`` (docs/contributing.md, "Adding a speculation method").

Standard library only (numpy and torch are not needed to choose drafts): loaded inside Triton.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from trt_spec.runtime.registry import discover

DRAFT_MODEL = "draft_model"  # a proposal's source: the draft engine
PROMPT_LOOKUP = "prompt_lookup"  # a proposal's source: n-grams of the request's own tokens
SOURCES = (DRAFT_MODEL, PROMPT_LOOKUP)

DEFAULT_METHOD = "draft_target"
# Upstream's defaults differ: TensorRT-LLM's NGramDecodingConfig.max_matching_ngram_size is 2
# (tensorrt_llm/llmapi/llm_args.py, 1.2.x and @0004396720054fd8e205cbf616f21f0b57c6b412), vLLM's
# prompt_lookup_min = prompt_lookup_max = 5 unless set (vllm/config/speculative.py); SGLang's NGRAM
# matches windows of 1..12. Ours: suffixes of 3 down to 1 token, a middle that keeps short code
# identifiers matchable without proposing after every common single token first.
DEFAULT_MIN_NGRAM = 1
DEFAULT_MAX_NGRAM = 3
MAX_NGRAM_LIMIT = 64  # longer suffixes never pay: a match that long is found by a shorter one first


@dataclass(frozen=True)
class LookupParams:
    """``speculative.prompt_lookup``: the suffix n-gram sizes matched against the request's tokens.

    Raises:
        ValueError: ``min_ngram`` below 1, or above ``max_ngram``, or ``max_ngram`` above the limit.
    """

    min_ngram: int = DEFAULT_MIN_NGRAM
    max_ngram: int = DEFAULT_MAX_NGRAM

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram <= MAX_NGRAM_LIMIT:
            raise ValueError(
                f"prompt lookup needs 1 <= min_ngram <= max_ngram <= {MAX_NGRAM_LIMIT}; "
                f"got min_ngram {self.min_ngram}, max_ngram {self.max_ngram}"
            )


DEFAULT_LOOKUP = LookupParams()


@dataclass(frozen=True)
class Proposal:
    """One step's drafts and where they came from (``DRAFT_MODEL`` or ``PROMPT_LOOKUP``)."""

    tokens: list[int]
    source: str


@dataclass(frozen=True)
class Method:
    """One speculation method: what it needs, and which drafts the context gives it.

    ``uses_draft_model``: a draft checkpoint, a draft engine and the ``tensorrt_llm_draft`` model;
    ``uses_lookup``: drafts from the request's own tokens (``speculative.prompt_lookup`` applies).
    ``llmapi_decoding_type``: its ``speculative_config.decoding_type`` on TensorRT-LLM's PyTorch
    backend (the llmapi flavor); ``None`` where that backend has no counterpart.
    """

    name: str
    summary: str
    uses_draft_model: bool
    uses_lookup: bool
    llmapi_decoding_type: str | None
    # The module's rule behind propose(): (sequence, K, lookup parameters) -> Proposal | None.
    context_drafts: Callable[[Sequence[int], int, LookupParams], Proposal | None]
    # The target engine's trtllm-build --speculative_decoding_mode: every method here hands the
    # target host-side drafts (draft_input_ids), so its target is built to take them.
    target_decoding_mode: str = "draft_tokens_external"

    @property
    def roles(self) -> tuple[str, ...]:
        """The engines a deployment of this method builds and serves, by role."""
        return ("target", "draft") if self.uses_draft_model else ("target",)

    def propose(self, sequence: Sequence[int], num_draft_tokens: int, lookup: LookupParams) -> Proposal | None:
        """The drafts the request's context gives for a step of ``num_draft_tokens`` (>= 1), or
        ``None``: ask the draft model. A proposal may be empty (no match): the step is plain."""
        return self.context_drafts(sequence, num_draft_tokens, lookup)


def _discover() -> dict[str, Method]:
    return discover(__name__, __path__, "METHOD", Method)


METHODS: dict[str, Method] = _discover()


def names() -> tuple[str, ...]:
    return tuple(METHODS)


def get(name: str) -> Method:
    """The method called ``name``.

    Raises:
        ValueError: no such method (names the choices).
    """
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"speculative.method must be one of {', '.join(METHODS)}; got {name!r}") from None
