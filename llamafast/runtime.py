"""A model made ready to decode fast, the one way every command and library caller gets it: the kernels an earlier
run of the same model loaded are preloaded on a thread while its weights load (load/preload.py), and its decode
launches are tuned on first use of a shape no launch table holds (tuning/). The decode step's and the prompt
buckets' CUDA graphs come with the Engine (generate.py). What happened comes back as data; the CLI prints it.

    with ready(open_model(path), torch.device("cuda")) as (lm, startup):
        engine = Engine(lm.model, SamplingConfig(), 512, n_vocab=lm.tokenizer.vocab_size)

Random weights of a known shape (`ready("llama-2-7b", device)`) are readied the same way, and a model built from
a ready one (load.quantized's FP8 copy) is tuned by ready_built.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from llamafast.config import Backend, DType, FP8Format, model_config
from llamafast.load import LoadedModel, OpenedModel, load_model, random_model
from llamafast.load.preload import KernelPreload, preloading

if TYPE_CHECKING:
    from llamafast import tuning

# What a caller's before-tuning hook may return: a context manager yielding a (phase, done, total) callback.
Shown = contextlib.AbstractContextManager[Callable[[str, int, int], None]]


@dataclass
class Tuning:
    """A sweep of the launches a model's shapes lacked, or only why the cached ones were ignored."""

    plan: tuning.Plan
    done: tuning.Tuned | None  # None: nothing was missing


@dataclass
class Startup:
    """What readying a model did, for the caller to report."""

    load_s: float
    tuning: Tuning | None = None  # None: tuning does not apply (tuning.prepare says where)
    preload: KernelPreload | None = field(default=None, repr=False)

    @property
    def kernels_preloaded(self) -> int:
        """Kernels loaded onto the GPU ahead of their first launch (so far: the thread may still run)."""
        return self.preload.loaded if self.preload else 0


def tune(model, before: Callable[[tuning.Plan], Shown | None] | None = None, timer=None) -> Tuning | None:
    """Tunes model's decode launches for the shapes no table holds (once per GPU, cached); None where tuning does
    not apply. before(plan) hears of the plan first, since a sweep (plan.missing) takes seconds, and may return a
    context manager whose (phase, done, total) callback hears of the sweep's progress (tuning.tune) while it
    runs."""
    if not model.backend.name.fused:  # the other backends launch no tuned kernels (and import no triton)
        return None
    from llamafast import tuning

    plan = tuning.prepare(model, timer)
    if plan is None:
        return None
    shown = before(plan) if before is not None else None
    if not plan.missing:
        return Tuning(plan, None)
    with shown if shown is not None else contextlib.nullcontext() as progress:
        return Tuning(plan, tuning.tune(plan, progress))


def ready_built(lm: LoadedModel, before_tuning: Callable[[tuning.Plan], Shown | None] | None = None) -> Startup:
    """A model built from a ready one (load.quantized's FP8 copy) tuned as ready() tunes its own: its weight format
    can need launches the first lacked."""
    return Startup(lm.load_s, tune(lm.model, before_tuning))


@contextlib.contextmanager
def ready(
    source: OpenedModel | str,
    device: torch.device,
    dtype: DType = DType.auto,
    backend: Backend | None = None,
    fp8: FP8Format | None = None,
    progress=None,
    ranks=None,
    before_tuning: Callable[[tuning.Plan], Shown | None] | None = None,
    warn: Callable[[str], None] | None = None,
) -> Iterator[tuple[LoadedModel, Startup]]:
    """Loads source's weights onto device (a checkpoint opened by open_model, or random weights of the shape named;
    a tensor-parallel rank's slices with ranks, agreed over them) with its kernels preloaded meanwhile, then tunes
    its decode launches. Yields (the model, Startup); when the block ends the kernels this run loaded are recorded
    for the next, and what could not be saved goes to warn."""
    config = model_config(source) if isinstance(source, str) else source.config
    with preloading(config, dtype, fp8, backend, device, ranks, warn=warn) as preload:
        def load() -> LoadedModel:
            shard = ranks and ranks.shard
            if isinstance(source, str):
                return random_model(source, device, dtype, backend, fp8=fp8, shard=shard)
            return load_model(source, None, device, dtype, backend, progress, fp8, shard)

        if ranks is None:
            lm = load()
        else:
            from llamafast.tp.dist import agree

            lm = agree(ranks, load)
        yield lm, dataclasses.replace(ready_built(lm, before_tuning), preload=preload)
