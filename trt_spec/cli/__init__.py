"""The ``trt-spec`` command line: a Click group of thin commands, one module per topic.

Library errors (``TrtSpecError``) become one line on stderr and exit code 1; any other
exception too, with a hint. ``TRT_SPEC_DEBUG=1`` shows the traceback instead. A closed stdout
(``trt-spec plan --json | head``) ends the command quietly, as it ends other Unix tools.
"""

from __future__ import annotations

import os

import click

from trt_spec import __version__
from trt_spec.errors import TrtSpecError


class _Group(click.Group):
    """Maps library errors to one line, once, for every command."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except TrtSpecError as exc:
            if os.environ.get("TRT_SPEC_DEBUG") == "1":
                raise
            raise click.ClickException(str(exc)) from None
        except KeyboardInterrupt:
            raise click.exceptions.Abort() from None
        except BrokenPipeError:
            # The reader went away: Click's own handler stops quietly (no message, exit 1) and keeps
            # the interpreter's last flush of stdout from raising again.
            raise
        except Exception as exc:  # last resort: one line, not a traceback
            if os.environ.get("TRT_SPEC_DEBUG") == "1":
                raise
            raise click.ClickException(
                f"internal error: {type(exc).__name__}: {exc} (run again with TRT_SPEC_DEBUG=1 for the traceback)"
            ) from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="trt-spec")
def main() -> None:
    """Draft-target speculative decoding on NVIDIA Hopper, from one YAML spec.

    \b
    A typical run:
      trt-spec init -o spec.yaml          # write an annotated spec, then edit it
      trt-spec plan --spec spec.yaml      # exact conversion + trtllm-build steps, memory plan
      trt-spec build --spec spec.yaml     # compile both engines (GPU machine)
      trt-spec repo --spec spec.yaml      # the Triton model repository
      trt-spec serve --repo model_repo    # run Triton on it

    \b
    On CPU, end to end with the embedded demo pair:
      trt-spec demo
    """


def _register() -> None:
    # One module per topic; each exposes `commands`, a list of click commands.
    from trt_spec.cli import (
        bench_cmds,
        build_cmds,
        checkpoint_cmds,
        demo_cmds,
        deploy_cmds,
        generate_cmds,
        serve_cmds,
        spec_cmds,
        tune_cmds,
    )

    for module in (
        spec_cmds,
        checkpoint_cmds,
        build_cmds,
        serve_cmds,
        generate_cmds,
        bench_cmds,
        tune_cmds,
        demo_cmds,
        deploy_cmds,
    ):
        for command in module.commands:
            main.add_command(command)


_register()
