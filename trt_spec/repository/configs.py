"""config.pbtxt builders: typed settings -> dict -> Triton's own ``ModelConfig`` protobuf.

As PyTriton does it: the dict is parsed by ``google.protobuf.json_format`` into
``tritonclient.grpc.model_config_pb2.ModelConfig``, so a misspelled field or a bad enum fails here,
when the repository is generated, not when a server loads it; ``text_format`` writes the file.
Tensor names, dtypes and shapes come from :mod:`trt_spec.runtime.tensors` only, and every model's
parameters from its typed class in :mod:`trt_spec.runtime.parameters` (the python models read
them back through the same classes).

Every limit comes from one :class:`RepositorySettings`, made from the plan
(:func:`settings_from_plan`) and, when engines are built, cross-checked against their
TensorRT-LLM ``config.json`` (:func:`check_engines`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from trt_spec import atomic
from trt_spec.errors import EngineMismatchError, RepositoryError
from trt_spec.layout import engine_dir
from trt_spec.plan import Plan, engine_max_input_len
from trt_spec.plan.memory import rank_params
from trt_spec.runtime import tensors as T
from trt_spec.runtime.costs import CPU_VERIFY_SLOPE, DEFAULT_STEP_COSTS, StepCosts
from trt_spec.runtime.parameters import (
    LoopParameters,
    ModelParameters,
    PostprocessingParameters,
    PreprocessingParameters,
    TensorrtLlmParameters,
    TorchEngineParameters,
    TrtllmPostprocessingParameters,
    TrtllmPreprocessingParameters,
)

ModelConfig = model_config_pb2.ModelConfig

FLAVORS = ("tensorrtllm", "torch")
TOKENIZER_SUBDIR = "tokenizer"  # beside model.py in the version directory; relocatable
# Keeps the KV budget an absolute token count (plan/memory.py) in every engine load order.
MAX_KV_FRACTION = 0.95
# guaranteed_no_evict: a request admitted to the batch always has KV blocks to finish, so a
# verifying target is never paused between draft and verify.
BATCH_SCHEDULER_POLICY = "guaranteed_no_evict"
# The engines' logits dtype, as TensorRT-LLM's checkpoint config names it: generation_logits and
# draft_logits are declared FP32 (tensors.py).
LOGITS_DTYPE = "float32"
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
    draft: EngineSettings
    adaptive_draft: bool = False  # the loop's default when a request does not send adaptive_draft
    torch_threads: int = 1  # torch flavor: intra-op threads per engine model; 0 = torch's default
    step_costs: StepCosts = DEFAULT_STEP_COSTS  # adaptive K's fixed costs (deployment_step_costs)

    def engine(self, role: str) -> EngineSettings:
        return {"target": self.target, "draft": self.draft}[role]


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
        "draft": memory.draft.kv_bytes_per_token * memory.kv_tokens,
    }
    fractions = {}
    for role, other in (("target", "draft"), ("draft", "target")):
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


def settings_from_plan(
    plan: Plan,
    *,
    flavor: str | None = None,
    engines_mount: str | Path | None = None,
    hf_model_dirs: dict[str, str] | None = None,
    adaptive_draft: bool = False,
    torch_threads: int = 1,
) -> RepositorySettings:
    """The repository's settings from the plan alone.

    ``engines_mount``: the spec's ``paths.engines`` as the serving machine sees it (e.g. a
    container mount point); default: the absolute local path. ``adaptive_draft``: the loop's
    default for requests that do not say. ``torch_threads``: the torch flavor's intra-op threads
    per engine model (0 = torch's default). One by default: a request keeps one engine busy at a
    time, the server's other processes (loop, postprocessing, Triton itself) need the remaining
    cores, and idle OpenMP threads spin-waiting on a shared CPU slow everything else down.
    """
    spec = plan.spec
    flavor = flavor or spec.triton.flavor
    if flavor not in FLAVORS:
        raise RepositoryError(f"flavor must be one of {', '.join(FLAVORS)}; got {flavor!r}")
    fractions = kv_cache_fractions(plan)
    engines = {}
    for role in ("target", "draft"):
        local = engine_dir(spec, role)
        if engines_mount is not None:
            served = str(Path(engines_mount) / spec.name / role)
        else:
            served = str(local.resolve())
        engines[role] = EngineSettings(
            role=role,
            engine_dir=served,
            hf_model_dir=(hf_model_dirs or {}).get(role),
            tp_size=spec.role(role).tp_size,
            kv_tokens=plan.memory.kv_tokens,
            kv_fraction=fractions[role],
        )
    return RepositorySettings(
        name=spec.name,
        flavor=flavor,
        max_batch_size=spec.engine.max_batch_size,
        max_input_len=spec.engine.max_input_len,
        max_seq_len=spec.engine.max_seq_len,
        max_draft_len=spec.num_draft_tokens,
        default_num_draft_tokens=spec.num_draft_tokens,
        acceptance=spec.speculative.acceptance,
        vocab_size=plan.target.model.vocab_size,
        target=engines["target"],
        draft=engines["draft"],
        adaptive_draft=adaptive_draft,
        torch_threads=torch_threads,
        step_costs=deployment_step_costs(plan, flavor),
    )


def deployment_step_costs(plan: Plan, flavor: str) -> StepCosts:
    """Adaptive K's fixed step costs for the repository's engines: on the spec's GPU (tensorrtllm)
    the projection's memory-bandwidth step model (``trt_spec.plan.projection``) at the spec's K; on a CPU
    (torch) the draft's parameter count over the target's for t_d / t_1 and the twin's measured
    verify slope. Fixed so that K, and so the output, never depends on the machine's load."""
    if flavor == "tensorrtllm":
        from trt_spec.plan.projection import project_plan

        k = plan.spec.num_draft_tokens
        return project_plan(plan, max_k=k).step_times.step_costs(k)
    draft, target = (rank_params(role.model, 1).streamed for role in (plan.draft, plan.target))
    return StepCosts.from_parameters(draft, target, verify_slope=CPU_VERIFY_SLOPE)


def read_engine_config(directory: Path) -> dict | None:
    """An engine directory's TensorRT-LLM ``config.json``, or None when no engine is built there."""
    path = Path(directory) / "config.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as exc:
        raise RepositoryError(
            f"cannot read the engine config {path}: {exc}; rebuild with `trt-spec build --spec F --force`"
        ) from None


def check_engines(plan: Plan, settings: RepositorySettings) -> list[str]:
    """Cross-check built engines against the spec; returns notes for the caller to show.

    Raises:
        EngineMismatchError: an engine's ``config.json`` disagrees with the spec (names the field,
            both values, and the fix).
    """
    spec = plan.spec
    notes, vocab = [], {}
    fix = "rebuild with `trt-spec build --spec F --force`, or change the spec to match the engine"
    for role in ("target", "draft"):
        directory = engine_dir(spec, role)
        config = read_engine_config(directory)
        if config is None:
            notes.append(f"{role}: no engine built in {directory}; the configs follow the plan, unchecked")
            continue
        build = config.get("build_config", {})
        pretrained = config.get("pretrained_config", {})

        def refuse(key: str, engine_value, spec_value, spec_key: str) -> None:
            raise EngineMismatchError(
                f"{role} engine in {directory} has {key} = {engine_value!r} but the spec's {spec_key} "
                f"asks for {spec_value!r}; {fix}",
                role=role,
                key=key,
                engine_value=engine_value,
                spec_value=spec_value,
            )

        if build.get("max_batch_size") != settings.max_batch_size:
            refuse(
                "build_config.max_batch_size",
                build.get("max_batch_size"),
                settings.max_batch_size,
                "engine.max_batch_size",
            )
        if (build.get("max_input_len") or 0) < engine_max_input_len(spec):
            # The loop resends the whole sequence (plan.engine_max_input_len): max_seq_len - 1.
            refuse(
                "build_config.max_input_len",
                build.get("max_input_len"),
                engine_max_input_len(spec),
                "engine.max_seq_len",
            )
        if (build.get("max_seq_len") or 0) < settings.max_seq_len:
            refuse("build_config.max_seq_len", build.get("max_seq_len"), settings.max_seq_len, "engine.max_seq_len")
        if role == "target" and (build.get("max_draft_len") or 0) < settings.max_draft_len:
            refuse(
                "build_config.max_draft_len",
                build.get("max_draft_len"),
                settings.max_draft_len,
                "speculative.num_draft_tokens",
            )
        if settings.acceptance == "probabilistic" and not _gathers_generation_logits(build):
            refuse("build_config.gather_generation_logits", False, True, "speculative.acceptance: probabilistic")
        # The backend copies draft_logits and returns generation_logits without converting dtypes:
        # both must be the engine's logits dtype, which our configs declare as FP32.
        logits_dtype = pretrained.get("logits_dtype", LOGITS_DTYPE)
        if settings.acceptance == "probabilistic" and logits_dtype != LOGITS_DTYPE:
            refuse(
                "pretrained_config.logits_dtype", logits_dtype, LOGITS_DTYPE, "speculative.acceptance: probabilistic"
            )
        vocab[role] = pretrained.get("vocab_size")
        if vocab[role] != settings.vocab_size:
            refuse("pretrained_config.vocab_size", vocab[role], settings.vocab_size, f"{role}.model (its config.json)")
        notes.append(f"{role}: engine in {directory} agrees with the spec")
    return notes


def _gathers_generation_logits(build: dict) -> bool:
    # 1.2.x writes the flag at the top of build_config; some releases nest it in plugin_config.
    return bool(build.get("gather_generation_logits") or build.get("plugin_config", {}).get("gather_generation_logits"))


# --- dict helpers ---------------------------------------------------------------------------------


def _io(tensor: T.Tensor) -> dict:
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


def _python_model(
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
        "input": [_io(t) for t in inputs],
        "output": [_io(t) for t in outputs],
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
# words, and a lone instance held every other prompt behind that (README, "Bounded inputs").
PREPROCESSING_INSTANCES = 2


def preprocessing_config(settings: RepositorySettings) -> ModelConfig:
    return _python_model(
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
            draft_logits=uses_draft_logits(settings),
        ),
        instances=PREPROCESSING_INSTANCES,
    )


def uses_draft_logits(settings: RepositorySettings) -> bool:
    """Sampled requests verify with the draft's logits when the engines can return them:
    TensorRT-LLM engines only when built for probabilistic acceptance (they gather generation
    logits), the PyTorch twin always. Otherwise the target matches tokens (also exact)."""
    return settings.acceptance == "probabilistic" or settings.flavor == "torch"


def postprocessing_config(settings: RepositorySettings) -> ModelConfig:
    return _python_model(
        T.POSTPROCESSING,
        settings,
        T.POSTPROCESSING_INPUTS,
        T.POSTPROCESSING_OUTPUTS,
        PostprocessingParameters(tokenizer_dir=TOKENIZER_SUBDIR, loop_model=T.LOOP),
        decoupled=True,  # a liveness probe of the loop gets no response (tensors.py)
    )


def loop_config(settings: RepositorySettings) -> ModelConfig:
    """The draft -> verify loop: python, decoupled (it streams each iteration's tokens)."""
    return _python_model(
        T.LOOP,
        settings,
        T.LOOP_INPUTS,
        T.LOOP_OUTPUTS,
        LoopParameters(
            target_model=T.TARGET,
            draft_model=T.DRAFT,
            max_draft_len=settings.max_draft_len,
            adaptive_draft=settings.adaptive_draft,
            use_draft_logits=uses_draft_logits(settings),
            draft_cost=round(settings.step_costs.draft, 4),
            verify_slope=round(settings.step_costs.verify_slope, 4),
        ),
        decoupled=True,
    )


def gpu_device_ids(tp_size: int) -> str:
    """An engine's GPUs: rank r on GPU r, for target and draft alike, so a TP-1 draft shares GPU 0
    with target rank 0, as the memory plan places it (plan/memory.py). In orchestrator mode, where
    ``trt-spec serve`` runs both engine models, each model's spawned ranks take these devices in
    order; the draft-target recipe of TensorRT-LLM also lets the two share a GPU."""
    return ",".join(str(rank) for rank in range(tp_size))


def engine_config(settings: RepositorySettings, role: str) -> ModelConfig:
    """``tensorrt_llm`` (target) or ``tensorrt_llm_draft`` in the settings' flavor."""
    engine = settings.engine(role)
    name = T.TARGET if role == "target" else T.DRAFT
    inputs = T.TARGET_INPUTS if role == "target" else T.DRAFT_ENGINE_INPUTS
    if settings.flavor == "torch":
        return _python_model(
            name,
            settings,
            inputs,
            T.ENGINE_OUTPUTS,
            TorchEngineParameters(
                role=role,
                hf_model_dir=engine.hf_model_dir or "",
                max_seq_len=settings.max_seq_len + (settings.max_draft_len if role == "target" else 0),
                max_draft_len=settings.max_draft_len if role == "target" else 0,
                torch_threads=settings.torch_threads,
                normalize_log_probs=NORMALIZE_LOG_PROBS,
            ),
        )
    config = {
        "name": name,
        "backend": "tensorrtllm",
        "max_batch_size": settings.max_batch_size,
        # The loop calls each engine once per iteration and waits for its one response;
        # TensorRT-LLM requires decoupled mode only for streaming requests, which it never sends.
        "model_transaction_policy": {"decoupled": False},
        "dynamic_batching": {"preferred_batch_size": [settings.max_batch_size], "max_queue_delay_microseconds": 0},
        "input": [_io(t) for t in inputs],
        "output": [_io(t) for t in T.ENGINE_OUTPUTS],
        # The backend drives its GPUs itself (gpu_device_ids); Triton sees one CPU instance.
        "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
        "parameters": TensorrtLlmParameters(
            gpt_model_type="inflight_fused_batching",
            gpt_model_path=engine.engine_dir,
            max_beam_width=1,
            batch_scheduler_policy=BATCH_SCHEDULER_POLICY,
            max_tokens_in_paged_kv_cache=engine.kv_tokens,
            kv_cache_free_gpu_mem_fraction=engine.kv_fraction,
            enable_kv_cache_reuse=True,  # the loop resends the prefix every iteration
            enable_chunked_context=True,
            exclude_input_in_output=ENGINE_EXCLUDE_INPUT_IN_OUTPUT,
            normalize_log_probs=NORMALIZE_LOG_PROBS,
            gpu_device_ids=gpu_device_ids(engine.tp_size),
            # Needs the workers pre-started by mpirun (participant_ids); trt-spec serve lets the
            # backend spawn them (trt_spec/serving/trtllm.py), so the logits go through the host.
            speculative_decoding_fast_logits=False,
            tokenizer_dir="",  # the three guided-decoding keys: required, empty = off
            xgrammar_tokenizer_info_path="",
            guided_decoding_backend="",
        ).to_config(),
    }
    return to_model_config(config)


def trtllm_preprocessing_config(settings: RepositorySettings) -> ModelConfig:
    """TensorRT-LLM's ``preprocessing``: unary, one prompt per row (tensors.py)."""
    return _python_model(
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
    return _python_model(
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
            "input": [_io(t) for t in inputs],
            "output": [_io(t) for t in T.ENSEMBLE_OUTPUTS],
            "ensemble_scheduling": {"step": steps},
        }
    )


def all_configs(settings: RepositorySettings) -> dict[str, ModelConfig]:
    """Every model of the repository, by name."""
    return {
        T.PREPROCESSING: preprocessing_config(settings),
        T.TARGET: engine_config(settings, "target"),
        T.DRAFT: engine_config(settings, "draft"),
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


def read_config(path: str | Path) -> ModelConfig:
    """Parse a config.pbtxt back into ``ModelConfig`` (raises ``text_format.ParseError``)."""
    return text_format.Parse(Path(path).read_text(), ModelConfig())
