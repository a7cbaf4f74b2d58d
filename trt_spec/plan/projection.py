"""What speculative decoding should give on the spec's GPU, projected before any GPU time.

A decode step of a transformer at small batch is memory-bound: it reads every weight once and the
KV cache of every sequence, and does ~2 FLOPs per weight per token. So each engine's step time on
one GPU (its rank 0) is modelled as a roofline,

    t(n tokens) = max(bytes / HBM bandwidth, FLOPs / peak FP16 tensor FLOP/s) + all-reduce time,

    bytes       = (layer + lm_head parameters per rank) x dtype bytes         (the weights, streamed)
                + KV bytes per token per rank x context x batch               (the cache, read)
    FLOPs       = 2 x (layer + lm_head parameters per rank) x n x batch       (the matmuls)
                + 4 x layers x heads per rank x head size x context x n x batch  (QK^T and AV)
    all-reduce  = 2 x layers x (latency + 2 (tp - 1) / tp x n x batch x hidden x dtype bytes
                                 / NVLink bandwidth per direction)            (ring, tp > 1 only)

with the parameter split and KV bytes of the memory plan (``trt_spec.plan.memory``), the architecture
numbers of each model's ``config.json`` and the spec's tp sizes, dtype and GPU. The embedding is
left out of the bytes: a step gathers only its tokens' rows. These give t_1 (the target, one
token), t_{K+1} (the target verifying K drafts plus one) and t_d (the draft, one token), the same
step times ``bench`` measures on a CPU, and ``trt_spec.runtime.costs``' cost model turns them into
tokens per target call and speedup over plain decoding at a stated acceptance alpha.

While a step is memory-bound, verifying K + 1 tokens costs what one token costs (t_{K+1} = t_1 up
to the KV and all-reduce bytes, which grow with n): the arithmetic intensity of a step is about
n x batch FLOP/byte at 2-byte weights, and the GPU turns compute-bound at its ridge point, peak
FLOP/s / HBM bytes/s (~295 FLOP/byte on an H100 SXM, ~206 on an H200). The roofline keeps the
max of the two, so a batch x (K + 1) past the ridge point shows as a verify cost ratio above 1.

It is a projection, not a measurement: peak bandwidth and FLOP/s, no kernel-launch or other fixed
per-step cost, no loop or Triton overhead, acceptance independent of position. docs/gpu.md, "What to
expect on a GPU (projection)", lists the assumptions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trt_spec.checkpoints.config import ModelInfo
from trt_spec.gpus import GIGA, GPUS, TERA, GpuSpec
from trt_spec.plan import Plan
from trt_spec.plan.memory import DTYPE_BYTES, kv_bytes_per_token_per_rank, rank_params
from trt_spec.runtime.costs import (
    Acceptance,
    AcceptanceProfile,
    CostModelRow,
    StepTimes,
    alpha_of,
    best_row,
    cost_model_rows,
)

# A typical per-position acceptance of a well-matched pair at temperature 0: a placeholder, not a
# measurement. Measure yours on your prompts with `trt-spec tune` (its report: --tuning).
DEFAULT_ALPHA = 0.7
DEFAULT_MAX_K = 8  # the largest K `trt-spec bench` measures by default
DEFAULT_BATCH = 1  # one stream: the latency case speculative decoding is for

FLOPS_PER_PARAM_PER_TOKEN = 2  # one multiply and one add per weight per token
ATTENTION_FLOPS_PER_CACHED_VALUE = 4  # per query token, layer, head dimension and cached token: QK^T and AV
ALLREDUCES_PER_LAYER = 2  # tensor parallelism: after the attention output and after the MLP down projection
# Each all-reduce's fixed cost: TensorRT-LLM's custom all-reduce kernel, ported to SGLang and
# measured there on H100 at tp 2/4/8 for 0.5-32 KB messages, took 3.7-7.8 us (sgl-project/sglang
# pull request 2904); an assumption for the engines built here.
ALLREDUCE_LATENCY_S = 5e-6
# Left out of the model, shown beside it: a fixed cost per kernel (launch, ramp-up and tail) that
# does not shrink with the bytes a kernel reads. KERNEL_FIXED_S is an assumption, the shortest
# kernel time in the same SGLang measurement; KERNELS_PER_LAYER is our count of a Llama decoder
# layer's kernels in TensorRT-LLM (input RMSNorm, QKV GEMM, attention with RoPE fused, output GEMM,
# residual add + RMSNorm, gate/up GEMM, SiLU x up, down GEMM, residual add, and one to spare).
KERNEL_FIXED_S = 3.7e-6
KERNELS_PER_LAYER = 10


@dataclass(frozen=True)
class RooflineStep:
    """One engine's forward step over ``num_tokens`` tokens per sequence, on one of its GPUs, as the
    projection models it: the bytes it reads and the FLOPs it does (its seconds follow from a GPU)."""

    num_tokens: int  # per sequence: 1 (decode, draft) or K + 1 (verify)
    weight_bytes: float  # bytes read from HBM per step
    kv_bytes: float
    flops: float
    allreduce_s: float  # seconds

    def memory_s(self, gpu: GpuSpec) -> float:
        return (self.weight_bytes + self.kv_bytes) / gpu.hbm_bytes_per_s

    def compute_s(self, gpu: GpuSpec) -> float:
        return self.flops / gpu.fp16_flops_per_s

    def seconds(self, gpu: GpuSpec) -> float:
        """The roofline: whichever of memory and compute is slower, plus the all-reduces."""
        return max(self.memory_s(gpu), self.compute_s(gpu)) + self.allreduce_s

    @property
    def arithmetic_intensity(self) -> float:
        """FLOP per byte read."""
        return self.flops / (self.weight_bytes + self.kv_bytes)


def allreduce_seconds(model: ModelInfo, *, tp_size: int, tokens: int, dtype: str, gpu: GpuSpec) -> float:
    """2 x layers x (latency + 2 (tp - 1) / tp x tokens x hidden x bytes / NVLink B/s): a ring
    all-reduce of the hidden-size activations, twice per layer; 0 at tp 1."""
    if tp_size == 1:
        return 0.0
    message_bytes = tokens * model.hidden_size * DTYPE_BYTES[dtype]
    transfer_s = 2 * (tp_size - 1) / tp_size * message_bytes / gpu.nvlink_bytes_per_s
    return ALLREDUCES_PER_LAYER * model.num_layers * (ALLREDUCE_LATENCY_S + transfer_s)


def roofline_step(
    model: ModelInfo, *, tp_size: int, dtype: str, gpu: GpuSpec, num_tokens: int, context: int, batch: int
) -> RooflineStep:
    """One step of an engine at ``context`` tokens already cached per sequence (see the module
    docstring for the formulas)."""
    streamed = rank_params(model, tp_size).streamed
    tokens = num_tokens * batch
    heads_per_rank = max(1, model.num_heads // tp_size)
    attention_flops = (
        ATTENTION_FLOPS_PER_CACHED_VALUE * model.num_layers * heads_per_rank * model.head_dim * context * tokens
    )
    return RooflineStep(
        num_tokens=num_tokens,
        weight_bytes=streamed * DTYPE_BYTES[dtype],
        kv_bytes=kv_bytes_per_token_per_rank(model, tp_size=tp_size, dtype=dtype) * context * batch,
        flops=FLOPS_PER_PARAM_PER_TOKEN * streamed * tokens + attention_flops,
        allreduce_s=allreduce_seconds(model, tp_size=tp_size, tokens=tokens, dtype=dtype, gpu=gpu),
    )


def fixed_kernel_seconds(model: ModelInfo | None) -> float:
    """layers x KERNELS_PER_LAYER x KERNEL_FIXED_S: what one step would add if no kernel's fixed
    cost overlapped another's work (an upper bound on what the bandwidth model leaves out); 0 for
    no model (drafts from prompt lookup, on the host)."""
    return 0.0 if model is None else model.num_layers * KERNELS_PER_LAYER * KERNEL_FIXED_S


# Prompt lookup drafts on the host (a suffix match over the request's tokens: microseconds beside a
# millisecond target step), so its draft step reads nothing from the GPU.
HOST_LOOKUP_STEP = RooflineStep(num_tokens=1, weight_bytes=0.0, kv_bytes=0.0, flops=0.0, allreduce_s=0.0)


def with_fixed_costs(step_times: StepTimes, target_s: float, draft_s: float) -> StepTimes:
    """``step_times`` with a fixed number of seconds added to every target and draft step."""
    return StepTimes(
        target_1=step_times.target_1 + target_s,
        target_by_num_tokens={n: t + target_s for n, t in step_times.target_by_num_tokens.items()},
        draft_by_k={k: t + draft_s for k, t in step_times.draft_by_k.items()},
    )


@dataclass(frozen=True)
class Projection:
    """The projected cost model of a plan on its GPU, at one acceptance (an i.i.d. alpha, or the
    profile ``trt-spec tune`` measured)."""

    gpu_key: str  # the spec's engine.gpu
    gpu: GpuSpec
    dtype: str
    target_model: ModelInfo
    draft_model: ModelInfo | None  # None: no draft model (prompt lookup drafts on the host)
    acceptance: Acceptance
    context: int  # tokens cached per sequence
    batch: int
    target_tp: int
    draft_tp: int
    target: RooflineStep  # one token
    draft: RooflineStep  # one token
    verify: dict[int, RooflineStep]  # K -> the target's (K + 1)-token step
    step_times: StepTimes  # seconds, the cost model's feed
    rows: tuple[CostModelRow, ...]
    spec_k: int  # the spec's num_draft_tokens

    @property
    def alpha(self) -> float:
        return alpha_of(self.acceptance)

    @property
    def measured(self) -> bool:
        """Acceptance from a measured profile rather than an assumed alpha."""
        return isinstance(self.acceptance, AcceptanceProfile)

    @property
    def best(self) -> CostModelRow:
        return best_row(self.rows)

    @property
    def recommended_k(self) -> int:
        return self.best.k

    @property
    def rows_with_fixed_costs(self) -> tuple[CostModelRow, ...]:
        """The rows again with :func:`fixed_kernel_seconds` added to every step."""
        times = with_fixed_costs(
            self.step_times, fixed_kernel_seconds(self.target_model), fixed_kernel_seconds(self.draft_model)
        )
        return tuple(cost_model_rows(self.acceptance, times, self.verify))

    @property
    def memory_bound_tokens(self) -> int:
        """Tokens per target step (batch x (K + 1)) up to which its step stays memory-bound."""
        compute_per_token = self.target.compute_s(self.gpu) / self.batch
        return int(self.target.memory_s(self.gpu) / compute_per_token)

    def to_json(self) -> dict[str, Any]:
        times = self.step_times
        return {
            "gpu": self.gpu_key,
            "alpha": self.alpha,
            "acceptance_profile": (
                list(self.acceptance.accepted_through) if isinstance(self.acceptance, AcceptanceProfile) else None
            ),
            "context_tokens": self.context,
            "batch": self.batch,
            "hbm_bytes_per_s": self.gpu.hbm_bytes_per_s,
            "nvlink_bytes_per_s": self.gpu.nvlink_bytes_per_s,
            "fp16_flops_per_s": self.gpu.fp16_flops_per_s,
            "ridge_point_flop_per_byte": self.gpu.ridge_point,
            "t_1_ms": times.target_1 * 1e3,
            "t_d_ms": times.draft_1 * 1e3,
            "target_bytes_per_step": self.target.weight_bytes + self.target.kv_bytes,
            "draft_bytes_per_step": self.draft.weight_bytes + self.draft.kv_bytes,
            "target_allreduce_ms": self.target.allreduce_s * 1e3,
            "memory_bound_tokens": self.memory_bound_tokens,
            "rows": [
                {
                    "k": row.k,
                    "tokens_per_target_call": row.tokens_per_target_call,
                    "draft_cost_ratio": row.draft_cost_ratio,
                    "verify_cost_ratio": row.verify_cost_ratio,
                    "t_k_plus_1_ms": times.target_by_num_tokens[row.k + 1] * 1e3,
                    "speedup": row.speedup,
                }
                for row in self.rows
            ],
            "recommended_k": self.recommended_k,
        }


def project_plan(
    plan: Plan,
    acceptance: Acceptance = DEFAULT_ALPHA,
    *,
    max_k: int = DEFAULT_MAX_K,
    context: int | None = None,
    batch: int = DEFAULT_BATCH,
    draft_share: float = 1.0,
) -> Projection:
    """The projection for ``plan`` on its spec's GPU for K in 1..``max_k`` (at most the K a
    measured profile reaches).

    ``context``: tokens already in each sequence's KV cache (default: the spec's max_input_len, a
    full-length prompt). ``draft_share``: the fraction of steps the draft engine runs, which t_d is
    charged for (1: every step, as a draft model drafts; 0: prompt lookup, on the host; hybrid: the
    share ``trt-spec tune`` measured, the steps where lookup had no match, or 1 as an upper bound).

    Raises:
        ValueError: alpha or draft_share outside [0, 1], max_k, context or batch below 1.
    """
    if isinstance(acceptance, AcceptanceProfile):
        max_k = min(max_k, acceptance.max_k)
    elif not 0 <= acceptance <= 1:
        raise ValueError(f"alpha must be in [0, 1]; got {acceptance}")
    if max_k < 1 or batch < 1 or (context is not None and context < 1):
        raise ValueError(f"max_k, context and batch must be at least 1; got {max_k}, {context}, {batch}")
    if not 0 <= draft_share <= 1:
        raise ValueError(f"draft_share must be in [0, 1]; got {draft_share}")
    spec = plan.spec
    gpu = GPUS[spec.engine.gpu]
    context = context or spec.engine.max_input_len
    draft_tp = min(spec.draft.tp_size, spec.target.tp_size) if spec.draft else 0

    def cost(model: ModelInfo, tp_size: int, num_tokens: int) -> RooflineStep:
        return roofline_step(
            model,
            tp_size=tp_size,
            dtype=spec.engine.dtype,
            gpu=gpu,
            num_tokens=num_tokens,
            context=context,
            batch=batch,
        )

    ks = range(1, max_k + 1)
    target = cost(plan.target.model, spec.target.tp_size, 1)
    draft = cost(plan.draft.model, draft_tp, 1) if plan.draft else HOST_LOOKUP_STEP
    verify = {k: cost(plan.target.model, spec.target.tp_size, k + 1) for k in ks}
    step_times = StepTimes(
        target_1=target.seconds(gpu),
        target_by_num_tokens={k + 1: step.seconds(gpu) for k, step in verify.items()},
        draft_by_k={k: draft.seconds(gpu) * draft_share for k in ks},
    )
    return Projection(
        gpu_key=spec.engine.gpu,
        gpu=gpu,
        dtype=spec.engine.dtype,
        target_model=plan.target.model,
        draft_model=plan.draft.model if plan.draft else None,
        acceptance=acceptance,
        context=context,
        batch=batch,
        target_tp=spec.target.tp_size,
        draft_tp=draft_tp,
        target=target,
        draft=draft,
        verify=verify,
        step_times=step_times,
        rows=tuple(cost_model_rows(acceptance, step_times, ks)),
        spec_k=spec.num_draft_tokens,
    )


@dataclass(frozen=True)
class ScheduleStep:
    """The best K with ``in_flight`` requests decoding together (0: plain decoding pays more)."""

    in_flight: int
    k: int
    speedup: float  # of that K over plain decoding at the same batch (1.0 at K = 0)

    def to_json(self) -> dict[str, Any]:
        return {"in_flight": self.in_flight, "k": self.k, "speedup": self.speedup}


def k_schedule(
    plan: Plan, acceptance: Acceptance = DEFAULT_ALPHA, *, context: int | None = None, draft_share: float = 1.0
) -> list[ScheduleStep]:
    """The best K (up to the spec's, the target engine's max_draft_len: K is fixed at build) for
    each number of requests in flight, 1 .. the spec's max_batch_size, from the projection at that
    batch: plain decoding gains from batching while a step stays memory-bound,
    but verifying batch x (K + 1) tokens turns compute-bound sooner, so the best K falls with load
    and is 0 (plain decoding) where no K's projected speedup exceeds 1.

    Upstream bounds the same effect by other means: a concurrency cap (speculation only below a
    number of requests in flight) and a per-batch-size draft-length schedule in its PyTorch backend;
    here the schedule comes from the projection, so it is as good as the roofline model is.
    """
    steps = []
    for in_flight in range(1, plan.spec.engine.max_batch_size + 1):
        best = project_plan(
            plan,
            acceptance,
            max_k=plan.spec.num_draft_tokens,
            context=context,
            batch=in_flight,
            draft_share=draft_share,
        ).best
        steps.append(
            ScheduleStep(in_flight, best.k, best.speedup) if best.speedup > 1 else ScheduleStep(in_flight, 0, 1.0)
        )
    return steps


def loop_schedule(steps: list[ScheduleStep], spec_k: int) -> tuple[int, ...]:
    """The K the loop model runs for each number of requests in flight (its ``k_schedule``), from
    the projection's best K per load: the spec's K (the user's choice, which ``check --tuning``
    questions) while load leaves the projected best K where it is for one request, and the
    projected best where load lowers it, down to 0. Empty (no schedule: the spec's K at any load)
    when the projection finds no K that pays even for one request: that is the spec's call, which
    ``plan`` reports, not the loop's."""
    if not steps or steps[0].k == 0:
        return ()
    alone = steps[0].k
    return tuple(spec_k if step.k >= alone else min(step.k, spec_k) for step in steps)


def render_schedule(steps: list[ScheduleStep], acceptance: Acceptance, spec_k: int | None = None) -> list[str]:
    """The schedule as ranges of requests in flight that share a K, and where speculation stops
    paying; with ``spec_k``, also what the loop model runs (:func:`loop_schedule`)."""
    lines = [
        f"K by requests in flight (projection at {describe_acceptance(acceptance)}; "
        "batch x (K + 1) tokens per target step):"
    ]
    start = 0
    for index in range(1, len(steps) + 1):
        if index == len(steps) or steps[index].k != steps[start].k:
            first, last = steps[start], steps[index - 1]
            span = f"{first.in_flight}" if first is last else f"{first.in_flight}-{last.in_flight}"
            what = (
                "K 0: plain decoding (no K beats it)"
                if first.k == 0
                else f"K {first.k} (x{first.speedup:.2f}" + (f" to x{last.speedup:.2f})" if first is not last else ")")
            )
            lines.append(f"  {span:>9} in flight: {what}")
            start = index
    stop = next((step.in_flight for step in steps if step.k == 0), None)
    lines.append(
        f"  speculation stops paying at {stop} requests in flight"
        if stop is not None
        else f"  speculation pays up to max_batch_size ({len(steps)} in flight)"
    )
    if spec_k is not None:
        runs = loop_schedule(steps, spec_k)
        lines.append(
            "  the loop model (tensorrtllm flavor) runs K "
            + " ".join(map(str, runs))
            + f" for 1..{len(runs)} in flight: the spec's K {spec_k} until load lowers the projected best"
            if runs
            else f"  the loop model keeps the spec's K {spec_k} at any load (no K pays even for one request here)"
        )
    return lines


def render_projection(projection: Projection) -> list[str]:
    """The projection as text lines: the step costs, the memory-bound condition, one row per K."""
    gpu, times = projection.gpu, projection.step_times
    target, draft = projection.target, projection.draft
    best = projection.best
    lines = [
        f"projection on {gpu.name} ({gpu.hbm_bytes_per_s / TERA:.2f} TB/s HBM): a memory-bandwidth model of the "
        "decode steps, not a measurement (docs/gpu.md: What to expect on a GPU)",
        f"  per step and GPU at {projection.context:,} cached tokens, batch {projection.batch}: target (tp "
        f"{projection.target_tp}) reads {_gb(target.weight_bytes)} weights + {_gb(target.kv_bytes)} KV -> "
        f"{target.memory_s(gpu) * 1e3:.3f} ms"
        + (f" + all-reduce {target.allreduce_s * 1e3:.3f} ms" if target.allreduce_s else "")
        + f" = t_1 {times.target_1 * 1e3:.3f} ms",
        (
            f"  draft (tp {projection.draft_tp}) reads {_gb(draft.weight_bytes)} + {_gb(draft.kv_bytes)} KV -> "
            f"t_d {times.draft_1 * 1e3:.3f} ms (c = t_d / t_1 = {times.cost_ratio:.3f})"
            if projection.draft_model is not None
            else "  drafts: prompt lookup on the host, no draft engine -> t_d ~ 0 (c = 0)"
        ),
    ]
    if projection.target_tp > 1:
        lines.append("  " + describe_allreduce(projection))
    max_k = max(projection.verify)
    widest = projection.verify[max_k]
    lines += [
        f"  verify of K + 1 tokens costs one step while memory-bound: arithmetic intensity "
        f"{target.arithmetic_intensity:.1f} FLOP/byte at 1 token, {widest.arithmetic_intensity:.1f} at K = {max_k}; "
        f"{gpu.name} ridge point {gpu.ridge_point:.0f} FLOP/byte: the target's step turns compute-bound near "
        f"{projection.memory_bound_tokens} tokens per step (batch x (K + 1))",
        (
            f"  at the {describe_acceptance(projection.acceptance)}: E = 1 + the fractions accepted through "
            "positions 1..K, speedup = E / (1 + K c + (t_(K+1)/t_1 - 1))"
            if projection.measured
            else f"  at alpha {projection.alpha:.2f} (--alpha; measure yours with trt-spec tune): "
            "E = (1 - alpha^(K+1)) / (1 - alpha), speedup = E / (1 + K c + (t_(K+1)/t_1 - 1))"
        ),
        f"  {'K':>3} {'tokens/call':>11} {'t_(K+1)/t_1':>11} {'speedup':>8}",
    ]
    for row in projection.rows:
        mark = "  <- recommended" if row.k == best.k else ""
        mark += "  (the spec's K)" if row.k == projection.spec_k else ""
        lines.append(
            f"  {row.k:>3} {row.tokens_per_target_call:>11.2f} {row.verify_cost_ratio:>11.4f} {row.speedup:>7.2f}x{mark}"
        )
    lines.append(
        f"  recommended K = {best.k} (projected {best.speedup:.2f}x plain decoding); the spec has K = {projection.spec_k}"
    )
    lines.append("  " + describe_fixed_costs(projection))
    return lines


def describe_acceptance(acceptance: Acceptance) -> str:
    """Which acceptance a projection uses, in a few words."""
    if isinstance(acceptance, AcceptanceProfile):
        through = ", ".join(f"{value:.2f}" for value in acceptance.accepted_through)
        return f"acceptance measured by trt-spec tune (alpha {acceptance.alpha:.2f}; accepted through 1..K: {through})"
    return f"alpha {acceptance:.2f}"


def describe_fixed_costs(projection: Projection) -> str:
    """What the fixed per-kernel costs the model leaves out would change, at most."""
    target_s = fixed_kernel_seconds(projection.target_model)
    draft_s = fixed_kernel_seconds(projection.draft_model)
    rows = projection.rows_with_fixed_costs
    best = best_row(rows)
    return (
        f"left out: fixed per-kernel costs, up to {KERNELS_PER_LAYER} kernels per layer x "
        f"{KERNEL_FIXED_S * 1e6:.1f} us = {target_s * 1e3:.2f} ms per target step and {draft_s * 1e3:.2f} ms per "
        f"draft step; with all of them c = {rows[0].draft_cost_ratio:.3f} and the best K = {best.k} "
        f"({best.speedup:.2f}x)"
    )


def describe_allreduce(projection: Projection) -> str:
    """The target's all-reduce term, with its numbers."""
    model, tp = projection.target_model, projection.target_tp
    count = ALLREDUCES_PER_LAYER * model.num_layers
    message_bytes = projection.batch * model.hidden_size * DTYPE_BYTES[projection.dtype]
    return (
        f"all-reduce: {ALLREDUCES_PER_LAYER} per layer x {model.num_layers} layers = {count} per step, each "
        f"{ALLREDUCE_LATENCY_S * 1e6:.0f} us + 2 ({tp} - 1) / {tp} x n x {message_bytes:,} B (batch x hidden x "
        f"bytes) / {projection.gpu.nvlink_bytes_per_s / GIGA:.0f} GB/s NVLink, n = 1 or K + 1 tokens: "
        f"{projection.target.allreduce_s * 1e3:.3f} ms at n = 1"
    )


def _gb(count: float) -> str:
    return f"{count / GIGA:,.3f} GB"
