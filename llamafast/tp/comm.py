"""How the ranks of a tensor-parallel model combine their partial results, chosen once per run (--tp-comm).

Sharding (shard.py): attention by heads and the FFN by neurons (Megatron, as gpt-fast's tp.py): wqkv, w1 and w3
are split by rows and need no communication; wo and w2 are split by columns, so each leaves a partial (C,) sum
on every rank: 2 synchronisation points per layer, the fewest this sharding allows, plus one to gather the
vocabulary-sharded logits. The residual stream stays whole on every rank, added exactly once.

    nccl  gpt-fast's scheme: each partial (rank 0's with the residual added) goes through an NCCL all-reduce,
          captured in the decode graph; the baseline.
    symm  decode through symmetric memory (kernels/tp_sync.py): wo and w2 push their partials into every rank's
          buffer and the next fused kernel sums them while it reads its input; no all-reduce kernel at all.
          Prompts (S > 1) sum through torch's two-shot all-reduce on symmetric memory (prompt_row_linear).
          On the persistent backend the one-kernel step pushes and waits itself (kernels/decode_step_tp.py).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from llamafast.config import TPComm, Weight
from llamafast.errors import LlamafastError
from llamafast.tp.dist import Ranks


class NcclComm:
    name = TPComm.nccl
    in_step = False  # the persistent decode step cannot call an all-reduce from inside its kernel: per op instead

    def __init__(self, ranks: Ranks, vocab_sharded: bool):
        self.ranks, self.vocab_sharded = ranks, vocab_sharded
        self.rank, self.world, self.group = ranks.shard.rank, ranks.shard.world, ranks.group

    def row_linear(self, ops, x, w: Weight, residual, slot: int):
        """residual + sum over ranks of x_r @ w_r.T: this rank's partial, the residual added on rank 0 only."""
        return self.sum_ranks(ops.linear_residual(x, w, residual if self.rank == 0 else torch.zeros_like(residual)))

    def sum_ranks(self, out: torch.Tensor) -> torch.Tensor:
        """out summed over the ranks, in place: an NCCL all-reduce."""
        dist.all_reduce(out, group=self.group)
        return out

    def lm_head(self, ops, x, norm_w, w: Weight, eps, slot: int):
        """The whole (S, V) logits on every rank: this rank's vocabulary rows, gathered."""
        logits = ops.rmsnorm_lm_head(x, norm_w, w, eps)
        if not self.vocab_sharded:
            return logits
        parts = [torch.empty_like(logits) for _ in range(self.world)]
        dist.all_gather(parts, logits.contiguous(), group=self.group)
        return torch.cat(parts, dim=1)


class SymmComm(NcclComm):
    name = TPComm.symm
    in_step = True  # the persistent decode step pushes and waits on these peers itself (kernels/decode_step_tp.py)

    def __init__(self, ranks: Ranks, vocab_sharded: bool, n_layers: int, dim: int, vocab: int):
        super().__init__(ranks, vocab_sharded)
        self.peers = symmetric_peers(ranks, 2 * n_layers + 1, dim, vocab if vocab_sharded else 0)
        self.push_configs: dict | None = None  # push_linear's launch table (None: the committed one)
        self.prompt_buffers: dict[torch.dtype, list[torch.Tensor]] = {}  # prompt_row_linear's, per activation dtype

    def barrier(self) -> None:
        """Every rank here (the persistent step's ranks meet once its kernel is compiled: backends.py)."""
        dist.barrier(group=self.group)

    def row_linear(self, ops, x, w: Weight, residual, slot: int):
        if x.shape[0] > 1:
            return self.prompt_row_linear(ops, x, w, residual)
        from llamafast.kernels.tp_sync import push_linear

        return push_linear(x, w, self.peers, slot, residual, self.push_configs)

    def prompt_row_linear(self, ops, x, w: Weight, residual):
        """A prompt chunk's (S, C) partials, written by the matmul straight into a symmetric buffer (rank 0's with
        the residual), then summed by torch's two-shot all-reduce (each rank sums its share of the rows, read
        from every rank, and every rank reads the others' sums). The buffer is made at the first chunk, on every
        rank at once (prompts run in step), and grows with the chunk; a buffer it outgrows stays allocated, since
        a prompt graph (prompt_graph.py) captured with it replays into it. Writing in place saves a copy of the
        partials (1.23 ms of rank 0's 59.65 ms of kernels in a 4,000-token 7B prompt at TP=2 on 2 x H100,
        scripts/results/tp/h100x2_prefill/prefill_profile_7b.txt) and, on the other ranks, a zeroed residual."""
        bufs = self.prompt_buffers.setdefault(residual.dtype, [])
        if not bufs or bufs[-1].numel() < residual.numel():
            import torch.distributed._symmetric_memory as symm_mem

            bufs.append(symm_mem.empty(residual.numel(), dtype=residual.dtype, device=residual.device))
            symm_mem.rendezvous(bufs[-1], self.group.group_name)
        buf = bufs[-1]
        part = buf[: residual.numel()].view(residual.shape)
        ops.linear_residual(x, w, residual if self.rank == 0 else None, out=part)
        out = torch.empty_like(residual)
        return torch.ops.symm_mem.two_shot_all_reduce_out(part, "sum", self.group.group_name, out)

    def lm_head(self, ops, x, norm_w, w: Weight, eps, slot: int):
        if x.shape[0] > 1 or not self.vocab_sharded:
            return super().lm_head(ops, x, norm_w, w, eps, slot)
        from llamafast.kernels.tp_sync import wait_logits

        ops.rmsnorm_lm_head(x, norm_w, w, eps, push=(self.peers, slot))  # the triton kernel, the model's launches
        return wait_logits(self.peers, slot)


def make_comm(kind: TPComm, ranks: Ranks, config, vocab_sharded: bool, backend_step: str):
    """The communication for a model of `config` sharded over `ranks`: symm needs the triton backend on GPUs
    with peer access; where that is missing the run falls back to the all-reduces of `nccl` and says why, naming
    the process group's backend that runs them (gloo on the CPU), in the note returned."""
    if kind == TPComm.nccl:
        return NcclComm(ranks, vocab_sharded), None
    reason = symm_unavailable(ranks, backend_step)
    if reason:
        backend = dist.get_backend(ranks.group)
        return NcclComm(ranks, vocab_sharded), f"--tp-comm symm unavailable ({reason}); using {backend} all-reduces"
    return SymmComm(ranks, vocab_sharded, config.n_layers, config.dim, config.vocab_size), None


def symm_unavailable(ranks: Ranks, backend_step: str) -> str | None:
    if backend_step != "graph":
        return "it runs on the triton backend only"
    if ranks.device.type != "cuda":
        return "no CUDA GPUs"
    try:
        import torch.distributed._symmetric_memory  # noqa: F401
    except ImportError:
        return f"torch {torch.__version__} has no symmetric memory"
    for peer in range(torch.cuda.device_count()):
        if peer != ranks.device.index and not torch.cuda.can_device_access_peer(ranks.device.index, peer):
            return f"GPU {ranks.device.index} cannot access GPU {peer} directly (no P2P)"
    return None


def symmetric_peers(ranks: Ranks, slots: int, dim: int, vocab: int):
    """This rank's Peers (kernels/tp_sync.py): parts (slots, N, C) fp32 and flags (slots, 2) int32 in symmetric
    memory, rendezvoused once, and the tables of every rank's addresses."""
    from llamafast.kernels.tp_sync import Peers

    world, device = ranks.shard.world, ranks.device
    try:
        parts, parts_table = symmetric_tensor(ranks, (slots, world, dim), torch.float32)
        flags, flags_table = symmetric_tensor(ranks, (slots, 2), torch.int32)
        logits, logits_table = symmetric_tensor(ranks, (vocab,), torch.float32) if vocab else (None, None)
    except RuntimeError as e:
        raise LlamafastError(f"symmetric memory failed ({str(e).splitlines()[0]}); use --tp-comm nccl") from None
    torch.cuda.synchronize(device)
    dist.barrier(group=ranks.group)  # every rank's buffers are zeroed before any peer writes into them
    counters = torch.zeros(slots, dtype=torch.int32, device=device)
    return Peers(ranks.shard.rank, world, parts_table, flags_table, parts, flags, counters, logits_table, logits)


def symmetric_tensor(ranks: Ranks, shape: tuple, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """A zeroed tensor in symmetric memory, rendezvoused on every rank at once, and the (N,) int64 table of every
    rank's address of it."""
    import torch.distributed._symmetric_memory as symm_mem

    t = symm_mem.empty(shape, dtype=dtype, device=ranks.device)
    t.zero_()
    handle = symm_mem.rendezvous(t, ranks.group.group_name)
    ptrs = list(getattr(handle, "buffer_ptrs", [])) or [
        handle.get_buffer(r, t.shape, t.dtype).data_ptr() for r in range(ranks.shard.world)]
    return t, torch.tensor(ptrs, dtype=torch.int64, device=ranks.device)
