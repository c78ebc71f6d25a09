"""flash_attention against torch's scaled_dot_product_attention (reference.attention, and SDPA's own causal
mask for a whole prompt): lengths that are not multiples of the blocks, chunks after earlier chunks, GQA,
head_dim 8 (stories260K) and 128."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from llamafast.config import ModelConfig
from llamafast.bench.prefill_registry import PREFILL, flash_attention

from .common import DEVICE, DOT_DTYPES, SHAPES, tolerance

SPEC = PREFILL["flash_attention"]
_gpu = pytest.mark.gpu
# (M, pos): shorter than a block, odd, a chunk after a chunk, and on the GPU whole 7B-sized prompts.
LENGTHS = [(1, 0), (5, 3), (33, 0), (100, 28), pytest.param(1000, 0, marks=_gpu), pytest.param(509, 2048, marks=_gpu),
           pytest.param(4096, 0, marks=_gpu)]


@pytest.mark.parametrize("dtype", DOT_DTYPES, ids=str)
@pytest.mark.parametrize("config", SHAPES[:3])  # stories260K (D 8, GQA), odd (D 16, GQA), 7B (D 128)
@pytest.mark.parametrize("m,pos", LENGTHS)
def test_matches_reference(config, dtype, m, pos):
    args, kw = SPEC.make_inputs(config, dtype, DEVICE, m, pos)
    torch.testing.assert_close(SPEC.kernel(*args, **kw), SPEC.reference(*args, **kw), **tolerance(dtype))


@pytest.mark.parametrize("dtype", DOT_DTYPES, ids=str)
@pytest.mark.parametrize("m", [17, pytest.param(777, marks=_gpu)])
def test_whole_prompt_matches_sdpa_causal(dtype, m):
    """A prompt at position 0 with the cache exactly its length: SDPA's is_causal, no mask tensor involved."""
    c = ModelConfig(dim=512, n_layers=1, n_heads=8, n_kv_heads=2, vocab_size=32, max_seq_len=m)  # D 64
    q = torch.randn(m, c.n_heads, c.head_dim, device=DEVICE).to(dtype)
    k, v = (torch.randn(c.n_kv_heads, m, c.head_dim, device=DEVICE).to(dtype) for _ in range(2))
    want = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k[None], v[None], is_causal=True, enable_gqa=True)
    got = flash_attention(q, k, v, torch.zeros((), dtype=torch.long, device=DEVICE))
    torch.testing.assert_close(got, want[0].transpose(0, 1).reshape(m, -1), **tolerance(dtype))
