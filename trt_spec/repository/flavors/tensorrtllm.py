"""The ``tensorrtllm`` flavor: the engine models are TensorRT-LLM 1.2.x's C++ backend
(``backend: "tensorrtllm"``) over the engines ``trt-spec build`` compiles, on the spec's GPUs.
On CPU the same repository is served through the backend emulator (``serve --emulate-tensorrtllm``)."""

from __future__ import annotations

import json
from pathlib import Path

from trt_spec.errors import EngineMismatchError, RepositoryError
from trt_spec.layout import engine_dir
from trt_spec.plan import Plan, engine_max_input_len
from trt_spec.repository import configs
from trt_spec.repository.configs import ModelConfig, RepositorySettings
from trt_spec.repository.flavors import Flavor
from trt_spec.runtime import tensors as T
from trt_spec.runtime.costs import Acceptance, StepCosts
from trt_spec.runtime.parameters import TrtllmEngineParameters

# guaranteed_no_evict: a request admitted to the batch always has KV blocks to finish, so a
# verifying target is never paused between draft and verify.
BATCH_SCHEDULER_POLICY = "guaranteed_no_evict"
# The engines' logits dtype, as TensorRT-LLM's checkpoint config names it: generation_logits and
# draft_logits are declared FP32 (tensors.py).
LOGITS_DTYPE = "float32"


class TrtllmFlavor(Flavor):
    name = "tensorrtllm"
    summary = "TensorRT-LLM 1.2.x engines in its C++ Triton backend, on the spec's GPUs"
    launcher = "tritonserver"  # NVIDIA's Triton TensorRT-LLM container (trt_spec/deploy)
    needs_gpus = True

    def step_costs(self, plan: Plan) -> StepCosts:
        """The projection's memory-bandwidth step model on the spec's GPU at the spec's K."""
        from trt_spec.plan.projection import project_plan

        k = plan.spec.num_draft_tokens
        return project_plan(plan, max_k=k).step_times.step_costs(k)

    def k_schedule(self, plan: Plan, acceptance: Acceptance) -> tuple[int, ...]:
        """From the projection's best K per requests in flight on the spec's GPU (``plan`` prints
        it): verifying batch x (K + 1) tokens turns compute-bound sooner than plain decoding, so K
        falls with load, to 0 where no K beats plain decoding. The spec's K stands until load
        lowers the projected best (:func:`~trt_spec.plan.projection.loop_schedule`)."""
        from trt_spec.plan.projection import k_schedule, loop_schedule

        return loop_schedule(k_schedule(plan, acceptance), plan.spec.num_draft_tokens)

    def gives_draft_logits(self, acceptance: str) -> bool:
        """Only engines built for probabilistic acceptance gather generation logits."""
        return acceptance == "probabilistic"

    def engine_config(self, settings: RepositorySettings, role: str) -> ModelConfig:
        engine = settings.engine(role)
        inputs = T.TARGET_INPUTS if role == "target" else T.DRAFT_ENGINE_INPUTS
        config = {
            "name": T.ENGINE_MODELS[role],
            "backend": "tensorrtllm",
            "max_batch_size": settings.max_batch_size,
            # The loop calls each engine once per iteration and waits for its one response;
            # TensorRT-LLM requires decoupled mode only for streaming requests, which it never sends.
            "model_transaction_policy": {"decoupled": False},
            "dynamic_batching": {"preferred_batch_size": [settings.max_batch_size], "max_queue_delay_microseconds": 0},
            "input": [configs.io_entry(t) for t in inputs],
            "output": [configs.io_entry(t) for t in T.ENGINE_OUTPUTS],
            # The backend drives its GPUs itself (gpu_device_ids); Triton sees one CPU instance.
            "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
            "parameters": TrtllmEngineParameters(
                gpt_model_type="inflight_fused_batching",
                gpt_model_path=engine.engine_dir,
                max_beam_width=1,
                batch_scheduler_policy=BATCH_SCHEDULER_POLICY,
                max_tokens_in_paged_kv_cache=engine.kv_tokens,
                kv_cache_free_gpu_mem_fraction=engine.kv_fraction,
                enable_kv_cache_reuse=True,  # the loop resends the prefix every iteration
                enable_chunked_context=True,
                exclude_input_in_output=configs.ENGINE_EXCLUDE_INPUT_IN_OUTPUT,
                normalize_log_probs=configs.NORMALIZE_LOG_PROBS,
                gpu_device_ids=gpu_device_ids(engine.tp_size),
                # Needs the workers pre-started by mpirun (participant_ids); trt-spec serve lets the
                # backend spawn them (trt_spec/serving/trtllm.py), so the logits go through the host.
                speculative_decoding_fast_logits=False,
                tokenizer_dir="",  # the three guided-decoding keys: required, empty = off
                xgrammar_tokenizer_info_path="",
                guided_decoding_backend="",
            ).to_config(),
        }
        return configs.to_model_config(config)

    def check(self, plan: Plan, settings: RepositorySettings) -> list[str]:
        return check_built_engines(plan, settings)


FLAVOR = TrtllmFlavor()


def gpu_device_ids(tp_size: int) -> str:
    """An engine's GPUs: rank r on GPU r, for target and draft alike, so a TP-1 draft shares GPU 0
    with target rank 0, as the memory plan places it (plan/memory.py). In orchestrator mode, where
    ``trt-spec serve`` runs both engine models, each model's spawned ranks take these devices in
    order; the draft-target recipe of TensorRT-LLM also lets the two share a GPU."""
    return ",".join(str(rank) for rank in range(tp_size))


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


def check_built_engines(plan: Plan, settings: RepositorySettings) -> list[str]:
    """Cross-check built engines against the spec; returns notes for the caller to show.

    Raises:
        EngineMismatchError: an engine's ``config.json`` disagrees with the spec (names the field,
            both values, and the fix).
    """
    spec = plan.spec
    notes, vocab = [], {}
    fix = "rebuild with `trt-spec build --spec F --force`, or change the spec to match the engine"
    for role in spec.roles:
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
