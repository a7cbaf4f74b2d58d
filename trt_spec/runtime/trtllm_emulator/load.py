"""Stage 1, load: the model config as the backend reads it, and the engine it would load.

:class:`BackendConfig` reads the config's parameters as ``ModelInstanceState``'s constructor reads
them, in its order, with ``std::stoi``/``std::stof``-like parsers; :func:`_check_executor` makes the
executor's load-time checks a config can fail. :class:`EngineFacts` is what a compiled engine would
tell the backend (on CPU: derived from the spec's plan).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from trt_spec.runtime import tensors as T
from trt_spec.runtime.tensors import ROLES
from trt_spec.runtime.trtllm_emulator.errors import _check, _CppError, _not_emulated

# Triton's logits dtypes the emulator returns (numpy has no bfloat16).
LOGITS_DTYPES = {"FP32": np.float32, "FP16": np.float16}


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
