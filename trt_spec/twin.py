"""The PyTorch twin: the draft -> verify loop in-process on a spec's two Hugging Face checkpoints.

The in-process loop runs the engine code the torch flavor serves: :class:`TorchDrafter` and
:class:`TorchVerifier` implement the loop's protocol by calling
:meth:`~trt_spec.runtime.twin_engine.TwinEngine.run` on the draft and target engine models with
the :class:`~trt_spec.runtime.twin_engine.EngineRequest` values the loop model would send them
(``bls.engine_inputs``: ``end_id``, the stop words, the penalties with ``min_tokens`` = what is left
of the request's minimum, TensorRT-LLM's 1 by default), without the tensors in between. So greedy
vs rejection sampling vs token matching, ``min_tokens`` and the stopping rules are the served
engines' own. :class:`TwinPair` loads both checkpoints (plus the shared tokenizer) and starts
requests.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from trt_spec.errors import GenerationParamsError, PairMismatch
from trt_spec.runtime import methods
from trt_spec.runtime.costs import CPU_VERIFY_SLOPE, StepCosts
from trt_spec.runtime.loop import NO_DRAFT, Draft, Generation, GenerationParams
from trt_spec.runtime.methods import DRAFT_MODEL
from trt_spec.runtime.parameters import MAX_DRAFT_TOKENS
from trt_spec.runtime.penalties import ENGINE_DEFAULT_PENALTIES, Penalties
from trt_spec.runtime.sampling import SamplingParams
from trt_spec.runtime.torch_engine import TorchCausalLM
from trt_spec.runtime.twin_engine import EngineRequest, TwinEngine
from trt_spec.spec import Spec

IN_PROCESS_CACHE_SLOTS = 1  # one request at a time: the engine's own KV cache, never a copy


def in_process_engine(engine: TorchCausalLM, role: str) -> TwinEngine:
    """The engine model ``role`` over ``engine`` for in-process requests: one KV cache (``engine``'s
    own), drafts up to the loop's largest K, sequences up to the model's context."""
    return TwinEngine(
        engine,
        role,
        max_draft_len=MAX_DRAFT_TOKENS,
        max_seq_len=engine.max_length or sys.maxsize,
        cache_slots=IN_PROCESS_CACHE_SLOTS,
    )


@dataclass(frozen=True)
class TwinRequest:
    """What every engine call of one in-process request carries besides its sequence, as the loop
    model sends it from a served request (``bls.engine_inputs``).

    ``prompt_length``: the request's prompt, so a call over ``sequence`` knows the tokens generated
    before it; ``end_id``: the end token the engines stop after and ``min_tokens`` holds back
    (``None``: none, as ``end_id`` -1); ``penalties``: the request's, ``min_tokens`` its minimum
    (TensorRT-LLM's default 1: no ``end_id`` as the first generated token).
    """

    prompt_length: int = 0
    end_id: int | None = None
    stop_sequences: tuple[tuple[int, ...], ...] = ()
    penalties: Penalties = ENGINE_DEFAULT_PENALTIES

    def engine_request(
        self, sequence: Sequence[int], request_output_len: int, sampling: SamplingParams, draft: Draft = NO_DRAFT
    ) -> EngineRequest:
        """The request of one engine call over ``sequence`` (with ``draft`` to verify, for the target)."""
        return EngineRequest(
            sequence=list(sequence),
            request_output_len=request_output_len,
            draft_tokens=draft.tokens,
            draft_logits=None,
            draft_probs=draft.probs,
            end_id=self.end_id,
            sampling=sampling,
            seed=None,  # the request's generator draws
            return_generation_logits=False,
            exclude_input_in_output=True,
            stop_sequences=self.stop_sequences,
            penalties=self.call_penalties(len(sequence) - self.prompt_length),
        )

    def call_penalties(self, num_generated: int) -> Penalties:
        """The penalties of a call after ``num_generated`` tokens: ``min_tokens`` what is left of the
        request's minimum, as the loop model sends it on every call (one object once it is spent)."""
        if num_generated >= self.penalties.min_tokens:
            return self._spent_penalties
        return self.penalties.after(num_generated)

    @cached_property
    def _spent_penalties(self) -> Penalties:
        return replace(self.penalties, min_tokens=0) if self.penalties.min_tokens else self.penalties


class TorchDrafter:
    """Drafts on the draft engine model: one call for up to K tokens, as the loop model asks it
    (fewer after ``end_id`` or a stop sequence). ``engine``: a :class:`TwinEngine`, or a
    :class:`TorchCausalLM` to run one over (:func:`in_process_engine`)."""

    def __init__(self, engine: TwinEngine | TorchCausalLM, request: TwinRequest = TwinRequest()):
        self.engine = engine if isinstance(engine, TwinEngine) else in_process_engine(engine, "draft")
        self.request = request

    def propose(
        self,
        sequence: Sequence[int],
        num_draft_tokens: int,
        sampling: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        answer = self.engine.run(self.request.engine_request(sequence, num_draft_tokens, sampling), generator)
        # A sampled draft keeps the distributions its tokens were drawn from ([1, V] each); greedy none.
        return Draft(tokens=answer.tokens, probs=torch.cat(answer.probs) if answer.probs else None)  # [k, V]


class MethodDrafter:
    """The spec's speculation method as an in-process :class:`~trt_spec.runtime.loop.Drafter`: the
    drafts the method takes from the context (``methods.Method.propose``: prompt lookup), else the
    draft model's (``model_drafter``; ``None`` for a method without one), as the loop model's
    ``bls.StepProposer`` chooses them. A sampled lookup draft carries its point mass as one-hot
    ``probs`` ``[k, V]``, the distribution the served target gets as ``draft_logits``."""

    def __init__(
        self,
        method: methods.Method,
        lookup: methods.LookupParams,
        model_drafter: TorchDrafter | None,
        vocab_size: int,
    ):
        if method.uses_draft_model and model_drafter is None:
            raise ValueError(f"speculative.method {method.name} needs a draft model")
        self.method, self.lookup, self.model_drafter, self.vocab_size = method, lookup, model_drafter, vocab_size

    def propose(
        self,
        sequence: Sequence[int],
        num_draft_tokens: int,
        sampling: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        proposal = self.method.propose(sequence, num_draft_tokens, self.lookup)
        if proposal is None:
            assert self.model_drafter is not None  # __init__: a method that asks for one has one
            return replace(
                self.model_drafter.propose(sequence, num_draft_tokens, sampling, generator), source=DRAFT_MODEL
            )
        probs = None
        if proposal.tokens and not sampling.greedy:
            probs = torch.zeros(len(proposal.tokens), self.vocab_size)  # [k, V]
            probs[torch.arange(len(proposal.tokens)), torch.tensor(proposal.tokens)] = 1.0
        return Draft(tokens=proposal.tokens, probs=probs, source=proposal.source)


class TorchVerifier:
    """Verifies on the target engine model: the sequence plus all drafts in one call, which
    returns the accepted drafts plus one token (an empty draft: one token of plain decoding).
    ``engine``: a :class:`TwinEngine`, or a :class:`TorchCausalLM` to run one over."""

    def __init__(self, engine: TwinEngine | TorchCausalLM, request: TwinRequest = TwinRequest()):
        self.engine = engine if isinstance(engine, TwinEngine) else in_process_engine(engine, "target")
        self.request = request

    def verify(
        self,
        sequence: Sequence[int],
        draft: Draft,
        sampling: SamplingParams,
        generator: torch.Generator | None,
    ) -> list[int]:
        request = self.request.engine_request(sequence, len(draft.tokens) + 1, sampling, draft)
        return self.engine.run(request, generator).tokens


@dataclass
class TwinPair:
    """The target and draft models and their shared tokenizer, ready to serve requests.

    ``target`` and ``draft`` (:class:`TorchCausalLM`, each with its KV cache) are what the engine
    models ``target_engine`` and ``draft_engine`` run on; requests go through the engine models.
    """

    target: TorchCausalLM
    draft: TorchCausalLM | None  # None: a method without a draft model (prompt lookup)
    tokenizer: Any  # a transformers tokenizer (AutoTokenizer's class varies by model)
    eos_token_ids: frozenset[int]
    method: methods.Method = methods.get(methods.DEFAULT_METHOD)  # where drafts come from
    lookup: methods.LookupParams = methods.DEFAULT_LOOKUP  # the method's n-gram sizes, if it looks up
    # The engine models over target and draft: what the torch flavor serves, called in-process.
    target_engine: TwinEngine = field(init=False, repr=False)
    draft_engine: TwinEngine | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.method.uses_draft_model and self.draft is None:
            raise ValueError(f"speculative.method {self.method.name} needs a draft model")
        self.target_engine = in_process_engine(self.target, "target")
        self.draft_engine = in_process_engine(self.draft, "draft") if self.draft is not None else None

    @property
    def draft_model(self) -> TorchCausalLM:
        """The draft model, for code that runs only for methods with one.

        Raises:
            ValueError: the pair has none (prompt lookup).
        """
        if self.draft is None:
            raise ValueError(f"speculative.method {self.method.name} has no draft model")
        return self.draft

    @classmethod
    def from_dirs(
        cls,
        target_dir: str | Path,
        draft_dir: str | Path | None,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        runner: str = "auto",
        method: methods.Method | None = None,
        lookup: methods.LookupParams = methods.DEFAULT_LOOKUP,
        engine_dtype: str = "float16",
    ) -> TwinPair:
        """Load the Hugging Face checkpoint directories (``draft_dir`` None: no draft model, for
        prompt lookup); the tokenizer comes from the target's. ``method``: where drafts come from
        (default: ``draft_target`` with a draft, ``prompt_lookup`` without).

        ``runner`` picks the engines' forward pass (see :class:`TorchCausalLM`); ``engine_dtype``
        the precision they run at (the spec's ``engine.dtype``: ``torch_engine.compute_dtypes``).

        Raises:
            PairMismatch: the two vocabularies differ in size.
        """
        from transformers import AutoTokenizer

        def load(directory: str | Path) -> TorchCausalLM:
            return TorchCausalLM.from_pretrained(
                directory, device=device, dtype=dtype, runner=runner, engine_dtype=engine_dtype
            )

        target = load(target_dir)
        draft = None
        if draft_dir is not None:
            draft = load(draft_dir)
            if target.vocab_size != draft.vocab_size:
                raise PairMismatch(
                    f"the target's vocabulary has {target.vocab_size} tokens and the draft's {draft.vocab_size}; "
                    f"speculative decoding needs one shared tokenizer"
                )
        if method is None:
            method = methods.get(methods.DEFAULT_METHOD if draft is not None else "prompt_lookup")
        tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
        return cls(target, draft, tokenizer, _eos_token_ids(target, tokenizer), method=method, lookup=lookup)

    @classmethod
    def from_spec(
        cls,
        spec: Spec,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        runner: str = "auto",
    ) -> TwinPair:
        """Load the spec's two checkpoints (a local directory, or the huggingface_hub cache).

        Raises:
            NotDownloadedError, IncompleteSnapshotError: a Hub model is not (fully) downloaded.
            PairMismatch: the two vocabularies differ in size.
        """
        return cls.from_dirs(
            checkpoint_dir(spec, "target"),
            checkpoint_dir(spec, "draft") if spec.has_draft else None,
            device=device,
            dtype=dtype,
            runner=runner,
            method=spec.method,
            lookup=spec.speculative.prompt_lookup.params,
            engine_dtype=spec.engine.dtype,
        )

    def with_method(self, method: methods.Method, lookup: methods.LookupParams | None = None) -> TwinPair:
        """The same loaded models drafting by another method (``tune`` and ``bench`` compare them).

        Raises:
            ValueError: ``method`` needs a draft model this pair has not loaded.
        """
        return TwinPair(self.target, self.draft, self.tokenizer, self.eos_token_ids, method, lookup or self.lookup)

    def generate(
        self,
        prompt: Sequence[int],
        params: GenerationParams,
        *,
        seed: int | None = None,
        penalties: Penalties = ENGINE_DEFAULT_PENALTIES,
    ) -> Generation:
        """Start one request; iterate the result for the tokens of each step.

        The engines get what a served request's engine calls get (:class:`TwinRequest`): ``end_id``
        (:meth:`end_id`), the stop sequences and ``penalties``, whose ``min_tokens`` is the
        request's minimum (by default TensorRT-LLM's 1, as the server applies it: EOS is never the
        first token).

        Raises:
            GenerationParamsError: the prompt is empty, or prompt + max_new_tokens + K exceeds the
            models' context length.
        """
        models = (self.target, self.draft) if self.draft is not None else (self.target,)
        limit = min(filter(None, (model.max_length for model in models)), default=None)
        needed = len(prompt) + params.max_new_tokens + params.num_draft_tokens
        if limit is not None and needed > limit:
            raise GenerationParamsError(
                f"prompt ({len(prompt)} tokens) + max_new_tokens ({params.max_new_tokens}) + K "
                f"({params.num_draft_tokens}) = {needed} exceeds the models' context of {limit} tokens"
            )
        generator = None
        if seed is not None:
            generator = torch.Generator(device=self.target.device).manual_seed(seed)
        request = TwinRequest(len(prompt), self.end_id(params.eos_token_ids), params.stop_sequences, penalties)
        drafter = None
        if params.num_draft_tokens:
            model_drafter = TorchDrafter(self.draft_engine, request) if self.draft_engine is not None else None
            drafter = MethodDrafter(self.method, self.lookup, model_drafter, self.target.vocab_size)
        return Generation(prompt, drafter, TorchVerifier(self.target_engine, request), params, generator)

    def end_id(self, eos_token_ids: frozenset[int]) -> int | None:
        """The engines' ``end_id`` for a request ending at ``eos_token_ids``: the tokenizer's EOS when
        it is one of them (what the server's preprocessing sends), else the smallest; ``None``
        without any (TensorRT-LLM takes one end id: other EOS ids still end the request in the loop,
        but ``min_tokens`` does not hold them back)."""
        if not eos_token_ids:
            return None
        tokenizer_eos = getattr(self.tokenizer, "eos_token_id", None)
        return tokenizer_eos if tokenizer_eos in eos_token_ids else min(eos_token_ids)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def step_costs(self) -> StepCosts:
        """Adaptive K's fixed costs for this pair (loop.StepCosts): t_d / t_1 as the draft's
        parameters over the target's (embeddings left out: a step reads only its tokens' rows),
        and on a CPU the twin's measured verify slope (on a GPU a verify step costs what one
        token costs)."""
        target = _step_params(self.target.model)
        # Without a draft model (prompt lookup) a draft costs next to nothing beside a target step.
        draft = _step_params(self.draft.model) if self.draft is not None and self.method.uses_draft_model else 0
        slope = CPU_VERIFY_SLOPE if self.target.device.type == "cpu" else 0.0
        return StepCosts.from_parameters(draft, target, verify_slope=slope)


def _step_params(model: torch.nn.Module) -> int:
    """The parameters one decode step reads: all but the input embedding's."""
    transformers_model: Any = model  # get_input_embeddings() is transformers', beyond torch.nn.Module's types
    embedding = transformers_model.get_input_embeddings().weight
    return sum(p.numel() for p in model.parameters() if p is not embedding)


def checkpoint_dir(spec: Spec, role: str) -> Path:
    """The Hugging Face checkpoint directory of ``role``: the spec's local directory, or the
    snapshot ``trt-spec download`` pinned in the lock file.

    Raises:
        NotDownloadedError: a Hub model that ``trt-spec download`` has not fetched.
        IncompleteSnapshotError: its files are missing or truncated.
    """
    from trt_spec.checkpoints.download import local_snapshot

    return local_snapshot(spec, role).path


def _eos_token_ids(engine: TorchCausalLM, tokenizer) -> frozenset[int]:
    generation_config = getattr(engine.model, "generation_config", None)
    eos = getattr(generation_config, "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return frozenset()
    return frozenset([eos] if isinstance(eos, int) else eos)
