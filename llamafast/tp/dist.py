"""The ranks of a tensor-parallel run: started by torchrun, one process per GPU, set up once per process.

A rank learns its place from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK). Collectives get a timeout,
and every step that can fail on one rank alone (opening and loading the checkpoint) ends in `agree`, where the
ranks exchange their errors over a CPU (gloo) group, so that every rank stops with the same error (a SharedError,
which rank 0 alone prints) and exit status instead of waiting for a peer that has already gone. Imported only when a run is tensor parallel.
"""

from __future__ import annotations

import hashlib
import os
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

import torch
import torch.distributed as dist

from llamafast.errors import LlamafastError, SharedError
from llamafast.load.shard import Shard
from llamafast.settings import settings

T = TypeVar("T")

# NVLink multicast stays off: llamafast's communication does not need it, and shared GPU hosts may require it
# off; set before any CUDA work.
_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


@dataclass(frozen=True)
class Ranks:
    shard: Shard
    device: torch.device
    group: dist.ProcessGroup  # NCCL on GPUs, gloo on the CPU: the model's collectives
    control: dist.ProcessGroup  # gloo: errors and small host values

    @property
    def leader(self) -> bool:
        return self.shard.rank == 0


def setup(device_name: str | None) -> Ranks:
    """Joins the torchrun job: the GPU LOCAL_RANK (or the CPU with gloo), the process groups."""
    wait = timeout()  # before any rank waits on another
    for key, value in _ENV.items():
        os.environ.setdefault(key, value)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    on_gpu = torch.cuda.is_available() and device_name != "cpu"
    if on_gpu and torch.cuda.device_count() <= local:
        raise LlamafastError(f"rank {rank}: torchrun started {world} ranks but this machine has "
                             f"{torch.cuda.device_count()} GPU(s); use --nproc-per-node {torch.cuda.device_count()}")
    device = torch.device("cuda", local) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        kw = {"device_id": device} if on_gpu else {}
        dist.init_process_group("nccl" if on_gpu else "gloo", timeout=wait, **kw)
    control = dist.new_group(backend="gloo", timeout=wait) if on_gpu else dist.group.WORLD
    return Ranks(Shard(rank, world), device, dist.group.WORLD, control)


def timeout() -> timedelta:
    """How long a collective waits for a rank that has gone (LLAMAFAST_TP_TIMEOUT, llamafast/settings.py)."""
    return timedelta(seconds=settings().tp_timeout_s)


def same_arguments(ranks: Ranks, args: Sequence[str]) -> None:
    """Every rank runs one command: ranks started with different arguments (a wrapper giving each its own
    prompt or token count) would disagree on shapes and steps and wait on each other until the timeout."""
    digest = hashlib.sha256("\0".join(args).encode("utf-8", "surrogateescape")).hexdigest()
    digests: list[str | None] = [None] * ranks.shard.world
    dist.all_gather_object(digests, digest, group=ranks.control)
    others = [r for r, d in enumerate(digests) if d != digests[0]]
    if others:
        raise SharedError(f"the ranks were started with different arguments (rank {others[0]}'s differ from rank "
                          "0's); start every rank with the same command, as torchrun does")


def agree(ranks: Ranks, step: Callable[[], T]) -> T:
    """Runs step on every rank; if it fails on any, every rank raises the first failing rank's error."""
    result, error = None, None
    try:
        result = step()
    except LlamafastError as e:
        error = str(e)
    except Exception as e:  # an unexpected failure still reaches the other ranks before this one exits
        error = f"{type(e).__name__}: {e}"
    errors: list[str | None] = [None] * ranks.shard.world
    dist.all_gather_object(errors, error, group=ranks.control)
    failed = [(r, e) for r, e in enumerate(errors) if e is not None]
    if failed:
        rank, message = failed[0]
        raise SharedError(message if rank == 0 else f"rank {rank} failed: {message}")
    return result


def from_leader(ranks: Ranks, step: Callable[[], T], wait: timedelta | None = None) -> T:
    """Runs step on rank 0 alone (only it has standard input; a file may exist only beside it) and gives every
    rank its result, or its error. wait: how long the other ranks wait for a step that may outlast the collective
    timeout (bench's TP=1 run): rank 0's outcome then goes out over a gloo group made first with that timeout (a
    monitored_barrier would not do: only rank 0 waits in it with its timeout, the others with the group's)."""
    group = ranks.control if wait is None else dist.new_group(backend="gloo", timeout=wait)
    box: list = [None, None]
    if ranks.leader:
        try:
            box[0] = step()
        except LlamafastError as e:
            box[1] = str(e)
        except Exception as e:  # the other ranks still learn of it, and stop with rank 0
            box[1] = f"{type(e).__name__}: {e}"
    dist.broadcast_object_list(box, src=0, group=group)
    if box[1] is not None:
        raise SharedError(box[1])
    return box[0]


def same_on_every_rank(ranks: Ranks, value: T) -> T:
    """Rank 0's value of a small host object (a sampling seed) on every rank."""
    box = [value]
    dist.broadcast_object_list(box, src=0, group=ranks.control)
    return box[0]


def leave_together(ranks: Ranks) -> None:
    """After a run that succeeded everywhere: a rank that exits while a peer's gloo threads still talk to it can
    abort the peer ("terminate called without an active exception"; seen with 4 CPU ranks on 2 cores)."""
    dist.barrier(group=ranks.control)


# CUDA graphs captured under tensor parallelism (decode steps: nccl's hold its all-reduces). NCCL's communicator
# cannot be destroyed while a graph that captured its collectives lives: destroy_process_group waits in
# ncclCommDestroy forever (pytorch/pytorch#115388; seen on 2 x H100, scripts/results/tp/h100x2_prefill/), so
# finish resets them first.
_GRAPHS: weakref.WeakSet = weakref.WeakSet()


def hold_graph(graph: torch.cuda.CUDAGraph) -> None:
    """graph, captured on a tensor-parallel model, is reset by finish before the process group goes."""
    _GRAPHS.add(graph)


def finish(ranks: Ranks) -> None:
    """Leaves the process group, the graphs captured under it reset first (_GRAPHS): their owners are done."""
    if not dist.is_initialized():
        return
    if ranks.device.type == "cuda":
        torch.cuda.synchronize(ranks.device)
    for graph in list(_GRAPHS):
        graph.reset()
    _GRAPHS.clear()
    dist.destroy_process_group()
