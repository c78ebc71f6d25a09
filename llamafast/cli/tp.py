"""Tensor parallel in the commands: `torchrun --standalone --nproc-per-node N -m llamafast generate|bench ...`.

Every rank runs the same command on its own GPU; rank 0 prints and streams, the others stay silent but for
their errors. Steps that can fail on one rank alone run under tp.dist.agree, so every rank stops with the
same error and status. A run of one process never imports torch.distributed.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from collections.abc import Callable, Iterator
from typing import Annotated, Optional, TypeVar

import typer

from llamafast.cli.common import err
from llamafast.config import Backend
from llamafast.errors import LlamafastError

T = TypeVar("T")

TPOpt = Annotated[Optional[int], typer.Option("--tp", help="Tensor-parallel size: one GPU per rank, started with torchrun --nproc-per-node N -m llamafast ... [default: torchrun's process count, else 1].")]
TP_COMM_HELP = ("How tensor-parallel ranks combine partial sums in decode: symm (symmetric memory, summed inside "
                "the next kernel) or nccl (an all-reduce after wo and w2, gpt-fast's scheme)")


@contextlib.contextmanager
def tensor_parallel(tp: int | None, device: str | None) -> Iterator:
    """Ranks (tp/dist.py) when this process is one of several torchrun started, else None."""
    if tp is not None and tp < 1:
        raise LlamafastError(f"--tp {tp}: the tensor-parallel size must be at least 1")
    if "WORLD_SIZE" not in os.environ:
        if tp not in (None, 1):
            args = shlex.join(sys.argv[1:])
            raise LlamafastError(f"--tp {tp} runs one process per GPU: torchrun --standalone --nproc-per-node {tp} "
                                 f"-m llamafast {args}")
        yield None
        return
    from llamafast.tp import dist

    world = int(os.environ["WORLD_SIZE"])
    if tp not in (None, world):
        raise LlamafastError(f"--tp {tp} disagrees with torchrun's {world} processes (--nproc-per-node)")
    ranks = dist.setup(device)
    if not ranks.leader:
        err.quiet = True  # notes and progress bars: rank 0's; errors still reach stderr (cli.common.fail)
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
    try:
        yield ranks
        dist.leave_together(ranks)
    finally:
        dist.finish(ranks)


def on_every_rank(ranks, step: Callable[[], T]) -> T:
    """step(), and under tensor parallelism the same outcome on every rank: its result, or every rank's error."""
    if ranks is None:
        return step()
    from llamafast.tp.dist import agree

    return agree(ranks, step)


def check_tp_backend(ranks, backend: Backend | None) -> None:
    if ranks is not None and backend == Backend.compile:
        raise LlamafastError("--tp runs the triton and reference backends, not compile")


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
