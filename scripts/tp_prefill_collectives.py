"""Which collective prefill uses under tensor parallelism: torch's fused all-gather matmul (symmetric memory, the
symm-mem recipes' technique) against NCCL all-gather then matmul, at Llama-2-7B TP=2 prompt shapes, and the
NCCL all-reduce that the Megatron sharding needs instead. It decides tp/comm.py's prompt path (NCCL all-reduces;
docs/benchmarks.md lists this comparison among what is open). On 2 GPUs:

    torchrun --standalone --nproc-per-node 2 scripts/tp_prefill_collectives.py OUT.json
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

for key in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
    os.environ.setdefault(key, "1" if "DISABLE" in key else "0")


def timed(fn, reps: int = 20) -> float:
    """Median microseconds of fn (a barrier before each, so that both ranks start together)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        dist.barrier()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[len(times) // 2]


def symmetric_all_reduces(partial: torch.Tensor, group: str) -> dict:
    """The same (M, C) all-reduce as NCCL's through symmetric memory: torch's two-shot (each rank sums its share
    of the rows from every rank, then every rank reads the others' sums) and one-shot (every rank reads every
    rank's whole partial), each with the copy of the partial into the symmetric buffer that a prompt pass makes."""
    import torch.distributed._symmetric_memory as symm_mem

    whole = symm_mem.empty(2 * partial.numel(), dtype=partial.dtype, device=partial.device)
    symm_mem.rendezvous(whole, group)
    buf = whole[: partial.numel()].view(partial.shape)  # a slice of a larger buffer, as SymmComm.prompt_row_linear's
    out = torch.empty_like(partial)

    def two_shot():
        buf.copy_(partial)
        torch.ops.symm_mem.two_shot_all_reduce_out(buf, "sum", group, out)

    def one_shot():
        buf.copy_(partial)
        torch.ops.symm_mem.one_shot_all_reduce_out(buf, "sum", group, out)

    expect = partial.clone()
    dist.all_reduce(expect)
    two_shot()
    diff = (out.float() - expect.float()).abs().max().item()
    return {"two_shot_us": timed(two_shot), "one_shot_us": timed(one_shot), "two_shot_max_diff": diff}


def main(out: str) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    from torch.distributed import _symmetric_memory  # noqa: F401 (registers torch.ops.symm_mem)

    group = dist.group.WORLD.group_name
    rows = []
    # (tokens, K, N): the prompt chunk through this rank's wqkv (7B TP=2: 6144 rows) and w1|w3 (2 x 5504).
    for m, k, n in ((512, 4096, 6144), (1952, 4096, 6144), (2048, 4096, 6144), (2048, 4096, 11008),
                    (4000, 4096, 6144)):
        a_shard = torch.randn(m // world, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16) * k ** -0.5
        gathered = torch.empty(m, k, device="cuda", dtype=torch.bfloat16)

        def unfused():
            dist.all_gather_into_tensor(gathered, a_shard)
            return gathered @ b

        def fused():
            return torch.ops.symm_mem.fused_all_gather_matmul(a_shard, [b], gather_dim=0, group_name=group)

        check = (fused()[1][0] - unfused()).abs().max().item()
        partial = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        row = {"tokens": m, "k": k, "n": n, "unfused_us": timed(unfused), "fused_us": timed(fused),
               "max_abs_diff": check, "matmul_us": timed(lambda: gathered @ b),
               "all_reduce_us": timed(lambda: dist.all_reduce(partial))}
        rows.append({**row, **symmetric_all_reduces(partial, group)})
    if rank == 0:
        print(f"{'tokens':>6} {'K':>5} {'N':>6} {'AG+mm us':>9} {'fused us':>9} {'mm us':>8} {'AR(M,C) us':>10} "
              f"{'2-shot us':>9} {'1-shot us':>9}")
        for r in rows:
            print(f"{r['tokens']:>6} {r['k']:>5} {r['n']:>6} {r['unfused_us']:>9.1f} {r['fused_us']:>9.1f} "
                  f"{r['matmul_us']:>8.1f} {r['all_reduce_us']:>10.1f} {r['two_shot_us']:>9.1f} "
                  f"{r['one_shot_us']:>9.1f}   2-shot max diff {r['two_shot_max_diff']:.3g}")
        with open(out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "world": world,
                       "rows": rows}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
