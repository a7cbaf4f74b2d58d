"""The benchmarks' plots, as PNGs: two panels side by side, one colour per group of rows.

Both raise ImportError when matplotlib is not installed (``pip install trt-spec[bench]``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trt_spec.bench.rows import FixedRow, ServerRow

if TYPE_CHECKING:
    from trt_spec.bench.inprocess import BenchReport
    from trt_spec.plan.tuning import TuningReport


def write_plot(report: BenchReport, path: str | Path) -> Path:
    """In-process: speedup and tokens per target call against K, with the theory overlaid."""
    figure, (speed_axis, calls_axis), colors = _two_panels()
    for temperature, color in zip(report.config.temperatures, colors):
        rows = [r for r in report.rows if r.temperature == temperature and isinstance(r, FixedRow)]
        ks = [r.k for r in rows]
        label = f"T={temperature:g}"
        speed_axis.plot(ks, [r.speedup for r in rows], "o-", color=color, label=f"{label} measured")
        speed_axis.plot(ks, [r.cost_model_speedup for r in rows], "--", color=color, label=f"{label} cost model")
        hf_speedups = [
            r.hf_assisted_tokens_per_s / r.hf_plain_tokens_per_s
            for r in rows
            if r.hf_assisted_tokens_per_s and r.hf_plain_tokens_per_s
        ]
        if len(hf_speedups) == len(rows):  # HF measured at every K
            speed_axis.plot(
                ks,
                hf_speedups,
                "x:",
                color=color,
                label=f"{label} HF assisted (over HF plain)",
            )
        calls_axis.plot(ks, [r.tokens_per_target_call for r in rows], "o", color=color, label=f"{label} measured")
        calls_axis.plot(
            ks,
            [r.theoretical_tokens_per_target_call for r in rows],
            "-",
            color=color,
            alpha=0.6,
            label=f"{label} theory at each K's alpha",
        )
    speed_axis.axhline(1.0, color="grey", linewidth=0.8)
    speed_axis.set(xlabel="K (draft tokens)", ylabel="speedup over plain decoding", title="Wall-clock speedup")
    calls_axis.set(xlabel="K (draft tokens)", ylabel="tokens per target call", title="(1 - alpha^(K+1)) / (1 - alpha)")
    title = f"trt-spec PyTorch twin ({report.runner} runner, {report.threads} threads)"
    return _save(figure, (speed_axis, calls_axis), title, path)


def write_server_plot(rows: list[ServerRow], path: str | Path) -> Path:
    """Through a server: tokens/s (speculative vs plain) and inter-token latency against concurrency."""
    figure, (speed_axis, latency_axis), colors = _two_panels()
    groups = sorted({(row.k, row.temperature) for row in rows})
    for (k, temperature), color in zip(groups, colors):
        group = sorted((r for r in rows if (r.k, r.temperature) == (k, temperature)), key=lambda r: r.concurrency)
        label = f"K={k} T={temperature:g}"
        concurrency = [r.concurrency for r in group]
        for axis, speculative, plain in (
            (speed_axis, [r.tokens_per_s for r in group], [r.baseline_tokens_per_s for r in group]),
            (latency_axis, [r.itl_ms for r in group], [r.baseline_itl_ms for r in group]),
        ):
            axis.plot(concurrency, speculative, "o-", color=color, label=f"{label} speculative")
            axis.plot(concurrency, plain, "x--", color=color, label=f"{label} plain")
    speed_axis.set(xlabel="concurrent requests", ylabel="tokens/s (all requests)", title="Throughput")
    latency_axis.set(xlabel="concurrent requests", ylabel="ms per token after the first", title="Inter-token latency")
    return _save(figure, (speed_axis, latency_axis), "trt-spec through Triton (gRPC streaming)", path)


def write_tuning_plot(report: TuningReport, path: str | Path) -> Path:
    """Acceptance through each position, and the projected speedup per K, one line per temperature."""
    figure, (accept_axis, speed_axis), colors = _two_panels()
    for result, color in zip(report.temperatures, colors):
        label = f"T={result.temperature:g}"
        positions = range(1, len(result.accepted_through) + 1)
        accept_axis.plot(positions, result.accepted_through, "o-", color=color, label=f"{label} measured")
        accept_axis.plot(
            positions,
            [result.alpha**i for i in positions],
            ":",
            color=color,
            label=f"{label} alpha^i (i.i.d. at alpha {result.alpha:.2f})",
        )
        ks = range(1, len(result.projected_speedup) + 1)
        speed_axis.plot(ks, result.projected_speedup, "o-", color=color, label=f"{label} projected")
        speed_axis.plot(
            [row.k for row in result.rows],
            [row.measured_speedup for row in result.rows],
            "x--",
            color=color,
            label=f"{label} measured here",
        )
    speed_axis.axhline(1.0, color="grey", linewidth=0.8)
    for axis in (accept_axis, speed_axis):
        axis.xaxis.get_major_locator().set_params(integer=True)
    accept_axis.set(xlabel="draft position i", ylabel="fraction of steps accepting drafts 1..i", title="Acceptance")
    speed_axis.set(
        xlabel="K (draft tokens)",
        ylabel="speedup over plain decoding",
        title=f"Speedup ({report.gpu.upper()} projected)",
    )
    return _save(
        figure, (accept_axis, speed_axis), f"trt-spec tune: {report.spec_name} on {report.workload.source}", path
    )


def _two_panels() -> tuple[Any, tuple[Any, Any], Iterator[str]]:
    """A figure of two side-by-side axes (headless backend), and the colour cycle, repeating."""
    import itertools

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = itertools.cycle(plt.rcParams["axes.prop_cycle"].by_key()["color"])
    return figure, tuple(axes), colors


def _save(figure: Any, axes: tuple[Any, ...], title: str, path: str | Path) -> Path:
    """Grid and legend on every axis, the title, then the PNG; closes the figure."""
    import matplotlib.pyplot as plt

    for axis in axes:
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
