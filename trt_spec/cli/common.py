"""Options and helpers shared by the commands."""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from trt_spec.plan import Plan
from trt_spec.spec import Spec, load_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# The wide pair: on one CPU thread its target's step costs ~10x its draft's (the smaller pair's
# ~4x), so there is something for drafting to win here. The tests run the smaller pystdlib-demo.yaml.
DEMO_SPEC = EXAMPLES / "pystdlib-wide.yaml"

spec_option = click.option(
    "--spec",
    "spec_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="The deployment spec (YAML).",
)


def read_spec(spec_path: str) -> Spec:
    return load_spec(spec_path)


def render_steps(the_plan: Plan, spec_path: str) -> list[str]:
    """The copy-pasteable commands of a plan: one conversion, then one trtllm-build per engine."""
    lines = [
        "# 1. convert both HF checkpoints to TensorRT-LLM checkpoints (CPU; skipped when up to date)",
        f"trt-spec convert --spec {shlex.quote(spec_path)}",
    ]
    for role in ("target", "draft"):
        convert = the_plan.engine(role).convert
        lines.append(f"#    {role}: {convert.source} -> {convert.output_dir} (tp {convert.tp_size}, {convert.dtype})")
    lines.append("# 2. compile the engines (GPU)")
    lines += [shlex.join(the_plan.engine(role).build_argv) for role in ("target", "draft")]
    return lines
