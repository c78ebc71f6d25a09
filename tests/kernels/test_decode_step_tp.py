"""The persistent decode step of a tensor-parallel rank (kernels/decode_step_tp.py): its synchronisation points as
waits on the peers' flags inside the kernel, against plain PyTorch's arithmetic of every rank's shard.

Every rank is simulated in one process, as tests/kernels/test_tp_sync.py does: each has its own parts and flags,
and the pointer tables hold all of their addresses. In the interpreter one program walks one rank's tasks, so the
other ranks' parts are written beforehand from the reference, with their arrivals on the flags; the rank's own
pushes must land in every peer's buffer and raise their flags, and each flag it consumed must be down again. On a
GPU two ranks also run at once, each on its own stream with half of the resident programs, for many steps."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from llamafast import reference
from llamafast.backends import build
from llamafast.config import MODEL_CONFIGS, Backend, Weight
from llamafast.kernels.decode_step import DecodeStep, LayerTensors, StepConfig
from llamafast.kernels.decode_step_plan import step_config
from llamafast.kernels.tp_sync import Peers
from llamafast.load.shard import Shard, random_shard
from llamafast.load.weights import random_state
from llamafast.model import rope_tables
from llamafast.quant import FP8Format, quantize
from llamafast.tp.comm import SymmComm

from .common import DEVICE, ODD, simulated_peers

ROOT = Path(__file__).resolve().parents[2]
# GQA 2:1 on each of 2 ranks (head_dim 24); F 200, 100 neurons a rank; K of wo 48 a rank.
SHAPE = dataclasses.replace(ODD, n_heads=4, n_kv_heads=2, n_layers=2)
EPS = 1e-5
BOUNDS = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 3e-2}


def rank_layers(config, world: int, rank: int, dtype, fp8: FP8Format | None, smax: int) -> list[LayerTensors]:
    """Random weights of one rank's shard (Megatron's: heads, neurons), seeded by rank, and zeroed caches."""
    gen = torch.Generator(device=DEVICE).manual_seed(rank)
    c, d = config.dim, config.head_dim
    hl, kvl, fl = config.n_heads // world, config.n_kv_heads // world, config.hidden_dim // world

    def w(n, k):
        t = torch.randn(n, k, device=DEVICE, generator=gen) * k ** -0.5 * (1 if n == c else world ** -0.5)
        if fp8 is None:
            return Weight(t.to(dtype))
        data, scale, _ = quantize(t, fp8)
        return Weight(data, scale, fp8.format)

    def cache():
        return torch.zeros(kvl, smax, d, device=DEVICE, dtype=dtype)

    def norm():
        return (1 + 0.1 * torch.randn(c, device=DEVICE, generator=gen)).to(dtype)

    return [LayerTensors(norm(), w((hl + 2 * kvl) * d, c), w(c, hl * d), norm(), w(fl, c), w(fl, c), w(c, fl),
                         cache(), cache()) for _ in range(config.n_layers)]


def reference_step(ranks: list[list[LayerTensors]], x, pos, cos, sin) -> tuple[torch.Tensor, list, dict]:
    """One token through every rank's shard: the whole model's output, each layer's h, and each slot's parts per
    rank (fp32), summed into the residual in rank order as the kernels sum them. Writes the ranks' caches."""
    dtype, parts, hs = x.dtype, {}, []

    def summed(residual, slot):
        out = residual.float()
        for p in parts[slot]:
            out = out + p
        return out.to(dtype)

    for layer in range(len(ranks[0])):
        ts = [layers[layer] for layers in ranks]
        atts = [reference.attention(reference.rmsnorm_qkv_rope(x, t.attn_norm, t.wqkv, cos, sin, pos, t.k_cache,
                                                               t.v_cache, EPS), t.k_cache, t.v_cache, pos)
                for t in ts]
        parts[2 * layer] = [a.float() @ reference.dense(t.wo, torch.float32).T for a, t in zip(atts, ts)]
        hs.append(summed(x, 2 * layer))
        ffs = [reference.rmsnorm_swiglu(hs[-1], t.ffn_norm, t.w1, t.w3, EPS) for t in ts]
        parts[2 * layer + 1] = [f.float() @ reference.dense(t.w2, torch.float32).T for f, t in zip(ffs, ts)]
        x = summed(hs[-1], 2 * layer + 1)
    return x, hs, parts


def steps_of(config, world, dtype, fp8, smax, cfg: StepConfig | None = None):
    """Each rank's layers and step, the reference's copies of the layers (its own caches), cos and sin."""
    cos, sin = rope_tables(config.head_dim, smax, config.rope_theta, DEVICE)
    ranks = [rank_layers(config, world, r, dtype, fp8, smax) for r in range(world)]
    twins = [[dataclasses.replace(t, k_cache=t.k_cache.clone(), v_cache=t.v_cache.clone()) for t in layers]
             for layers in ranks]
    peers = simulated_peers(world, 2 * config.n_layers + 1, config.dim)
    key = (config.dim, config.hidden_dim // world, 1 if fp8 else torch.empty(0, dtype=dtype).element_size())
    configs = None if cfg is None else {key: cfg}
    steps = [DecodeStep(ranks[r], cos, sin, config.n_heads // world, EPS, configs, peers=peers[r])
             for r in range(world)]
    return steps, twins, peers, cos, sin


def close(got: torch.Tensor, want: torch.Tensor, dtype) -> bool:
    return ((got.float() - want.float()).norm() / want.float().norm()).item() < BOUNDS[dtype]


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("dtype,fp8", [(torch.float32, None), (torch.float16, None),
                                       (torch.float32, FP8Format.e4m3)], ids=["fp32", "fp16", "e4m3"])
def test_a_rank_sums_its_peers_parts_and_pushes_its_own(rank, dtype, fp8):
    """Two steps of one rank of two, the other's parts and arrivals written beforehand: its output (the last
    layer's h and parts, which the LM head sums), its pushes in the peer's buffer, every flag and ticket."""
    world, n = 2, SHAPE.n_layers
    steps, twins, peers, cos, sin = steps_of(SHAPE, world, dtype, fp8, 8)
    other = 1 - rank
    gen = torch.Generator(device=DEVICE).manual_seed(7)
    for i in range(2):
        x = torch.randn(1, SHAPE.dim, device=DEVICE, generator=gen).to(dtype)
        pos = torch.tensor(i, device=DEVICE)
        want, hs, parts = reference_step(twins, x, pos, cos, sin)
        for slot in range(2 * n):  # the peer has pushed every slot and raised the flags
            peers[rank].parts[slot, other] = parts[slot][other]
        peers[rank].flags[: 2 * n, 0] = 1  # (the LM head lowered the last slot's in the step before)
        peers[other].flags.zero_()
        out = steps[rank](x, pos)
        assert close(out.residual, hs[-1], dtype)
        got = out.residual.float() + out.parts[0] + out.parts[1]
        assert close(got.to(dtype), want, dtype)
        for slot in range(2 * n):
            assert close(peers[other].parts[slot, rank], parts[slot][rank], dtype), slot
        assert peers[rank].flags[: 2 * n - 1].eq(0).all() and peers[rank].flags[2 * n - 1].tolist() == [2, 0]
        assert peers[other].flags[: 2 * n].tolist() == [[1, 0]] * (2 * n)
        assert peers[rank].counters.eq(0).all()
        for t, twin in zip(steps[rank].layers, twins[rank]):
            assert close(t.k_cache[:, : i + 1], twin.k_cache[:, : i + 1], dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("config,fp8", [
    pytest.param(dataclasses.replace(MODEL_CONFIGS["llama-2-7b"], n_layers=4), None, id="7b"),
    pytest.param(dataclasses.replace(MODEL_CONFIGS["llama-2-7b"], n_layers=4), FP8Format.e5m2, id="7b-e5m2"),
    pytest.param(dataclasses.replace(MODEL_CONFIGS["llama-2-70b"], n_layers=2), None, id="70b-gqa"),
])
def test_two_ranks_at_once_for_64_steps(config, fp8):
    """Both ranks of two on one GPU at once, each on its own stream with one program per SM (co-resident together),
    for 64 steps: each step's output against the reference, the two ranks' sums equal bit for bit, no watchdog."""
    world, dtype = 2, torch.bfloat16
    key = (config.dim, config.hidden_dim // world, 2 if fp8 is None else 1)
    cfg = dataclasses.replace(step_config({}, key), programs_per_sm=1)
    steps, twins, peers, cos, sin = steps_of(config, world, dtype, fp8, 128, cfg)
    streams = [torch.cuda.Stream() for _ in range(world)]
    gen = torch.Generator(device=DEVICE).manual_seed(7)
    errors = []
    for i in range(64):
        x = (torch.randn(1, config.dim, device=DEVICE, generator=gen) * 0.1).to(dtype)
        pos = torch.tensor(i, device=DEVICE)
        want = reference_step(twins, x, pos, cos, sin)[0]
        torch.cuda.synchronize()
        outs = []
        for step, stream in zip(steps, streams):
            with torch.cuda.stream(stream):
                outs.append(step(x, pos))
        torch.cuda.synchronize()
        sums = [(o.residual.float() + o.parts[0] + o.parts[1]).to(dtype) for o in outs]
        assert torch.equal(sums[0], sums[1]), i
        errors.append(((sums[0].float() - want.float()).norm() / want.float().norm()).item())
        for p in peers:  # what the LM head does with the last slot
            p.flags[2 * config.n_layers - 1].zero_()
    assert not any(s.check_watchdog() for s in steps)
    print(f"two ranks vs reference, bf16: max {max(errors):.2e}")
    assert max(errors) < BOUNDS[dtype], errors
    assert all(p.flags.eq(0).all() and p.counters.eq(0).all() for p in peers)


def simulated_symm(peers: Peers) -> SymmComm:
    """tp/comm.py's SymmComm on simulated peers: what a decode step uses of it (no process group)."""
    comm = object.__new__(SymmComm)
    comm.peers, comm.vocab_sharded, comm.rank, comm.world = peers, True, peers.rank, peers.world
    comm.barrier = lambda: None  # the ranks are one process
    return comm


def sharded_models_decode() -> None:
    """Two ranks' models (random_shard's slices of random_state's weights) on the persistent backend with symm's
    decode, each on its own stream: the persistent step, then the LM head's logits exchanged through the peers.
    Teacher forced over 32 tokens, the logits of both ranks equal bit for bit and within the bf16 bound of the
    whole model's on the reference backend.

    One process runs both ranks, so a kernel that one rank loads for the first time while the other's step spins
    waits for that step (CUDA loads kernels lazily, and a load may synchronize the context: the CUDA programming
    guide's "Lazy Loading"), which waits for the first rank: each rank first decodes once alone, every flag of its
    peer raised beforehand, so that every kernel is loaded before the ranks run at once."""
    config, world, dtype = dataclasses.replace(MODEL_CONFIGS["llama-2-7b"], n_layers=2), 2, torch.bfloat16
    whole = build(config, random_state(config, DEVICE, dtype), Backend.reference)
    ranks = [build(config, random_shard(config, Shard(r, world), DEVICE, dtype), Backend.persistent,
                   shard=Shard(r, world)) for r in range(world)]
    peers = simulated_peers(world, 2 * config.n_layers + 1, config.dim, config.vocab_size)
    key = (config.dim, config.hidden_dim // world, 2)
    for model, p in zip(ranks, peers):
        model.comm = simulated_symm(p)
        launches = model.backend.launches["decode_step"]  # one program per SM: both grids resident at once
        launches[key] = dataclasses.replace(step_config(launches, key), programs_per_sm=1)
    tokens = torch.randint(0, config.vocab_size, (32,), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    streams = [torch.cuda.Stream() for _ in range(world)]
    errors = []
    with torch.no_grad():
        for m in (whole, *ranks):
            m.setup_cache(len(tokens))
        for model, p in zip(ranks, peers):  # alone: the peer's arrivals are already on every flag
            p.flags[:, 0] = 1
            model(tokens[:1], torch.tensor(0, device=DEVICE)).clone()
            torch.cuda.synchronize()
        for p in peers:
            p.flags.zero_()
        for i in range(len(tokens)):
            pos = torch.tensor(i, device=DEVICE)
            want = whole(tokens[i: i + 1], pos)
            torch.cuda.synchronize()
            got = []
            for model, stream in zip(ranks, streams):
                with torch.cuda.stream(stream):
                    got.append(model(tokens[i: i + 1], pos).clone())
            torch.cuda.synchronize()
            assert torch.equal(got[0], got[1]), i
            errors.append(((got[0] - want).norm() / want.norm()).item())
    assert not any(m._decode_step[1].check_watchdog() for m in ranks)
    print(f"sharded persistent vs whole reference, bf16: max {max(errors):.2e}")
    assert max(errors) < BOUNDS[dtype], errors


@pytest.mark.gpu
def test_sharded_models_decode_as_the_whole_model():
    """sharded_models_decode in a process of its own, which a time limit ends: a wait that never ends (the LM
    head's wait for its peers has no watchdog) fails the test instead of holding the GPU."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", "from tests.kernels.test_decode_step_tp import sharded_models_decode; "
                           "sharded_models_decode()"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    print(done.stdout[-2000:])
    assert done.returncode == 0, done.stderr[-3000:]
