"""sparse_ffn (sparse_select + the gather-scatter kernel) against reference.sparse_ffn.

The kernel scores groups in fp32 where the reference rounds norm(x) to the model dtype first, so a group whose
score sits on the threshold may be decided differently; the tests therefore check the decisions away from the
threshold, and the output against the reference FFN over the groups the kernel chose."""

from __future__ import annotations

import pytest
import torch
from llamafast.kernels import sparse_ffn

from llamafast import reference
from llamafast.measure.registry import rand, transposed, weight
from llamafast.config import MODEL_CONFIGS, ModelConfig, SparseMode, Weight, WeightFormat, sparse_work_size
from llamafast.sparse.blocks import W2T_BLOCKS

from .common import BLOCKS, DEVICE, FP8, K_QUANTS, ON_GPU, tolerance

gpu = pytest.mark.gpu
# (config, group size): odd group counts (C = 96 is no power of two; 200 / 8 = 25 groups, 172 / 4 = 43)
SHAPES = [
    pytest.param(ModelConfig(dim=96, n_layers=1, n_heads=6, hidden_dim=200), 8, id="odd-25x8"),
    pytest.param(MODEL_CONFIGS["stories260K"], 4, id="stories260K-43x4"),
    *[pytest.param(MODEL_CONFIGS[n], 32, id=n, marks=gpu) for n in ("llama-2-7b", "llama-2-13b")],
]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Block weights: gate and up in each format, w2t in Q8_0 along C (llamafast/sparse/blocks.py); C a multiple of 32
# (96), of 256 for the K-quants (dim 256: 24 groups of 32), 7B's and SmolLM2's shapes on the GPU.
K256 = ModelConfig(dim=256, n_layers=1, n_heads=4, hidden_dim=768)
BLOCK_SPARSE = [
    *[pytest.param(SHAPES[0].values[0], 8, fmt, id=f"odd-25x8-{fmt.value}") for fmt in BLOCKS],
    *[pytest.param(K256, 32, fmt, id=f"k256-{fmt.value}") for fmt in K_QUANTS],
    *[pytest.param(MODEL_CONFIGS[n], 32, fmt, id=f"{n}-{fmt.value}", marks=gpu)
      for n, fmts in (("llama-2-7b", BLOCKS + K_QUANTS), ("smollm2-135m", BLOCKS)) for fmt in fmts],
]


def inputs(c: ModelConfig, g: int, dtype, fp8, mode, threshold):
    f, n = c.hidden_dim, c.hidden_dim // g
    x, norm_w = rand(1, c.dim, dtype=dtype, device=DEVICE), rand(c.dim, dtype=dtype, device=DEVICE, scale=0.2) + 1
    w1, w3 = (weight(f, c.dim, dtype, DEVICE, fp8) for _ in range(2))
    w2t = transposed(rand(c.dim, f, dtype=dtype, device=DEVICE, scale=f**-0.5), fp8)
    router_w = rand(n, c.dim, dtype=dtype, device=DEVICE, scale=c.dim**-0.5)
    router_b = torch.randn(n, device=DEVICE) * 0.5
    work = torch.zeros(sparse_work_size(n), dtype=torch.int32, device=DEVICE)
    thr = torch.tensor([threshold], device=DEVICE, dtype=torch.float32)
    args = (x, norm_w, w1, w3, w2t, router_w, router_b, thr, work, c.norm_eps, g, mode)
    return args, {}


def scores(args, kw):
    """fp32 scores the way the kernel computes them: router sigmoid, or the group's |SiLU(gate)| mass."""
    x, norm_w, w1, _, _, router_w, router_b, _, _, eps, g, mode = args
    xf = x.float()
    h = xf * torch.rsqrt(xf.pow(2).mean() + eps) * norm_w.float()
    if mode == SparseMode.router:
        return torch.sigmoid(h @ router_w.float().T + router_b)[0]
    (gate,) = reference.normed_products(xf, norm_w, eps, w1)  # int8 activations where w1 takes them
    return torch.nn.functional.silu(gate)[0].abs().unflatten(0, (-1, g)).sum(-1)


def run(args, kw):
    work = args[8]
    out = sparse_ffn(*args, **kw)
    count = int(work[0])
    n = args[2].shape[0] // args[10]  # w1's rows / group size
    active = torch.zeros(n, dtype=torch.bool, device=DEVICE)
    active[work[4 : 4 + count].long()] = True
    return out, active


def with_groups(args, kw, active):
    """The reference FFN over exactly these groups (a router whose scores are 1 for them, 0 elsewhere)."""
    x, norm_w, w1, w3, w2t, router_w, _, _, work, eps, g, _ = args
    bias = torch.where(active, 50.0, -50.0).to(DEVICE)
    zero_router = torch.zeros_like(router_w, dtype=x.dtype)
    thr = torch.tensor([0.5], device=DEVICE)
    return reference.sparse_ffn(x, norm_w, w1, w3, w2t, zero_router, bias, thr, work.clone(), eps, g,
                                SparseMode.router, **kw)


def median_threshold(args, kw):
    s = scores(args, kw).sort().values
    return float(s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


@pytest.mark.parametrize("mode", list(SparseMode), ids=str)
@pytest.mark.parametrize("fp8", FP8, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("config,g", SHAPES)
def test_matches_reference(config, g, dtype, fp8, mode):
    check_matches_reference(config, g, dtype, fp8, mode)


def check_matches_reference(config, g, dtype, fp8, mode):
    args, kw = inputs(config, g, dtype, fp8, mode, 0.0)
    args[7].fill_(median_threshold(args, kw))  # about half the groups
    out, active = run(args, kw)
    s, thr = scores(args, kw), float(args[7])
    clear = (s - thr).abs() > 1e-2 * max(thr, 1e-3)
    assert torch.equal(active[clear], (s > thr)[clear]), "decisions away from the threshold"
    assert 0 < int(active.sum()) < active.numel()
    # The oracle in fp32: in the model dtype the reference rounds the FFN's sum before adding x, which where x and
    # the FFN cancel is a rounding step of a term near 4, past bf16's atol (an H100: 0.0168 at an output of 0.016,
    # odd-25x8 bf16 E4M3). The kernel adds in fp32 and rounds once.
    exact = with_groups((args[0].float(), args[1].float(), *args[2:]), kw, active)
    torch.testing.assert_close(out.float(), exact, **tolerance(dtype))


@pytest.mark.parametrize("mode", list(SparseMode), ids=str)
@pytest.mark.parametrize("config,g,fmt", BLOCK_SPARSE)
def test_block_weights_match_reference(config, g, fmt, mode):
    """Gate and up dequantized in registers against int8 activations, w2t's Q8_0 against float h: the reference
    (int8 activations as the kernels round them) over the groups the kernel chose."""
    check_matches_reference(config, g, torch.float16, fmt, mode)


@pytest.mark.parametrize("config,g,fmt", BLOCK_SPARSE)
def test_block_weights_every_group_is_the_dense_ffn(config, g, fmt):
    check_every_group_is_the_dense_ffn(config, g, fmt)


@pytest.mark.parametrize("mode", list(SparseMode), ids=str)
@pytest.mark.parametrize("config,g", SHAPES)
def test_no_group_gives_the_residual(config, g, mode):
    args, kw = inputs(config, g, torch.float16, None, mode, 1e9)
    out, active = run(args, kw)
    assert not active.any()
    torch.testing.assert_close(out, args[0], rtol=0, atol=0)


@pytest.mark.parametrize("fp8", FP8, ids=str)
@pytest.mark.parametrize("config,g", SHAPES)
def test_every_group_is_the_dense_ffn(config, g, fp8):
    check_every_group_is_the_dense_ffn(config, g, fp8)


def check_every_group_is_the_dense_ffn(config, g, fp8):
    dtype = torch.float16
    args, kw = inputs(config, g, dtype, fp8, SparseMode.router, -1.0)
    out, active = run(args, kw)
    assert active.all()
    x, norm_w, w1, w3, w2t, *_ = args
    f = reference.rmsnorm_swiglu(x, norm_w, w1, w3, args[9])
    dense = reference.linear_residual_t(f, w2t, x)
    torch.testing.assert_close(out, dense, **tolerance(dtype))


@pytest.mark.parametrize("config,g", SHAPES)
def test_same_bits_every_run(config, g):
    """The partial rows are summed in a fixed order: no atomics, the same bits on every run."""
    args, kw = inputs(config, g, torch.float32, None, SparseMode.router, 0.0)
    args[7].fill_(median_threshold(args, kw))
    first, _ = run(args, kw)
    for _ in range(3):
        assert torch.equal(run(args, kw)[0], first)


@pytest.mark.parametrize("config,g", SHAPES)
def test_counters_and_list(config, g):
    """count, the ascending id list, and the running totals match the reference's bookkeeping, call after call
    (on the GPU this checks the last-program compaction's memory ordering under many concurrent programs)."""
    args, kw = inputs(config, g, torch.float32, None, SparseMode.router, 0.0)
    levels = scores(args, kw).sort().values
    work, ref_work = args[8], torch.zeros_like(args[8])
    ref_args = (*args[:8], ref_work, *args[9:])
    for i in range(20 if ON_GPU else 3):
        k = (7 * i + 3) % (len(levels) - 1)
        args[7].fill_(float(levels[k] + levels[k + 1]) / 2)
        run(args, kw)
        reference.sparse_ffn(*ref_args, **kw)
        count = int(work[0])
        assert count == len(levels) - 1 - k
        assert torch.equal(work[4 : 4 + count], ref_work[4 : 4 + count])
    count = int(work[0])
    assert work[1] == 0, "the ticket is reset for the next call"
    assert torch.equal(work[:1], ref_work[:1]) and torch.equal(work[2:4], ref_work[2:4])
    assert torch.equal(work[4 : 4 + count], ref_work[4 : 4 + count])


@pytest.mark.parametrize("mode", list(SparseMode), ids=str)
def test_bench_inputs_skip_half(mode):
    """bench --kernels times exactly what its byte count assumes: n - round(n / 2) groups run."""
    from llamafast.measure.registry import REGISTRY

    config = ModelConfig(dim=96, n_layers=1, n_heads=6, hidden_dim=200)  # 25 groups of 8
    args, kw = REGISTRY[f"sparse_ffn[{mode.value} 0.5]"].make_inputs(config, torch.float32, DEVICE, 1, None)
    out, active = run(args, kw)
    assert int(active.sum()) == 25 - round(25 / 2)
    torch.testing.assert_close(out, reference.sparse_ffn(*args[:8], args[8].clone(), *args[9:], **kw),
                               **tolerance(torch.float32))


@pytest.mark.parametrize("mode", list(SparseMode), ids=str)
def test_bench_inputs_of_block_weights(mode):
    """bench --kernels and tune.py sparse on block weights: gate and up in Q4_0, W2t in Q8_0, against the reference,
    and a byte count that is the tensors' the run reads (whole rows of blocks with their scales)."""
    from llamafast.measure.registry import REGISTRY

    spec = REGISTRY[f"sparse_ffn[{mode.value} 0.5]"]
    config = ModelConfig(dim=96, n_layers=1, n_heads=6, hidden_dim=200)  # 25 groups of 8
    args, kw = spec.make_inputs(config, torch.float16, DEVICE, 1, WeightFormat.q4_0)
    x, _, w1, w3, w2t, router_w = args[:6]
    assert (w1.fmt, w3.fmt, w2t.fmt) == (WeightFormat.q4_0, WeightFormat.q4_0, W2T_BLOCKS)
    out, active = run(args, kw)
    exact = reference.sparse_ffn(x.float(), args[1].float(), w1, w3, w2t, router_w.float(), *args[6:8],
                                 args[8].clone(), *args[9:], **kw)
    torch.testing.assert_close(out.float(), exact, **tolerance(torch.float16))  # the fp32 oracle, as above
    rows = int(active.sum()) * 8

    def stored(w: Weight) -> int:  # its blocks with their scales
        return w.data.nbytes + w.scale.nbytes

    def running(w: Weight) -> int:  # the running groups' rows
        return stored(w) // 200 * rows

    select = router_w.nbytes + 4 * 25 if mode == SparseMode.router else stored(w1)
    gate_up = running(w1) + running(w3) if mode == SparseMode.router else running(w3)
    read = select + gate_up + running(w2t) + x.nbytes + 4 * 96
    assert spec.bytes_moved(config, torch.float16, 1, WeightFormat.q4_0) == read
