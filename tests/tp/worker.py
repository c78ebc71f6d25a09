"""Run by tests/tp/test_tp_run.py under torchrun (gloo on the CPU; NCCL and symmetric memory on GPUs): each rank
loads its shard and the whole model, runs the same prompt and decode steps through both (on GPUs the shard's prompt
also replayed from its prompt graph), and writes what it saw to OUT/rank{R}.pt for the test to compare.

    torchrun --standalone --nproc-per-node N tests/tp/worker.py OUT MODEL|shape:NAME STEPS COMM [DTYPE]
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from llamafast.backends import with_backend
from llamafast.config import Backend, DType, SamplingConfig, TPComm
from llamafast.generate import Engine, stream_tokens
from llamafast.load import load_model, random_model
from llamafast.prompt_graph import bucket
from llamafast.tp.comm import make_comm
from llamafast.tp.dist import finish, setup


def main(out: Path, source: str, steps: int, comm: str, dtype: str = "float32") -> None:
    ranks = setup(None)
    dev = ranks.device
    backend = Backend.triton if dev.type == "cuda" else Backend.reference

    def loaded(shard):
        if source.startswith("shape:"):
            return random_model(source[6:], dev, DType(dtype), backend, shard=shard)
        return load_model(Path(source), None, dev, DType(dtype), backend, shard=shard)

    sharded, whole = loaded(ranks.shard), loaded(None)
    config = whole.model.config
    sharded.model.comm, note = make_comm(TPComm(comm), ranks, config, ranks.shard.vocab_sharded(config),
                                         sharded.model.backend.step)
    prompt = [1] + torch.randint(3, config.vocab_size, (15,), generator=torch.Generator().manual_seed(0)).tolist()
    record = {"note": note, "comm": sharded.model.comm.name.value}
    for name, lm in (("tp", sharded), ("one", whole)):  # greedy, decode steps replayed from graphs on GPUs
        record[f"{name}_tokens"] = list(stream_tokens(Engine(lm.model, SamplingConfig(temperature=0),
                                                             len(prompt) + steps), prompt, steps))
    # Logits, each model fed TP=1's greedy tokens; the reference backend on the same whole weights shows what a
    # different summation order alone changes (the yardstick for bf16), and the reference with nccl's roundings
    # what summing rounded partials changes.
    reference = with_backend(whole.model, Backend.reference)
    for name, model in (("tp", sharded.model), ("one", whole.model), ("ref", reference)):
        record[f"{name}_logits"] = step_logits(model, prompt, record["one_tokens"][: steps - 1])
    reference.comm = RoundedPartials(ranks.shard.world)
    record["rounded_logits"] = step_logits(reference, prompt, record["one_tokens"][: steps - 1])
    if dev.type == "cuda":
        record["prompt_runs"], record["prompt_graphs"] = prompt_runs(sharded.model, prompt)
    torch.manual_seed(1234)
    sampler = Engine(sharded.model, SamplingConfig(temperature=0.9, top_p=0.95), len(prompt) + steps)
    record["sampled"] = list(stream_tokens(sampler, prompt, steps))
    torch.save(record, out / f"rank{ranks.shard.rank}.pt")
    dist.barrier()  # leave together: a rank exiting with live gloo threads aborts ("terminate called without...")
    finish(ranks)  # with sampler's decode graph alive, as a CLI run's engine is


class RoundedPartials:
    """The whole model's arithmetic with the roundings of the nccl path, on one process: wo's and w2's products
    split by columns as the ranks split them, each rank's partial (rank 0's with the residual) rounded to the
    activation dtype, then summed in it, as the all-reduce sums them."""

    name = TPComm.nccl

    def __init__(self, world: int):
        self.world = world

    def row_linear(self, ops, x, w, residual, slot):
        k = x.shape[-1] // self.world
        parts = [ops.linear_residual(x[..., r * k:(r + 1) * k].contiguous(),
                                     dataclasses.replace(w, data=w.data[:, r * k:(r + 1) * k].contiguous()),
                                     residual if r == 0 else torch.zeros_like(residual)) for r in range(self.world)]
        return functools.reduce(torch.add, parts)

    def lm_head(self, ops, x, norm_w, w, eps, slot):
        return ops.rmsnorm_lm_head(x, norm_w, w, eps)


@torch.no_grad()
def prompt_runs(model, prompt: list[int]) -> tuple[list[torch.Tensor], list[int]]:
    """The prompt's last logits from one engine four times: eagerly, eagerly padded to its bucket and captured,
    then replayed from that prompt graph twice; and the buckets captured."""
    engine = Engine(model, SamplingConfig(temperature=0), max(bucket(len(prompt)), len(prompt) + 1))
    ids = torch.tensor(prompt, device=model.tok_embeddings.weight.device)
    return [engine.prompt_logits(ids).float().cpu() for _ in range(4)], sorted(engine.prompts.graphs)


@torch.no_grad()
def step_logits(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """(1 + len(tokens), V) fp32: the prompt's last logits, then each decode step's, run eagerly."""
    dev = model.tok_embeddings.weight.device
    model.setup_cache(len(prompt) + len(tokens) + 1)
    rows = [model(torch.tensor(prompt, device=dev), torch.tensor(0, device=dev))[0].float().cpu()]
    for i, token in enumerate(tokens):
        pos = torch.tensor(len(prompt) + i, device=dev)
        rows.append(model(torch.tensor([token], device=dev), pos)[0].float().cpu())
    return torch.stack(rows)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4], *sys.argv[5:])
