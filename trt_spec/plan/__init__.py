"""plan(spec, model configs) -> Plan: every derived value of a deployment, computed once.

Pure: no I/O beyond reading the two ``config.json`` files (and only when they are not passed
in), no GPU, no ``tensorrt_llm`` import. Executors (convert, build, repo) carry a plan out.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trt_spec.checkpoints.config import ModelInfo, load_model_info
from trt_spec.errors import PlanError
from trt_spec.layout import engine_dir, trtllm_checkpoint_dir
from trt_spec.plan.memory import KV_BLOCK_TOKENS, MemoryPlan, engine_memory, format_bytes, place
from trt_spec.spec import TP_SIZES, Spec

TRTLLM_VERSION_LINE = "1.2"  # the release line whose trtllm-build flags we emit
# trtllm-build's own default; longer prompts are processed in chunks (paged context FMHA).
DEFAULT_MAX_NUM_TOKENS = 8192


@dataclass(frozen=True)
class ConvertStep:
    """HF checkpoint -> TensorRT-LLM checkpoint (``trt-spec convert``)."""

    source: str  # the spec's model: repo id or local directory
    revision: str | None
    output_dir: Path
    tp_size: int
    dtype: str

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "revision": self.revision,
            "output_dir": str(self.output_dir),
            "tp_size": self.tp_size,
            "dtype": self.dtype,
        }


@dataclass(frozen=True)
class EnginePlan:
    role: str  # "target" | "draft"
    model: ModelInfo
    convert: ConvertStep
    engine_dir: Path
    max_num_tokens: int
    build_argv: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "architecture": self.model.architecture,
            "num_params": self.model.num_params,
            "config_source": self.model.source,
            "convert": self.convert.to_json(),
            "engine_dir": str(self.engine_dir),
            "build_argv": list(self.build_argv),
            "build_command": shlex.join(self.build_argv),
        }


@dataclass(frozen=True)
class Plan:
    spec: Spec
    target: EnginePlan
    draft: EnginePlan | None  # None: the spec's method has no draft model (prompt lookup)
    memory: MemoryPlan
    warnings: tuple[str, ...]
    notes: tuple[str, ...] = ()  # why a derived value differs from the spec's, one line each
    route: Route | None = None  # the spec's flavor's route (make_plan: the engine route unless given)

    @property
    def builds_engines(self) -> bool:
        """Whether the route compiles TensorRT engines (``plan`` prints their build steps)."""
        return self.route is None or self.route.builds_engines

    @property
    def roles(self) -> tuple[str, ...]:
        """The engines this plan builds: the spec's method's roles."""
        return self.spec.roles

    def engine(self, role: str) -> EnginePlan:
        """The engine of ``role``.

        Raises:
            KeyError: ``draft`` of a plan without a draft engine.
        """
        engine = {"target": self.target, "draft": self.draft}[role]
        if engine is None:
            raise KeyError(f"speculative.method {self.spec.speculative.method} builds no {role} engine")
        return engine

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.spec.name,
            "spec_hash": self.spec.content_hash(),
            "tensorrt_llm": TRTLLM_VERSION_LINE,
            "num_draft_tokens": self.spec.num_draft_tokens,
            "method": self.spec.speculative.method,
            "target": self.target.to_json(),
            "draft": None if self.draft is None else self.draft.to_json(),
            "memory": self.memory.to_json(),
            "warnings": list(self.warnings),
            "notes": list(self.notes),
            "builds_engines": self.builds_engines,
        }


@dataclass(frozen=True)
class Route:
    """How the spec's flavor takes the plan to a GPU, as ``plan`` and ``check`` say it: its own
    warnings and notes (``label`` names their rows in ``check``), and whether it compiles TensorRT
    engines. Each flavor gives its own (``Flavor.route`` in ``trt_spec/repository/flavors``);
    :func:`engine_route` is the engine route's."""

    label: str
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    builds_engines: bool = True


def engine_route(spec: Spec) -> Route:
    """The engine route (trtllm-build engines, served by TensorRT-LLM's backend or its twin)."""
    return Route("lengths", notes=(input_len_note(spec),))


def make_plan(
    spec: Spec, target: ModelInfo | None = None, draft: ModelInfo | None = None, *, route: Route | None = None
) -> Plan:
    """The full plan for ``spec``. Model infos are read from their ``config.json`` when not given.

    Raises:
        ModelConfigError: a ``config.json`` cannot be found.
        PlanError: the two engines do not fit on the spec's GPUs; the message has the numbers
            and the smallest target ``tp_size`` that would fit.
    """
    models = {"target": target or load_model_info(spec, "target")}
    if spec.has_draft:
        models["draft"] = draft or load_model_info(spec, "draft")
    engines = {role: _engine_plan(spec, role, models[role]) for role in spec.roles}
    memory = _memory_plan(spec, models, target_tp=spec.target.tp_size)
    _check_fits(spec, models, memory)
    route = route or engine_route(spec)
    return Plan(
        spec=spec,
        target=engines["target"],
        draft=engines.get("draft"),
        memory=memory,
        warnings=(*_warnings(spec, memory), *route.warnings),
        notes=route.notes,
        route=route,
    )


def input_len_note(spec: Spec) -> str:
    """Why the engines' input limit is not the spec's max_input_len (``plan`` and ``check`` print it)."""
    return (
        f"engines take inputs up to {engine_max_input_len(spec)} tokens (max_seq_len - 1), not max_input_len "
        f"{spec.engine.max_input_len}: each loop iteration resends prompt + output as a new request (the KV cache "
        f"reuses what it has seen); max_input_len stays the longest prompt a client may send"
    )


def engine_max_input_len(spec: Spec) -> int:
    """The engines' ``--max_input_len``: the longest sequence the loop sends, not the longest prompt.

    Every loop iteration is a new executor request whose prompt is the whole sequence so far
    (prompt + output; KV-cache reuse recomputes only what is new), and ``LlmRequest::validate``
    refuses a prompt over ``max_input_len`` and discards the drafts that pass it. A request may
    grow to ``max_seq_len`` tokens and its last step adds at least one, so the sequence sent plus
    its drafts is at most ``max_seq_len - 1`` tokens. The spec's ``max_input_len`` stays the
    longest prompt a client may send (preprocessing checks it)."""
    # Source: NVIDIA/TensorRT-LLM@119c6e60e65e5ecec4e97afdb6ea584f674aed24:cpp/tensorrt_llm/batch_manager/llmRequest.cpp LlmRequest::validate
    return spec.engine.max_seq_len - 1


def max_num_tokens(spec: Spec) -> int:
    """Tokens one engine step may process: a whole (chunk of a) prompt, or every sequence of the
    batch verifying K drafts plus one (the target's generation step is K + 1 tokens wide)."""
    engine = spec.engine
    return max(min(engine.max_input_len, DEFAULT_MAX_NUM_TOKENS), engine.max_batch_size * (spec.num_draft_tokens + 1))


def _engine_plan(spec: Spec, role: str, model: ModelInfo) -> EnginePlan:
    ref = spec.role(role)
    engine = spec.engine
    checkpoint_dir = trtllm_checkpoint_dir(spec, role)
    output_dir = engine_dir(spec, role)
    num_tokens = max_num_tokens(spec)
    # One flag and its value per line.
    # fmt: off
    argv = [
        "trtllm-build",
        "--checkpoint_dir", str(checkpoint_dir),
        "--output_dir", str(output_dir),
        "--gemm_plugin", engine.dtype,
        "--kv_cache_type", "paged",
        # Explicit, not the release's default: the memory plan's blocks and the scheduler's chunk unit.
        "--tokens_per_block", str(KV_BLOCK_TOKENS),
        # The loop resends the prefix every iteration; paged context FMHA makes KV-cache reuse
        # (and chunked context) possible.
        "--use_paged_context_fmha", "enable",
        "--max_batch_size", str(engine.max_batch_size),
        # What the loop resends, not the longest prompt (engine_max_input_len).
        "--max_input_len", str(engine_max_input_len(spec)),
        # The builder adds max_draft_len to the target's max_seq_len itself.
        "--max_seq_len", str(engine.max_seq_len),
        "--max_num_tokens", str(num_tokens),
        "--workers", str(ref.tp_size),
    ]
    if role == "target":
        argv += [
            "--speculative_decoding_mode", spec.method.target_decoding_mode,
            "--max_draft_len", str(spec.num_draft_tokens),
        ]
    # fmt: on
    if spec.speculative.acceptance == "probabilistic":
        # Rejection sampling compares the draft's and the target's distributions at each
        # drafted position. (Never --gather_context_logits on the target: it is incompatible
        # with max_draft_len > 0.)
        argv.append("--gather_generation_logits")
    return EnginePlan(
        role=role,
        model=model,
        convert=ConvertStep(
            source=ref.model,
            revision=ref.revision,
            output_dir=checkpoint_dir,
            tp_size=ref.tp_size,
            dtype=engine.dtype,
        ),
        engine_dir=output_dir,
        max_num_tokens=num_tokens,
        build_argv=tuple(argv),
    )


def _memory_plan(spec: Spec, models: dict[str, ModelInfo], *, target_tp: int) -> MemoryPlan:
    engine = spec.engine
    num_tokens = max_num_tokens(spec)
    k = spec.num_draft_tokens
    target = engine_memory(
        models["target"],
        tp_size=target_tp,
        dtype=engine.dtype,
        max_num_tokens=num_tokens,
        max_batch_size=engine.max_batch_size,
        logits_positions=k + 1,
    )
    draft = None
    if spec.draft is not None:
        draft = engine_memory(
            models["draft"],
            tp_size=min(spec.draft.tp_size, target_tp),
            dtype=engine.dtype,
            max_num_tokens=num_tokens,
            max_batch_size=engine.max_batch_size,
            logits_positions=1,
        )
    return place(engine.gpu, target, draft, tokens_per_sequence=engine.max_seq_len + k)


def _check_fits(spec: Spec, models: dict[str, ModelInfo], memory: MemoryPlan) -> None:
    if memory.kv_tokens >= memory.tokens_per_sequence:
        return
    gpu0 = memory.gpus[0]
    fixed = gpu0.target_fixed + gpu0.draft_fixed
    usable = gpu0.capacity - gpu0.headroom
    suggestion = _smallest_fitting_tp(spec, models)
    hint = (
        f"use target.tp_size: {suggestion}"
        if suggestion
        else "no tp_size up to 8 fits; use a smaller model, a shorter max_seq_len or a larger GPU"
    )
    models_named = spec.target.model + (f" + {spec.draft.model}" if spec.draft else "")
    raise PlanError(
        f"{models_named} ({spec.engine.dtype}) do not fit on "
        f"{spec.target.tp_size} x {spec.engine.gpu.upper()} ({format_bytes(gpu0.capacity)} each): GPU 0 needs "
        f"{format_bytes(fixed)} for weights, activations and runtime of {format_bytes(usable)} usable, leaving KV cache "
        f"for {memory.kv_tokens} tokens where one sequence of max_seq_len + K needs {memory.tokens_per_sequence}; {hint}"
    )


def _smallest_fitting_tp(spec: Spec, models: dict[str, ModelInfo]) -> int | None:
    for tp in TP_SIZES:
        if tp <= spec.target.tp_size:
            continue
        memory = _memory_plan(spec, models, target_tp=tp)
        if memory.kv_tokens >= memory.tokens_per_sequence:
            return tp
    return None


def _warnings(spec: Spec, memory: MemoryPlan) -> list[str]:
    warnings = []
    if memory.full_sequences < spec.engine.max_batch_size:
        warnings.append(
            f"the KV cache holds {memory.full_sequences} sequences of max_seq_len + K "
            f"({memory.tokens_per_sequence} tokens), fewer than max_batch_size {spec.engine.max_batch_size}; "
            "long requests will queue"
        )
    return warnings
