"""`llamafast bench`: one subcommand per benchmark (decode.py: decode and sparse; prefill.py; kernels.py;
timeline.py), their shared options and model readying in shared.py.

Arguments that name no subcommand are routed by their mode flag (ROUTES), so that scripts may write bench as one
command: `bench --model M` is `bench decode --model M`, `bench --kernels --prefill` is `bench kernels --prefill`.
"""

from __future__ import annotations

import typer

from llamafast.cli.bench.decode import decode, sparse
from llamafast.cli.bench.kernels import kernels
from llamafast.cli.bench.prefill import prefill
from llamafast.cli.bench.timeline import timeline
from llamafast.cli.tp import refuse_under_torchrun

# The mode flags, in order of precedence: the subcommand each stands for, and whether the flag is dropped (sparse
# takes --sparsity, --sparse-mode and --group-size itself; --kernels --prefill keeps --prefill, which kernels
# takes).
ROUTES = [("--kernels", "kernels", True), ("--timeline", "timeline", True), ("--prefill", "prefill", True),
          *((flag, "sparse", False) for flag in ("--sparsity", "--sparse-mode", "--group-size"))]


def route(args: list[str], commands) -> list[str]:
    """args with the subcommand they name first: given, picked by a flag of ROUTES, or decode."""
    if args and (args[0] in commands or args[0] == "--help"):
        return args
    for flag, command, dropped in ROUTES:
        if any(arg == flag or arg.startswith(flag + "=") for arg in args):
            return [command, *(arg for arg in args if not (dropped and arg == flag))]
    return ["decode", *args]


class _Bench(typer.core.TyperGroup):
    """bench's subcommands, with arguments that name none routed to one."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        return super().parse_args(ctx, route(args, self.commands))


app = typer.Typer(cls=_Bench, rich_markup_mode=None)


@app.callback()
def _bench(ctx: typer.Context):
    """Measure decode speed, time to first token, the sparse FFN and each kernel, against the memory bandwidth
    measured in the same run. Without a subcommand bench runs decode.

    Mode flags stand for subcommands: `bench [OPTIONS]` is `bench decode [OPTIONS]`, and --prefill, --kernels
    (with or without --prefill), --timeline and --sparsity pick the subcommand that takes the other options."""
    refuse_under_torchrun(f"bench {ctx.invoked_subcommand}")


app.command(short_help="Decode tok/s and bandwidth per backend (the default).")(decode)
app.command(short_help="Time to first token per prompt length and backend.")(prefill)
app.command(short_help="Sparse FFN decode tok/s per sparsity, beside the dense run.")(sparse)
app.command(short_help="The decode step's kernels in place, per op and layer (CUDA).")(timeline)
app.command(short_help="Each kernel against its torch reference (CUDA).")(kernels)
