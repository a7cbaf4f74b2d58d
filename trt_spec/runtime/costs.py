"""Adaptive K's step costs and the expected tokens per target call: pure arithmetic, standard library
only (the repository writer imports it without torch)."""

from __future__ import annotations

from dataclasses import dataclass

from trt_spec.runtime.errors import GenerationParamsError


def expected_tokens_per_call(alpha: float, num_draft_tokens: int) -> float:
    """(1 - alpha^(K+1)) / (1 - alpha), written as the sum 1 + alpha + ... + alpha^K (no 0/0 at 1)."""
    return sum(alpha**power for power in range(num_draft_tokens + 1))


@dataclass(frozen=True)
class StepCosts:
    """A deployment's step costs relative to one target step t_1, fixed for the deployment: what
    adaptive K weighs acceptance against. ``draft`` = t_d / t_1; ``verify_slope`` = what each
    verified position adds, (t_{K+1} - t_1) / (K t_1): near 0 on a GPU (a decode step is
    memory-bound), and about as small for the PyTorch twin on a CPU (measured: ``CPU_VERIFY_SLOPE``).

    Fixed rather than measured per request on purpose: K chosen from step times measured under
    load would run other K sequences, so other verification widths, and in floating point a
    near-tie between the target's two best tokens could then come out differently. With fixed
    costs, K depends on the tokens alone, so one request always gives the same tokens.

    Raises:
        GenerationParamsError: a cost that is negative or not finite.
    """

    draft: float
    verify_slope: float

    def __post_init__(self) -> None:
        if not (0 <= self.draft < float("inf") and 0 <= self.verify_slope < float("inf")):
            raise GenerationParamsError(
                f"step costs must be finite and >= 0; got draft {self.draft}, verify_slope {self.verify_slope}"
            )

    def speedup(self, alpha: float, num_draft_tokens: int) -> float:
        """The cost model's speedup of K drafts at acceptance alpha: E(alpha, K) t_1 / (K t_d + t_{K+1})."""
        k = num_draft_tokens
        return expected_tokens_per_call(alpha, k) / (k * self.draft + 1 + k * self.verify_slope)


# The PyTorch twin on a CPU with its oneDNN projections (torch_engine._Linear; bench --local, wide
# demo pair, 2 threads: t_5 = 1.03 t_1, t_7 = 1.12 t_1, so each verified position adds ~0.02 t_1;
# on MKL's kernels it was ~0.3). t_d / t_1 measured 0.10-0.12 there, its parameter ratio 0.046.
CPU_VERIFY_SLOPE = 0.02
DEFAULT_STEP_COSTS = StepCosts(draft=0.1, verify_slope=CPU_VERIFY_SLOPE)
