"""GPU memory model for a target engine beside its draft engine.

Placement: target rank r runs on GPU r; draft rank r shares GPU r with target rank r (so a
tp-1 draft sits on GPU 0). Every sequence lives in both KV caches (the draft reads the same
tokens as the target), so both engines get the same number of KV-cache tokens, chosen as the
largest number that fits on every GPU. That number is given to TensorRT-LLM as an absolute
``max_tokens_in_paged_kv_cache``: a free-memory fraction alone would depend on which engine
loads first.

Estimates, each named so it can be checked against a real deployment:
- weights: parameters x bytes, split by tensor parallelism the way TensorRT-LLM's Llama
  checkpoints are (attention and MLP split, vocabulary embedding replicated, lm_head split
  by rows and stored even when the HF model ties it to the embedding, norms replicated);
- KV cache per token: 2 (K and V) x layers x KV heads per rank x head size x bytes;
- activations: TensorRT allocates the engine's scratch memory for ``max_num_tokens`` tokens at
  load; we take the widest per-token buffers of a decoder layer, twice over, plus float32
  generation logits for every verified position;
- a fixed runtime overhead per engine per GPU (CUDA context, cuBLAS/NCCL workspaces) and a
  share of the GPU kept free as headroom.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from trt_spec.checkpoints.config import ModelInfo
from trt_spec.gpus import GPUS

MIB = 1024**2
GIB = 1024**3

RUNTIME_OVERHEAD_BYTES = 1 * GIB  # per engine per GPU: CUDA context, cuBLAS and NCCL workspaces
HEADROOM_FRACTION = 0.05  # of each GPU, never planned for
KV_BLOCK_TOKENS = 64  # the engines' tokens_per_block (plan passes it to trtllm-build); budgets are whole blocks
LOGITS_BYTES = 4  # generation logits are float32
DTYPE_BYTES = {"float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class EngineMemory:
    """What one engine needs on each GPU it occupies."""

    tp_size: int
    weights_bytes: int  # per rank
    kv_bytes_per_token: int  # per rank
    activation_bytes: int  # per rank
    overhead_bytes: int  # per rank

    @property
    def fixed_bytes(self) -> int:
        return self.weights_bytes + self.activation_bytes + self.overhead_bytes


@dataclass(frozen=True)
class GpuMemory:
    """One GPU's ledger, in bytes."""

    index: int
    capacity: int
    headroom: int
    target_fixed: int
    draft_fixed: int
    kv_bytes_per_token: int  # both engines' KV caches together, per token
    kv_cache: int  # both engines' KV caches at the planned token budget
    unused: int


@dataclass(frozen=True)
class MemoryPlan:
    gpu: str
    gpu_capacity_bytes: int
    target: EngineMemory
    draft: EngineMemory | None  # None: the method has no draft model (prompt lookup)
    gpus: tuple[GpuMemory, ...]
    kv_tokens: int  # max_tokens_in_paged_kv_cache, the same for both engines
    tokens_per_sequence: int  # max_seq_len + K: the longest sequence either cache must hold

    @property
    def full_sequences(self) -> int:
        return self.kv_tokens // self.tokens_per_sequence

    def to_json(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "gpu_capacity_bytes": self.gpu_capacity_bytes,
            "kv_tokens": self.kv_tokens,
            "full_sequences": self.full_sequences,
            "target": {**asdict(self.target), "max_tokens_in_paged_kv_cache": self.kv_tokens},
            "draft": (
                None if self.draft is None else {**asdict(self.draft), "max_tokens_in_paged_kv_cache": self.kv_tokens}
            ),
            "per_gpu": [asdict(gpu) for gpu in self.gpus],
        }


@dataclass(frozen=True)
class RankParams:
    """The parameters one tensor-parallel rank stores, grouped by how a decode step reads them."""

    embedding: int  # the vocabulary embedding, replicated: a step gathers only its tokens' rows
    layers: int  # this rank's share of every decoder layer (attention and MLP split, norms replicated)
    lm_head: int  # this rank's rows of the output projection

    @property
    def total(self) -> int:
        return self.embedding + self.layers + self.lm_head

    @property
    def streamed(self) -> int:
        """Parameters every decode step reads whole: the layers and the lm_head (not the embedding)."""
        return self.layers + self.lm_head


def rank_params(model: ModelInfo, tp_size: int) -> RankParams:
    """Parameters per rank in TensorRT-LLM's Llama split (see the module docstring)."""
    split = model.layer_params - 2 * model.hidden_size  # attention + MLP, split across ranks
    replicated = 2 * model.hidden_size + model.hidden_size  # layer norms, final norm
    vocab_per_rank = -(-model.vocab_size // tp_size)  # lm_head rows, padded to a multiple of tp
    return RankParams(
        embedding=model.embedding_params,
        layers=model.num_layers * (split // tp_size + replicated),
        lm_head=vocab_per_rank * model.hidden_size,  # stored separately even when tied in HF
    )


def kv_bytes_per_token_per_rank(model: ModelInfo, *, tp_size: int, dtype: str) -> int:
    """2 (K and V) x layers x KV heads per rank x head size x bytes. KV heads are replicated when
    fewer than ranks."""
    kv_heads_per_rank = max(1, model.num_kv_heads // tp_size)
    return 2 * model.num_layers * kv_heads_per_rank * model.head_dim * DTYPE_BYTES[dtype]


def engine_memory(
    model: ModelInfo,
    *,
    tp_size: int,
    dtype: str,
    max_num_tokens: int,
    max_batch_size: int,
    logits_positions: int,
) -> EngineMemory:
    """Per-rank memory of one engine. ``logits_positions``: positions per sequence whose
    logits the engine returns each step (K + 1 for a verifying target)."""
    dtype_bytes = DTYPE_BYTES[dtype]
    vocab_per_rank = -(-model.vocab_size // tp_size)  # lm_head rows, padded to a multiple of tp
    kv_bytes_per_token = kv_bytes_per_token_per_rank(model, tp_size=tp_size, dtype=dtype)
    qkv_width = (model.num_heads + 2 * model.num_kv_heads) * model.head_dim // tp_size
    widest_per_token = 4 * model.hidden_size + 2 * model.intermediate_size // tp_size + qkv_width
    activations = 2 * max_num_tokens * widest_per_token * dtype_bytes
    logits = max_batch_size * logits_positions * vocab_per_rank * LOGITS_BYTES
    return EngineMemory(
        tp_size=tp_size,
        weights_bytes=rank_params(model, tp_size).total * dtype_bytes,
        kv_bytes_per_token=kv_bytes_per_token,
        activation_bytes=activations + logits,
        overhead_bytes=RUNTIME_OVERHEAD_BYTES,
    )


def place(gpu: str, target: EngineMemory, draft: EngineMemory | None, tokens_per_sequence: int) -> MemoryPlan:
    """Place both engines on the target's GPUs and size the shared KV-cache token budget
    (``draft`` None: the target alone, for a method without a draft model).

    The budget may come out zero or negative; the caller decides what is an error.
    """
    capacity = GPUS[gpu].memory_bytes
    headroom = int(capacity * HEADROOM_FRACTION)
    budgets = []
    for index in range(target.tp_size):
        on_gpu_draft = draft is not None and index < draft.tp_size
        free = capacity - headroom - target.fixed_bytes - (draft.fixed_bytes if draft and on_gpu_draft else 0)
        per_token = target.kv_bytes_per_token + (draft.kv_bytes_per_token if draft and on_gpu_draft else 0)
        budgets.append((index, on_gpu_draft, free, per_token))
    kv_tokens = min(free // per_token for _, _, free, per_token in budgets)
    kv_tokens = max(0, kv_tokens) // KV_BLOCK_TOKENS * KV_BLOCK_TOKENS
    gpus = tuple(
        GpuMemory(
            index=index,
            capacity=capacity,
            headroom=headroom,
            target_fixed=target.fixed_bytes,
            draft_fixed=draft.fixed_bytes if draft and on_gpu_draft else 0,
            kv_bytes_per_token=per_token,
            kv_cache=kv_tokens * per_token,
            unused=free - kv_tokens * per_token,
        )
        for index, on_gpu_draft, free, per_token in budgets
    )
    return MemoryPlan(
        gpu=gpu,
        gpu_capacity_bytes=capacity,
        target=target,
        draft=draft,
        gpus=gpus,
        kv_tokens=kv_tokens,
        tokens_per_sequence=tokens_per_sequence,
    )


def format_bytes(count: int) -> str:
    return f"{count / GIB:,.2f} GiB" if abs(count) >= GIB / 10 else f"{count / MIB:,.1f} MiB"
