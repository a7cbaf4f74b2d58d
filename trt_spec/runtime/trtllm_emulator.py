"""An emulator of TensorRT-LLM 1.2.x's C++ Triton backend (``backend: "tensorrtllm"``) on CPU.

The tensorrtllm flavor's engine models ``tensorrt_llm`` (target) and ``tensorrt_llm_draft`` run in
TensorRT-LLM's C++ backend, which needs a GPU and compiled engines. This module does on a CPU
what that backend does with the same ``config.pbtxt`` and the same request tensors, with a
PyTorch model (:class:`~trt_spec.runtime.torch_engine.TorchCausalLM`) computing the logits the
engine would. It was written from TensorRT-LLM's source, and every rule it enforces names its
origin in a ``# Source: NVIDIA/TensorRT-LLM@<commit>:<path> <function>`` comment. Commit
``0c8de69`` is 1.2.0rc8 and ``b35ac1b`` is 1.2.0rc2 (their ``tensorrt_llm/version.py``); the other
commits are the stored copies read, whose release was not pinned.

What a request goes through, stage by stage, and how each stage's errors reach a client:

1. **load** (:meth:`TrtllmBackendEmulator.load`, :class:`BackendConfig`): the model config's
   parameters, read as ``ModelInstanceState``'s constructor reads them, in its order. A failure is
   ``unexpected error when creating modelInstanceState: <what>``. Parameters that have a default
   fall back to it, as upstream does, when they are absent or do not parse; one given but
   unusable adds a line to :attr:`TrtllmBackendEmulator.warnings`.
2. **enqueue** (:class:`BackendRequest`): the request's tensors into an executor request
   (``utils.cc createRequestsFromInputTensors``). A failure is the exception text itself.
3. **executor**: the executor's validation of a new request (``LlmRequest::validate`` and
   ``Executor::Impl::fetchNewRequests``), then the decoder's setup (the draft logits' copy). A
   failure is ``Executor failed process requestId <n> due to the following error: <where>: <what>``.
4. **schedule**: the requests that reached the executor together (one Triton batch) go through
   its steps as :mod:`trt_spec.runtime.trtllm_scheduler` models them: within ``max_batch_size``
   and ``max_num_tokens``, chunked context as configured, and a target request's drafts discarded
   where ``fitDraftTokens`` discards them. A failed scheduling check fails every request of the
   batch, as it fails every active request upstream.
5. **run**: decoding (:func:`decode_tokens`), or one external-draft-tokens verification step
   (:func:`verify_drafts`) over the model's logits, with KV caches reused by token prefix
   (:class:`~trt_spec.runtime.prefix_cache.PrefixCachePool`).
6. **response** (``fillTritonResponse``): the output tensors, and with ``return_perf_metrics``
   the speculative-decoding counts (``total_draft_tokens``: the drafts verified, after any
   discarded); with ``return_log_probs`` ``output_log_probs`` and ``cum_log_probs``, with
   ``return_num_input_tokens`` / ``return_num_output_tokens`` the counts, as
   :mod:`~trt_spec.runtime.engine_interface` computes them for both flavors. A failure is
   ``Error encountered while populating response: <what>``.

Message texts are upstream's: a ``TLLM_CHECK`` failure reads ``[TensorRT-LLM][ERROR] Assertion
failed: <info>``; the `` (<file>:<line>)`` and stack trace that ``TllmException`` appends to
every ``TLLM_CHECK``/``TLLM_THROW`` text are left out (match messages by prefix or substring).
:class:`BackendError` also carries ``stage`` (``load``, ``enqueue``, ``executor``, ``response``,
or ``emulator`` for what the emulator cannot do and what this repository does not support: the
inputs :mod:`~trt_spec.runtime.engine_interface` refuses unless neutral, ``num_return_sequences``
above 1, ``return_log_probs`` with ``draft_input_ids``; upstream would run those).

Penalties, ``min_tokens``, bad words and the embedding bias are applied as the penalty and
ban-words layers do, per position (:mod:`trt_spec.runtime.penalties` cites the kernels), with
``min_tokens`` 1 when a request sends none.

Not emulated: the engine directory (``gpt_model_path`` is not checked to exist: there is no
engine on a CPU), beam search, streaming and batched requests in decoupled mode, the inputs
declared but not supported (``len_penalty``, guided decoding, LoRA, ...: refused unless neutral),
log probs of a draft-tokens request (refused), perf metrics other than the speculative counts (the
``kv_cache_*`` and timing outputs are never sent), context logits, orchestrator mode,
FP16 arithmetic (probabilities are float32 whatever the engine dtype), and what the scheduler
module lists.

One batch at a time (the caller serialises ``execute_batch``). Standard library, numpy and torch
only: this module is copied into model repositories with the rest of :mod:`trt_spec.runtime`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from trt_spec.runtime import engine_interface
from trt_spec.runtime import tensors as T
from trt_spec.runtime.engine_interface import TOP_K_MAX
from trt_spec.runtime.errors import GenerationParamsError
from trt_spec.runtime.parameters import MAX_DRAFT_TOKENS
from trt_spec.runtime.penalties import (
    ENGINE_DEFAULT_PENALTIES,
    ENGINE_MIN_TOKENS,
    NEUTRAL_TEMPERATURE,
    Penalties,
    adjusted_scores,
)
from trt_spec.runtime.prefix_cache import PrefixCachePool
from trt_spec.runtime.sampling import SamplingParams, filtered_softmax, greedy_verify, residual_distribution, sample
from trt_spec.runtime.torch_engine import TorchCausalLM
from trt_spec.runtime.trtllm_scheduler import SchedulerLimits, SchedulingError, StepRequest, schedule

ROLES = ("target", "draft")
# Triton's logits dtypes the emulator returns (numpy has no bfloat16).
LOGITS_DTYPES = {"FP32": np.float32, "FP16": np.float16}
# What BufferManager::copy names a tensor's data type in "Incompatible data types: %s != %s".
_DTYPE_NAMES = {"float32": "float", "float16": "half", "int32": "int32", "int64": "int64", "int8": "int8"}
_DTYPE_NAMES.update({"uint8": "uint8", "bool": "bool", "float64": "double", "uint64": "uint64"})

# Inputs the backend reads that change decoding in ways the emulator does not reproduce, and that
# our configs do not declare: refused. The declared ones are engine_interface.UNSUPPORTED_INPUTS.
NOT_EMULATED_INPUTS = frozenset({"no_repeat_ngram_size"})


# --- errors -----------------------------------------------------------------------------------


class BackendError(Exception):
    """An error as TensorRT-LLM's backend reports it; str() is the message text a client sees.

    ``stage``: where upstream raises it: ``load``, ``enqueue``, ``executor``, ``response``, or
    ``emulator`` (something this emulator does not reproduce; not an upstream message).
    """

    def __init__(self, message: str, *, stage: str):
        super().__init__(message)
        self.message = message
        self.stage = stage

    def __str__(self) -> str:
        return self.message


class _CppError(Exception):
    """An exception thrown inside the backend: str() is its ``what()``. Each stage wraps it into
    a :class:`BackendError` the way upstream turns it into a Triton error."""


def _check(condition: bool, info: str) -> None:
    """``TLLM_CHECK_WITH_INFO(condition, info)`` (``TLLM_CHECK(expr)``: info is the expression text)."""
    # Source: NVIDIA/TensorRT-LLM@0c6a62a1d7ca643ceeaa3413b6833e164d324667:cpp/include/tensorrt_llm/common/tllmException.h throwRuntimeError
    if not condition:
        raise _CppError(f"[TensorRT-LLM][ERROR] Assertion failed: {info}")


def _load_error(error: _CppError) -> BackendError:
    # Source: NVIDIA/TensorRT-LLM@0c8de69a1ca6213eebb20a51873890ff128666c2:triton_backend/inflight_batcher_llm/src/model_instance_state.cc ModelInstanceState::Create
    return BackendError(f"unexpected error when creating modelInstanceState: {error}", stage="load")


def _executor_error(request_id: int, where: str, error: _CppError) -> BackendError:
    # Source: NVIDIA/TensorRT-LLM@b35ac1b64368513d215c57d2ed01d62d910df8da:cpp/tensorrt_llm/executor/executorImpl.cpp Executor::Impl::fetchNewRequests, Executor::Impl::forwardAsync
    # Source: NVIDIA/TensorRT-LLM@0c8de69a1ca6213eebb20a51873890ff128666c2:triton_backend/inflight_batcher_llm/src/model_instance_state.cc ModelInstanceState::fillTritonResponse
    return BackendError(
        f"Executor failed process requestId {request_id} due to the following error: {where}: {error}", stage="executor"
    )


def _not_emulated(what: str) -> BackendError:
    return BackendError(f"TensorRT-LLM backend emulator: {what} is not emulated", stage="emulator")


def _unsupported(message: str) -> BackendError:
    """What this repository refuses though upstream would run it (engine_interface's messages)."""
    return BackendError(f"TensorRT-LLM backend emulator: {message}", stage="emulator")


# --- what an engine would tell the backend ----------------------------------------------------


@dataclass(frozen=True)
class EngineFacts:
    """What a compiled engine would tell the backend (on CPU: derived from the spec's plan).

    Raises (constructor):
        ValueError: an unknown role or logits dtype, or a limit out of range.
    """

    role: str  # "target" | "draft"
    hf_model_dir: str  # the HF checkpoint whose logits stand in for the engine's
    max_batch_size: int
    max_input_len: int
    max_seq_len: int  # the engine's build max_seq_len (the target's includes +K, as trtllm-build adds)
    max_draft_len: int  # target: K (speculative_decoding_mode draft_tokens_external); draft: 0
    vocab_size: int  # the engine's vocabSizePadded
    gather_generation_logits: bool
    logits_dtype: str = "FP32"  # the engine's "logits" tensor dtype, Triton spelling
    max_num_tokens: int = 8192  # tokens one executor step may process (trtllm-build --max_num_tokens)
    tokens_per_block: int = 64  # the paged KV cache's block (trtllm-build --tokens_per_block)
    FILE: ClassVar[str] = "emulated_engine.json"

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}; got {self.role!r}")
        if self.logits_dtype not in LOGITS_DTYPES:
            raise ValueError(f"logits_dtype must be one of {', '.join(LOGITS_DTYPES)}; got {self.logits_dtype!r}")
        limits = (self.max_batch_size, self.max_input_len, self.max_seq_len, self.vocab_size, self.max_num_tokens)
        if min(*limits, self.tokens_per_block) < 1:
            raise ValueError(
                f"max_batch_size, max_input_len, max_seq_len, vocab_size, max_num_tokens and tokens_per_block "
                f"must be >= 1: {self}"
            )
        if self.max_draft_len < 0 or (self.role == "draft") != (self.max_draft_len == 0):
            raise ValueError(f"max_draft_len must be > 0 on a target and 0 on a draft; got {self.max_draft_len}")

    @property
    def is_target(self) -> bool:
        """Built with ``speculative_decoding_mode draft_tokens_external`` (max_draft_len > 0)."""
        return self.max_draft_len > 0

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping) -> EngineFacts:
        """Raises: ValueError: a missing or unknown key, a value of the wrong type."""
        names = {field.name: str(field.type) for field in fields(cls)}  # "str", "int", "bool" (postponed)
        defaulted = {field.name for field in fields(cls) if field.default is not MISSING}
        missing = sorted(name for name in names if name not in data and name not in defaulted)
        unknown = sorted(key for key in data if key not in names)
        if missing or unknown:
            raise ValueError(f"{cls.FILE}: missing keys {missing}, unknown keys {unknown}")
        for name, value in data.items():
            kind = {"str": str, "int": int, "bool": bool}[names[name]]
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise ValueError(f"{cls.FILE}: {name} must be {names[name]}; got {value!r}")
        return cls(**data)


# --- load time: the model config as the backend reads it ---------------------------------------

_INT = re.compile(r"\s*([+-]?\d+)")
_FLOAT = re.compile(r"\s*([+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf(?:inity)?|nan))", re.IGNORECASE)
_FLT_MAX = 3.4028234663852886e38


def _stoi(text: str) -> int:
    """``std::stoi``: the leading integer of ``text`` (``"4abc"`` is 4), int32 range."""
    match = _INT.match(text)
    if match is None:
        raise _CppError("stoi")  # std::invalid_argument
    value = int(match.group(1))
    if not -(2**31) <= value < 2**31:
        raise _CppError("stoi")  # std::out_of_range
    return value


def _stoull(text: str) -> int:
    """``std::stoull`` (size_t, uint64): a leading '-' wraps around, as strtoull does."""
    match = _INT.match(text)
    if match is None or abs(int(match.group(1))) >= 2**64:
        raise _CppError("stoull")
    return int(match.group(1)) % 2**64


def _stof(text: str) -> float:
    """``std::stof``: the leading float of ``text`` (decimal, inf, nan), float range."""
    match = _FLOAT.match(text)
    if match is None:
        raise _CppError("stof")
    value = float(match.group(1))
    if math.isfinite(value) and abs(value) > _FLT_MAX:
        raise _CppError("stof")
    return value


def _to_bool(text: str) -> bool:
    # Source: NVIDIA/TensorRT-LLM@5cdd69218f8815d6c8c101ca1facf2ec4ac4b622:triton_backend/inflight_batcher_llm/src/model_state.cc ModelState::GetParameter<bool>
    if text in ("True", "true", "TRUE", "1"):
        return True
    if text in ("False", "false", "FALSE", "0"):
        return False
    raise _CppError(f"Cannot convert {text} to a boolean.")


def _csv_ints(text: str) -> list[int]:
    # Source: NVIDIA/TensorRT-LLM@192908136e53ddfc2f282e81e6ecdb76af06eb50:triton_backend/inflight_batcher_llm/src/utils.cc csvStrToVecInt
    _check(text != "", "Cannot convert empty string to vector of vector of ints")
    values = []
    for part in text.split(","):
        part = part.lstrip()
        if not part:
            break
        values.append(_stoi(part))
    _check(bool(values), "Empty vector")
    return values


_PARSERS: dict[str, Callable[[str], Any]] = {
    "int32": _stoi,
    "uint32": lambda text: _stoull(text) % 2**32,
    "size_t": _stoull,
    "float": _stof,
    "bool": _to_bool,
    "int_list": _csv_ints,
}


@dataclass(frozen=True)
class _Defaulted:
    """A parameter read inside ``try``/``catch``: absent or unparseable means ``default``, logged."""

    name: str
    kind: str  # a key of _PARSERS
    default: Any
    log: str  # what upstream logs when it falls back, "{}" standing for the name ("" = nothing)


_NOT_SPECIFIED = "{} is not specified, will "
# Read in this order by the ModelInstanceState constructor, each inside try/catch.
# Source: NVIDIA/TensorRT-LLM@0c8de69a1ca6213eebb20a51873890ff128666c2:triton_backend/inflight_batcher_llm/src/model_instance_state.cc ModelInstanceState::getExecutorConfigFromParams, getKvCacheConfigFromParams, getPeftCacheConfigFromParams, getParallelConfigFromParams, getExtendedRuntimePerfKnobConfigFromParams, getSpeculativeDecodingConfigFromParams
_WITH_DEFAULTS = tuple(
    _Defaulted(*entry)
    for entry in (
        ("max_beam_width", "int32", 1, _NOT_SPECIFIED + "use default value of 1"),
        ("iter_stats_max_iterations", "int32", 1000, _NOT_SPECIFIED + "use default value of 1000"),
        ("request_stats_max_iterations", "int32", 0, _NOT_SPECIFIED + "use default value of 0"),
        ("enable_trt_overlap", "bool", False, ""),
        ("normalize_log_probs", "bool", True, _NOT_SPECIFIED + "be set to true"),
        ("max_tokens_in_paged_kv_cache", "int32", None, _NOT_SPECIFIED + "use default value"),
        (
            "kv_cache_free_gpu_mem_fraction",
            "float",
            None,
            _NOT_SPECIFIED + "use default value of 0.9 or max_tokens_in_paged_kv_cache",
        ),
        (
            "cross_kv_cache_fraction",
            "float",
            None,
            "{} is not specified, error if it's encoder-decoder model, otherwise ok",
        ),
        ("kv_cache_host_memory_bytes", "size_t", None, "{} not set, defaulting to 0"),
        ("kv_cache_onboard_blocks", "bool", True, "{} not set, defaulting to true"),
        (
            "max_attention_window_size",
            "int_list",
            None,
            _NOT_SPECIFIED + "use default value (i.e. max_sequence_length)",
        ),
        ("sink_token_length", "int32", None, _NOT_SPECIFIED + "use default value"),
        ("enable_kv_cache_reuse", "bool", True, _NOT_SPECIFIED + "be set to true"),
        ("enable_chunked_context", "bool", False, _NOT_SPECIFIED + "be set to false."),
        ("lora_cache_max_adapter_size", "int32", 64, "{} not set, defaulting to 64"),
        ("lora_cache_optimal_adapter_size", "int32", 8, "{} not set, defaulting to 8"),
        ("lora_cache_gpu_memory_fraction", "float", None, "{} not set, defaulting to 0.05"),
        ("lora_cache_host_memory_bytes", "size_t", None, "{} not set, defaulting to 1GB"),
        ("num_nodes", "int32", 1, _NOT_SPECIFIED + "be set to 1"),
        ("multi_block_mode", "bool", True, _NOT_SPECIFIED + "be set to true"),
        ("enable_context_fmha_fp32_acc", "bool", False, _NOT_SPECIFIED + "be set to false"),
        ("cuda_graph_mode", "bool", False, _NOT_SPECIFIED + "be set to false"),
        ("cuda_graph_cache_size", "int32", 0, _NOT_SPECIFIED + "be set to 0"),
        ("speculative_decoding_fast_logits", "bool", False, _NOT_SPECIFIED + "be set to false"),
        ("gpu_weights_percent", "float", 1.0, "{} parameter is not specified, will use default value of 1.0"),
        ("recv_poll_period_ms", "int32", 0, "{} is not set, will use busy loop"),
    )
)
# Read by the constructor after the executor is created.
# Source: NVIDIA/TensorRT-LLM@0c8de69a1ca6213eebb20a51873890ff128666c2:triton_backend/inflight_batcher_llm/src/model_instance_state.cc ModelInstanceState::ModelInstanceState
_AFTER_EXECUTOR = (
    _Defaulted(T.EXCLUDE_INPUT_IN_OUTPUT.name, "bool", False, _NOT_SPECIFIED + "be set to false"),  # as the input
    _Defaulted("cancellation_check_period_ms", "int32", 100, _NOT_SPECIFIED + "be set to 100 (ms)"),
    _Defaulted("stats_check_period_ms", "int32", 100, _NOT_SPECIFIED + "be set to 100 (ms)"),
)
SCHEDULER_POLICIES = ("max_utilization", "guaranteed_no_evict")
DECODING_MODES = tuple("top_k top_p top_k_top_p beam_search medusa redrafter lookahead eagle".split())
# The model-config parameters, named as the request inputs of the same meaning.
LOOKAHEAD_PARAMETERS = tuple(
    tensor.name for tensor in (T.LOOKAHEAD_WINDOW_SIZE, T.LOOKAHEAD_NGRAM_SIZE, T.LOOKAHEAD_VERIFICATION_SET_SIZE)
)


class _Parameters:
    """``ModelState::GetParameter<T>`` over a Triton model config dict."""

    def __init__(self, model_config: Mapping[str, Any]):
        self.section = model_config.get("parameters")
        self.warnings: list[str] = []

    def text(self, name: str) -> str:
        # Source: NVIDIA/TensorRT-LLM@5cdd69218f8815d6c8c101ca1facf2ec4ac4b622:triton_backend/inflight_batcher_llm/src/model_state.cc ModelState::GetParameter<std::string>
        if not isinstance(self.section, Mapping):
            raise _CppError("Model config doesn't have a parameters section")
        entry = self.section.get(name)
        if not isinstance(entry, Mapping):
            raise _CppError(f"Cannot find parameter with name: {name}")
        value = entry.get("string_value", "")  # protobuf's JSON leaves an empty string_value out
        return value if isinstance(value, str) else ""

    def value(self, name: str, kind: str) -> Any:
        text = self.text(name)
        return text if kind == "str" else _PARSERS[kind](text)

    def with_default(self, param: _Defaulted) -> Any:
        """The parameter, or its default where upstream's ``catch`` would take it."""
        try:
            return self.value(param.name, param.kind)
        except _CppError as error:
            present = isinstance(self.section, Mapping) and param.name in self.section
            if present:  # absent parameters are routine; an unusable given one is worth a line
                log = param.log.format(param.name) or f"(not logged upstream) {param.name} keeps its default"
                self.warnings.append(f"{log} [{param.name}={self.text(param.name)!r}: {error}]")
            return param.default


@dataclass(frozen=True)
class BackendConfig:
    """What the backend takes from a model config at load (``model_state.cc`` and the
    ``ModelInstanceState`` constructor), checked as it checks it."""

    name: str
    decoupled: bool
    logits_dtype: str | None  # the config's generation_logits/context_logits data_type ("FP32")
    outputs: tuple[str, ...]  # the declared outputs: Triton's "all outputs"
    gpt_model_type: str
    batch_scheduler_policy: str
    decoding_mode: str | None
    tokenizer_dir: str
    xgrammar_tokenizer_info_path: str
    guided_decoding_backend: str
    gpt_model_path: str
    exclude_input_in_output: bool
    parameters: Mapping[str, Any]  # every parameter read with a default, parsed (the default where unusable)
    warnings: tuple[str, ...]

    @property
    def enable_kv_cache_reuse(self) -> bool:
        return bool(self.parameters["enable_kv_cache_reuse"])

    @classmethod
    def parse(cls, model_config: Mapping[str, Any]) -> BackendConfig:
        """Raises: _CppError: what the constructor throws (the caller wraps it)."""
        params = _Parameters(model_config)
        # Source: NVIDIA/TensorRT-LLM@5cdd69218f8815d6c8c101ca1facf2ec4ac4b622:triton_backend/inflight_batcher_llm/src/model_state.cc ModelState::LoadParameters
        decoupled = bool((model_config.get("model_transaction_policy") or {}).get("decoupled", False))
        outputs = tuple(output.get("name", "") for output in model_config.get("output") or ())
        logits_dtype = next(
            (
                str(output.get("data_type", ""))[len("TYPE_") :]
                for output in model_config.get("output") or ()
                if output.get("name") in (T.GENERATION_LOGITS.name, T.ENGINE_CONTEXT_LOGITS.name)
            ),
            None,
        )
        values: dict[str, Any] = {}
        for name in ("gpu_device_ids", "participant_ids"):  # "0,1;2,3": one group per instance
            try:
                groups = params.text(name).split(";")
                values[name] = [_csv_ints(group) for group in groups[: -1 if groups[-1] == "" else None]]
            except _CppError as error:
                values[name] = None
                if isinstance(params.section, Mapping) and name in params.section:
                    params.warnings.append(f"{name} is not specified, will be automatically set [{name}: {error}]")

        # Source: NVIDIA/TensorRT-LLM@0c8de69a1ca6213eebb20a51873890ff128666c2:triton_backend/inflight_batcher_llm/src/model_instance_state.cc ModelInstanceState::getBatchingTypeFromParams
        gpt_model_type = params.text("gpt_model_type")
        if gpt_model_type not in ("V1", "v1", "inflight_batching", "inflight_fused_batching"):
            raise _CppError("Invalid gpt_model_type. Must be v1/inflight_batching/inflight_fused_batching.")

        for param in _WITH_DEFAULTS:
            values[param.name] = params.with_default(param)

        # Source: NVIDIA/TensorRT-LLM@0c8de69a1ca6213eebb20a51873890ff128666c2:triton_backend/inflight_batcher_llm/src/model_instance_state.cc ModelInstanceState::getSchedulerConfigFromParams
        policy = "guaranteed_no_evict"
        try:
            given = params.text("batch_scheduler_policy")
            if given not in SCHEDULER_POLICIES:
                params.warnings.append(
                    "batch_scheduler_policy parameter was not found or is invalid "
                    f"(must be max_utilization or guaranteed_no_evict) [batch_scheduler_policy={given!r}]"
                )
            else:
                policy = given
        except _CppError:
            pass  # absent: logged upstream, the default stays

        # Source: NVIDIA/TensorRT-LLM@0c8de69a1ca6213eebb20a51873890ff128666c2:triton_backend/inflight_batcher_llm/src/model_instance_state.cc ModelInstanceState::getSpeculativeDecodingConfigFromParams
        if values["speculative_decoding_fast_logits"]:
            params.warnings.append(
                "speculative_decoding_fast_logits is set, but requires orchestrator with spawn_processes "
                "disabled.Disabling fast logits."
            )
            values["speculative_decoding_fast_logits"] = False

        # Source: NVIDIA/TensorRT-LLM@0c8de69a1ca6213eebb20a51873890ff128666c2:triton_backend/inflight_batcher_llm/src/model_instance_state.cc ModelInstanceState::getExecutorConfigFromParams
        decoding_mode = None
        try:
            given = params.text("decoding_mode")
            if given in DECODING_MODES:
                decoding_mode = given
            else:
                params.warnings.append(
                    "decoding_mode parameter is invalid or not specified(must be one of the {top_k, top_p, "
                    "top_k_top_p, beam_search, medusa, redrafter, lookahead, eagle}).Using default: top_k_top_p "
                    f"if max_beam_width == 1, beam_search otherwise [decoding_mode={given!r}]"
                )
        except _CppError:
            pass
        if decoding_mode == "lookahead":  # read without a default: the one numeric load failure
            try:
                for name in LOOKAHEAD_PARAMETERS:
                    values[name] = params.value(name, "uint32")
            except _CppError:
                raise _CppError(
                    "Decoding mode is set to lookahead but lookahead parameters are not specified. Please set "
                    "parameters lookahead_window_size, lookahead_ngram_size, and lookahead_verification_set_size."
                ) from None

        # Source: NVIDIA/TensorRT-LLM@0c8de69a1ca6213eebb20a51873890ff128666c2:triton_backend/inflight_batcher_llm/src/model_instance_state.cc ModelInstanceState::getGuidedDecodingConfigFromParams
        tokenizer_dir = params.text("tokenizer_dir")
        info_path = params.text("xgrammar_tokenizer_info_path")
        guided_backend = params.text("guided_decoding_backend")
        guided = guided_backend not in ("", "${guided_decoding_backend}") and info_path not in (
            "",
            "${xgrammar_tokenizer_info_path}",
        )
        if guided:
            _check(Path(info_path).exists(), f"Xgrammar's tokenizer info path at {info_path} does not exist.")
            if guided_backend != "xgrammar":
                raise _CppError(
                    "Guided decoding is currently supported with 'xgrammar' backend. Invalid "
                    "guided_decoding_backend parameter provided."
                )
            params.warnings.append("guided decoding is configured; the emulator ignores it (not emulated)")

        # Source: NVIDIA/TensorRT-LLM@0c8de69a1ca6213eebb20a51873890ff128666c2:triton_backend/inflight_batcher_llm/src/model_instance_state.cc ModelInstanceState::ModelInstanceState
        # Upstream also treats a gpt_model_path that does not exist as empty. Not emulated: on a CPU
        # there is no engine directory, so any non-empty path is taken.
        try:
            gpt_model_path = params.text("gpt_model_path")
        except _CppError:
            gpt_model_path = ""
        try:
            encoder_model_path = params.text("encoder_model_path")
        except _CppError:
            encoder_model_path = ""
        _check(bool(gpt_model_path) or bool(encoder_model_path), "Both encoder and decoder model paths are empty")
        if encoder_model_path:
            raise _not_emulated(f"an encoder model (encoder_model_path={encoder_model_path!r})")

        after = {param.name: params.with_default(param) for param in _AFTER_EXECUTOR}
        values.update(after)
        return cls(
            name=str(model_config.get("name", "")),
            decoupled=decoupled,
            logits_dtype=logits_dtype,
            outputs=outputs,
            gpt_model_type=gpt_model_type,
            batch_scheduler_policy=policy,
            decoding_mode=decoding_mode,
            tokenizer_dir=tokenizer_dir,
            xgrammar_tokenizer_info_path=info_path,
            guided_decoding_backend=guided_backend,
            gpt_model_path=gpt_model_path,
            exclude_input_in_output=bool(after[T.EXCLUDE_INPUT_IN_OUTPUT.name]),
            parameters=values,
            warnings=tuple(params.warnings),
        )


def _check_executor(config: BackendConfig, engine: EngineFacts) -> None:
    """The executor's load-time checks that a config can fail (raises _CppError), in the order
    the executor makes them. Our engines are decoder-only, built with paged context FMHA."""
    # Source: NVIDIA/TensorRT-LLM@0c8de69a1ca6213eebb20a51873890ff128666c2:triton_backend/inflight_batcher_llm/src/model_instance_state.cc ModelInstanceState::getBatchingTypeFromParams (V1: static batching)
    # Source: NVIDIA/TensorRT-LLM@b35ac1b64368513d215c57d2ed01d62d910df8da:cpp/tensorrt_llm/executor/executorImpl.cpp Executor::Impl::createModel
    if config.gpt_model_type in ("V1", "v1"):
        raise _CppError(
            "Static batching type is deprecated. Please use in-flight batching with "
            "CapacitySchedulerPolicy::kSTATIC_BATCH instead."
        )
    # Source: NVIDIA/TensorRT-LLM@b35ac1b64368513d215c57d2ed01d62d910df8da:cpp/tensorrt_llm/executor/kvCacheConfig.cpp KvCacheConfig::setCrossKvCacheFraction
    cross_fraction = config.parameters["cross_kv_cache_fraction"]
    if cross_fraction is not None:
        _check(cross_fraction > 0, "crossKvCacheFraction > 0.F")
        _check(cross_fraction < 1, "crossKvCacheFraction < 1.F")
    # Source: NVIDIA/TensorRT-LLM@b35ac1b64368513d215c57d2ed01d62d910df8da:cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.cpp TrtGptModelInflightBatching::TrtGptModelInflightBatching
    _check(bool(config.parameters["kv_cache_onboard_blocks"]), "KV cache blocks need to be onboarded if context FMHA.")
    if engine.is_target:
        # Source: NVIDIA/TensorRT-LLM@b35ac1b64368513d215c57d2ed01d62d910df8da:cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.cpp TrtGptModelInflightBatching::TrtGptModelInflightBatching
        _check(
            config.enable_kv_cache_reuse, "KV cache block reuse must be enabled for speculative decoding target model"
        )
    # Source: NVIDIA/TensorRT-LLM@b35ac1b64368513d215c57d2ed01d62d910df8da:cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.cpp TrtGptModelInflightBatching::TrtGptModelInflightBatching
    _check(cross_fraction is None, "Do not set crossKvCacheFraction for decoder-only model")
    if config.parameters["max_beam_width"] != 1:
        raise _not_emulated(f"beam search (max_beam_width {config.parameters['max_beam_width']})")


# --- per request: the tensors as the backend reads them ----------------------------------------


def _scalar(inputs: Mapping[str, np.ndarray], name: str, ctype: type) -> Any:
    """``extractSingleton<ctype>``: None when absent; exactly one element; the buffer read as
    ``ctype`` without conversion (a same-size dtype is reinterpreted, as the C++ cast does)."""
    # Source: NVIDIA/TensorRT-LLM@89fd9b74ab7ae753b4c6b3db25a400dca7ea54a0:triton_backend/inflight_batcher_llm/src/utils.h extractSingleton
    if name not in inputs:
        return None
    array = np.asarray(inputs[name])
    _check(array.size == 1, f"Invalid size for tensor {name}")
    return _as_ctype(array, name, ctype).reshape(-1)[0].item()


def _vector(inputs: Mapping[str, np.ndarray], name: str) -> list[int] | None:
    """``extractVector<int32_t>``: the whole (flattened) tensor, or None when absent."""
    if name not in inputs:
        return None
    return _as_ctype(np.asarray(inputs[name]), name, np.int32).reshape(-1).tolist()


def _as_ctype(array: np.ndarray, name: str, ctype: type) -> np.ndarray:
    if array.dtype == ctype:
        return array
    if array.dtype.itemsize == np.dtype(ctype).itemsize:
        return np.ascontiguousarray(array).view(ctype)
    raise BackendError(
        f"TensorRT-LLM backend emulator: input {name} is {array.dtype}, but the backend reads its buffer as "
        f"{np.dtype(ctype)} without conversion (undefined); declare it as {np.dtype(ctype)} in config.pbtxt",
        stage="emulator",
    )


def _penalties(**values: Any) -> Penalties:
    """The penalty layer's parameters; values TensorRT-LLM takes but trt-spec refuses as unsafe
    (``penalties.py``' ranges) are not emulated."""
    try:
        return Penalties(**values)
    except GenerationParamsError as exc:
        raise _not_emulated(f"{exc} (outside trt-spec's ranges)") from None


def _bool_input(inputs: Mapping[str, np.ndarray], name: str) -> bool:
    """``getRequestBooleanInputTensor``: the first element, false when absent."""
    array = inputs.get(name)
    return bool(np.asarray(array).reshape(-1)[0]) if array is not None and np.asarray(array).size else False


def convert_word_list(sparse: Sequence[int]) -> list[list[int]]:
    """``stop_words_list``/``bad_words_list`` flattened (``[ids..., end offsets..., -1 padding]``) ->
    one token list per word, as the backend converts (and refuses) it.

    Raises: _CppError: upstream's message for an odd length, extra -1s, or bad offsets.
    """
    # Source: NVIDIA/TensorRT-LLM@192908136e53ddfc2f282e81e6ecdb76af06eb50:triton_backend/inflight_batcher_llm/src/utils.cc convertWordList
    text = "".join(f"{value} " for value in sparse)
    n = len(sparse)
    _check(n % 2 == 0, f"Sparse list must not have odd length: {text}")
    num_tokens = n // 2
    words, current = [], 0
    for i in range(num_tokens, n):
        if sparse[i] == -1:
            for j in range(i + 1, n):
                _check(sparse[j] == -1, f"Sparse list must not have additional -1s: {text}")
            break
        _check(sparse[i] <= num_tokens, f"Sparse list must not have out-of-bound offsets: {text}")
        if i != num_tokens:
            _check(sparse[i] > sparse[i - 1], f"Sparse list must not have non-increasing offsets: {text}")
        word = []
        while current < sparse[i]:
            word.append(sparse[current])
            current += 1
        words.append(word)
    return words


@dataclass(frozen=True)
class BackendRequest:
    """One executor request as the backend builds it from a batch-1 Triton request's tensors."""

    input_tokens: tuple[int, ...]
    max_new_tokens: int  # request_output_len
    end_id: int | None
    exclude_input_from_output: bool
    return_generation_logits: bool
    return_context_logits: bool
    stop_words: tuple[tuple[int, ...], ...]
    # Sampling as sent (None = absent; runtime_top_p <= 0 is absent).
    beam_width: int
    top_k: int | None
    top_p: float | None
    temperature: float | None
    seed: int  # absent = 0 (DefaultDecodingParams::getSeed)
    # External draft tokens (draft_input_ids present).
    draft_tokens: tuple[int, ...] | None
    draft_logits: np.ndarray | None  # as sent, batch dimension squeezed
    draft_acceptance_threshold: float | None
    penalties: Penalties = ENGINE_DEFAULT_PENALTIES
    embedding_bias_size: int = 0  # entries of the embedding_bias sent (0: none)
    return_perf_metrics: bool = False
    return_log_probs: bool = False
    return_num_input_tokens: bool = False
    return_num_output_tokens: bool = False

    @classmethod
    def from_tensors(cls, inputs: Mapping[str, np.ndarray], config: BackendConfig) -> BackendRequest:
        """Raises: _CppError: what ``createRequestsFromInputTensors`` throws;
        BackendError: an input the emulator does not reproduce (stage ``emulator``)."""
        # Source: NVIDIA/TensorRT-LLM@192908136e53ddfc2f282e81e6ecdb76af06eb50:triton_backend/inflight_batcher_llm/src/utils.cc splitBatchInputsTensors
        if T.INPUT_IDS.name not in inputs:
            raise _CppError("inputTokens or encoderInputFeatures tensor not provided")
        input_ids = np.asarray(inputs[T.INPUT_IDS.name])
        _check(input_ids.ndim == 2, "Expected inputTokens tensors to have 2 dimensions")
        batch_size = input_ids.shape[0]
        if batch_size > 1:
            _check(T.INPUT_LENGTHS.name in inputs, "input lengths tensor not provided")

        # Source: NVIDIA/TensorRT-LLM@192908136e53ddfc2f282e81e6ecdb76af06eb50:triton_backend/inflight_batcher_llm/src/utils.cc createRequestsFromInputTensors
        if batch_size > 1 and not config.decoupled:
            raise _CppError("Batch size > 1 requires the tensorrt_llm backend to be using decoupled transaction policy")
        streaming = _bool_input(inputs, T.STREAMING.name)
        if streaming and not config.decoupled:
            raise _CppError("Streaming is only supported if model is deployed using decoupled mode.")
        if batch_size > 1 or streaming:
            raise _not_emulated("a decoupled model's batched or streaming request")
        refused = sorted(NOT_EMULATED_INPUTS & set(inputs))
        if refused:
            raise _not_emulated(f"the input {', '.join(refused)}")
        unsupported = engine_interface.num_return_sequences_error(inputs) or engine_interface.unsupported_input(inputs)
        if unsupported:
            raise _unsupported(unsupported)

        # Source: NVIDIA/TensorRT-LLM@192908136e53ddfc2f282e81e6ecdb76af06eb50:triton_backend/inflight_batcher_llm/src/utils.cc getOutputConfigFromTensors
        return_log_probs = bool(_scalar(inputs, T.ENGINE_RETURN_LOG_PROBS.name, np.bool_))
        return_generation_logits = bool(_scalar(inputs, T.RETURN_GENERATION_LOGITS.name, np.bool_))
        return_context_logits = bool(_scalar(inputs, T.ENGINE_RETURN_CONTEXT_LOGITS.name, np.bool_))
        return_perf_metrics = bool(_scalar(inputs, T.RETURN_PERF_METRICS.name, np.bool_))
        exclude = _scalar(inputs, T.EXCLUDE_INPUT_IN_OUTPUT.name, np.bool_)  # the request's wins over the config's

        input_tokens = _vector(inputs, T.INPUT_IDS.name) or []  # batch 1: all of input_ids (input_lengths unread)
        max_new_tokens = _scalar(inputs, T.REQUEST_OUTPUT_LEN.name, np.int32)
        if max_new_tokens is None:
            raise _CppError("request_output_len is not present in the request")
        end_id = _scalar(inputs, T.END_ID.name, np.int32)
        _scalar(inputs, T.PAD_ID.name, np.int32)

        # Source: NVIDIA/TensorRT-LLM@192908136e53ddfc2f282e81e6ecdb76af06eb50:triton_backend/inflight_batcher_llm/src/utils.cc getSamplingConfigFromTensors
        beam_width = _scalar(inputs, T.BEAM_WIDTH.name, np.int32)
        beam_width = 1 if beam_width is None else beam_width
        top_k = _scalar(inputs, T.RUNTIME_TOP_K.name, np.int32)
        top_p = _scalar(inputs, T.RUNTIME_TOP_P.name, np.float32)
        if top_p is not None and top_p <= 0:
            top_p = None
        temperature = _scalar(inputs, T.ENGINE_TEMPERATURE.name, np.float32)
        seed = _scalar(inputs, T.ENGINE_SEED.name, np.uint64)
        # Source: NVIDIA/TensorRT-LLM@3585984b32cded5cc002d3087d3da4b0fd9fb8a5:cpp/tensorrt_llm/executor/samplingConfig.cpp SamplingConfig::SamplingConfig
        _check(
            0 < beam_width <= 1024,
            "beamWidth > 0 && beamWidth <= static_cast<SizeType32 const>(tensorrt_llm::kernels::kMaxBeamWidth)",
        )
        if top_k is not None:
            _check(top_k >= 0, "topK.value() >= 0")
        if top_p is not None:
            _check(top_p > 0, "topP.value() > 0.f")  # NaN: anything <= 0 was dropped above
            _check(top_p <= 1, "topP.value() <= 1.f")
        if temperature is not None:
            _check(temperature >= 0, "temperature.value() >= 0.f")
        repetition = _scalar(inputs, T.ENGINE_REPETITION_PENALTY.name, np.float32)
        if repetition is not None:
            _check(repetition > 0, "repetitionpenalty.value() > 0.f")
        min_tokens = _scalar(inputs, T.ENGINE_MIN_TOKENS.name, np.int32)
        if min_tokens is not None:
            _check(min_tokens >= 0, "minTokens.value() >= 0")
        presence = _scalar(inputs, T.ENGINE_PRESENCE_PENALTY.name, np.float32)  # not checked upstream
        frequency = _scalar(inputs, T.ENGINE_FREQUENCY_PENALTY.name, np.float32)
        if beam_width != 1:
            raise _not_emulated(f"beam search (beam_width {beam_width})")

        stop_words: list[list[int]] = []
        stop_words_raw = _vector(inputs, T.STOP_WORDS_LIST.name)
        if stop_words_raw is not None:
            stop_words = convert_word_list(stop_words_raw)
        bad_words_raw = _vector(inputs, T.BAD_WORDS_LIST.name)
        bad_words = [] if bad_words_raw is None else convert_word_list(bad_words_raw)
        # Source: NVIDIA/TensorRT-LLM@249d93d551e8ec11d6d62aabfc9ca8df41ead84c:cpp/tensorrt_llm/kernels/penaltyKernels.cu batchApplyPenalty (bias added to every vocabulary entry)
        bias = inputs.get(T.EMBEDDING_BIAS.name)
        bias_pairs: tuple[tuple[int, float], ...] = ()
        bias_size = 0
        if bias is not None and np.asarray(bias).size:
            bias = np.asarray(bias).reshape(-1)
            if bias.dtype != np.float32:
                raise _not_emulated(f"an embedding_bias of {bias.dtype} (emulated: float32, as our configs declare it)")
            bias_size = bias.size
            bias_pairs = tuple((int(i), float(bias[i])) for i in np.flatnonzero(bias))

        # Source: NVIDIA/TensorRT-LLM@192908136e53ddfc2f282e81e6ecdb76af06eb50:triton_backend/inflight_batcher_llm/src/utils.cc getExternalDraftTokensConfigFromTensors, squeezeTensor
        draft_tokens = _vector(inputs, T.DRAFT_INPUT_IDS.name)
        draft_logits = threshold = None
        if draft_tokens is not None:
            if T.DRAFT_LOGITS.name in inputs:
                draft_logits = np.asarray(inputs[T.DRAFT_LOGITS.name])
                if draft_logits.ndim == 3 and draft_logits.shape[0] == 1:
                    draft_logits = draft_logits[0]
            threshold = _scalar(inputs, "draft_acceptance_threshold", np.float32)
            if return_log_probs and draft_tokens:
                raise _unsupported(engine_interface.LOG_PROBS_WITH_DRAFTS)

        # Source: NVIDIA/TensorRT-LLM@a678b91aafbeff265cd0b764abb59d7def624ac2:cpp/tensorrt_llm/executor/requestImpl.h Request::Impl::validate
        _check(bool(input_tokens), "!mInputTokenIds.empty()")
        _check(max_new_tokens > 0, "mMaxNewTokens > 0")
        return cls(
            input_tokens=tuple(input_tokens),
            max_new_tokens=max_new_tokens,
            end_id=end_id,
            exclude_input_from_output=config.exclude_input_in_output if exclude is None else bool(exclude),
            return_generation_logits=return_generation_logits,
            return_context_logits=return_context_logits,
            return_perf_metrics=return_perf_metrics,
            return_log_probs=return_log_probs,
            # Source: NVIDIA/TensorRT-LLM@0c8de69a1ca6213eebb20a51873890ff128666c2:triton_backend/inflight_batcher_llm/src/model_instance_state.cc ModelInstanceState::enqueue (getRequestBooleanInputTensor)
            return_num_input_tokens=_bool_input(inputs, T.ENGINE_RETURN_NUM_INPUT_TOKENS.name),
            return_num_output_tokens=_bool_input(inputs, T.ENGINE_RETURN_NUM_OUTPUT_TOKENS.name),
            stop_words=tuple(tuple(word) for word in stop_words if word),
            beam_width=beam_width,
            top_k=top_k,
            top_p=top_p,
            temperature=temperature,
            seed=0 if seed is None else int(seed),
            draft_tokens=None if draft_tokens is None else tuple(draft_tokens),
            draft_logits=draft_logits,
            draft_acceptance_threshold=threshold,
            embedding_bias_size=bias_size,
            penalties=_penalties(
                repetition_penalty=1.0 if repetition is None else float(repetition),
                presence_penalty=0.0 if presence is None else float(presence),
                frequency_penalty=0.0 if frequency is None else float(frequency),
                # Source: NVIDIA/TensorRT-LLM@1020a8d799d04a1776f8eec19496ecafa2558506:cpp/tensorrt_llm/layers/defaultDecodingParams.h getMinLength (1)
                min_tokens=ENGINE_MIN_TOKENS if min_tokens is None else int(min_tokens),
                bad_words=tuple(tuple(word) for word in bad_words if word),
                embedding_bias=bias_pairs,
            ),
        )

    @property
    def score_temperature(self) -> float:
        """The temperature the penalty kernel scales by: the one sent, else 1 (no scaling)."""
        return NEUTRAL_TEMPERATURE if self.temperature is None else min(float(self.temperature), _FLT_MAX)

    def sampling_params(self, warn: Callable[[str], None]) -> SamplingParams:
        """The distribution the decoding layers sample from: ``SamplingParams()`` (greedy) when
        top-k is 1 after TensorRT-LLM's regularisation, which turns an absent top-k AND top-p into
        top-k 1 whatever the temperature; else softmax(mask_topk_topp(logits / temperature))."""
        # Source: NVIDIA/TensorRT-LLM@21c8b6d4b656cd3e6e89698ee2bf882344b3cd01:cpp/include/tensorrt_llm/layers/defaultDecodingParams.h DefaultDecodingParams (topK 0, topP 0, temperature 1)
        top_k = 0 if self.top_k is None else self.top_k
        top_p = 0.0 if self.top_p is None else self.top_p
        # Source: NVIDIA/TensorRT-LLM@e41b05cdc69021efb4116ed5f32eeb1840a47981:cpp/tensorrt_llm/kernels/samplingTopKKernels.h clampTopK, regularizeTopKTopP
        if top_k > TOP_K_MAX:
            warn(f"TopK ({top_k}) is larger than max supported number ({TOP_K_MAX}). Clip to max supported number.")
            top_k = TOP_K_MAX
        if top_k == 0 and top_p == 0.0:
            top_k = 1
        if top_k > 0 and top_p == 0.0:
            top_p = 1.0
        # Temperature 0 with top-k/top-p: the penalty kernel multiplies by 1 / (0 + 1e-6), so the
        # distribution is the argmax's up to near-ties; emulated as the argmax of those scores.
        if top_k == 1 or self.temperature == 0:
            return SamplingParams()
        temperature = 1.0 if self.temperature is None else min(self.temperature, _FLT_MAX)  # inf: uniform
        return SamplingParams(temperature, top_k, top_p)


# --- decoding and verification: pure functions over logits ------------------------------------


def ends_with_stop_word(sequence: Sequence[int], stop_words: Sequence[Sequence[int]]) -> bool:
    """A stop word at the end of ``sequence`` (prompt included: upstream's stop criteria look at the
    whole output ids; unconfirmed for words reaching into the prompt)."""
    return any(len(sequence) >= len(word) and tuple(sequence[-len(word) :]) == tuple(word) for word in stop_words)


def decode_tokens(
    next_logits: Callable[[list[int]], torch.Tensor],
    prompt: Sequence[int],
    max_new_tokens: int,
    sampling: SamplingParams,
    *,
    end_id: int | None,
    stop_words: Sequence[Sequence[int]] = (),
    generator: torch.Generator | None = None,
    penalties: Penalties = ENGINE_DEFAULT_PENALTIES,
    temperature: float = NEUTRAL_TEMPERATURE,
) -> tuple[list[int], list[torch.Tensor]]:
    """Up to ``max_new_tokens`` tokens, one at a time: the argmax (greedy) or a draw after top-k
    and top-p, of the penalty and ban-words layers' scores (``adjusted_scores`` at ``temperature``,
    the one sent or 1). Stops after a stop word (kept) or at ``end_id`` (left out); ``end_id``
    None never stops. Returns the tokens and each step's raw logits ``[V]`` (the end_id step's
    included).
    """
    # Source: NVIDIA/TensorRT-LLM@b35ac1b64368513d215c57d2ed01d62d910df8da:cpp/tensorrt_llm/batch_manager/createNewDecoderRequests.cpp CreateNewDecoderRequests::createDecoderRequests (endId.value_or(-1): no end_id, no EOS stop)
    sequence, tokens, step_logits = list(prompt), [], []
    for step in range(max_new_tokens):
        logits = next_logits(sequence)  # [V]
        step_logits.append(logits)
        scores = adjusted_scores(logits[None], temperature, penalties.after(step), sequence, (), end_id)  # [1, V]
        if sampling.greedy:
            token = int(scores.argmax())
        else:
            token = int(sample(filtered_softmax(scores, sampling), generator))
        if token == end_id:  # not in the output (unconfirmed for a sampled EOS; confirmed for drafts)
            break
        tokens.append(token)
        sequence.append(token)
        if ends_with_stop_word(sequence, stop_words):
            break
    return tokens, step_logits


def verify_drafts(
    draft_tokens: Sequence[int],
    target_logits: torch.Tensor,
    sampling: SamplingParams,
    *,
    draft_probs: torch.Tensor | None = None,
    threshold: float | None = None,
    generator: torch.Generator | None = None,
    context: Sequence[int] = (),
    end_id: int | None = None,
    penalties: Penalties = ENGINE_DEFAULT_PENALTIES,
    temperature: float = NEUTRAL_TEMPERATURE,
) -> list[int]:
    """One external-draft-tokens step: the accepted drafts, then one recovered or bonus token.

    ``target_logits`` ``[K + 1, V]``: the target's raw logits at each draft's position and after
    the last, adjusted per position by the penalty and ban-words layers (row i after ``context``
    and the drafts before it, as the decoder runs one sub-step per draft). Greedy: argmax
    matching. Sampled: p = top-k/top-p softmax of those scores; with ``draft_probs`` ``[K, V]``
    (softmax of the draft_logits sent) by :func:`accept_by_probability`, without by
    :func:`accept_by_token_match`.
    """
    # Source: NVIDIA/TensorRT-LLM@1d263f15a979ef2902c60de3f6238bcc0952bb29:cpp/tensorrt_llm/layers/externalDraftTokensLayer.cpp ExternalDraftTokensLayer::forwardAsync
    scores = adjusted_scores(target_logits, temperature, penalties, context, draft_tokens, end_id)  # [K + 1, V]
    if sampling.greedy:
        return greedy_verify(draft_tokens, scores)
    target_probs = filtered_softmax(scores, sampling)  # [K + 1, V]
    if draft_probs is None:
        return accept_by_token_match(draft_tokens, target_probs, generator)
    return accept_by_probability(draft_tokens, draft_probs, target_probs, threshold, generator)


def accept_by_probability(
    draft_tokens: Sequence[int],
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    threshold: float | None = None,
    generator: torch.Generator | None = None,
) -> list[int]:
    """Accept draft i iff p_i(d) > u * q_i(d), u ~ U(0, 1) (``threshold`` instead when given);
    at the first rejection a token from norm(max(0, p_i - q_i)); after K acceptances one from p_K.

    Unlike :func:`~trt_spec.runtime.sampling.rejection_sample`, a draft with q = 0 is accepted
    whenever p > 0, as the kernel's comparison does.
    """
    # Source: NVIDIA/TensorRT-LLM@2931b93fa41bf8b6d23a6e266ffc17810a5966ef:cpp/tensorrt_llm/kernels/speculativeDecoding/externalDraftTokensKernels.cu acceptDraftTokensKernel
    emitted: list[int] = []
    for position, token in enumerate(draft_tokens):
        u = threshold if threshold is not None else float(torch.rand((), generator=generator, dtype=torch.float64))
        if float(target_probs[position, token]) > u * float(draft_probs[position, token]):
            emitted.append(int(token))
            continue
        residual = residual_distribution(target_probs[position].double(), draft_probs[position].double())
        emitted.append(int(sample(residual[None], generator)))
        return emitted
    emitted.append(int(sample(target_probs[len(draft_tokens)][None], generator)))  # bonus
    return emitted


def accept_by_token_match(
    draft_tokens: Sequence[int], target_probs: torch.Tensor, generator: torch.Generator | None = None
) -> list[int]:
    """Without draft logits: t_i ~ p_i, draft i accepted iff t_i == d_i; after a rejection a FRESH
    draw from p_i is emitted (not t_i); after K acceptances one draw from p_K.

    This is the kernel code path as read (the residual correction runs only with draft logits, and
    the multinomial sampling that follows redraws from the uncorrected p_i). For sampled requests
    it is biased toward the draft: P(out = d) = p(d) * (2 - p(d)). Our reading; no upstream test
    confirms it. Greedy requests never get here (argmax matching is exact).
    """
    # Source: NVIDIA/TensorRT-LLM@2931b93fa41bf8b6d23a6e266ffc17810a5966ef:cpp/tensorrt_llm/kernels/speculativeDecoding/externalDraftTokensKernels.cu acceptDraftTokensKernel
    # Source: NVIDIA/TensorRT-LLM@1d263f15a979ef2902c60de3f6238bcc0952bb29:cpp/tensorrt_llm/layers/externalDraftTokensLayer.cpp ExternalDraftTokensLayer::multinomialSampling
    emitted: list[int] = []
    for position, token in enumerate(draft_tokens):
        row = target_probs[position][None]
        if int(sample(row, generator)) == token:
            emitted.append(int(token))
            continue
        emitted.append(int(sample(row, generator)))  # fresh draw (biased, see the docstring)
        return emitted
    emitted.append(int(sample(target_probs[len(draft_tokens)][None], generator)))  # bonus
    return emitted


def truncate_at_stop(
    prompt: Sequence[int], emitted: Sequence[int], end_id: int | None, stop_words: Sequence[Sequence[int]]
) -> list[int]:
    """A verification step's tokens up to end_id (left out) or through a stop word (kept)."""
    # Source: NVIDIA/TensorRT-LLM@2931b93fa41bf8b6d23a6e266ffc17810a5966ef:cpp/tensorrt_llm/kernels/speculativeDecoding/externalDraftTokensKernels.cu forwardAcceptedTokensKernel ("Do not increase seq len when EOS is generated")
    kept: list[int] = []
    for token in emitted:
        if token == end_id:
            break
        kept.append(token)
        if ends_with_stop_word([*prompt, *kept], stop_words):  # per token: unconfirmed for drafts
            break
    return kept


# --- the backend ---------------------------------------------------------------------------------


class TrtllmBackendEmulator:
    """One engine model (``tensorrt_llm`` or ``tensorrt_llm_draft``) as TensorRT-LLM's backend runs it.

    ``warnings``: what upstream would log as a warning for this model: unusable parameters at load,
    clamped requests since. ``notes``: what upstream logs at debug level that an operator of the
    emulator wants to see (drafts the scheduler discarded). A caller may log and clear both.
    """

    def __init__(self, config: BackendConfig, engine: EngineFacts, model: TorchCausalLM):
        if model.vocab_size != engine.vocab_size:
            raise ValueError(
                f"{engine.role} engine: vocab_size {engine.vocab_size} but the model {engine.hf_model_dir} has "
                f"{model.vocab_size} (the emulator pads no vocabulary)"
            )
        self.config = config
        self.engine = engine
        self.model = model
        self.warnings: list[str] = list(config.warnings)
        self.notes: list[str] = []
        # KV-cache block reuse: the longest cached prefix is resumed, as twin_engine.py does. A cache
        # holding at most a step's tokens past the shared prefix is the same request's (a target's
        # rejected drafts; a draft's unaccepted tokens, up to the K a loop asks for).
        self.pool = PrefixCachePool(
            model, engine.max_batch_size, max_divergence=max(engine.max_draft_len, MAX_DRAFT_TOKENS) + 1
        )
        self._last_request_id = 0

    @classmethod
    def load(
        cls, model_config: Mapping[str, Any], engine: EngineFacts, *, model: TorchCausalLM | None = None
    ) -> TrtllmBackendEmulator:
        """model_config: the dict Triton hands a model's initialize() (json of the unchanged
        tensorrtllm config.pbtxt). Enforces the backend's load-time rules; raises BackendError with
        the backend's message (e.g. "unexpected error when creating modelInstanceState: Cannot find
        parameter with name: tokenizer_dir"). Loads TorchCausalLM.from_pretrained(engine.hf_model_dir)
        when model is None."""
        try:
            config = BackendConfig.parse(model_config)
            _check_executor(config, engine)
        except _CppError as error:
            raise _load_error(error) from None
        if model is None:
            model = TorchCausalLM.from_pretrained(engine.hf_model_dir)
        return cls(config, engine, model)

    def execute(
        self, inputs: Mapping[str, np.ndarray], requested_outputs: Sequence[str], *, request_id: str | None = None
    ) -> dict[str, np.ndarray]:
        """One Triton request on its own: :meth:`execute_batch` of one. Raises its BackendError."""
        result = self.execute_batch([BatchItem(inputs, requested_outputs, request_id)])[0]
        if isinstance(result, BackendError):
            raise result
        return result

    def execute_batch(self, batch: Sequence[BatchItem]) -> list[dict[str, np.ndarray] | BackendError]:
        """Triton requests that reached the executor together (one ``execute`` of the model), in
        arrival order: inputs by name WITH the batch dimension as Triton delivers them;
        requested_outputs as the caller requested them (empty: Triton's "all outputs"). Returns,
        per request, its outputs by name with their backend shapes (``{}`` for a ``stop``
        request: the empty final response), or the BackendError with the backend's message for
        every rule it enforces. ``request_id``: Triton's request id, checked only for a ``stop``
        request when given (None: unknown). The admitted requests are scheduled together
        (:mod:`~trt_spec.runtime.trtllm_scheduler`), so one request's drafts may be discarded
        because of the others, as upstream.
        """
        results: list[dict[str, np.ndarray] | BackendError | None] = [None] * len(batch)
        admitted: list[_Admitted] = []
        for index, item in enumerate(batch):
            try:
                admission = self._admit(item, index)
            except BackendError as error:
                results[index] = error
                continue
            if admission is None:
                results[index] = {}  # a stop request
            else:
                admitted.append(admission)
        try:
            self._schedule(admitted)
        except SchedulingError as error:
            for entry in admitted:
                cause = _CppError(str(error))
                results[entry.index] = _executor_error(entry.id, "Encountered an error in forwardAsync function", cause)
            admitted = []
        for entry in admitted:
            try:
                results[entry.index] = self._run(entry)
            except BackendError as error:
                results[entry.index] = error
        return [result if result is not None else {} for result in results]

    def _admit(self, item: BatchItem, index: int) -> _Admitted | None:
        """The enqueue and the executor's validation of the batch's ``index``-th request (None: a
        stop request)."""
        inputs = item.inputs
        # Source: NVIDIA/TensorRT-LLM@0c8de69a1ca6213eebb20a51873890ff128666c2:triton_backend/inflight_batcher_llm/src/model_instance_state.cc ModelInstanceState::handleStopRequest
        if _bool_input(inputs, T.STOP.name):
            if item.request_id == "":
                raise BackendError("Trying to stop a request but request ID is not provided", stage="enqueue")
            return None  # nothing of this request runs here, so there is nothing to cancel

        # Source: NVIDIA/TensorRT-LLM@0c8de69a1ca6213eebb20a51873890ff128666c2:triton_backend/inflight_batcher_llm/src/model_instance_state.cc ModelInstanceState::enqueue (the error text is sent as it is)
        try:
            request = BackendRequest.from_tensors(inputs, self.config)
        except _CppError as error:
            raise BackendError(str(error), stage="enqueue") from None
        self._last_request_id += 1
        request_id_number = self._last_request_id
        try:
            draft_tokens, max_new_tokens = self._validate(request)
        except _CppError as error:
            raise _executor_error(request_id_number, "Encountered an error when fetching new request", error) from None
        return _Admitted(request_id_number, request, draft_tokens, max_new_tokens, tuple(item.requested_outputs), index)

    def _schedule(self, admitted: list[_Admitted]) -> None:
        """The executor's steps over the admitted requests: discards the drafts its scheduler
        discards (and their draft logits' rows, as ``discardDraftTokens`` reshapes them).

        Raises: SchedulingError: a step's check failed (every admitted request fails with it)."""
        engine = self.engine
        limits = SchedulerLimits(
            max_batch_size=engine.max_batch_size,
            max_num_tokens=engine.max_num_tokens,
            tokens_per_block=engine.tokens_per_block,
            chunked_context=bool(self.config.parameters["enable_chunked_context"]),
        )
        steps = [
            StepRequest(
                prompt_len=len(entry.request.input_tokens),
                num_draft_tokens=len(entry.draft_tokens),
                reused_len=self.pool.longest_cached_prefix(entry.request.input_tokens),
                max_new_tokens=max(1, entry.max_new_tokens),
            )
            for entry in admitted
        ]
        outcome = schedule(steps, limits)
        for entry, kept in zip(admitted, outcome.kept_drafts):
            if kept < len(entry.draft_tokens):
                # Source: NVIDIA/TensorRT-LLM@b8b7b782622c5dc57307f42ea96628f66b34f922:cpp/tensorrt_llm/batch_manager/microBatchScheduler.cpp MicroBatchScheduler::fitDraftTokens (TLLM_LOG_DEBUG)
                self.notes.append(f"Discarding {len(entry.draft_tokens) - kept} draft tokens (request {entry.id})")
                entry.discard_drafts(kept)

    def _run(self, entry: _Admitted) -> dict[str, np.ndarray]:
        """The decoder's setup, the step(s) and the response of one scheduled request."""
        request, draft_tokens = entry.request, entry.draft_tokens
        try:
            draft_probs = self._draft_probabilities(request, draft_tokens, entry.draft_logits)
        except _CppError as error:
            raise _executor_error(entry.id, "Encountered an error in forwardAsync function", error) from None

        vocab = self.engine.vocab_size
        if request.embedding_bias_size not in (0, vocab):
            raise _not_emulated(
                f"an embedding_bias of {request.embedding_bias_size} values (emulated: one per vocabulary entry, {vocab})"
            )
        if any(not 0 <= token < vocab for token in (*request.input_tokens, *draft_tokens)):
            raise _not_emulated(f"a token id outside [0, {vocab}) in input_ids or draft_input_ids (undefined upstream)")
        sampling = request.sampling_params(self.warnings.append)
        generator = torch.Generator().manual_seed(request.seed)  # a constant seed repeats the randomness
        prompt = list(request.input_tokens)
        if draft_tokens:
            tokens, logits = self._verify(request, prompt, draft_tokens, draft_probs, sampling, generator)
        else:
            tokens, logits = self._decode(request, prompt, entry.max_new_tokens, sampling, generator)

        try:
            return self._fill(request, prompt, tokens, logits, entry.requested_outputs, draft_tokens)
        except _CppError as error:
            # Source: NVIDIA/TensorRT-LLM@0c8de69a1ca6213eebb20a51873890ff128666c2:triton_backend/inflight_batcher_llm/src/model_instance_state.cc ModelInstanceState::fillTritonResponse
            raise BackendError(f"Error encountered while populating response: {error}", stage="response") from None

    # --- stages ------------------------------------------------------------------------------

    def _validate(self, request: BackendRequest) -> tuple[list[int], int]:
        """The executor's checks of a new request: returns the drafts to verify (possibly
        truncated) and the clamped max_new_tokens."""
        engine = self.engine
        prompt_len = len(request.input_tokens)
        # Source: NVIDIA/TensorRT-LLM@119c6e60e65e5ecec4e97afdb6ea584f674aed24:cpp/tensorrt_llm/batch_manager/llmRequest.cpp LlmRequest::validate
        if request.end_id is not None:
            _check(
                -1 <= request.end_id < engine.vocab_size,
                f"EndId ({request.end_id}) is not within acceptable range [-1, {engine.vocab_size}).",
            )
        if prompt_len > engine.max_input_len:
            raise _CppError(
                f"Prompt length ({prompt_len}) exceeds maximum input length ({engine.max_input_len}). Set log level "
                "to info and check TRTGptModel logs for how maximum input length is set"
            )
        drafts = list(request.draft_tokens or ())
        draft_len_per_step = engine.max_draft_len  # also subtracted when a target request sends no drafts
        if drafts:
            if len(drafts) > engine.max_draft_len:
                raise _CppError(
                    f"Draft tokens length ({len(drafts)}) exceeds maximum draft tokens length ({engine.max_draft_len})."
                )
            draft_len_per_step = len(drafts)
            if prompt_len + draft_len_per_step > engine.max_input_len:
                fitting = engine.max_input_len - prompt_len
                self.warnings.append(
                    f"Prompt length + number of draft tokens ({prompt_len} + {draft_len_per_step}) exceeds maximum "
                    f"input length ({engine.max_input_len}).Number of draft tokens is changed to ({fitting})"
                )
                draft_len_per_step = fitting
                drafts = drafts[:fitting]
        max_new_tokens = request.max_new_tokens
        if prompt_len + max_new_tokens + draft_len_per_step > engine.max_seq_len:
            clamped = engine.max_seq_len - prompt_len - draft_len_per_step
            self.warnings.append(
                "Prompt length + number of requested output tokens + draft tokens per step "
                f"({prompt_len} + {max_new_tokens} + {draft_len_per_step}) exceeds maximum sequence length "
                f"({engine.max_seq_len}). Number of requested output tokens is changed to ({clamped})."
            )
            max_new_tokens = clamped
        # Source: NVIDIA/TensorRT-LLM@b35ac1b64368513d215c57d2ed01d62d910df8da:cpp/tensorrt_llm/executor/executorImpl.cpp Executor::Impl::fetchNewRequests
        if request.return_context_logits:  # the emulated engines never gather context logits
            _check(False, "Return context logit need to build engine with gather_context_logits")
        if request.return_generation_logits:
            _check(
                engine.gather_generation_logits,
                "To return generation logits, gather_generation_logits must be enabled in ExecutorConfig",
            )
        return drafts, max_new_tokens

    def _draft_probabilities(
        self, request: BackendRequest, drafts: list[int], logits: np.ndarray | None
    ) -> torch.Tensor | None:
        """q = softmax(draft_logits) [k, V], after the decoder's copy of the logits sent (``logits``:
        as the request holds them) into its [k, vocabSizePadded] buffer of the engine's logits
        dtype (no temperature, top-k or top-p)."""
        if not drafts or logits is None:
            return None
        engine_dtype = np.dtype(LOGITS_DTYPES[self.engine.logits_dtype])
        # Source: NVIDIA/TensorRT-LLM@b35ac1b64368513d215c57d2ed01d62d910df8da:cpp/tensorrt_llm/batch_manager/createNewDecoderRequests.cpp newRequestDraftTokensExternal, retrieveDraftLogits
        # Source: NVIDIA/TensorRT-LLM@1a43c7d62d008ca9d1efdfd50f9180390598d314:cpp/tensorrt_llm/runtime/bufferManager.cpp BufferManager::copy
        _check(
            logits.dtype == engine_dtype,
            f"Incompatible data types: {_dtype_name(logits.dtype)} != {_dtype_name(engine_dtype)}",
        )
        expected_bytes = len(drafts) * self.engine.vocab_size * engine_dtype.itemsize
        _check(logits.nbytes == expected_bytes, f"Incompatible buffer sizes: {logits.nbytes} != {expected_bytes}")
        rows = torch.from_numpy(np.ascontiguousarray(logits).reshape(len(drafts), -1).astype(np.float32))
        # Source: NVIDIA/TensorRT-LLM@1d263f15a979ef2902c60de3f6238bcc0952bb29:cpp/tensorrt_llm/layers/externalDraftTokensLayer.cpp ExternalDraftTokensLayer::acceptDraftTokens (invokeAddBiasSoftMax over the draft logits as given)
        return rows.softmax(dim=-1)

    def _decode(
        self,
        request: BackendRequest,
        prompt: list[int],
        max_new_tokens: int,
        sampling: SamplingParams,
        generator: torch.Generator,
    ) -> tuple[list[int], list[torch.Tensor]]:
        engine = self.pool.engine_for(prompt)
        return decode_tokens(
            lambda sequence: engine.logits(sequence, 1)[0],
            prompt,
            max(1, max_new_tokens),  # a clamp to <= 0 still runs the context step (unconfirmed)
            sampling,
            end_id=request.end_id,
            stop_words=request.stop_words,
            generator=generator,
            penalties=request.penalties,
            temperature=request.score_temperature,
        )

    def _verify(
        self,
        request: BackendRequest,
        prompt: list[int],
        drafts: list[int],
        draft_probs: torch.Tensor | None,
        sampling: SamplingParams,
        generator: torch.Generator,
    ) -> tuple[list[int], list[torch.Tensor]]:
        """ONE engine step over prompt + drafts: accepted + 1 tokens, whatever request_output_len."""
        # Source: NVIDIA/TensorRT-LLM@b35ac1b64368513d215c57d2ed01d62d910df8da:cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.cpp TrtGptModelInflightBatching::updateRequests (a draft-tokens request terminates after one step)
        sequence = prompt + drafts
        target_logits = self.pool.engine_for(sequence).logits(sequence, len(drafts) + 1)  # [k + 1, V]
        emitted = verify_drafts(
            drafts,
            target_logits,
            sampling,
            draft_probs=draft_probs,
            threshold=request.draft_acceptance_threshold,
            generator=generator,
            context=prompt,
            end_id=request.end_id,
            penalties=request.penalties,
            temperature=request.score_temperature,
        )
        tokens = truncate_at_stop(prompt, emitted, request.end_id, request.stop_words)
        # Generation logits of a draft-tokens request: one row per token added, so none when the
        # first new token is end_id (which never advances the sequence length).
        # Source: NVIDIA/TensorRT-LLM@b35ac1b64368513d215c57d2ed01d62d910df8da:cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.cpp TrtGptModelInflightBatching::updateRequests (numAcceptedTokens)
        return tokens, list(target_logits[: len(tokens)])

    def _fill(
        self,
        request: BackendRequest,
        prompt: list[int],
        tokens: list[int],
        logits: list[torch.Tensor],
        requested_outputs: Sequence[str],
        draft_tokens: Sequence[int] = (),
    ) -> dict[str, np.ndarray]:
        # Source: NVIDIA/TensorRT-LLM@0c8de69a1ca6213eebb20a51873890ff128666c2:triton_backend/inflight_batcher_llm/src/model_instance_state.cc ModelInstanceState::fillTritonResponse
        names = set(requested_outputs) if requested_outputs else set(self.config.outputs)
        ids = tokens if request.exclude_input_from_output else prompt + tokens
        outputs = {}
        if T.OUTPUT_IDS.name not in names:
            raise _CppError(f"{T.OUTPUT_IDS.name} tensor must be present in list of output tensors")
        outputs[T.OUTPUT_IDS.name] = np.array(ids, dtype=np.int32).reshape(1, 1, len(ids))  # [1, beams, n]
        if T.SEQUENCE_LENGTH.name not in names:
            raise _CppError(f"{T.SEQUENCE_LENGTH.name} tensor must be present in list of output tensors")
        outputs[T.SEQUENCE_LENGTH.name] = np.array([[len(ids)]], dtype=np.int32)  # [1, beams]
        if T.GENERATION_LOGITS.name in names and request.return_generation_logits:
            _check(
                self.config.logits_dtype == self.engine.logits_dtype,
                "generationLogitsType == model_state_->getLogitsDataType()",
            )
            vocab = self.engine.vocab_size
            rows = torch.stack(logits).numpy() if logits else np.zeros((0, vocab), np.float32)  # [n, V] raw
            rows = rows.astype(LOGITS_DTYPES[self.engine.logits_dtype])
            outputs[T.GENERATION_LOGITS.name] = rows.reshape(1, 1, *rows.shape)  # [1, beams, n, V]
        if request.return_log_probs:
            log_probs = engine_interface.log_prob_outputs(
                logits,
                prompt,
                tokens,
                temperature=request.score_temperature,
                penalties=request.penalties,
                end_id=request.end_id,
                top_k=engine_interface.log_prob_top_k(request.top_k, request.top_p),
                normalize=bool(self.config.parameters["normalize_log_probs"]),
            )
            outputs.update({name: array for name, array in log_probs.items() if name in names})
        counts = engine_interface.token_count_outputs(
            len(request.input_tokens),
            len(ids),
            input_count=request.return_num_input_tokens,
            output_count=request.return_num_output_tokens,
        )
        outputs.update({name: array for name, array in counts.items() if name in names})
        if request.return_perf_metrics:
            outputs.update(_speculative_metrics(names, draft_tokens, tokens, self.engine))
        return outputs


def _speculative_metrics(
    names: set[str], draft_tokens: Sequence[int], tokens: Sequence[int], engine: EngineFacts
) -> dict[str, np.ndarray]:
    """The speculative-decoding perf metrics of one finished request, as the executor counts them:
    for a target request that verified drafts, the drafts it verified (after any discarded) and
    the tokens it added past the first; zero otherwise. Only the outputs requested are filled."""
    # Source: NVIDIA/TensorRT-LLM@d879430b040ea30c65220c9171a8a70607398748:cpp/include/tensorrt_llm/batch_manager/llmRequest.h LlmRequest::updateNumTokensPerIteration
    # Source: NVIDIA/TensorRT-LLM@c8c6df08bd0ead54cd47f7973e1e425c28a174cd:triton_backend/inflight_batcher_llm/src/model_instance_state.cc ModelInstanceState::fillTritonResponse (processStats)
    drafted = min(len(draft_tokens), engine.max_draft_len) if engine.is_target else 0
    accepted = max(0, len(tokens) - 1) if drafted else 0  # numTokensPerIteration - 1
    rate = accepted / drafted if drafted else 0.0  # set where the request finishes (unconfirmed when 0 drafts)
    values = {
        T.ENGINE_TOTAL_DRAFT_TOKENS.name: np.array([[drafted]], dtype=np.int32),
        T.ENGINE_TOTAL_ACCEPTED_DRAFT_TOKENS.name: np.array([[accepted]], dtype=np.int32),
        T.ENGINE_ACCEPTANCE_RATE.name: np.array([[rate]], dtype=np.float32),
    }
    return {name: array for name, array in values.items() if name in names}


@dataclass(frozen=True)
class BatchItem:
    """One Triton request of a batch, as :meth:`TrtllmBackendEmulator.execute_batch` takes it."""

    inputs: Mapping[str, np.ndarray]
    requested_outputs: Sequence[str] = ()
    request_id: str | None = None


@dataclass
class _Admitted:
    """A request the executor took: its id, what validate left of it, where its answer goes."""

    id: int
    request: BackendRequest
    draft_tokens: list[int]
    max_new_tokens: int
    requested_outputs: tuple[str, ...]
    index: int  # its place in the batch
    draft_logits: np.ndarray | None = None  # as the request holds them (reshaped when drafts are discarded)

    def __post_init__(self) -> None:
        self.draft_logits = self.request.draft_logits

    def discard_drafts(self, kept: int) -> None:
        """``LlmRequest::discardDraftTokens``: the drafts resized, the draft logits reshaped to as many rows."""
        # Source: NVIDIA/TensorRT-LLM@00e9b8a773a690c1182ba23717e6c660a2246b70:cpp/include/tensorrt_llm/batch_manager/llmRequest.h LlmRequest::discardDraftTokens
        self.draft_tokens = self.draft_tokens[:kept]
        if self.draft_logits is not None:
            logits = np.asarray(self.draft_logits)
            self.draft_logits = logits[:kept] if logits.ndim == 2 else logits  # other shapes fail the copy anyway


def _dtype_name(dtype: np.dtype) -> str:
    return _DTYPE_NAMES.get(np.dtype(dtype).name, np.dtype(dtype).name)
