"""The ranks of a tensor-parallel run: started by torchrun, one process per GPU, set up once per process.

A rank learns its place from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK). Collectives get a timeout,
and every step that can fail on one rank alone (opening and loading the checkpoint) ends in `agree`, where the
ranks exchange their errors over a CPU (gloo) group, so that every rank stops with the same one-line error and
exit status instead of waiting for a peer that has already gone. Imported only when a run is tensor parallel.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

import torch
import torch.distributed as dist

from llamafast.errors import LlamafastError
from llamafast.tp.shard import Shard

T = TypeVar("T")

# NVLink multicast stays off on the lent machines (KERNELS.md); set before any CUDA work.
_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
TIMEOUT = timedelta(seconds=int(os.environ.get("LLAMAFAST_TP_TIMEOUT", "60")))


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
        dist.init_process_group("nccl" if on_gpu else "gloo", timeout=TIMEOUT, **kw)
    control = dist.new_group(backend="gloo", timeout=TIMEOUT) if on_gpu else dist.group.WORLD
    return Ranks(Shard(rank, world), device, dist.group.WORLD, control)


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
        raise LlamafastError(message if rank == ranks.shard.rank else f"rank {rank} failed: {message}")
    return result


def same_on_every_rank(ranks: Ranks, value: T) -> T:
    """Rank 0's value of a small host object (a sampling seed) on every rank."""
    box = [value]
    dist.broadcast_object_list(box, src=0, group=ranks.control)
    return box[0]


def leave_together(ranks: Ranks) -> None:
    """After a run that succeeded everywhere: a rank that exits while a peer's gloo threads still talk to it can
    abort the peer ("terminate called without an active exception"; seen with 4 CPU ranks on 2 cores)."""
    dist.barrier(group=ranks.control)


def finish(ranks: Ranks) -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
