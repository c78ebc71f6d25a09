"""End-to-end decode benchmark: every backend on the same weights, in one process, against the copy
bandwidth measured in the same run. Returns data; the CLI prints it.

Achieved GB/s counts the bytes a decode step must read (every weight once, the embedding table one row,
the KV cache up to the current position) over the measured time per token, the way gpt-fast reports
"bandwidth achieved", with the KV cache added.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import asdict, dataclass, field

import torch

from llamafast.measure.common import copy_bandwidth, environment, now, random_prompt
from llamafast.config import Backend, SamplingConfig, SparseLayout, SparseRun, Weight
from llamafast.generate import Engine, stream_tokens
from llamafast.backends import with_backend
from llamafast.load import LoadedModel


GREEDY = SamplingConfig(temperature=0)  # every figure in docs/ unless it says otherwise


@dataclass
class BackendResult:
    backend: str
    weights: str  # "bfloat16", "fp8_e5m2", ...
    startup_s: float  # first (warm-up) generation: compilation, graph capture
    ttft_ms: float  # prompt in, first new token on the host, as any prompt after the first of its length runs
    prefill_tokens_per_s: float
    decode_tokens: int
    decode_tokens_per_s: float
    decode_ms_per_token: float
    bytes_per_token: float  # weights + average KV read per decode step
    achieved_gb_s: float
    fraction_of_copy_bw: float
    peak_memory_gb: float | None
    sparsity: float | None = None  # sparse FFN runs: the sparsity asked for, the mode, the share of groups skipped
    sparse_mode: str | None = None
    groups_skipped: float | None = None
    speedup: float | None = None  # decode tok/s over the dense triton run (tensor parallel: the nccl run) of the same weights
    tp: int = 1  # tensor-parallel ranks; the bytes and GB/s are one rank's (one GPU's)
    tp_comm: str | None = None
    vs_tp1: float | None = None  # tensor parallel: decode tok/s over the TP=1 run of the same backend and weights


@dataclass
class BenchReport:
    model: str
    format: str
    dtype: str
    params: int
    prompt_tokens: int
    new_tokens: int
    context: int  # KV cache positions each run holds
    load_s: float
    copy_bw_gb_s: float  # device-to-device copy, bytes read + written, measured in this run
    environment: dict = field(default_factory=dict)
    results: list[BackendResult] = field(default_factory=list)
    sampling: SamplingConfig = field(default_factory=lambda: GREEDY)  # how every run picked its tokens

    def to_dict(self) -> dict:
        return asdict(self)


def bench_backend(lm: LoadedModel, backend: Backend, prompt: list[int], new_tokens: int, comm=None,
                  sampling: SamplingConfig = GREEDY, context: int | None = None) -> BackendResult:
    """One backend on lm's weights: a warm-up, then prompt and new_tokens timed, with a KV cache of context
    positions (default: the prompt plus the new tokens)."""
    device = lm.model.tok_embeddings.weight.device
    model = with_backend(lm.model, backend)
    if comm is not None:
        model.comm = comm
    engine = Engine(model, sampling, context or len(prompt) + new_tokens)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = now(device)
    _run(engine, prompt, min(new_tokens, 8))  # warm-up: compile, capture the decode graph
    startup = now(device) - t0
    _run(engine, prompt, 1)  # the prompt's bucket captured (a bucket's first prompt runs eagerly: prompt_graph.py)
    t0 = now(device)
    stamps = [time.perf_counter() for _ in stream_tokens(engine, prompt, new_tokens)]
    ttft, decode_s = stamps[0] - t0, stamps[-1] - stamps[0]
    n = new_tokens - 1  # decode steps timed: each feeds the token at position len(prompt) + i
    kv = model.kv_bytes_per_position() * (len(prompt) + (n + 1) / 2)  # mean context read per step
    skipped = model.groups_skipped()
    per_token = model.weight_bytes_per_token() - _skipped_bytes(model, skipped or 0.0) + kv
    tps = n / decode_s if n else float("nan")
    gb_s = per_token * tps / 1e9
    peak = torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None
    sparse = model.sparse
    return BackendResult(
        backend.value, lm.weights, startup, ttft * 1e3, len(prompt) / ttft, n, tps, 1e3 / tps, per_token, gb_s, 0.0,
        peak, sparse and sparse.sparsity, sparse and sparse.mode.value, skipped, None, model.world,
        comm and comm.name.value,
    )


def _params(model) -> int:
    """The model's weights, counted in weights: a block-format tensor's packed nibbles and block scales as the
    weights they hold (the first model may be a block copy alone), shared tensors and a tied head once."""
    blocks = {name.removesuffix(".weight") for name, fmt in model.tensor_formats.items() if fmt.is_block}
    seen, total = set(), 0
    for name, p in model.named_parameters(remove_duplicate=False):
        module, _, kind = name.rpartition(".")
        if p.data_ptr() in seen or (module in blocks and kind == "scale") or (model.tied and module == "output"):
            continue
        seen.add(p.data_ptr())
        if module in blocks:
            n, k = Weight(p, model.get_submodule(module).scale, model.get_submodule(module).fmt).shape
            total += n * k
        else:
            total += p.numel()
    return total


def _run(engine: Engine, prompt: list[int], n: int) -> None:
    for _ in stream_tokens(engine, prompt, n):
        pass


def _skipped_bytes(model, skipped: float) -> int:
    """Weight bytes a decode step did not read: the skipped share of the FFN rows that the mode can skip (W1, W3
    and W2t in router mode; W3 and W2t in gate mode, which also never reads the router), block scales included."""
    if model.sparse is None:
        return 0
    router = model.sparse.mode.value == "router"
    total = 0
    for layer in model.layers:
        ff = layer.feed_forward
        parts = [ff.w3, ff.w2t] + ([ff.w1] if router else [])
        total += skipped * sum(p.weight.nbytes + (p.scale.nbytes if p.fmt.is_block else 0) for p in parts)
        if not router:
            total += ff.router.weight.nbytes + ff.router_bias.nbytes
        total += ff.thresholds.nbytes  # read on the host when the sparsity is set, not per token
    return int(total)


def sparse_pair(lm: LoadedModel, group_size: int) -> tuple[LoadedModel, LoadedModel]:
    """(dense, sparse) twins sharing every weight they can: a dense model gets exact-sparsity routers and a
    transposed copy of w2 (llamafast.sparse.exact_sparse_state; Q8_0 for block weights); a sparsified one a dense
    copy of w2t (dense_state)."""
    from llamafast.backends import build
    from llamafast.sparse import dense_state, exact_sparse_state
    from llamafast.sparse.blocks import sparse_formats

    model, t0 = lm.model, time.perf_counter()
    if model.layout is None:
        layout = SparseLayout(group_size)
        formats = model.tensor_formats
        state = exact_sparse_state(model.config, model.state_dict(), layout, formats)
        twin = build(model.config, state, lm.backend, *model.weight_formats, layout, formats=sparse_formats(formats))
        return lm, LoadedModel(twin, lm.tokenizer, lm.backend, lm.format, lm.source, time.perf_counter() - t0, lm.weights)
    formats = model.tensor_formats
    dense_formats = {n.replace(".w2t.", ".w2."): f for n, f in formats.items() if f.is_block}
    dense = build(model.config, dense_state(model.state_dict(), formats), lm.backend, *model.weight_formats,
                  formats=dense_formats)
    return LoadedModel(dense, lm.tokenizer, lm.backend, lm.format, lm.source, lm.load_s, lm.weights), lm


def run_bench(models: list[LoadedModel], backends: list[Backend], prompt_len: int, new_tokens: int,
              sparse_twins: list[LoadedModel] | None = None, runs: list[SparseRun] = (), comms=(None,),
              sampling: SamplingConfig = GREEDY, context: int | None = None,
              sparse_backends: tuple[Backend, ...] = (Backend.triton,)) -> BenchReport:
    """Every backend on every model (the same weights in other formats), in this order, in this process; then
    each sparse run on models[i]'s sparse twin, on each of sparse_backends, beside models[i]'s dense triton run.
    Tensor parallel: each backend with each of comms (tp/comm.py), the others against the nccl run. Each run picks
    its tokens with sampling, with a KV cache of context positions (default: prompt_len + new_tokens)."""
    lm = models[0]
    device = lm.model.tok_embeddings.weight.device
    params = _params(lm.model)
    prompt = _prompt(prompt_len, lm)
    report = BenchReport(
        lm.source, lm.format, str(lm.model.tok_embeddings.weight.dtype).removeprefix("torch."), params,
        prompt_len, new_tokens, context or prompt_len + new_tokens, lm.load_s, copy_bandwidth(device),
        environment(device), sampling=sampling,
    )
    for i, model in enumerate(models):
        dense = None
        for backend in backends:
            results = [bench_backend(model, backend, prompt, new_tokens, comm, sampling, report.context)
                       for comm in comms if backend != Backend.persistent or getattr(comm, "in_step", True)]
            nccl = next((r for r in results if r.tp_comm == "nccl"), None)
            for result in results:
                result.speedup = nccl and result.decode_tokens_per_s / nccl.decode_tokens_per_s
                report.results.append(_against_copy(result, report))
                dense = result if backend == Backend.triton else dense
        for run, backend in itertools.product(runs if sparse_twins else (), sparse_backends):
            sparse_twins[i].model.set_sparsity(run)
            result = _against_copy(bench_backend(sparse_twins[i], backend, prompt, new_tokens, None, sampling,
                                                 report.context), report)
            result.speedup = dense and result.decode_tokens_per_s / dense.decode_tokens_per_s
            report.results.append(result)
    return report


def add_tp1(report: BenchReport, models: list[LoadedModel], backends: list[Backend]) -> None:
    """Tensor parallel, after run_bench: the whole model (models: it and its FP8 copy, as run_bench had the shards)
    on one of the ranks' GPUs, each backend timed on the same prompt and token counts, its rows appended (tp=1);
    then every row's vs_tp1 against the TP=1 row of its backend and weights."""
    prompt = _prompt(report.prompt_tokens, models[0])
    for lm in models:
        for backend in backends:
            r = bench_backend(lm, backend, prompt, report.new_tokens, None, report.sampling, report.context)
            report.results.append(_against_copy(r, report))
    one = {(r.backend, r.weights): r for r in report.results if r.tp == 1}
    for r in report.results:
        base = one.get((r.backend, r.weights))
        r.vs_tp1 = base and r.decode_tokens_per_s / base.decode_tokens_per_s


def _prompt(n: int, lm: LoadedModel) -> list[int]:
    """The prompt every run of a report decodes after: the same n tokens each time."""
    return random_prompt(n, lm.model.config.vocab_size, torch.Generator().manual_seed(0))


def _against_copy(result: BackendResult, report: BenchReport) -> BackendResult:
    """result with its achieved bandwidth as a share of the copy bandwidth report measured (on rank 0's GPU under
    tensor parallelism, where the TP=1 run is timed too)."""
    result.fraction_of_copy_bw = result.achieved_gb_s / report.copy_bw_gb_s
    return result
