"""config.pbtxt builders: typed settings -> dict -> Triton's own ``ModelConfig`` protobuf.

As PyTriton does it: the dict is parsed by ``google.protobuf.json_format`` into
``tritonclient.grpc.model_config_pb2.ModelConfig``, so a misspelled field or a bad enum fails here,
when the repository is generated, not when a server loads it; ``text_format`` writes the file.
Tensor names, dtypes and shapes come from :mod:`trt_spec.runtime.tensors` only, and every model's
parameters from its typed class in :mod:`trt_spec.runtime.parameters` (the python models read
them back through the same classes).

Every limit comes from one :class:`RepositorySettings`, made from the plan by the flavor
(:func:`trt_spec.repository.flavors.settings_from_plan`); the engine models' configs are the
flavor's (:mod:`trt_spec.repository.flavors`), the rest of the pipeline is built here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from trt_spec import atomic
from trt_spec.errors import RepositoryError
from trt_spec.plan import Plan
from trt_spec.runtime import methods
from trt_spec.runtime import tensors as T
from trt_spec.runtime.costs import DEFAULT_STEP_COSTS, StepCosts
from trt_spec.runtime.methods import DEFAULT_METHOD, LookupParams
from trt_spec.runtime.parameters import (
    NO_PRIOR_ALPHA,
    LoopParameters,
    ModelParameters,
    PostprocessingParameters,
    PreprocessingParameters,
    TrtllmPostprocessingParameters,
    TrtllmPreprocessingParameters,
)

ModelConfig: TypeAlias = model_config_pb2.ModelConfig  # tritonclient ships no types: Any to mypy

TOKENIZER_SUBDIR = "tokenizer"  # beside model.py in the version directory; relocatable
# Keeps the KV budget an absolute token count (plan/memory.py) in every engine load order.
MAX_KV_FRACTION = 0.95
# The ensemble's exclude_input_in_output for a request that sends none: text_output is the
# completion without the prompt.
EXCLUDE_INPUT_IN_OUTPUT = True
# The engine models' own default: output_ids hold the prompt too, as TensorRT-LLM's engine-level
# clients read them (e2e_grpc_speculative_decoding_client.py feeds output_ids back as the next
# input_ids; inflight_batcher_llm_client.py strips the prompt unless told it is excluded). The
# loop sends exclude_input_in_output true on every call, so it does not depend on this.
ENGINE_EXCLUDE_INPUT_IN_OUTPUT = False
# The engine models' output_log_probs: renormalised over the top-k candidates, TensorRT-LLM's
# default (greedy tokens get 0.0; cum_log_probs is the plain sum either way).
NORMALIZE_LOG_PROBS = True


@dataclass(frozen=True)
class EngineSettings:
    """What one engine model's config needs."""

    role: str  # "target" | "draft"
    engine_dir: str  # as the server will see it (a container's mount point may differ)
    hf_model_dir: str | None  # the HF checkpoint (torch flavor)
    tp_size: int
    kv_tokens: int  # max_tokens_in_paged_kv_cache
    kv_fraction: float  # kv_cache_free_gpu_mem_fraction that admits kv_tokens in any load order
    max_num_tokens: int = 8192  # tokens one engine step may run (the plan's, as trtllm-build gets it)


@dataclass(frozen=True)
class RepositorySettings:
    name: str
    flavor: str
    max_batch_size: int
    max_input_len: int
    max_seq_len: int  # prompt + generated tokens; the builder adds K on the target itself
    max_draft_len: int  # K of the target engine
    default_num_draft_tokens: int
    acceptance: str  # greedy | probabilistic
    vocab_size: int
    target: EngineSettings
    draft: EngineSettings | None  # None: the method has no draft model (no tensorrt_llm_draft)
    adaptive_draft: bool = False  # the loop's default when a request does not send adaptive_draft
    dtype: str = "float16"  # engine.dtype: the engines' precision (the torch flavor's twin runs at it)
    torch_threads: int = 1  # torch flavor: intra-op threads per engine model; 0 = torch's default
    step_costs: StepCosts = DEFAULT_STEP_COSTS  # adaptive K's fixed costs (the flavor's step_costs)
    # Sampled requests verify with the draft's logits (else the target matches tokens; also exact).
    draft_logits: bool = False
    # Without draft logits, sampled requests still speculate, verified by token matching
    # (LoopParameters.sampled_token_match: the twin serving an llmapi route whose 1.3+ does so).
    sampled_token_match: bool = False
    # K by requests in flight, for 1, 2, ... in flight (the last entry beyond), 0 = plain decoding;
    # () = none (settings_from_plan: the flavor's, Flavor.k_schedule). Caps the K of requests that
    # send no num_draft_tokens; a request that sends one keeps it.
    k_schedule: tuple[int, ...] = ()
    method: str = DEFAULT_METHOD  # speculative.method: where the loop's drafts come from
    lookup: LookupParams = LookupParams()  # speculative.prompt_lookup (methods with a lookup)

    def __post_init__(self) -> None:
        out_of_range = any(not 0 <= k <= self.max_draft_len for k in self.k_schedule)
        if out_of_range or len(self.k_schedule) > max(1, self.max_batch_size):
            raise RepositoryError(
                f"k_schedule must give at most max_batch_size {self.max_batch_size} K values, each in "
                f"0..max_draft_len {self.max_draft_len}; got {list(self.k_schedule)}"
            )

    @property
    def roles(self) -> tuple[str, ...]:
        """The engine models this repository has, by role."""
        return methods.get(self.method).roles

    def engine(self, role: str) -> EngineSettings:
        engine = {"target": self.target, "draft": self.draft}[role]
        if engine is None:
            raise RepositoryError(f"speculative.method {self.method} has no {role} engine model")
        return engine


def kv_cache_fractions(plan: Plan) -> dict[str, float]:
    """``kv_cache_free_gpu_mem_fraction`` per engine, matching the plan's absolute KV budget.

    TensorRT-LLM allocates min(max_tokens_in_paged_kv_cache, fraction x free memory at load).
    Free memory at an engine's KV allocation is smallest when the other engine is already loaded
    with its KV cache: capacity - both engines' fixed memory - the other's KV cache. The fraction
    is the engine's KV bytes over that worst case (on its tightest GPU), rounded up, so the token
    count, not the fraction, is what binds whichever engine loads first.
    """
    memory = plan.memory
    kv_bytes = {
        "target": memory.target.kv_bytes_per_token * memory.kv_tokens,
        "draft": memory.draft.kv_bytes_per_token * memory.kv_tokens if memory.draft else 0,
    }
    fractions = {}
    for role, other in (("target", "draft"), ("draft", "target"))[: len(plan.roles)]:
        worst = 0.0
        for gpu in memory.gpus:
            on_gpu = role == "target" or gpu.draft_fixed > 0
            if not on_gpu:
                continue
            other_kv = kv_bytes[other] if (other == "target" or gpu.draft_fixed > 0) else 0
            free = gpu.capacity - gpu.target_fixed - gpu.draft_fixed - other_kv
            worst = max(worst, kv_bytes[role] / free if free > 0 else 1.0)
        fractions[role] = min(MAX_KV_FRACTION, math.ceil(worst * 1000) / 1000 or 0.001)
    return fractions


# --- dict helpers ---------------------------------------------------------------------------------


def io_entry(tensor: T.Tensor) -> dict:
    entry: dict = {"name": tensor.name, "data_type": tensor.config_dtype, "dims": list(tensor.dims)}
    if tensor.scalar_reshape:
        entry["reshape"] = {"shape": []}
    if tensor.optional:
        entry["optional"] = True
    if tensor.ragged:
        entry["allow_ragged_batch"] = True
    return entry


def to_model_config(config: dict) -> ModelConfig:
    """Parse a config dict into Triton's ``ModelConfig``.

    Raises:
        RepositoryError: an unknown field or a bad value (a bug in a builder, named here).
    """
    try:
        return json_format.ParseDict(config, ModelConfig())
    except json_format.ParseError as exc:
        raise RepositoryError(f"model config {config.get('name')!r} does not validate: {exc}") from None


def python_model(
    name: str,
    settings: RepositorySettings,
    inputs: tuple[T.Tensor, ...],
    outputs: tuple[T.Tensor, ...],
    parameters: ModelParameters,
    *,
    decoupled: bool = False,
    instances: int = 1,
) -> ModelConfig:
    config = {
        "name": name,
        "backend": "python",
        "max_batch_size": settings.max_batch_size,
        "input": [io_entry(t) for t in inputs],
        "output": [io_entry(t) for t in outputs],
        "instance_group": [{"count": instances, "kind": "KIND_CPU"}],
        "parameters": parameters.to_config(),
    }
    if decoupled:
        config["model_transaction_policy"] = {"decoupled": True}
    return to_model_config(config)


# --- the models -------------------------------------------------------------------------------------


# Two tokenizer processes, so one request's inputs are never a queue for everyone else's: the
# python backend turns a BYTES input into Python objects one string at a time in the stub before
# the model sees it (triton_python_backend_utils.deserialize_bytes_tensor), ~50 ms for 100,000 bad
# words, and a lone instance held every other prompt behind that (docs/operating.md, "Connections and inputs are bounded").
PREPROCESSING_INSTANCES = 2


def preprocessing_config(settings: RepositorySettings) -> ModelConfig:
    return python_model(
        T.PREPROCESSING,
        settings,
        T.PREPROCESSING_INPUTS,
        T.PREPROCESSING_OUTPUTS,
        PreprocessingParameters(
            tokenizer_dir=TOKENIZER_SUBDIR,
            add_special_tokens=True,
            max_input_len=settings.max_input_len,
            max_seq_len=settings.max_seq_len,
            max_draft_len=settings.max_draft_len,
            default_num_draft_tokens=settings.default_num_draft_tokens,
            vocab_size=settings.vocab_size,
            exclude_input_in_output=EXCLUDE_INPUT_IN_OUTPUT,
            draft_logits=settings.draft_logits,
        ),
        instances=PREPROCESSING_INSTANCES,
    )


def postprocessing_config(settings: RepositorySettings) -> ModelConfig:
    return python_model(
        T.POSTPROCESSING,
        settings,
        T.POSTPROCESSING_INPUTS,
        T.POSTPROCESSING_OUTPUTS,
        PostprocessingParameters(tokenizer_dir=TOKENIZER_SUBDIR, loop_model=T.LOOP),
        decoupled=True,  # a liveness probe of the loop gets no response (tensors.py)
    )


def loop_config(settings: RepositorySettings) -> ModelConfig:
    """The draft -> verify loop: python, decoupled (it streams each iteration's tokens)."""
    prior = settings.step_costs.prior_alpha
    return python_model(
        T.LOOP,
        settings,
        T.LOOP_INPUTS,
        T.LOOP_OUTPUTS,
        LoopParameters(
            target_model=T.TARGET,
            draft_model=T.DRAFT if settings.draft is not None else "",
            method=settings.method,
            lookup_min_ngram=settings.lookup.min_ngram,
            lookup_max_ngram=settings.lookup.max_ngram,
            vocab_size=settings.vocab_size,
            max_draft_len=settings.max_draft_len,
            adaptive_draft=settings.adaptive_draft,
            use_draft_logits=settings.draft_logits,
            sampled_token_match=settings.sampled_token_match,
            draft_cost=round(settings.step_costs.draft, 4),
            verify_slope=round(settings.step_costs.verify_slope, 4),
            k_schedule=LoopParameters.schedule_text(settings.k_schedule),
            prior_alpha=NO_PRIOR_ALPHA if prior is None else round(prior, 4),
            prior_profile=",".join(f"{value:.4f}" for value in settings.step_costs.prior_profile),
        ),
        decoupled=True,
    )


def trtllm_preprocessing_config(settings: RepositorySettings) -> ModelConfig:
    """TensorRT-LLM's ``preprocessing``: unary, one prompt per row (tensors.py)."""
    return python_model(
        T.TRTLLM_PREPROCESSING,
        settings,
        T.TRTLLM_PREPROCESSING_INPUTS,
        T.TRTLLM_PREPROCESSING_OUTPUTS,
        TrtllmPreprocessingParameters(
            tokenizer_dir=TOKENIZER_SUBDIR, add_special_tokens=True, max_input_len=settings.max_input_len
        ),
    )


def trtllm_postprocessing_config(settings: RepositorySettings) -> ModelConfig:
    """TensorRT-LLM's ``postprocessing``: unary, whole sequences to text (tensors.py)."""
    return python_model(
        T.TRTLLM_POSTPROCESSING,
        settings,
        T.TRTLLM_POSTPROCESSING_INPUTS,
        T.TRTLLM_POSTPROCESSING_OUTPUTS,
        TrtllmPostprocessingParameters(tokenizer_dir=TOKENIZER_SUBDIR, skip_special_tokens=True),
    )


def ensemble_config(settings: RepositorySettings, name: str = T.ENSEMBLE) -> ModelConfig:
    """spec_preprocessing -> spec_loop -> spec_postprocessing as ``ensemble`` (TensorRT-LLM 1.2.x's
    ensemble inputs and outputs plus ours) or as ``tensorrt_llm_bls`` (the same, plus upstream
    BLS's use_draft_logits): :mod:`trt_spec.runtime.tensors`. Every request input goes to
    preprocessing, which checks them all and resolves their defaults, except the seeds and
    adaptive_draft (to the loop); every output comes from postprocessing: text_output, and the
    loop's others passed through (tensors.py says why)."""
    inputs = T.BLS_INPUTS if name == T.BLS else T.ENSEMBLE_INPUTS
    pre = {t.name: f"_pre_{t.name}" for t in T.PREPROCESSING_OUTPUTS}
    loop_private = {t.name: f"_loop_{t.name}" for t in T.POSTPROCESSING_INPUTS}
    steps = [
        {
            "model_name": T.PREPROCESSING,
            "model_version": -1,
            "input_map": {t.name: t.name for t in T.PREPROCESSING_INPUTS if t in inputs},
            "output_map": pre,
        },
        {
            "model_name": T.LOOP,
            "model_version": -1,
            "input_map": {**pre, **{t.name: t.name for t in T.LOOP_DIRECT_INPUTS}},
            "output_map": loop_private,
        },
        {
            "model_name": T.POSTPROCESSING,
            "model_version": -1,
            "input_map": loop_private,
            "output_map": {t.name: t.name for t in T.POSTPROCESSING_OUTPUTS},
        },
    ]
    return to_model_config(
        {
            "name": name,
            "platform": "ensemble",
            "max_batch_size": settings.max_batch_size,
            "input": [io_entry(t) for t in inputs],
            "output": [io_entry(t) for t in T.ENSEMBLE_OUTPUTS],
            "ensemble_scheduling": {"step": steps},
        }
    )


def pipeline_configs(settings: RepositorySettings, engines: dict[str, ModelConfig]) -> dict[str, ModelConfig]:
    """The repository's models around a flavor's two ``engines`` (by name), by name: our
    spec_preprocessing -> spec_loop -> spec_postprocessing as ``ensemble`` and
    ``tensorrt_llm_bls``, and TensorRT-LLM's own ``preprocessing`` and ``postprocessing``; no
    ``tensorrt_llm_draft`` for a method without a draft model."""
    return {
        T.PREPROCESSING: preprocessing_config(settings),
        **{T.ENGINE_MODELS[role]: engines[T.ENGINE_MODELS[role]] for role in settings.roles},
        T.LOOP: loop_config(settings),
        T.POSTPROCESSING: postprocessing_config(settings),
        T.ENSEMBLE: ensemble_config(settings),
        T.BLS: ensemble_config(settings, T.BLS),
        T.TRTLLM_PREPROCESSING: trtllm_preprocessing_config(settings),
        T.TRTLLM_POSTPROCESSING: trtllm_postprocessing_config(settings),
    }


def config_text(config: ModelConfig) -> str:
    return text_format.MessageToString(config)


def write_config(config: ModelConfig, repo: str | Path) -> Path:
    """Write ``<repo>/<config.name>/config.pbtxt`` atomically (a reader never sees half a file)."""
    if not config.name:
        raise RepositoryError("a model config without a name cannot be written")
    path = Path(repo) / config.name / "config.pbtxt"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(path, config_text(config))
    return path


def read_config(path: str | Path, *, allow_unknown_fields: bool = False) -> ModelConfig:
    """Parse a config.pbtxt back into ``ModelConfig``: the package's one reader of config files.
    ``allow_unknown_fields``: skip fields this protobuf schema lacks (a newer Triton's).

    Raises:
        OSError: the file cannot be read.
        text_format.ParseError: it does not parse (names the line).
    """
    return text_format.Parse(Path(path).read_text(), ModelConfig(), allow_unknown_field=allow_unknown_fields)
