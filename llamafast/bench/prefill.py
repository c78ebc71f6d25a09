"""Prefill benchmark: time to first token and prefill tokens/s at several prompt lengths, per backend, on the
same weights in one process. Returns data; the CLI prints it.

Time to first token is measured as a user sees it: prompt ids on the host to the first sampled id back on
the host (upload, chunked prefill, final norm and LM head, sampling, download); median of `reps` runs after
warm-up runs at that length (Triton compilation, prompt graph capture), at least 3 and at least WARMUP_S: with
one warm-up run, the first length timed on a fresh machine read 18.9 ms at 512 tokens (median of 5, min 13.9)
where a warm GPU gives 14.4 (the clocks had not ramped up). TFLOP/s counts the matmul and causal
attention FLOPs a prefill must do (LM head for the last position only).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import torch

from llamafast.backends import with_backend
from llamafast.config import Backend, ModelConfig, SamplingConfig
from llamafast.generate import Engine, prompt_chunk
from llamafast.load import LoadedModel
from llamafast.measure.common import environment, now, random_prompt

WARMUP_S = 0.5


@dataclass
class PrefillResult:
    backend: str
    prompt_tokens: int
    ttft_ms: float  # median
    ttft_ms_min: float
    prefill_tokens_per_s: float
    tflop_s: float
    prompt_graphs: bool = False  # chunks replayed from CUDA graphs (prompt_graph.py), else queued op by op
    speedup: float | None = None  # reference ttft / this ttft at the same length, when the reference ran
    tp: int = 1  # tensor-parallel ranks
    tp_comm: str | None = None  # tensor parallel: how the ranks sum (tp/comm.py)
    vs_tp1: float | None = None  # tensor parallel: the TP=1 ttft (add_tp1 says which) / this ttft
    weights: str | None = None  # the weights' format: "bfloat16", "fp8_e5m2", "q4_0", ... (LoadedModel.weights)
    chunk: int | None = None  # prompt tokens per forward pass


@dataclass
class PrefillReport:
    model: str
    dtype: str
    chunk: int  # its first run's: each row says its own (a tensor-parallel report's TP=1 rows differ)
    reps: int
    environment: dict = field(default_factory=dict)
    results: list[PrefillResult] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def attention_flops(c: ModelConfig, m: int, pos: int) -> float:
    """Causal attention of m queries at positions pos..: QK^T and PV over the visible keys only (pos + i + 1 for
    query i), 4 D per query-key pair and head, one layer."""
    pairs = m * pos + m * (m + 1) / 2
    return 4.0 * c.head_dim * c.n_heads * pairs


def prefill_flops(c: ModelConfig, n: int) -> float:
    """2 * tokens * (layer weights) + causal attention + one LM head row."""
    per_layer = c.qkv_dim * c.dim + c.dim * c.dim + 3 * c.hidden_dim * c.dim
    return c.n_layers * (2.0 * n * per_layer + attention_flops(c, n, 0)) + 2.0 * c.vocab_size * c.dim


def time_prefill(engine: Engine, ids: list[int], reps: int) -> list[float]:
    """Seconds from prompt ids on the host to the first new token id on the host, `reps` times."""
    times, device = [], engine.token.device
    for _ in range(reps):
        t0 = now(device)
        engine.prefill(ids)
        int(engine.token[0])  # the host read waits for the token
        times.append(time.perf_counter() - t0)
    return times


def warmed_times(engine: Engine, ids: list[int], reps: int) -> list[float]:
    """time_prefill's seconds of `reps` runs, sorted, after the warm-up runs _warming asks for."""
    until, runs = now(engine.token.device) + WARMUP_S, 0
    while _warming(engine.model, runs, until):  # a prompt graph is captured on its bucket's 2nd run
        time_prefill(engine, ids, 1)
        runs += 1
    return sorted(time_prefill(engine, ids, reps))


def _warming(model, runs: int, until: float) -> bool:
    """Whether another warm-up run is due: at least 3, and until WARMUP_S has passed. Under tensor parallelism the
    ranks decide together: every run is a collective, and a rank whose clock ran one more alone would leave the
    others waiting (gloo: a size mismatch once they move on)."""
    device = model.tok_embeddings.weight.device
    due = torch.tensor([int(runs < 3 or now(device) < until)], device=device)
    if model.comm is not None:
        import torch.distributed as dist

        dist.all_reduce(due, op=dist.ReduceOp.MAX, group=model.comm.group)
    return bool(due.item())


def run_prefill_bench(
    lm: LoadedModel, backends: list[Backend], lengths: list[int], reps: int = 10, chunk: int | None = None
) -> PrefillReport:
    """Each backend at each prompt length, each length's prompt the same in every run, in chunks of `chunk` tokens
    (None: the model's default, generate.prompt_chunk); speedups are against the
    reference backend when it ran. The triton backend on a GPU runs twice, prompts replayed from CUDA graphs and
    queued eagerly, the baseline in the same process."""
    device = lm.model.tok_embeddings.weight.device
    config = lm.model.config
    chunk = chunk or prompt_chunk(lm.model)
    gen = torch.Generator().manual_seed(0)
    prompts = [(n, random_prompt(n, config.vocab_size, gen)) for n in lengths]
    report = PrefillReport(lm.source, str(lm.model.tok_embeddings.weight.dtype).removeprefix("torch."), chunk, reps,
                           environment(device))
    runs = [(b, g) for b in backends for g in ((True, False) if b.fused and device.type == "cuda" else (False,))]
    for backend, graphs in runs:
        model = with_backend(lm.model, backend)
        engine = Engine(model, SamplingConfig(temperature=0), max(lengths) + 1, prefill_chunk=chunk,
                        prompt_graphs=graphs)
        for n, ids in prompts:
            times = warmed_times(engine, ids, reps)
            median = times[len(times) // 2]
            report.results.append(PrefillResult(backend.value, n, median * 1e3, times[0] * 1e3, n / median,
                                                prefill_flops(config, n) / median / 1e12, engine.prompts is not None,
                                                tp=model.world, tp_comm=model.comm and model.comm.name.value,
                                                weights=lm.weights, chunk=chunk))
        del engine, model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    ref = {r.prompt_tokens: r.ttft_ms for r in report.results if r.backend == Backend.reference.value}
    for r in report.results:
        r.speedup = ref[r.prompt_tokens] / r.ttft_ms if r.prompt_tokens in ref else None
    return report


def add_tp1(report: PrefillReport, one: PrefillReport) -> None:
    """Tensor parallel: one's rows (run_prefill_bench on the whole model, on one of the ranks' GPUs) appended to
    report's, and every row's vs_tp1, the TP=1 ttft of its backend and length over its own; the TP=1 row with
    prompt graphs where they ran, as one GPU runs a prompt by default."""
    base: dict[tuple[str, int], PrefillResult] = {}
    for r in one.results:
        key = (r.backend, r.prompt_tokens)
        if r.prompt_graphs or key not in base:
            base[key] = r
    report.results += one.results
    for r in report.results:
        b = base.get((r.backend, r.prompt_tokens))
        r.vs_tp1 = b and b.ttft_ms / r.ttft_ms
