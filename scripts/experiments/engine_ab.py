"""What the one-process A/Bs of a decode step share (embedding_row/, pdl_edges/, token_handoff/): random models of a
shape in each weight format asked for, readied and warmed, and an engine's decode steps timed as `bench decode`
times them (streamed, the host reading every token) or replayed with the host reading nothing."""

from __future__ import annotations

import time

import torch

from llamafast.backends import with_backend
from llamafast.config import Backend, DType, FP8Format, WeightFormat
from llamafast.generate import Engine, stream_tokens
from llamafast.load import quantized, random_block_models, random_model
from llamafast.measure.common import copy_bandwidth, random_prompt
from llamafast.runtime import ready_built


def streamed(tokens) -> tuple[float, list[int]]:
    """µs per decode step from the first token's arrival to the last's, as bench_backend times them; the ids."""
    stamps, ids = [], []
    for t in tokens:
        stamps.append(time.perf_counter())
        ids.append(t)
    return 1e6 * (stamps[-1] - stamps[0]) / (len(stamps) - 1), ids


def replayed(engine: Engine, prompt: list[int], new: int) -> float:
    """µs per decode step over new - 1 steps after prompt, one synchronize at the end."""
    engine.prefill(prompt)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(new - 1):
        engine.decode()
    torch.cuda.synchronize()
    return 1e6 * (time.perf_counter() - t0) / (new - 1)


def models(shape: str, fp8: list[str], weights: list[str], device):
    """(name, LoadedModel): random bf16 weights of shape, their FP8 copies (fp8: e5m2, e4m3), then block-format
    models (weights: q8_0, q4_0, ...) made as `bench --weights` makes them, after the float ones are dropped."""
    lm = random_model(shape, device, DType.bfloat16, Backend.triton)
    yield "bf16", lm
    for f in fp8:
        yield f"fp8 {f}", quantized(lm, FP8Format(f))
    blocks = [WeightFormat(w) for w in weights]
    if blocks:
        del lm
        torch.cuda.empty_cache()
        for w, blm in zip(blocks, random_block_models(shape, device, DType.bfloat16, Backend.triton, blocks)):
            yield w.value, blm


def opened(lm, shape: str, new: int, what: str, prompt: list[int] | None):
    """(lm's model on the triton backend, tuned on first use; the 16-token prompt): made, and the shape's header
    printed, for the first model of a shape (prompt None)."""
    ready_built(lm)
    model = with_backend(lm.model, Backend.triton)
    if prompt is None:
        device = lm.model.tok_embeddings.weight.device
        prompt = random_prompt(16, model.config.vocab_size, torch.Generator().manual_seed(0))
        print(f"{shape} on {torch.cuda.get_device_name(device)}; copy bandwidth {copy_bandwidth(device):.0f} GB/s; "
              f"16 + {new} tokens, {what}", flush=True)
    return model, prompt


def warm(engines, prompt: list[int]) -> None:
    """Compiles the kernels and captures each engine's decode graph and its prompt's."""
    for e in engines:
        list(stream_tokens(e, prompt, 8))
        list(stream_tokens(e, prompt, 8))
