"""Options and helpers shared by the commands."""

from __future__ import annotations

import click

from trt_spec.spec import Spec, load_spec

spec_option = click.option(
    "--spec",
    "spec_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="The deployment spec (YAML).",
)


def read_spec(spec_path: str) -> Spec:
    return load_spec(spec_path)
