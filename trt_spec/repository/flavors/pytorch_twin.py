"""The ``torch`` flavor: the engine models are Triton python models running the PyTorch twin of
the two Hugging Face checkpoints (``runtime/twin_engine.py``) behind TensorRT-LLM's tensor
interface, on CPU (or CUDA when present). For development, CI and staging without GPUs."""

from __future__ import annotations

from pathlib import Path

from trt_spec.plan import Plan
from trt_spec.plan.memory import rank_params
from trt_spec.repository import configs
from trt_spec.repository.configs import ModelConfig, RepositorySettings
from trt_spec.repository.flavors import Flavor
from trt_spec.runtime import tensors as T
from trt_spec.runtime.costs import CPU_VERIFY_SLOPE, Acceptance, StepCosts
from trt_spec.runtime.parameters import TorchEngineParameters


class TorchFlavor(Flavor):
    name = "torch"
    uses_measured_step_costs = True
    summary = "the PyTorch twin of both checkpoints in Triton python models (CPU, or CUDA when present)"
    needs_draft_checkpoint = True
    engine_source = "torch_engine"  # both engine models share one source; their config's `role` tells them apart
    launcher = "trt-spec-serve"  # `trt-spec serve` on CPU in the trt-spec image (trt_spec/deploy)

    def step_costs(self, plan: Plan) -> StepCosts:
        """t_d / t_1 as the draft's streamed parameters over the target's, and the twin's measured
        verify slope on a CPU."""
        target = rank_params(plan.target.model, 1).streamed
        draft = rank_params(plan.draft.model, 1).streamed if plan.draft else 0  # prompt lookup: ~free
        return StepCosts.from_parameters(draft, target, verify_slope=CPU_VERIFY_SLOPE)

    def k_schedule(self, plan: Plan, acceptance: Acceptance) -> tuple[int, ...]:
        """None from the plan alone: no model projects this machine's costs under load. The schedule
        is measured instead, through a running server (``trt-spec tune --url``: each K against
        plain decoding at each load), and ``repo --tuning`` writes it (``TuningReport.loop_schedule``).
        The engine models batch in flight, and on a CPU a batched forward pass costs about in
        proportion to its rows past ~8 (its projections are compute-bound there, unlike a GPU's):
        8 verifications of K 4 run 40 rows where 8 plain decodes run 8, so speculation that pays
        alone can lose under load (docs/measurements.md, "Beside vLLM")."""
        return ()

    def gives_draft_logits(self, acceptance: str) -> bool:
        return True  # the twin always returns the logits each draft token was drawn from

    def engine_config(self, settings: RepositorySettings, role: str) -> ModelConfig:
        engine = settings.engine(role)
        return configs.python_model(
            T.ENGINE_MODELS[role],
            settings,
            T.TARGET_INPUTS if role == "target" else T.DRAFT_ENGINE_INPUTS,
            T.ENGINE_OUTPUTS,
            TorchEngineParameters(
                role=role,
                hf_model_dir=engine.hf_model_dir or "",
                dtype=settings.dtype,
                max_seq_len=settings.max_seq_len + (settings.max_draft_len if role == "target" else 0),
                max_draft_len=settings.max_draft_len if role == "target" else 0,
                torch_threads=settings.torch_threads,
                max_num_tokens=engine.max_num_tokens,
                normalize_log_probs=configs.NORMALIZE_LOG_PROBS,
            ),
        )

    def notes(self, settings: RepositorySettings, repo: Path) -> list[str]:
        checkpoints = " and ".join(str(settings.engine(role).hf_model_dir) for role in settings.roles)
        return [
            f"torch flavor: the engine models run the Hugging Face checkpoint{'s' if settings.draft else ''} "
            f"{checkpoints} in PyTorch (CPU, or CUDA when present); serve with `trt-spec serve --repo {repo}`"
        ]


FLAVOR = TorchFlavor()
