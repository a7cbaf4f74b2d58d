"""The PyTorch twin: the draft -> verify loop in-process on a spec's two Hugging Face checkpoints.

:class:`TorchDrafter` and :class:`TorchVerifier` implement the loop's protocol over two
:class:`~trt_spec.runtime.torch_engine.TorchCausalLM` engines; :class:`TwinPair` loads both
(plus the shared tokenizer) and starts requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from trt_spec.errors import GenerationParamsError, PairMismatch
from trt_spec.runtime.costs import CPU_VERIFY_SLOPE, StepCosts
from trt_spec.runtime.loop import Draft, Generation, GenerationParams
from trt_spec.runtime.sampling import SamplingParams, greedy_verify, probabilities, rejection_sample, sample
from trt_spec.runtime.torch_engine import TorchCausalLM
from trt_spec.spec import Spec


class TorchDrafter:
    """Drafts autoregressively on its engine: one single-token call per draft token."""

    def __init__(self, engine: TorchCausalLM):
        self.engine = engine

    def propose(
        self,
        sequence: Sequence[int],
        num_draft_tokens: int,
        sampling: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        context = list(sequence)
        draft_probs = []  # k x [1, V]; greedy verification needs none
        for _ in range(num_draft_tokens):
            logits = self.engine.logits(context, 1)  # [1, V]
            if sampling.greedy:
                token = int(logits.argmax())
            else:
                probs = probabilities(logits, sampling)  # [1, V]
                token = int(sample(probs, generator))
                draft_probs.append(probs)
            context.append(token)
        return Draft(tokens=context[len(sequence) :], probs=torch.cat(draft_probs) if draft_probs else None)  # [k, V]


class TorchVerifier:
    """Scores the last committed token plus all drafts in one target call, then accepts."""

    def __init__(self, engine: TorchCausalLM):
        self.engine = engine

    def verify(
        self,
        sequence: Sequence[int],
        draft: Draft,
        sampling: SamplingParams,
        generator: torch.Generator | None,
    ) -> list[int]:
        num_drafts = len(draft.tokens)
        # Row i scores draft i's position; row k is the bonus position.
        target_logits = self.engine.logits(list(sequence) + draft.tokens, num_drafts + 1)  # [k + 1, V]
        if sampling.greedy:
            return greedy_verify(draft.tokens, target_logits)
        target_probs = probabilities(target_logits, sampling)  # [k + 1, V]
        return rejection_sample(draft.tokens, _draft_probs(draft, sampling, target_probs), target_probs, generator)


def _draft_probs(draft: Draft, sampling: SamplingParams, target_probs: torch.Tensor) -> torch.Tensor:
    """The draft's distributions ``[k, V]``: as proposed, else processed from its logits."""
    if draft.probs is not None:
        return draft.probs
    if draft.logits is not None:
        return probabilities(draft.logits, sampling)
    if not draft.tokens:
        return target_probs.new_zeros(0, target_probs.shape[-1])
    raise ValueError("sampled verification needs the draft's probs or logits")


@dataclass
class TwinPair:
    """The target and draft engines and their shared tokenizer, ready to serve requests."""

    target: TorchCausalLM
    draft: TorchCausalLM
    tokenizer: object  # a transformers tokenizer
    eos_token_ids: frozenset[int]

    @classmethod
    def from_dirs(
        cls,
        target_dir: str | Path,
        draft_dir: str | Path,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        runner: str = "auto",
    ) -> TwinPair:
        """Load two Hugging Face checkpoint directories; the tokenizer comes from the target's.

        ``runner`` picks the engines' forward pass (see :class:`TorchCausalLM`).

        Raises:
            PairMismatch: the two vocabularies differ in size.
        """
        from transformers import AutoTokenizer

        target = TorchCausalLM.from_pretrained(target_dir, device=device, dtype=dtype, runner=runner)
        draft = TorchCausalLM.from_pretrained(draft_dir, device=device, dtype=dtype, runner=runner)
        if target.vocab_size != draft.vocab_size:
            raise PairMismatch(
                f"the target's vocabulary has {target.vocab_size} tokens and the draft's {draft.vocab_size}; "
                f"speculative decoding needs one shared tokenizer"
            )
        tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
        return cls(target, draft, tokenizer, _eos_token_ids(target, tokenizer))

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
            checkpoint_dir(spec, "target"), checkpoint_dir(spec, "draft"), device=device, dtype=dtype, runner=runner
        )

    def generate(
        self,
        prompt: Sequence[int],
        params: GenerationParams,
        *,
        seed: int | None = None,
    ) -> Generation:
        """Start one request; iterate the result for the tokens of each step.

        Raises:
            GenerationParamsError: the prompt is empty, or prompt + max_new_tokens + K exceeds the
            models' context length.
        """
        limit = min(filter(None, (self.target.max_length, self.draft.max_length)), default=None)
        needed = len(prompt) + params.max_new_tokens + params.num_draft_tokens
        if limit is not None and needed > limit:
            raise GenerationParamsError(
                f"prompt ({len(prompt)} tokens) + max_new_tokens ({params.max_new_tokens}) + K "
                f"({params.num_draft_tokens}) = {needed} exceeds the models' context of {limit} tokens"
            )
        generator = None
        if seed is not None:
            generator = torch.Generator(device=self.target.device).manual_seed(seed)
        drafter = TorchDrafter(self.draft) if params.num_draft_tokens else None
        return Generation(prompt, drafter, TorchVerifier(self.target), params, generator)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def step_costs(self) -> StepCosts:
        """Adaptive K's fixed costs for this pair (loop.StepCosts): t_d / t_1 as the draft's
        parameters over the target's (embeddings left out: a step reads only its tokens' rows),
        and on a CPU the twin's measured verify slope (on a GPU a verify step costs what one
        token costs)."""
        draft, target = (_step_params(engine.model) for engine in (self.draft, self.target))
        slope = CPU_VERIFY_SLOPE if self.target.device.type == "cpu" else 0.0
        return StepCosts.from_parameters(draft, target, verify_slope=slope)


def _step_params(model: torch.nn.Module) -> int:
    """The parameters one decode step reads: all but the input embedding's."""
    embedding = model.get_input_embeddings().weight
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
