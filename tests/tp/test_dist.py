"""llamafast/tp/dist.py's teardown: the CUDA graphs captured under tensor parallelism are reset before the process
group is destroyed (NCCL's destroy waits forever on a graph that captured its collectives)."""

from __future__ import annotations

import gc

import torch

from llamafast.load.shard import Shard
from llamafast.tp import dist


class Graph:
    def __init__(self, events: list[str]):
        self.events = events

    def reset(self) -> None:
        self.events.append("reset")


def test_finish_resets_held_graphs_before_leaving(monkeypatch):
    events: list[str] = []
    monkeypatch.setattr(dist.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist.dist, "destroy_process_group", lambda: events.append("destroy"))
    held, gone = Graph(events), Graph(events)
    dist.hold_graph(held)
    dist.hold_graph(gone)
    del gone  # its owner freed it: nothing is left to reset
    gc.collect()
    dist.finish(dist.Ranks(Shard(0, 2), torch.device("cpu"), None, None))
    assert events == ["reset", "destroy"]
    assert not dist._GRAPHS
