"""Options and helpers shared by the commands (the command modules import only this of each other):
the spec option, the demo spec, the plan's build steps, and ``--url`` | ``--local --spec F``,
the two ways ``generate`` and ``bench`` run."""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from trt_spec.client import DEFAULT_URL
from trt_spec.plan import Plan, Route, make_plan
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


tuning_option = click.option(
    "--tuning",
    "tuning_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="A `trt-spec tune` report: acceptance measured on your prompts.",
)


def read_tuning(tuning_path: str | None, spec: Spec):
    """The tuning report at ``tuning_path`` checked against ``spec``'s pair, or None."""
    from trt_spec.plan.tuning import load_tuning

    return load_tuning(tuning_path, spec) if tuning_path else None


def spec_route(spec: Spec) -> Route:
    """What the spec's flavor says about its route (``Flavor.route``): its warnings and notes, and
    whether it builds TensorRT engines."""
    from trt_spec.repository import flavors

    return flavors.get(spec.triton.flavor).route(spec)


def spec_plan(spec: Spec) -> Plan:
    """The plan of ``spec`` on its flavor's route (what ``plan``, ``check`` and ``build`` say)."""
    return make_plan(spec, route=spec_route(spec))


def render_steps(the_plan: Plan, spec_path: str) -> list[str]:
    """The copy-pasteable commands of a plan: one conversion, then one trtllm-build per engine; on a
    route without engines, the command that writes what serves it."""
    if not the_plan.builds_engines:
        flavor = the_plan.spec.triton.flavor
        return [
            f"# the {flavor} flavor builds no TensorRT engines: TensorRT-LLM loads both checkpoints itself",
            f"trt-spec repo --spec {shlex.quote(spec_path)} -o model_repo",
        ]
    roles = the_plan.roles
    which = "both HF checkpoints" if len(roles) > 1 else "the target's HF checkpoint (no draft model)"
    lines = [
        f"# 1. convert {which} to TensorRT-LLM checkpoints (CPU; skipped when up to date)",
        f"trt-spec convert --spec {shlex.quote(spec_path)}",
    ]
    for role in roles:
        convert = the_plan.engine(role).convert
        lines.append(f"#    {role}: {convert.source} -> {convert.output_dir} (tp {convert.tp_size}, {convert.dtype})")
    lines.append("# 2. compile the engines (GPU)" if len(roles) > 1 else "# 2. compile the target engine (GPU)")
    lines += [shlex.join(the_plan.engine(role).build_argv) for role in roles]
    return lines


DEVICES = ("auto", "cpu", "cuda")


def mode_options(command):
    """``--url`` | ``--local --spec F`` and the engine options of the local mode."""
    options = [
        click.option(
            "--url",
            metavar="HOST:PORT",
            default=None,
            help=f"A Triton server running the repository (gRPC); the default, at {DEFAULT_URL}.",
        ),
        click.option("--local", is_flag=True, help="Run in-process on the spec's checkpoints (the PyTorch twin)."),
        click.option(
            "--spec",
            "spec_path",
            type=click.Path(dir_okay=False),
            default=None,
            help="The deployment spec (YAML); needed with --local.",
        ),
        click.option(
            "--device",
            type=click.Choice(DEVICES),
            default="auto",
            show_default=True,
            help="--local: where the models run (auto: CUDA when present).",
        ),
        click.option(
            "--runner",
            type=click.Choice(("auto", "llama", "hf")),
            default="auto",
            show_default=True,
            help="--local: the forward pass: a lean Llama one (auto, for Llama models) or Hugging Face's own (hf).",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def choose_mode(
    url: str | None, local: bool, spec_path: str | None, *, spec_with_url: bool = False
) -> tuple[str | None, Spec | None]:
    """(url, None) for a server run, (None, spec) for ``--local``; fails early, naming the
    alternative. ``spec_with_url``: the command also takes ``--spec`` beside ``--url``."""
    if url and local:
        raise click.UsageError("--url and --local are alternatives; pass one of them")
    if local:
        if spec_path is None:
            raise click.UsageError("--local needs --spec FILE (the deployment spec naming both checkpoints)")
        return None, read_spec(spec_path)
    if spec_path is not None and not spec_with_url:
        raise click.UsageError("--spec is for in-process runs: pass --local --spec FILE, or --url HOST:PORT alone")
    return url or DEFAULT_URL, read_spec(spec_path) if spec_path else None


def load_twin(spec: Spec, device: str, runner: str):
    from trt_spec.twin import TwinPair

    return TwinPair.from_spec(spec, device=None if device == "auto" else device, runner=runner)


def dataset_options(command):
    """``--dataset SOURCE`` and its companions: prompts from the user's data (``bench``, ``tune``)."""
    options = [
        click.option(
            "--dataset",
            metavar="SOURCE",
            default=None,
            help="Prompts from your data instead of the packaged ones: a .jsonl/.json/.csv/.parquet file or a "
            "Hugging Face dataset name; records with OpenAI chat `messages` (rendered with the target's chat "
            "template), ShareGPT `conversations`, or a prompt column (prompt, text, input, question, instruction).",
        ),
        click.option(
            "--dataset-column", default=None, help="--dataset: the prompt column (default: the first known one)."
        ),
        click.option("--dataset-split", default="train", show_default=True, help="--dataset: a Hub dataset's split."),
        click.option("--seed", type=int, default=0, show_default=True, help="--dataset: the sample's seed."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


DEFAULT_DATASET_PROMPTS = 8


def load_dataset_workload(
    dataset: str, tokenizer, spec: Spec | None, *, num_prompts: int | None, column: str | None, split: str, seed: int
):
    """A seeded sample of ``dataset`` within ``spec``'s limits (none without a spec); a bad source
    is one usage error naming --dataset. The sample's shape goes to stderr."""
    from trt_spec.bench.dataset import DatasetError, load_workload

    try:
        workload = load_workload(
            dataset,
            tokenizer,
            num_prompts=num_prompts or DEFAULT_DATASET_PROMPTS,
            max_input_len=spec.engine.max_input_len if spec else 1 << 30,
            max_seq_len=spec.engine.max_seq_len if spec else 1 << 30,
            column=column,
            split=split,
            seed=seed,
        )
    except DatasetError as exc:
        raise click.BadParameter(str(exc), param_hint="--dataset") from None
    click.echo(f"workload: {workload.describe()}", err=True)
    return workload
