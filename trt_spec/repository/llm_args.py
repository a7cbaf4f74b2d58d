"""What the llmapi flavor emits for TensorRT-LLM's LLM API, per release line, with unknown keys refused.

The PyTorch backend (``trtllm-serve`` and Triton's ``llmapi`` python model) is configured with the
LLM API's arguments (``tensorrt_llm/llmapi/llm_args.py``: ``TorchLlmArgs`` and the configs it
nests). Upstream's own models forbid unknown keys (``StrictBaseModel``), but only when the server
starts on a GPU machine. Here every key we emit is modelled per release line, from upstream's
source at the commits cited below, so a misspelled or wrong-version key is refused by name when the
repository is written (:func:`validate_options`), before GPU time.

Only the keys trt-spec writes, and their neighbours in the same upstream sections that a user is
likely to add, are modelled: a key outside this table is refused even where upstream would take it
(add it here, with its citation, when we need it).

The release lines (``TRTLLM_VERSIONS``) and where each key comes from:

========================================  ================================  ================================
key                                        1.2.x                              1.3+
========================================  ================================  ================================
speculative_config.speculative_model       yes (alias speculative_model_dir)  yes (alias speculative_model_dir)
speculative_config.acceptance_window       yes                                no (renamed)
speculative_config.acceptance_length_...   yes                                no (renamed)
speculative_config.acceptance_rate_...     no                                 yes (window_size, threshold)
speculative_config.use_rejection_sampling  no                                 yes (prototype)
speculative_config.advanced_sampling_mode  no                                 yes
speculative_config.enable_penalty          no                                 yes (prototype)
speculative_config.max_matching_ngram_...  yes (NGram, with is_keep_all,     yes (the same)
                                           is_use_oldest, is_public_pool)
========================================  ================================  ================================

Sources (NVIDIA/TensorRT-LLM, ``tensorrt_llm/llmapi/llm_args.py``):

- 1.3+: commit 0004396720054fd8e205cbf616f21f0b57c6b412 (``DecodingBaseConfig``,
  ``DraftTargetDecodingConfig`` with ``_draft_target_one_model = True``), matching the published API
  reference of 1.3.0rc27/rc29 and 1.4.0rc1 (nvidia.github.io/TensorRT-LLM/1.3.0rc29/llm-api/reference/).
- 1.2.x: the stored copy whose ``MTPDecodingConfig`` warns that "the mtp_eagle_one_model flag will do
  nothing in release 1.3" (so a 1.2-line file): ``DecodingBaseConfig`` with ``speculative_model``
  (validation alias ``speculative_model_dir``), ``acceptance_window``, ``acceptance_length_threshold``,
  ``allow_advanced_sampling`` and no ``use_rejection_sampling``; ``CudaGraphConfig`` (``batch_sizes``,
  ``max_batch_size``, ``enable_padding``); ``KvCacheConfig``. The search index that served it does not
  resolve its commit hash: NOT pinned to a commit; re-read at the v1.2.x tag before relying on it.
- ``NGramDecodingConfig`` (``decoding_type`` NGram, ``max_matching_ngram_size`` PositiveInt 2,
  ``is_keep_all``, ``is_use_oldest``, ``is_public_pool`` all True; "max_draft_len must be > 0 for
  NGram"): the same fields and defaults on both lines (1.3+ at 0004396720054fd8e205cbf616f21f0b57c6b412,
  1.2.x in the unpinned copy above); the pool they configure is
  ``tensorrt_llm/_torch/speculative/ngram.py`` @0249976575050d2c624a5f285683c66de311a3b7.
- ``KvCacheConfig`` (``enable_block_reuse``, ``max_tokens``, ``free_gpu_memory_fraction``) and the
  top-level ``tensor_parallel_size``, ``pipeline_parallel_size``, ``max_batch_size``,
  ``max_num_tokens``, ``max_seq_len``, ``dtype``, ``trust_remote_code``: ``BaseLlmArgs`` at
  fcd3f31682808ae56118ae43c1d7864a3a945e6f and the keys ``trtllm-serve`` itself passes
  (``tensorrt_llm/commands/serve.py`` ``get_llm_args`` at 4c05a74891e4df8066f08ed4ce14b0972abe4e25);
  ``disable_overlap_scheduler`` and ``cuda_graph_config``: ``TorchLlmArgs`` (same file, both lines).
- Triton's llmapi ``model.yaml``: ``model``, ``backend`` and ``triton_config`` (``max_batch_size``,
  ``decoupled``; ``cancellation_check_period_ms`` optional) as
  ``triton_backend/all_models/llmapi/tensorrt_llm/1/model.py`` (b35ac1b64368513d215c57d2ed01d62d910df8da,
  1.2.0rc2) reads them: the rest of the file goes to ``LLM(**args)`` unchanged.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import yaml
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveInt,
    ValidationError,
    model_validator,
)

from trt_spec.errors import RepositoryError

# The TensorRT-LLM release lines we emit for; "1.3" covers 1.3 and later until a table says otherwise.
TRTLLM_VERSIONS = ("1.2", "1.3")
# Upstream's current line (main moved past 1.2.x, which was the last with TensorRT engines).
DEFAULT_TRTLLM_VERSION = "1.3"
VERSION_LABELS = {"1.2": "1.2.x", "1.3": "1.3+"}
# The draft's checkpoint key we write, per line: both lines take both names (AliasChoices), but
# 1.2-era configs and upstream's 1.2 examples spell it speculative_model_dir; 1.3+ names the field
# speculative_model (its API reference shows only that name).
DRAFT_MODEL_KEY = {"1.2": "speculative_model_dir", "1.3": "speculative_model"}


class LlmArgsError(RepositoryError):
    """An LLM-API options file has a key or value the release line does not take; ``key_path``
    is the dotted path of the offending key."""

    def __init__(self, message: str, *, key_path: str):
        super().__init__(message)
        self.key_path = key_path


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class KvCacheConfig(_Strict):
    """``KvCacheConfig`` (both lines)."""

    enable_block_reuse: bool | None = None
    max_tokens: PositiveInt | None = None
    free_gpu_memory_fraction: float | None = Field(None, gt=0.0, le=1.0)


class CudaGraphConfig(_Strict):
    """``CudaGraphConfig`` (1.2.x) / ``BaseCudaGraphConfig`` (1.3+): the fields both share."""

    batch_sizes: list[PositiveInt] | None = None
    max_batch_size: NonNegativeInt | None = None
    enable_padding: bool | None = None


class DraftTargetConfig(_Strict):
    """``DecodingBaseConfig`` fields both lines share, and ``DraftTargetDecodingConfig``'s own."""

    decoding_type: Literal["Draft_Target"]
    max_draft_len: PositiveInt  # upstream: "max_draft_len must be > 0 for DraftTarget"
    max_total_draft_tokens: PositiveInt | None = None
    speculative_model: str | None = Field(
        None, validation_alias=AliasChoices("speculative_model", "speculative_model_dir")
    )
    max_concurrency: PositiveInt | None = None
    draft_len_schedule: dict[int, int] | None = None
    load_format: str | None = None
    allow_advanced_sampling: bool | None = None

    @model_validator(mode="after")
    def _needs_a_draft(self) -> DraftTargetConfig:
        # upstream: "speculative_model must be specified for DraftTarget"
        if not self.speculative_model:
            raise ValueError("speculative_model (or speculative_model_dir) must name the draft checkpoint")
        return self


class DraftTargetConfig12(DraftTargetConfig):
    """1.2.x: the acceptance gate is ``acceptance_window`` / ``acceptance_length_threshold``."""

    acceptance_window: NonNegativeInt | None = None
    acceptance_length_threshold: NonNegativeFloat | None = None


class DraftTargetConfig13(DraftTargetConfig):
    """1.3+: the gate renamed to ``acceptance_rate_*``; rejection sampling on the one-model path."""

    acceptance_rate_window_size: NonNegativeInt | None = None
    acceptance_rate_threshold: float | None = Field(None, ge=0.0, le=1.0)
    use_rejection_sampling: bool | None = None
    advanced_sampling_mode: Literal["full", "no_topk", "no_topp", "no_topk_no_topp"] | None = None
    enable_penalty: bool | None = None


class NGramConfig(_Strict):
    """``NGramDecodingConfig`` (both lines): the ``DecodingBaseConfig`` fields it shares with
    draft-target, and its own pool options with upstream's defaults."""

    decoding_type: Literal["NGram"]
    max_draft_len: PositiveInt  # upstream: max_draft_len must be > 0 for NGram
    max_total_draft_tokens: PositiveInt | None = None
    max_concurrency: PositiveInt | None = None
    draft_len_schedule: dict[int, int] | None = None
    allow_advanced_sampling: bool | None = None
    max_matching_ngram_size: PositiveInt = 2  # the longest suffix matched; sizes down to 1 are tried
    is_keep_all: bool = True  # every match of a pattern kept, not only the longest
    is_use_oldest: bool = True  # the oldest match proposed (False: the newest)
    is_public_pool: bool = True  # one pool for all requests (False: one per request)


class NGramConfig12(NGramConfig):
    acceptance_window: NonNegativeInt | None = None
    acceptance_length_threshold: NonNegativeFloat | None = None


class NGramConfig13(NGramConfig):
    acceptance_rate_window_size: NonNegativeInt | None = None
    acceptance_rate_threshold: float | None = Field(None, ge=0.0, le=1.0)
    use_rejection_sampling: bool | None = None  # DecodingBaseConfig's; TorchLlmArgs refuses True for NGram

    @model_validator(mode="after")
    def _no_rejection_sampling(self) -> NGramConfig13:
        # upstream: "spec mode NGRAM is not a supported rejection-sampling path"
        if self.use_rejection_sampling:
            raise ValueError("use_rejection_sampling must be false for NGram: its drafts carry no logits")
        return self


# A speculative_config is one of the decoding types we write, told apart by decoding_type.
DECODING_TYPES = ("Draft_Target", "NGram")
SpeculativeConfig12 = Annotated[DraftTargetConfig12 | NGramConfig12, Field(discriminator="decoding_type")]
SpeculativeConfig13 = Annotated[DraftTargetConfig13 | NGramConfig13, Field(discriminator="decoding_type")]


class _LlmOptions(_Strict):
    """The top-level LLM-API arguments we write (the ``trtllm-serve`` options file)."""

    tensor_parallel_size: PositiveInt
    pipeline_parallel_size: PositiveInt = 1
    max_batch_size: PositiveInt
    max_num_tokens: PositiveInt
    max_seq_len: PositiveInt
    dtype: Literal["auto", "float16", "bfloat16", "float32"] = "auto"
    trust_remote_code: bool = False
    kv_cache_config: KvCacheConfig
    cuda_graph_config: CudaGraphConfig | None = None
    disable_overlap_scheduler: bool = False
    # TorchLlmArgs (both lines; default false, "prototype" on 1.3+): trtllm-serve's /metrics reports
    # iteration statistics only with it (tensorrt_llm/serve/openai_server.py get_iteration_stats).
    # Not written by the flavor; read by `serve`'s twin of the route.
    enable_iter_perf_stats: bool = False
    speculative_config: DraftTargetConfig | NGramConfig

    @model_validator(mode="after")
    def _fits_a_verify_step(self) -> _LlmOptions:
        k = self.speculative_config.max_draft_len
        if self.max_num_tokens < self.max_batch_size * (k + 1):
            raise ValueError(
                f"max_num_tokens {self.max_num_tokens} < max_batch_size {self.max_batch_size} x (max_draft_len "
                f"{k} + 1): a full batch cannot verify its drafts in one step"
            )
        if self.pipeline_parallel_size != 1:
            raise ValueError("pipeline_parallel_size must be 1: speculation does not run with pipeline parallelism")
        return self


class LlmOptions12(_LlmOptions):
    speculative_config: SpeculativeConfig12


class LlmOptions13(_LlmOptions):
    speculative_config: SpeculativeConfig13


class TritonConfig(_Strict):
    """``triton_config`` of Triton's llmapi ``model.yaml`` (read by its ``model.py``)."""

    max_batch_size: NonNegativeInt
    decoupled: bool
    cancellation_check_period_ms: PositiveInt | None = None


class _ModelYaml(_Strict):
    model: str
    backend: Literal["pytorch"]
    triton_config: TritonConfig


class ModelYaml12(_ModelYaml, LlmOptions12):
    pass


class ModelYaml13(_ModelYaml, LlmOptions13):
    pass


OPTIONS: dict[str, type[_LlmOptions]] = {"1.2": LlmOptions12, "1.3": LlmOptions13}
MODEL_YAML: dict[str, type[_LlmOptions]] = {"1.2": ModelYaml12, "1.3": ModelYaml13}
Kind = Literal["options", "model_yaml"]


def version_line(version: str) -> str:
    """``version`` as a line of ``TRTLLM_VERSIONS``: "1.2", "1.2.1" -> "1.2"; "1.3", "1.4.0rc1" -> "1.3".

    Raises:
        RepositoryError: a version before 1.2 or not a version.
    """
    parts = version.strip().split(".")
    try:
        major, minor = int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) if len(parts) > 1 else "0")
    except ValueError:
        major, minor = -1, -1
    if (major, minor) == (1, 2):
        return "1.2"
    if (major, minor) >= (1, 3):
        return "1.3"
    raise RepositoryError(f"TensorRT-LLM version must be 1.2 or 1.3 (or later); got {version!r}")


def _model_for(version: str, kind: Kind) -> type[_LlmOptions]:
    return (OPTIONS if kind == "options" else MODEL_YAML)[version_line(version)]


def keys_of(model: type[BaseModel]) -> dict[str, tuple[type[BaseModel], ...]]:
    """Every key a model takes (field names and their validation aliases), with the nested models
    each one may hold (several for a union such as ``speculative_config``; none for a plain value)."""
    keys: dict[str, tuple[type[BaseModel], ...]] = {}
    for name, field in model.model_fields.items():
        nested = tuple(
            candidate
            for candidate in _flattened(field.annotation)
            if isinstance(candidate, type) and issubclass(candidate, BaseModel)
        )
        names = [name]
        if isinstance(field.validation_alias, AliasChoices):
            names += [str(choice) for choice in field.validation_alias.choices]
        for key in names:
            keys[key] = nested
    return keys


def _flattened(annotation: Any) -> list[Any]:
    """The types an annotation names, through unions and ``Annotated``."""
    if get_origin(annotation) is Annotated:
        return _flattened(get_args(annotation)[0])
    args = get_args(annotation)
    return [annotation] if not args else [leaf for arg in args for leaf in _flattened(arg)]


def _chosen(candidates: tuple[type[BaseModel], ...], value: Mapping[str, Any]) -> type[BaseModel] | None:
    """Of a union's models, the one ``value`` is: told by its ``decoding_type`` where the models
    have one (``speculative_config``), else the only one; None when none matches."""
    if len(candidates) == 1:
        return candidates[0]
    for candidate in candidates:
        field = candidate.model_fields.get("decoding_type")
        if field is not None and value.get("decoding_type") in get_args(field.annotation):
            return candidate
    return None


def _other_lines(version: str, kind: Kind, path: tuple[str, ...], key: str) -> list[str]:
    found = []
    for other in TRTLLM_VERSIONS:
        if other == version:
            continue
        models: tuple[type[BaseModel], ...] = (_model_for(other, kind),)
        for part in path:
            models = tuple(nested for model in models for nested in keys_of(model).get(part, ()))
        if any(key in keys_of(model) for model in models):
            found.append(VERSION_LABELS[other])
    return found


def _refuse_unknown_keys(data: Mapping[str, Any], model: type[BaseModel], version: str, kind: Kind, path=()) -> None:
    known = keys_of(model)
    for key, value in data.items():
        key_path = ".".join((*path, str(key)))
        if key not in known:
            elsewhere = _other_lines(version, kind, path, str(key))
            if elsewhere:
                hint = f"it is TensorRT-LLM {' and '.join(elsewhere)}'s, not {VERSION_LABELS[version]}'s"
            else:
                close = difflib.get_close_matches(str(key), list(known), n=1)
                hint = f"did you mean {close[0]}?" if close else f"known keys here: {', '.join(sorted(known))}"
            raise LlmArgsError(
                f"{key_path}: unknown key for TensorRT-LLM {VERSION_LABELS[version]}; {hint}", key_path=key_path
            )
        if known[key] and isinstance(value, Mapping):
            nested = _chosen(known[key], value)
            if nested is not None:  # else the union's own validation names the decoding_type
                _refuse_unknown_keys(value, nested, version, kind, (*path, str(key)))


def validate_options(data: Mapping[str, Any], version: str, kind: Kind = "options") -> _LlmOptions:
    """Check an options mapping against the key table of ``version``'s line: every key known
    (a misspelled or other-version key is refused by its dotted path, with the likely key), every
    value of its type, and a full batch able to verify its drafts in one step.

    ``kind``: "options" (the ``trtllm-serve`` options file) or "model_yaml" (Triton's llmapi
    ``model.yaml``: the same plus ``model``, ``backend`` and ``triton_config``).

    Raises:
        LlmArgsError: an unknown key or a bad value (names the key path).
        RepositoryError: an unknown version.
    """
    line = version_line(version)
    model = _model_for(line, kind)
    if not isinstance(data, Mapping):
        raise LlmArgsError(f"an LLM-API options file must be a mapping; got {type(data).__name__}", key_path="")
    _refuse_unknown_keys(data, model, line, kind)
    try:
        return model.model_validate(dict(data))
    except ValidationError as exc:
        error = exc.errors()[0]
        # The loc names a union's member by its tag (speculative_config.NGram.max_draft_len): not a key.
        parts = [str(part) for part in error["loc"]]
        key_path = ".".join(
            part for part in parts if not part.startswith("function-after") and part not in DECODING_TYPES
        )
        where = f"{key_path}: " if key_path else ""
        raise LlmArgsError(
            f"{where}{error['msg'].removeprefix('Value error, ')} (TensorRT-LLM {VERSION_LABELS[line]})",
            key_path=key_path,
        ) from None


def validate_yaml(path: str | Path, version: str, kind: Kind = "options") -> _LlmOptions:
    """:func:`validate_options` on a YAML file.

    Raises:
        LlmArgsError: the file does not parse, or a key or value is refused (names the file and key).
        OSError: the file cannot be read.
    """
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise LlmArgsError(f"{path} is not valid YAML: {exc}", key_path="") from None
    try:
        return validate_options(data, version, kind)
    except LlmArgsError as exc:
        raise LlmArgsError(f"{path}: {exc}", key_path=exc.key_path) from None
