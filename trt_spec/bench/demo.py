"""What ``trt-spec demo`` measures besides the server run, and how it explains the speedup: alpha
from the server's metrics, the step costs in-process with the bench's code, and the cost model
fed either this machine's step costs or the projection for the spec's GPU."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trt_spec.bench.server import run_alpha, settled_metrics
from trt_spec.plan import Plan
from trt_spec.plan.projection import project_plan
from trt_spec.runtime.costs import StepTimes, cost_model_rows
from trt_spec.spec import Spec

if TYPE_CHECKING:
    from trt_spec.bench.inprocess import BenchReport

# In-process step-cost measurement after the server run (the bench code): prompts and new tokens.
MEASURE_PROMPTS = 2
MEASURE_MAX_NEW_TOKENS = 32
MIN_MEASURE_NEW_TOKENS = 2  # the bench's own minimum (`bench --max-tokens`)
# The server's engine models run on one torch thread each (`trt-spec repo --torch-threads`, default 1).
ENGINE_THREADS = 1


def server_alpha(metrics_url: str, requests: int) -> float | None:
    """alpha = accepted / (accepted + rejections) over the server's run, from its metrics port
    (once the loop has recorded ``requests`` requests); None when unreadable or nothing was drafted."""
    metrics = settled_metrics(metrics_url, {}, requests=requests)
    return run_alpha({}, metrics) if metrics else None


def measure_step_costs(spec: Spec, max_tokens: int) -> BenchReport:
    """t_1, t_(K+1) and t_d of the spec's pair at its K, and alpha, with the bench's in-process
    code (a short greedy run, no HF or adaptive runs) on :data:`ENGINE_THREADS` torch threads."""
    import torch

    from trt_spec.bench.inprocess import BenchConfig, run_local_bench
    from trt_spec.twin import TwinPair

    config = BenchConfig(
        ks=(spec.num_draft_tokens,),
        temperatures=(0.0,),
        num_prompts=MEASURE_PROMPTS,
        max_new_tokens=max(MIN_MEASURE_NEW_TOKENS, min(max_tokens, MEASURE_MAX_NEW_TOKENS)),
        hf_assisted=False,
        adaptive=False,
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(ENGINE_THREADS)
    try:
        return run_local_bench(TwinPair.from_spec(spec, device="cpu"), config)
    finally:
        torch.set_num_threads(threads)


def explain_here(measured: float, alpha: float, k: int, times: StepTimes) -> str:
    """Why the speedup measured here is what it is: the cost model fed this machine's step costs
    (milliseconds) and the run's alpha."""
    row = cost_model_rows(alpha, times, [k])[0]
    verify = f"t_{k + 1}"
    return (
        f"  why x{measured:.2f}: here t_1 {times.target_1 * 1e3:.1f} ms, {verify} "
        f"{times.target_by_num_tokens[k + 1] * 1e3:.1f} ms ({row.verify_cost_ratio:.2f} t_1), t_d "
        f"{times.draft_by_k[k] * 1e3:.1f} ms (c {row.draft_cost_ratio:.2f}), alpha {alpha:.2f} -> "
        f"{row.tokens_per_target_call:.2f} tokens per call; cost model E t_1 / (K t_d + {verify}) = "
        f"x{row.speedup:.2f} (the rest: the loop's overhead through Triton, and noise)"
    )


def explain_on_gpu(plan: Plan, alpha: float, spec_path: str) -> str:
    """The projection for the spec's GPU at the alpha just measured (what `trt-spec plan` prints)."""
    projection = project_plan(plan, alpha)
    k = plan.spec.num_draft_tokens
    row = next(row for row in projection.rows if row.k == k)
    best = projection.best
    return (
        f"  on {projection.gpu.name} (projection by bytes over bandwidth: t_{k + 1} = "
        f"{row.verify_cost_ratio:.2f} t_1, c {row.draft_cost_ratio:.3f}): at alpha {alpha:.2f}, K = {k} -> "
        f"x{row.speedup:.2f}; best K = {best.k} (x{best.speedup:.2f}); `trt-spec plan --spec {spec_path} "
        f"--alpha {alpha:.2f}` has the table (at this size, fixed per-kernel costs would dominate a real GPU step)"
    )
