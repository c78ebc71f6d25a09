"""decode_attention against reference.attention (SDPA over the masked cache), at lengths around the split
and block sizes, with GQA groups of 1, 2, 3 and 8."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from llamafast.config import ModelConfig
from llamafast.measure.registry import REGISTRY
from llamafast.kernels.decode_attention import AttentionConfig, attention_config

from .common import DEVICE, DOT_DTYPES, SHAPES, tolerance

SPEC = REGISTRY["decode_attention"]
SMAX = 600  # the cache's positions in these tests


@pytest.mark.parametrize("dtype", DOT_DTYPES, ids=str)
@pytest.mark.parametrize("config", SHAPES)
@pytest.mark.parametrize("where", ["first", "block-1", "block+1", "split", "split+3", "2splits+block+5", "full"])
def test_matches_reference(config, dtype, where):
    """Lengths at and around the block and split edges of the launch this shape gets."""
    cfg = attention_config(config.n_kv_heads, config.n_heads // config.n_kv_heads)
    b, s = cfg.block_s, cfg.split_len(SMAX)
    length = {"first": 1, "block-1": b - 1, "block+1": b + 1, "split": s, "split+3": s + 3,
              "2splits+block+5": 2 * s + b + 5, "full": SMAX}[where]
    (q, k_cache, v_cache, _), _ = SPEC.make_inputs(config, dtype, DEVICE, SMAX)
    pos = torch.tensor(min(length, SMAX) - 1, device=DEVICE)
    torch.testing.assert_close(SPEC.kernel(q, k_cache, v_cache, pos), SPEC.reference(q, k_cache, v_cache, pos),
                               **tolerance(dtype))


def test_ignores_positions_past_length(tiny_config):
    (q, k_cache, v_cache, _), _ = SPEC.make_inputs(tiny_config, torch.float32, DEVICE, 64)
    pos = torch.tensor(20, device=DEVICE)
    out = SPEC.kernel(q, k_cache, v_cache, pos)
    k_cache[:, 21:] = float("nan")  # garbage beyond the current length must not leak in
    v_cache[:, 21:] = float("nan")
    torch.testing.assert_close(SPEC.kernel(q, k_cache, v_cache, pos), out, atol=0, rtol=0)


@pytest.mark.parametrize("config", SHAPES)
@pytest.mark.parametrize("where", ["first", "2splits+block+5", "full"])
def test_merge_by_the_last_split_matches_reference(config, where):
    """The merge done by each KV head's last split program, twice in a row through the same tickets, which every
    call leaves at zero."""
    from llamafast.kernels.decode_attention import tickets

    cfg = attention_config(config.n_kv_heads, config.n_heads // config.n_kv_heads)
    length = {"first": 1, "2splits+block+5": 2 * cfg.split_len(SMAX) + cfg.block_s + 5, "full": SMAX}[where]
    (q, k_cache, v_cache, _), _ = SPEC.make_inputs(config, torch.float32, DEVICE, SMAX)
    pos = torch.tensor(min(length, SMAX) - 1, device=DEVICE)
    want = SPEC.reference(q, k_cache, v_cache, pos)
    for _ in range(2):
        torch.testing.assert_close(SPEC.kernel(q, k_cache, v_cache, pos), want,
                                   **tolerance(torch.float32))
        assert not tickets(q.device, config.n_kv_heads).any()


@pytest.mark.parametrize("dtype", DOT_DTYPES, ids=str)
@pytest.mark.parametrize("config", SHAPES)
@pytest.mark.parametrize("where", ["first", "block+1", "min-split+1", "splits*min-split+5", "full"])
def test_splits_cut_from_the_length_match_reference(config, dtype, where):
    """A launch with min_split: the current length cut into the grid's splits of at least min_split positions,
    at lengths that use one split, two, more than the grid has at min_split (so the splits grow), and all, twice
    through the merge's tickets."""
    from llamafast.kernels.decode_attention import tickets

    kvh, group = config.n_kv_heads, config.n_heads // config.n_kv_heads
    cfg = attention_config(kvh, group)
    cut = dataclasses.replace(cfg, min_split=2 * cfg.block_s)
    n_splits = -(-SMAX // cfg.split_len(SMAX))
    length = {"first": 1, "block+1": cfg.block_s + 1, "min-split+1": cut.min_split + 1,
              "splits*min-split+5": n_splits * cut.min_split + 5, "full": SMAX}[where]
    (q, k_cache, v_cache, _), _ = SPEC.make_inputs(config, dtype, DEVICE, SMAX)
    pos = torch.tensor(min(length, SMAX) - 1, device=DEVICE)
    want = SPEC.reference(q, k_cache, v_cache, pos)
    for _ in range(2):
        got = SPEC.kernel(q, k_cache, v_cache, pos, configs={(kvh, group): cut})
        torch.testing.assert_close(got, want, **tolerance(dtype))
        assert not tickets(q.device, kvh).any()


@pytest.mark.parametrize("config", SHAPES)
@pytest.mark.parametrize("where", ["first", "2splits+block+5", "full"])
def test_under_pdl_matches_reference(config, where):
    """A launch under programmatic dependent launch (AttentionConfig.pdl; on the CPU, which lacks it, the plain
    launch), twice through the merge's tickets."""
    from llamafast.kernels.decode_attention import tickets

    kvh, group = config.n_kv_heads, config.n_heads // config.n_kv_heads
    cfg = dataclasses.replace(attention_config(kvh, group), pdl=True)
    length = {"first": 1, "2splits+block+5": 2 * cfg.split_len(SMAX) + cfg.block_s + 5, "full": SMAX}[where]
    (q, k_cache, v_cache, _), _ = SPEC.make_inputs(config, torch.float32, DEVICE, SMAX)
    pos = torch.tensor(min(length, SMAX) - 1, device=DEVICE)
    want = SPEC.reference(q, k_cache, v_cache, pos)
    for _ in range(2):
        got = SPEC.kernel(q, k_cache, v_cache, pos, configs={(kvh, group): cfg})
        torch.testing.assert_close(got, want, **tolerance(torch.float32))
        assert not tickets(q.device, kvh).any()


# Groups the CPU shapes lack: Llama-2-70B's 8 query heads a KV head and SmolLM2's 3, head_dim 64 and 128 (so a
# merge takes 8 splits a load), and Llama-2-7B's 1 (its own merge, of one head).
GROUPS = [pytest.param(ModelConfig(dim=512, n_layers=1, n_heads=4, n_kv_heads=4, vocab_size=64, max_seq_len=SMAX),
                       id="group1"),
          pytest.param(ModelConfig(dim=1536, n_layers=1, n_heads=24, n_kv_heads=3, vocab_size=64,
                                   max_seq_len=SMAX), id="group8"),
          pytest.param(ModelConfig(dim=1152, n_layers=1, n_heads=9, n_kv_heads=3, vocab_size=64,
                                   max_seq_len=SMAX), id="group3")]


@pytest.mark.parametrize("config", GROUPS)
@pytest.mark.parametrize("used", [1, 2, "chunk+1", "all"])
def test_merge_of_every_head_of_a_group_matches_reference(config, used):
    """The merge loads every head of the group and merge_blocks' chunk of splits at once (a group of one: every
    split): lengths that use one split, two, one more than a chunk, and all (fp32, 32-position splits)."""
    from llamafast.kernels.attention_merge import merge_blocks
    from llamafast.kernels.decode_attention import tickets

    kvh, group = config.n_kv_heads, config.n_heads // config.n_kv_heads
    launch = AttentionConfig(n_splits=32, block_s=16, num_warps=2)
    split = launch.split_len(SMAX)
    every = -(-SMAX // split)
    chunk = merge_blocks(group, config.head_dim, every)[1]
    if used == "chunk+1":
        if group == 1:
            pytest.skip("a group of one merges its splits in one load")
        assert chunk + 1 < every
    splits = {1: 1, 2: 2, "chunk+1": chunk + 1, "all": every}[used]
    (q, k_cache, v_cache, _), _ = SPEC.make_inputs(config, torch.float32, DEVICE, SMAX)
    pos = torch.tensor(min(SMAX, (splits - 1) * split + 3) - 1, device=DEVICE)
    want = SPEC.reference(q, k_cache, v_cache, pos)
    for _ in range(2):
        got = SPEC.kernel(q, k_cache, v_cache, pos, configs={(kvh, group): launch})
        torch.testing.assert_close(got, want, **tolerance(torch.float32))
        assert not tickets(q.device, kvh).any()
