"""The llamafast command line: each command parses, calls the library, and prints what it returns.

One module per command: generate.py, chat.py, serve.py, info.py, convert.py, quantize.py, eval.py, sparsify.py, and
bench/ for bench's subcommands; common.py holds the shared options, the console and clean errors, presets.py the
TOML run presets.
"""

from __future__ import annotations

import importlib
import sys
from typing import Annotated

import typer

from llamafast.cli.bench import app as bench_app
from llamafast.cli.chat import chat
from llamafast.cli.common import clean_errors
from llamafast.cli.streams import guarded_streams
from llamafast.cli.convert import convert_fp8
from llamafast.cli.eval import eval_command
from llamafast.cli.generate import generate
from llamafast.cli.info import info
from llamafast.cli.quantize import quantize
from llamafast.cli.serve import serve
from llamafast.cli.sparsify import sparsify
from llamafast.cli.tp import check_settings, refuse_under_torchrun


class _Commands(typer.core.TyperGroup):
    """Typer's own usage errors (an unknown --dtype value, an option without its value) end like every other
    bad input: one `error:` line and exit code 1, not a boxed message and exit code 2."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        sys.exit(guarded_streams(lambda: self._run(args, prog_name, complete_var, **extra)))

    def _run(self, args, prog_name, complete_var, **extra) -> int:
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _click.exceptions.NoArgsIsHelpError as e:  # bare `llamafast`: the help
            typer.echo(e.format_message())
            code = 0
        except _click.exceptions.ClickException as e:
            typer.echo(f"error: {' '.join(e.format_message().split())}", err=True)
            code = 1
        except typer.Abort:
            code = 130
        return code if isinstance(code, int) else 0


# Typer vendors click from 0.20 on; older releases import it.
_click = getattr(typer.core, "_click", None) or importlib.import_module("click")
# rich_markup_mode=None: help texts are plain text, so their "[default: 0.6]" is shown, not read as markup.
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, cls=_Commands,
                  rich_markup_mode=None)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"llamafast {version('llamafast')}")
        except PackageNotFoundError:  # run from a source tree that was never installed
            typer.echo("llamafast (not installed)")
        raise typer.Exit()


@app.callback()
def _main(
    ctx: typer.Context,
    show_version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                               help="Print the version and exit.")] = False,
):
    """llamafast: Llama 2 at batch 1, as fast as the GPU's memory allows."""
    with clean_errors():
        refuse_under_torchrun(ctx.invoked_subcommand)
        check_settings()


app.add_typer(bench_app, name="bench")
app.command()(chat)
app.command("convert-fp8")(convert_fp8)
app.command()(generate)
app.command()(info)
app.command()(quantize)
app.command()(serve)
app.command("eval")(eval_command)
app.command()(sparsify)
