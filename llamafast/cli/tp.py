"""Tensor parallel in the commands: `torchrun --standalone --nproc-per-node N -m llamafast generate|bench ...`
(bench decode and bench prefill).

Every rank runs the same command (checked) on its own GPU; rank 0 reads the prompt, prints and streams, the
others stay silent but for errors of their own. Steps that can fail on one rank alone run under tp.dist.agree,
so every rank stops with the same error and status, and rank 0 alone prints it. A run of one process never
imports torch.distributed.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Annotated, Optional, TypeVar

import typer

from llamafast.cli.common import err, print_error
from llamafast.cli.streams import discard
from llamafast.config import Backend, TPComm
from llamafast.errors import LlamafastError, SharedError

T = TypeVar("T")

TPOpt = Annotated[Optional[int], typer.Option("--tp", help="Tensor-parallel size: one GPU per rank, started with torchrun --nproc-per-node N -m llamafast ... [default: torchrun's process count, else 1].")]
TP_COMM_HELP = ("How tensor-parallel ranks combine partial sums: symm (symmetric memory: summed inside the next "
                "kernel in decode, torch's two-shot all-reduce for prompts) or nccl (NCCL all-reduces after wo and "
                "w2, gpt-fast's scheme)")


# The commands that run tensor parallel; under torchrun any other would run once per rank, side by side. bench's
# other subcommands refuse torchrun as they start (cli/bench).
TP_COMMANDS = ("generate", "bench decode", "bench prefill")
# What torchrun sets for every rank; LOCAL_RANK defaults to RANK.
_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# The longest a silent rank waits, before the ranks are connected, for torchrun to stop it once rank 0 has
# reported an error that every rank found (they run the same code, so rank 0 is a moment behind at most).
_SILENT_WAIT_S = 10


@dataclass(frozen=True)
class Launch:
    rank: int
    world: int


def torchrun_launch() -> Launch | None:
    """This process's place among the ranks torchrun started; None when WORLD_SIZE is unset (no torchrun)."""
    if "WORLD_SIZE" not in os.environ:
        return None
    env = {key: os.environ.get(key, "") for key in _TORCHRUN_VARS}
    missing = [key for key, value in env.items() if not value]
    try:
        launch = Launch(int(env["RANK"]), int(env["WORLD_SIZE"]))
    except ValueError:
        launch = None
    if missing or launch is None or not 0 <= launch.rank < launch.world:
        raise LlamafastError(_not_torchrun(env, missing))
    return launch


def _not_torchrun(env: dict[str, str], missing: list[str]) -> str:
    what = f"without {', '.join(missing)}" if missing else f"with RANK={env['RANK']}"
    n = env["WORLD_SIZE"] if env["WORLD_SIZE"].isdigit() and int(env["WORLD_SIZE"]) > 1 else "2"
    return (f"WORLD_SIZE={env['WORLD_SIZE']} {what}: torchrun sets {', '.join(_TORCHRUN_VARS)} for each rank it "
            f"starts; run torchrun --standalone --nproc-per-node {n} -m llamafast {shlex.join(sys.argv[1:])}")


def refuse_under_torchrun(command: str | None) -> None:
    """Under torchrun only the tensor-parallel commands run; any other is refused on every rank before it does its
    work (convert-fp8 would convert once per rank, chat hold one conversation per rank), reported by rank 0."""
    launch = torchrun_launch()
    groups = {name.split()[0] for name in TP_COMMANDS}  # bench: its subcommand decides
    if launch is None or launch.world == 1 or command in TP_COMMANDS or command in groups:
        return
    with reported_once(launch.rank):
        raise SharedError(f"{command} does not run under torchrun (only {', '.join(TP_COMMANDS[:-1])} and "
                          f"{TP_COMMANDS[-1]} run tensor parallel); run it once, without torchrun")


def check_settings() -> None:
    """The LLAMAFAST_* variables (llamafast/settings.py), checked as a command starts: a garbage value is one line
    (printed once under torchrun, where every rank has the same environment), before any work."""
    from llamafast.settings import settings

    launch = torchrun_launch()
    with reported_once(launch.rank if launch else 0):
        settings()


@contextlib.contextmanager
def reported_once(rank: int, ranks=None) -> Iterator[None]:
    """An error that every rank raises alike is printed by rank 0 alone, and every rank exits with status 1 once
    it has been: torchrun stops all ranks as soon as one exits with an error, and a silent rank that exited first
    could have rank 0 stopped before it printed."""
    try:
        yield
    except SharedError as e:
        if rank == 0:
            print_error(str(e))
        if ranks is not None:
            from llamafast.tp.dist import leave_together

            leave_together(ranks)
        elif rank != 0:
            _wait_for_torchrun()
        raise typer.Exit(1) from None


def _wait_for_torchrun() -> None:
    def stopped(signum, frame):
        raise typer.Exit(1)

    signal.signal(signal.SIGTERM, stopped)
    time.sleep(_SILENT_WAIT_S)


@contextlib.contextmanager
def tensor_parallel(tp: int | None, device: str | None) -> Iterator:
    """Ranks (tp/dist.py) when this process is one of several torchrun started, else None."""
    launch = torchrun_launch()
    if launch is None:
        check_tp(tp, None)
        yield None
        return
    from llamafast.tp import dist

    with reported_once(launch.rank):
        ranks = dist.setup(device)
    try:
        with reported_once(launch.rank, ranks):
            dist.same_arguments(ranks, sys.argv[1:])  # before any check that reads them
            check_tp(tp, launch.world)
            _quiet_or_leading(ranks)
            yield ranks
        dist.leave_together(ranks)
    finally:
        dist.finish(ranks)


def check_tp(tp: int | None, world: int | None) -> None:
    """--tp against torchrun's process count (world; None without torchrun)."""
    if tp is not None and tp < 1:
        raise SharedError(f"--tp {tp}: the tensor-parallel size must be at least 1")
    if world is None and tp not in (None, 1):
        raise LlamafastError(f"--tp {tp} runs one process per GPU: torchrun --standalone --nproc-per-node {tp} "
                             f"-m llamafast {shlex.join(sys.argv[1:])}")
    if world is not None and tp not in (None, world):
        raise SharedError(f"--tp {tp} disagrees with torchrun's {world} processes (--nproc-per-node)")


def _quiet_or_leading(ranks) -> None:
    if ranks.leader:
        sys.stdout = ReaderMayLeave(sys.stdout)
        return
    err.quiet = True  # notes and progress bars: rank 0's; errors of its own still reach stderr (cli.common.fail)
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115


class ReaderMayLeave:
    """Rank 0's standard output under torchrun. When its reader goes (`| head -c 5`), the rest of the output goes
    nowhere and the run goes on to its end: the other ranks wait for rank 0 in every collective until then, and
    stopping them all early would cost every decode step an exchange."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._reader_gone()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._reader_gone()

    def _reader_gone(self) -> None:
        discard(self._stream)  # what is still buffered, and the interpreter's last flush, go to /dev/null

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def on_every_rank(ranks, step: Callable[[], T]) -> T:
    """step(), and under tensor parallelism the same outcome on every rank: its result, or every rank's error."""
    if ranks is None:
        return step()
    from llamafast.tp.dist import agree

    return agree(ranks, step)


def on_rank0(ranks, step: Callable[[], T], wait: timedelta | None = None) -> T:
    """step() on rank 0 alone (reading standard input or a file), its result or its error on every rank; wait: how
    long the others wait for it, where that may be longer than the collective timeout (tp.dist.from_leader)."""
    if ranks is None:
        return step()
    from llamafast.tp.dist import from_leader

    return from_leader(ranks, step, wait)


def check_tp_backend(ranks, backend: Backend | None, comms=()) -> None:
    """--tp runs the triton, reference and persistent backends; persistent synchronises inside its kernel, through
    symmetric memory (kernels/decode_step_tp.py), so at least one of comms (the --tp-comm asked for) must be symm."""
    if ranks is not None and backend == Backend.compile:
        raise LlamafastError("--tp runs the triton, persistent and reference backends, not compile")
    if ranks is not None and backend == Backend.persistent and comms and TPComm.symm not in comms:
        raise LlamafastError("--backend persistent under --tp waits on symmetric memory inside its kernel: use "
                             "--tp-comm symm")


def attach_comm(ranks, lm, kind) -> str | None:
    """Gives a sharded model its communication (tp/comm.py); returns a note when symm fell back to NCCL."""
    if ranks is None:
        return None
    lm.model.comm, note = make_comms(ranks, lm, [kind])[0]
    return note


def make_comms(ranks, lm, kinds) -> list[tuple]:
    """(comm, note) for each kind asked for, on lm's sharded model (tp/comm.make_comm)."""
    from llamafast.tp.comm import make_comm

    model = lm.model
    vocab_sharded = model.shard.vocab_sharded(model.config)
    made = {}
    for kind in kinds:  # a symm that fell back to nccl is not timed twice
        comm, note = make_comm(kind, ranks, model.config, vocab_sharded, model.backend.step)
        made.setdefault(comm.name, (comm, note))
    return list(made.values())


def shared_seed(ranks, seed: int | None) -> int | None:
    """Under tensor parallelism every rank samples from the same seed (rank 0's), so that identical logits give
    identical tokens on every rank (tests/tp/test_tp_run.py)."""
    if ranks is None:
        return seed
    from llamafast.tp.dist import same_on_every_rank

    return same_on_every_rank(ranks, seed if seed is not None else int.from_bytes(os.urandom(4), "little"))
