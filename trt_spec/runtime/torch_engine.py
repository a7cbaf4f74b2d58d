"""The PyTorch twin of a TensorRT-LLM engine: a Hugging Face causal LM with a reused KV cache.

Like TensorRT-LLM with KV-cache reuse, :meth:`TorchCausalLM.logits` takes the whole sequence
and computes only what its cache does not hold yet. The cache is position-indexed, so rolling back
rejected drafts is a crop: nothing of the accepted prefix is recomputed. One engine holds the cache
of one sequence; :meth:`TorchCausalLM.logits_batch` runs several engines' sequences in one forward
pass (an in-flight batch: ``runtime/inflight_batcher.py``).

Two runners do the forward pass over the model's own weights:

- :class:`LlamaRunner` for Llama-architecture models: a plain forward (fused projections, a
  preallocated KV cache where a crop is moving an index). On small models much of a Hugging Face
  forward is framework overhead: on the demo pair on a CPU this runner is about twice as fast.
- :class:`HFRunner` for any other causal LM: the model's own ``forward`` with transformers'
  ``DynamicCache`` (cropped with ``DynamicCache.crop``).

Precision follows the spec's ``engine.dtype`` (:func:`compute_dtypes`): on a GPU the model runs in
it; a CPU has no fast float16 kernels, so float16 runs in float32 (its weights exactly) and
bfloat16 as bfloat16 matrix products inside a float32 forward (:class:`_Linear`).

Works with transformers 4.57 (NVIDIA's TensorRT-LLM container) and 5.x: the API differences (the
cache argument's name, ``dtype``) are looked up here, once.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.nn.functional as F

from trt_spec.runtime.loop import common_prefix_length

if TYPE_CHECKING:
    from transformers import DynamicCache
    from typing_extensions import Self

LLAMA_MODEL_TYPES = ("llama",)
RUNNERS = ("auto", "llama", "hf")  # auto: llama where the model is one, else hf
_TORCH_VERSION = tuple(int(part) for part in torch.__version__.split(".")[:2])
_SDPA_HAS_GQA = _TORCH_VERSION >= (2, 5)
_HAS_FUSED_RMS_NORM = hasattr(F, "rms_norm")
ENGINE_DTYPES = ("float16", "bfloat16")  # the spec's engine.dtype


def compute_dtypes(engine_dtype: str, device: torch.device) -> tuple[torch.dtype, torch.dtype | None]:
    """(the dtype the twin computes in, the dtype of its projections' products where it differs)
    for an engine of ``engine_dtype`` on ``device``.

    On CUDA the twin runs in the engine's dtype. On a CPU float16 runs in float32: float16 weights
    are exact in float32, and without AVX512-FP16 a float16 matrix product is ~10x slower.
    bfloat16 runs as the engine's GEMMs do (bfloat16 weights and inputs, float32 accumulation, a
    bfloat16 result) inside a float32 forward: attention, norms, residuals and sampling stay
    float32. The weights are read in half the bytes, which is what a memory-bound decode step
    costs. Every operation of the Llama runner computes a row as it would beside any other rows
    (:class:`_Linear`, :func:`_by_row_blocks`), so a request batched computes what it computes
    alone bit for bit, which bfloat16 needs: its roundings turn a last-bit difference into one
    that can change a token.

    Raises:
        ValueError: an engine dtype other than float16 or bfloat16.
    """
    if engine_dtype not in ENGINE_DTYPES:
        raise ValueError(f"engine dtype must be one of {', '.join(ENGINE_DTYPES)}; got {engine_dtype!r}")
    if device.type == "cuda":
        return getattr(torch, engine_dtype), None
    return torch.float32, (torch.bfloat16 if engine_dtype == "bfloat16" else None)


class Runner(Protocol):
    def forward(self, new_tokens: torch.Tensor, start: int, num_logits: int) -> torch.Tensor:
        """Run ``new_tokens`` ``[1, n]`` at positions start..start+n-1 after a cache holding
        positions 0..start-1; return the logits ``[num_logits, V]`` of the last positions."""

    def crop(self, length: int) -> None:
        """Keep only positions 0..length-1 in the cache."""

    def fork(self) -> Self:
        """A runner over the same weights with an empty cache of its own."""

    def copy_prefix(self, other: Self, length: int) -> None:
        """Replace this cache with positions 0..length-1 of ``other``'s (a runner of the same model)."""


class _Projection(Protocol):
    """An ``nn.Linear``'s weights, as a fused projection reads them."""

    @property
    def weight(self) -> torch.Tensor: ...

    @property
    def bias(self) -> torch.Tensor | None: ...


class TorchCausalLM:
    """A causal LM scoring one sequence at a time, reusing its KV cache across calls.

    ``runner``: ``"auto"`` (Llama runner for Llama models, else Hugging Face's forward),
    ``"llama"`` or ``"hf"``.

    Raises (from the constructor):
        ValueError: an unknown runner, or ``"llama"`` for a model that is not a Llama.
    Raises (from :meth:`logits`):
        ValueError: ``num_positions`` outside 1..len(sequence), or a sequence longer than the
        model's ``max_position_embeddings``.
    """

    def __init__(self, model: torch.nn.Module, *, runner: str = "auto", gemm_dtype: torch.dtype | None = None):
        if runner not in RUNNERS:
            raise ValueError(f"runner must be one of {', '.join(RUNNERS)}; got {runner!r}")
        self.model = model.eval()
        config: Any = model.config  # a transformers config: torch types a module's attributes as Tensor | Module
        self.config = config
        self.device = next(model.parameters()).device
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        self.vocab_size: int = text_config.vocab_size
        self.max_length: int | None = getattr(text_config, "max_position_embeddings", None)
        is_llama = getattr(text_config, "model_type", None) in LLAMA_MODEL_TYPES
        if runner == "llama" and not is_llama:
            raise ValueError(f"the llama runner needs a Llama model; this is {text_config.model_type!r}")
        use_llama = runner == "llama" or (runner == "auto" and is_llama)
        self.runner_name = "llama" if use_llama else "hf"
        # gemm_dtype (bfloat16 on a CPU, compute_dtypes): the Llama runner's projections run in it;
        # the HF runner computes in the model's dtype over the same rounded weights.
        self.gemm_dtype = gemm_dtype
        self.runner: Runner = LlamaRunner(model, self.max_length, gemm_dtype) if use_llama else HFRunner(model)
        self._cached_tokens: list[int] = []

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        runner: str = "auto",
        engine_dtype: str = "float16",
    ) -> TorchCausalLM:
        """Load a checkpoint directory on CUDA when present, else on the CPU, at the precision of
        an ``engine_dtype`` engine (:func:`compute_dtypes`); ``dtype`` overrides the compute dtype."""
        from transformers import AutoModelForCausalLM

        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        compute, gemm = compute_dtypes(engine_dtype, device)
        dtype = dtype or compute
        gemm = gemm if dtype == torch.float32 else None
        with _quiet_loading():
            # bfloat16 products: the weights rounded to bfloat16 as the engine's are, then float32
            loaded = gemm or dtype
            model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(str(path), **{_dtype_argument(): loaded})
        return cls(model.to(device, dtype), runner=runner, gemm_dtype=gemm)

    @property
    def cached_length(self) -> int:
        return len(self._cached_tokens)

    @property
    def cached_tokens(self) -> list[int]:
        """The sequence the cache holds (read-only: do not modify)."""
        return self._cached_tokens

    def reset(self) -> None:
        """Forget the cached sequence."""
        self.runner.crop(0)
        self._cached_tokens = []

    @torch.inference_mode()
    def fork(self) -> TorchCausalLM:
        """A second engine over the same model and weights, with an empty KV cache of its own
        (one per sequence in flight, e.g. one per request a server interleaves)."""
        twin = copy.copy(self)
        twin.runner = self.runner.fork()
        twin._cached_tokens = []
        return twin

    @torch.inference_mode()
    def copy_prefix_from(self, other: TorchCausalLM, length: int) -> None:
        """Make this engine's cache hold ``other``'s first ``length`` cached tokens (copied, so
        both go on independently), as TensorRT-LLM's KV-cache block reuse shares a prefix."""
        length = min(length, other.cached_length)
        self.runner.copy_prefix(other.runner, length)
        self._cached_tokens = other._cached_tokens[:length]

    @torch.inference_mode()
    def logits(self, sequence: Sequence[int], num_positions: int = 1) -> torch.Tensor:
        """Logits ``[num_positions, V]`` (float32) at the last ``num_positions`` positions of ``sequence``.

        Row i predicts the token after ``sequence[len(sequence) - num_positions + i]``. Only the
        tokens past the longest prefix shared with the cache are run through the model (at least
        ``num_positions`` of them); the cache is cropped to that prefix first.
        """
        return TorchCausalLM.logits_batch([(self, sequence, num_positions)])[0]

    def new_tokens_for(self, sequence: Sequence[int], num_positions: int = 1) -> int:
        """How many tokens :meth:`logits` would run for ``sequence``: those past the cached prefix."""
        return len(sequence) - min(common_prefix_length(self._cached_tokens, sequence), len(sequence) - num_positions)

    @staticmethod
    @torch.inference_mode()
    def logits_batch(calls: Sequence[tuple[TorchCausalLM, Sequence[int], int]]) -> list[torch.Tensor]:
        """:meth:`logits` of several ``(engine, sequence, num_positions)`` calls, each engine a
        distinct cache over the same model, in ONE forward pass where the runner can batch (the
        Llama runner), else one after the other; each call's logits are its own."""
        for engine, sequence, num_positions in calls:  # every call checked before any cache changes
            length = len(sequence)
            if not 1 <= num_positions <= length:
                raise ValueError(f"num_positions must be in 1..{length} (the sequence length); got {num_positions}")
            if engine.max_length and length > engine.max_length:
                raise ValueError(f"the sequence has {length} tokens; the model takes at most {engine.max_length}")
        starts, new_tokens = [], []
        for engine, sequence, num_positions in calls:
            reused = min(common_prefix_length(engine._cached_tokens, sequence), len(sequence) - num_positions)
            if reused < len(engine._cached_tokens):
                engine.runner.crop(reused)
            starts.append(reused)
            new_tokens.append(torch.tensor(sequence[reused:], dtype=torch.long, device=engine.device))  # [new]
        counts = [num_positions for _, _, num_positions in calls]
        runners = [engine.runner for engine, _, _ in calls]
        if len(calls) > 1 and all(isinstance(runner, LlamaRunner) for runner in runners):
            llama_runners = [runner for runner in runners if isinstance(runner, LlamaRunner)]
            results = LlamaRunner.forward_batch(llama_runners, new_tokens, starts, counts)
        else:
            results = [
                runner.forward(tokens[None], start, count)
                for runner, tokens, start, count in zip(runners, new_tokens, starts, counts)
            ]
        for engine, sequence, _ in calls:
            engine._cached_tokens = list(sequence)
        return [logits.float() for logits in results]


class HFRunner:
    """Any causal LM through its own ``forward``, with a transformers ``DynamicCache``."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        forward_params = inspect.signature(model.forward).parameters
        # transformers 5 renamed `past_key_values` to `cache`.
        self._cache_argument = "cache" if "cache" in forward_params else "past_key_values"
        self._keeps_logits = "logits_to_keep" in forward_params
        self._cache: DynamicCache | None = None
        self._length = 0

    def crop(self, length: int) -> None:
        if length == 0:
            self._cache = None
        elif length < self._length:
            assert self._cache is not None  # a cached length > 0: forward made the cache
            self._cache.crop(length - self._length)  # negative: drop that many (4.57 and 5.x alike)
        self._length = min(self._length, length)

    def fork(self) -> HFRunner:
        return HFRunner(self.model)

    def copy_prefix(self, other: HFRunner, length: int) -> None:
        self._cache = copy.deepcopy(other._cache) if other._cache is not None and length > 0 else None
        self._length = other._length if self._cache is not None else 0
        self.crop(length)

    def forward(self, new_tokens: torch.Tensor, start: int, num_logits: int) -> torch.Tensor:
        if self._cache is None:
            self._cache = _new_dynamic_cache(self.model)
        end = start + new_tokens.shape[1]
        positions = torch.arange(start, end, device=new_tokens.device)[None]  # [1, n]
        extra = {"logits_to_keep": num_logits} if self._keeps_logits else {}
        output = self.model(
            input_ids=new_tokens, position_ids=positions, use_cache=True, **{self._cache_argument: self._cache}, **extra
        )
        self._length = end
        return output.logits[0, -num_logits:]  # [num_logits, V]


class LlamaRunner:
    """A Llama forward over the Hugging Face module's weights, with a preallocated KV cache.

    The same maths as transformers' Llama (RMSNorm, rotary embeddings from the model's own
    rotary module, scaled-dot-product attention, gated MLP), in as few tensor operations as it
    takes: on small models each operation's dispatch costs more than its arithmetic. The changes
    move float32 results only in the last bits: QKV and gate/up projections fused into one matmul
    each, each run by the kernel that is fastest for its size (:class:`_Linear`); rotary tables
    computed once per position. Those weight copies roughly double the weight memory: this is a
    twin for tests, demos and small models, not a serving runtime.
    """

    # Rotary types whose frequencies depend on the sequence length: no fixed table.
    DYNAMIC_ROPE_TYPES = ("dynamic", "longrope")

    def __init__(self, model: torch.nn.Module, max_length: int | None, gemm_dtype: torch.dtype | None = None):
        # transformers' LlamaConfig, LlamaModel and head: torch types a module's attributes as Tensor | Module.
        config: Any = model.config
        decoder: Any = model.model
        lm_head: Any = model.lm_head
        self.num_heads: int = config.num_attention_heads
        self.num_kv_heads: int = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim: int = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.eps: float = config.rms_norm_eps
        self.scale = self.head_dim**-0.5  # SDPA's default scale
        self.hidden_act: str | None = getattr(config, "hidden_act", None)
        self.rotary: torch.nn.Module = decoder.rotary_emb
        self.embed: torch.Tensor = decoder.embed_tokens.weight  # [V, H]
        self.final_norm: torch.Tensor = decoder.norm.weight  # [H]
        self.gemm_dtype = gemm_dtype
        self.lm_head = _Linear([lm_head.weight], None, gemm_dtype)  # H -> V
        self.layers = [_LlamaLayer(layer, self) for layer in decoder.layers]
        self.max_length = max_length
        self._static_rope = getattr(self.rotary, "rope_type", "default") not in self.DYNAMIC_ROPE_TYPES
        half = self.head_dim // 2
        # rotate_half(x) = cat(-x2, x1) = x[..., swap] * sign
        self._swap_halves = torch.cat([torch.arange(half, self.head_dim), torch.arange(half)]).to(self.embed.device)
        self._sign = torch.cat([-torch.ones(half), torch.ones(half)]).to(self.embed)
        # [layers, kv_heads, capacity, head_dim]; grown by doubling as the sequence grows.
        self._keys = self.embed.new_zeros(len(self.layers), self.num_kv_heads, 0, self.head_dim)
        self._values = torch.zeros_like(self._keys)
        self._cos = self._signed_sin = self.embed.new_zeros(0, self.head_dim)  # [capacity, head_dim]
        self._length = 0

    def crop(self, length: int) -> None:
        self._length = min(self._length, length)  # positions past it are overwritten later

    def fork(self) -> LlamaRunner:
        twin = copy.copy(self)  # shares the weights and rotary tables; _reserve replaces, never mutates, them
        twin._keys = self._keys.new_zeros(*self._keys.shape[:2], 0, self.head_dim)
        twin._values = torch.zeros_like(twin._keys)
        twin._cos = twin._signed_sin = self.embed.new_zeros(0, self.head_dim)
        twin._length = 0
        return twin

    def copy_prefix(self, other: LlamaRunner, length: int) -> None:
        length = min(length, other._length)
        self._length = 0
        self._reserve(length)
        self._keys[:, :, :length] = other._keys[:, :, :length]
        self._values[:, :, :length] = other._values[:, :, :length]
        self._length = length

    def forward(self, new_tokens: torch.Tensor, start: int, num_logits: int) -> torch.Tensor:
        return LlamaRunner.forward_batch([self], [new_tokens[0]], [start], [num_logits])[0]

    @staticmethod
    def forward_batch(
        runners: Sequence[LlamaRunner],
        new_tokens: Sequence[torch.Tensor],
        starts: Sequence[int],
        num_logits: Sequence[int],
    ) -> list[torch.Tensor]:
        """Several sequences in ONE forward pass, each on its own runner (distinct caches over the
        same weights): sequence i's ``new_tokens[i]`` ``[n_i]`` at positions starts[i].. after its
        cache; returns its logits ``[num_logits[i], V]``. The projections, MLP and head run once
        over all the rows (the weights are read once per step, as an in-flight batch on a GPU);
        attention runs per sequence over its own cache (:class:`_Segment`)."""
        first = runners[0]
        segments = []
        row = 0
        for runner, tokens, start, count in zip(runners, new_tokens, starts, num_logits):
            num_new = tokens.shape[0]
            end = start + num_new
            runner._reserve(end)
            context = num_new - min(count, num_new)
            # A context row attends to the cache and to the new tokens up to itself.
            mask = None
            if context > 1:
                mask = torch.ones(context, start + context, dtype=torch.bool, device=first.embed.device).tril(start)
            segments.append(_Segment(runner, row, row + num_new, start, end, context, mask))
            row += num_new
        tokens = new_tokens[0] if len(new_tokens) == 1 else torch.cat(list(new_tokens))  # [rows]
        hidden = F.embedding(tokens, first.embed)  # [rows, H]
        tables = [segment.runner._rotary_tables(hidden, segment.start, segment.end) for segment in segments]
        if len(tables) == 1:
            cos, signed_sin = tables[0]
        else:
            cos, signed_sin = torch.cat([c for c, _ in tables]), torch.cat([s for _, s in tables])
        for index, layer in enumerate(first.layers):
            hidden = layer.forward(hidden, cos, signed_sin, index, segments)
        for segment in segments:
            segment.runner._length = segment.end
        last_rows = [
            hidden[segment.rows_end - count : segment.rows_end] for segment, count in zip(segments, num_logits)
        ]
        kept = last_rows[0] if len(last_rows) == 1 else torch.cat(last_rows)
        logits = first.lm_head(_rms_norm(kept, first.final_norm, first.eps))  # [sum num_logits, V]
        return list(logits.split(list(num_logits)))

    def rotate(self, heads: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
        """Rotary embedding of ``heads`` ``[n, h, d]``: x cos + rotate_half(x) sin."""
        return heads * cos + heads[..., self._swap_halves] * signed_sin

    def _rotary_tables(self, hidden: torch.Tensor, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not self._static_rope:
            positions = torch.arange(start, end, device=hidden.device)[None]  # [1, n]
            cos, sin = self.rotary(hidden[None], positions)  # [1, n, d] each
            return cos[0, :, None], (sin[0] * self._sign)[:, None]
        return self._cos[start:end, None], self._signed_sin[start:end, None]

    def _reserve(self, length: int) -> None:
        capacity = self._keys.shape[2]
        if length <= capacity:
            return
        new_capacity = max(length, 2 * capacity, 64)
        if self.max_length:
            new_capacity = max(length, min(new_capacity, self.max_length))
        shape = list(self._keys.shape)
        shape[2] = new_capacity
        keys, values = self._keys.new_zeros(shape), self._values.new_zeros(shape)
        keys[:, :, : self._length] = self._keys[:, :, : self._length]
        values[:, :, : self._length] = self._values[:, :, : self._length]
        self._keys, self._values = keys, values
        if self._static_rope:
            positions = torch.arange(new_capacity, device=keys.device)[None]  # [1, capacity]
            cos, sin = self.rotary(self.embed[None, :1], positions)  # [1, capacity, d] each
            self._cos, self._signed_sin = cos[0].contiguous(), (sin[0] * self._sign).contiguous()


class _LlamaLayer:
    """One decoder layer's weights, projections fused: [q k v] and [gate up].

    ``layer``: transformers' ``LlamaDecoderLayer`` (Any: torch types a module's submodules as
    Tensor | Module)."""

    def __init__(self, layer: Any, runner: LlamaRunner):
        attention, mlp = layer.self_attn, layer.mlp
        self.runner = runner
        self.input_norm: torch.Tensor = layer.input_layernorm.weight
        self.post_attention_norm: torch.Tensor = layer.post_attention_layernorm.weight
        projections = (attention.q_proj, attention.k_proj, attention.v_proj)
        gemm = runner.gemm_dtype
        self.qkv = _Linear([p.weight for p in projections], _fused_bias(projections), gemm)  # H -> (heads + 2 kv) d
        self.o_proj = _Linear([attention.o_proj.weight], attention.o_proj.bias, gemm)  # heads d -> H
        gate_up = [mlp.gate_proj.weight, mlp.up_proj.weight]
        self.gate_up = _Linear(gate_up, _fused_bias((mlp.gate_proj, mlp.up_proj)), gemm)
        self.down = _Linear([mlp.down_proj.weight], mlp.down_proj.bias, gemm)  # I -> H
        # F.silu rather than the module: the module costs a dispatch more
        self.act: Callable[[torch.Tensor], torch.Tensor] = F.silu if runner.hidden_act == "silu" else mlp.act_fn
        self.intermediate_size: int = mlp.gate_proj.weight.shape[0]

    def forward(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        signed_sin: torch.Tensor,
        index: int,
        segments: Sequence[_Segment],
    ) -> torch.Tensor:
        """``hidden`` ``[rows, H]`` of the ``segments`` (each a sequence's rows) -> ``[rows, H]``;
        writes each sequence's new keys and values into its runner's cache of layer ``index``."""
        runner = self.runner
        num_rows, heads, kv_heads = hidden.shape[0], runner.num_heads, runner.num_kv_heads

        normed = _rms_norm(hidden, self.input_norm, runner.eps)  # [rows, H]
        qkv = self.qkv(normed).view(num_rows, heads + 2 * kv_heads, runner.head_dim)
        rotated = runner.rotate(qkv[:, : heads + kv_heads], cos, signed_sin)  # [rows, heads + kv_heads, d]
        attended_parts = []
        for segment in segments:
            rows = slice(segment.rows_start, segment.rows_end)
            keys, values = segment.runner._keys[index], segment.runner._values[index]  # [kv_heads, capacity, d]
            keys[:, segment.start : segment.end] = rotated[rows, heads:].transpose(0, 1)
            values[:, segment.start : segment.end] = qkv[rows, heads + kv_heads :].transpose(0, 1)
            if segment.context:  # [heads, context, d]
                context_rows = slice(segment.rows_start, segment.rows_start + segment.context)
                context_end = segment.start + segment.context
                query = rotated[context_rows, :heads].transpose(0, 1)[None]  # [1, heads, context, d]
                keys_to, values_to = keys[None, :, :context_end], values[None, :, :context_end]
                attended_parts.append(_attention(query, keys_to, values_to, segment.mask)[0])
            for offset in range(segment.context, segment.rows_end - segment.rows_start):
                # a scored row alone, over the cache up to itself: three small ops cost less than
                # SDPA's setup (~0.1 ms), and a token is computed alike in a decode and a verification
                end = segment.start + offset + 1
                query = rotated[segment.rows_start + offset, :heads].view(kv_heads, heads // kv_heads, runner.head_dim)
                weights = torch.bmm(query, keys[:, :end].transpose(1, 2)).mul_(runner.scale).softmax(dim=-1)
                attended_parts.append(torch.bmm(weights, values[:, :end]).view(heads, 1, runner.head_dim))
        attended = (
            attended_parts[0] if len(attended_parts) == 1 else torch.cat(attended_parts, dim=1)
        )  # [heads, rows, d]
        attended = attended.transpose(0, 1).reshape(num_rows, heads * runner.head_dim)  # [rows, heads * d]
        hidden = self.o_proj(attended, residual=hidden)

        normed = _rms_norm(hidden, self.post_attention_norm, runner.eps)
        gate, up = self.gate_up(normed).split(self.intermediate_size, dim=-1)
        return self.down(_by_row_blocks(self.act, gate) * up, residual=hidden)  # [rows, H]


@dataclass(frozen=True)
class _Segment:
    """One sequence's part of a batched forward: its runner (cache), its rows of the batch, the
    positions start..end-1 they take, how many of them (the first) are context, and the causal
    mask of those (None for fewer than two).

    Context rows (a prompt, a chunk of one) attend together in one scaled-dot-product attention.
    The rows whose logits are asked for (the last prompt row; a verification's K + 1; a decode's
    one) attend one by one, each by the same three operations: SDPA's result for a row depends on
    how many rows it runs with (in the last bit), so a token verified among K + 1 rows would
    otherwise differ from the same token decoded alone -- which a bfloat16 GEMM's input rounding
    carries, now and then, into a different greedy token (2 of 16 completions at bfloat16, before)."""

    runner: LlamaRunner
    rows_start: int
    rows_end: int
    start: int
    end: int
    context: int
    mask: torch.Tensor | None


class _Linear:
    """``residual + x @ W.T + b`` for nn.Linear weights ``W`` (several, concatenated: one fused
    projection), stored for the faster of two CPU kernels, or as is on a GPU.

    On a CPU torch's float32 matmul runs on MKL, which on AMD processors takes a code path whose
    cost grows with the row count: on this project's machines (AMD EPYC, AVX-512) a 2-row product
    costs about twice a 1-row one, so verifying K + 1 tokens cost 1.5-2.2x a one-token step.
    oneDNN's inner-product kernel, fed a weight reordered once into its blocked layout, is nearly
    flat from 1 to 8 rows (measured on the wide demo target: t_7 = 1.0 t_1 instead of 1.65 t_1),
    as a memory-bound decode step should be; each call carries ~15 us of fixed cost, so it only
    pays from ~1 MiB of weights on. The ops are the ones TorchInductor's CPU weight prepacking
    emits (PyTorch ``aten/src/ATen/native/mkldnn/Linear.cpp``, ``mkldnn_linear_pointwise``;
    ``MKLDNNConversions.cpp``, ``mkldnn_reorder_linear_weight``), float32 in and out: the
    weights are the checkpoint's, only the order of the sums differs.

    A row's product on oneDNN does not depend on the rows beside it (bit for bit, 2 to 300 rows,
    either dtype, measured on the wide target's shapes), except that for some shapes (its
    1376-wide down projection; 2048 wide too) one row alone takes a kernel that sums in another
    order. Such a projection, found by a probe when it is built (:func:`_one_row_sums_apart`),
    runs one row as two, so a request decoding alone computes what it computes in a batch; the
    others keep the one-row kernel, 10-25% cheaper. bfloat16 needs this most: the result's
    rounding turns a last-bit difference into a visible one (1 element in ~20,000 here), which
    changed 2 of 16 greedy completions under load before.

    ``gemm_dtype`` bfloat16 (:func:`compute_dtypes`): the product a bfloat16 GEMM computes --
    bfloat16 input and weights, float32 accumulation, a bfloat16 result -- returned in float32,
    on oneDNN's bfloat16 kernel (half the weight bytes per row; AVX512-BF16 where the CPU has it).
    Below that kernel's size (the draft's small projections) the product is float32 over the
    weights rounded to bfloat16 (:meth:`TorchCausalLM.from_pretrained` loads them so): rounding
    the activations too would cost more ops than the product itself.
    """

    ONEDNN_MIN_ELEMENTS = 1 << 18  # 1 MiB of float32: below it MKL's lower call cost wins

    def __init__(self, weights: list[torch.Tensor], bias: torch.Tensor | None, gemm_dtype: torch.dtype | None = None):
        weight = torch.cat(weights).detach()  # [out, in]; no autograd history to keep
        self.bias = bias
        self.gemm_dtype = gemm_dtype
        self.packed: torch.Tensor | None = None
        self.one_row_as_two = False
        self.input_major: torch.Tensor | None = None
        if _onednn_suits(weight, gemm_dtype) and weight.numel() >= self.ONEDNN_MIN_ELEMENTS:
            # batch size None: the layout for any row count (a hint of 1 slows 2+ rows ~2x)
            stored = weight if gemm_dtype is None else weight.to(gemm_dtype)
            self.packed = torch.ops.mkldnn._reorder_linear_weight(stored.contiguous(), None)
            self.one_row_as_two = _one_row_sums_apart(self.packed, weight.shape[1], stored.dtype)
            if bias is not None and gemm_dtype is not None:
                self.bias = bias.to(gemm_dtype)
        else:
            # input-major: a BLAS runs x @ W about twice as fast as x @ W.T at decoding's row counts
            self.input_major = weight.t().contiguous()  # [in, out]

    def __call__(self, hidden: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        gemm = self.gemm_dtype
        if self.packed is not None:
            operand = hidden if gemm is None else hidden.to(gemm)
            one_row = self.one_row_as_two and operand.shape[0] == 1
            if one_row:  # see the class docstring
                operand = operand.expand(2, -1).contiguous()
            product = torch.ops.mkldnn._linear_pointwise(operand, self.packed, self.bias, "none", [], "")
            if one_row:
                product = product[:1]
            out = product if gemm is None else product.to(hidden.dtype)
            return out if residual is None else out.add_(residual)
        assert self.input_major is not None
        if self.bias is None:
            if residual is None:
                return hidden @ self.input_major
            return torch.addmm(residual, hidden, self.input_major)
        addend = self.bias if residual is None else residual + self.bias
        return torch.addmm(addend, hidden, self.input_major)


def _onednn_suits(weight: torch.Tensor, gemm_dtype: torch.dtype | None = None) -> bool:
    """float32 on a CPU, with torch built with oneDNN and its prepacked-linear ops present (and,
    for bfloat16 products, oneDNN's bfloat16 support)."""
    if weight.device.type != "cpu" or weight.dtype != torch.float32 or not torch.backends.mkldnn.is_available():
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight  # noqa: B018 (a lookup: raises where the op is absent)
        torch.ops.mkldnn._linear_pointwise  # noqa: B018
        return gemm_dtype != torch.bfloat16 or bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def _one_row_sums_apart(packed: torch.Tensor, in_features: int, dtype: torch.dtype, rows: int = 32) -> bool:
    """Whether oneDNN's product of one row alone differs from the same row's in a batch, for this
    packed weight. The probe's rows span 2^-12..2^12 in magnitude, so that the order of the sums
    shows in the result even after bfloat16 rounding."""
    generator = torch.Generator().manual_seed(0)
    scale = torch.exp2(torch.randint(-12, 13, (rows, in_features), generator=generator).float())
    probe = (torch.randn(rows, in_features, generator=generator) * scale).to(dtype)
    batched = torch.ops.mkldnn._linear_pointwise(probe, packed, None, "none", [], "")
    return any(
        not torch.equal(
            torch.ops.mkldnn._linear_pointwise(probe[i : i + 1], packed, None, "none", [], ""), batched[i : i + 1]
        )
        for i in range(rows)
    )


# at::internal::GRAIN_SIZE (ATen/Parallel.h): an elementwise op over fewer elements runs on one thread.
_ELEMENTWISE_GRAIN = 32768


def _by_row_blocks(op: Callable[[torch.Tensor], torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
    """``op(rows)`` for an elementwise ``op`` with a transcendental (SiLU's exp), computed so that a
    row's result does not depend on the rows beside it. Over more than ``_ELEMENTWISE_GRAIN``
    elements ATen splits the range between threads where the row count puts the split, and each
    part's tail runs the scalar exp instead of the vectorized one (1 ulp apart): a batched request
    then differs from itself alone in the last bit, which a bfloat16 GEMM's input rounding can
    carry into its tokens. Blocks of rows under the grain run on one thread, each row alike."""
    block = max(1, _ELEMENTWISE_GRAIN // max(1, rows.shape[-1]))
    if rows.shape[0] <= block:
        return op(rows)
    return torch.cat([op(part) for part in rows.split(block)])


def _attention(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    if _SDPA_HAS_GQA:
        return F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, enable_gqa=True)
    groups = query.shape[1] // keys.shape[1]
    keys, values = keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(query, keys, values, attn_mask=mask)


def _rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if hidden.dtype == torch.float32 and _HAS_FUSED_RMS_NORM:
        return F.rms_norm(hidden, weight.shape, weight, eps)
    # As transformers' LlamaRMSNorm: normalise in float32, scale in the model's dtype.
    as_float = hidden.float()
    normed = as_float * torch.rsqrt(as_float.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(hidden.dtype)


def _fused_bias(projections: Sequence[_Projection]) -> torch.Tensor | None:
    if all(p.bias is None for p in projections):
        return None
    return torch.cat([p.bias if p.bias is not None else p.weight.new_zeros(p.weight.shape[0]) for p in projections])


def _new_dynamic_cache(model: torch.nn.Module) -> DynamicCache:
    from transformers import DynamicCache

    config: Any = model.config  # a transformers config: torch types a module's attributes as Tensor | Module
    try:
        return DynamicCache(config=config)
    except TypeError:  # transformers releases whose DynamicCache takes no config
        return DynamicCache()


def _dtype_argument() -> str:
    """``from_pretrained`` takes ``dtype`` since transformers 4.56, ``torch_dtype`` before."""
    import transformers

    major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


@contextmanager
def _quiet_loading() -> Iterator[None]:
    """transformers draws a progress bar while loading weights; the library never prints."""
    from transformers.utils import logging

    bars_were_on = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if bars_were_on:
            logging.enable_progress_bar()
