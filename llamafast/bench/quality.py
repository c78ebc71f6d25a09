"""The quality lab behind `llamafast eval`: what a weight variant (another dtype, FP8, GGUF blocks) costs against
the base model on the same token stream, in llama.cpp's quality figures: perplexity of each, and the KL divergence
of the next-token distribution from the base's (mean, median, 99th percentile) with top-1 agreement.

The stream is a user's text, or text the base model samples from a fixed set of prompts with a fixed seed (so
no corpus is needed). Each piece of it runs teacher-forced through every model in one prefill, all positions'
logits at once; the first position of a piece predicts nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from llamafast.config import Backend, SamplingConfig, SparseRun
from llamafast.generate import Engine, stream_tokens
from llamafast.bench.prompts import PROMPTS
from llamafast.load import LoadedModel

# Plain-text openings in several registers, for the sampled stream.


@dataclass
class VariantQuality:
    name: str
    perplexity: float
    kl_mean: float | None = None  # KL(base || variant) per position, nats
    kl_median: float | None = None
    kl_p99: float | None = None
    top1_agreement: float | None = None  # share of positions whose argmax equals the base's
    groups_skipped: float | None = None  # sparse FFN variants: the share of neuron groups that did not run


@dataclass
class QualityReport:
    model: str
    base: str
    tokens: int  # positions scored
    source: str  # "text FILE" or "sampled: N prompts x T tokens, seed S"
    results: list[VariantQuality] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def sampled_stream(lm: LoadedModel, n_prompts: int, n_tokens: int, seed: int) -> list[list[int]]:
    """Each of the first n_prompts PROMPTS followed by n_tokens the base model samples (temperature 1, top-p 1)."""
    tok, pieces = lm.tokenizer, []
    for i, prompt in enumerate(PROMPTS[:n_prompts]):
        torch.manual_seed(seed + i)
        ids = tok.encode(prompt)
        engine = Engine(lm.model, SamplingConfig(temperature=1.0, top_p=1.0, seed=seed + i), len(ids) + n_tokens,
                        n_vocab=tok.vocab_size)
        pieces.append(ids + list(stream_tokens(engine, ids, n_tokens)))
    return pieces


# Tokens of a user's text scored unless --tokens says otherwise: on the CPU stories260K scores some 5,000 tokens
# a second, a 7B model far fewer, and the perplexity of 16,384 tokens is already steady to about 1%; a 20 MB
# corpus (5 million tokens) would take many minutes per variant.
TEXT_TOKENS = 16384


def text_stream(lm: LoadedModel, text: str, window: int, limit: int = TEXT_TOKENS) -> tuple[list[list[int]], int]:
    """The first `limit` of the text's ids in windows of at most `window` tokens (each scored on its own), and
    how many ids the whole text has."""
    ids = lm.tokenizer.encode(text)
    used = ids[:limit]
    return [used[i : i + window] for i in range(0, len(used), window) if len(used[i : i + window]) > 1], len(ids)


@torch.no_grad()
def log_probs(lm: LoadedModel, piece: list[int]) -> torch.Tensor:
    """(S - 1, V) fp32 log-probabilities of the next token at every position but the last."""
    model = lm.model
    device = model.tok_embeddings.weight.device
    model.setup_cache(len(piece))
    tokens = torch.tensor(piece, device=device)
    logits = model(tokens, torch.zeros((), dtype=torch.long, device=device), all_logits=True)[:-1]
    return torch.log_softmax(logits.float(), dim=-1).cpu()


def compare(base: LoadedModel, variants: dict[str, LoadedModel], pieces: list[list[int]], model: str,
            source: str, progress: Callable[[int, int], None] | None = None) -> QualityReport:
    """progress(pieces done, pieces) after each piece has run through every model."""
    nll = {name: [] for name in ["base", *variants]}
    kls, agree = {name: [] for name in variants}, {name: [] for name in variants}
    for done, piece in enumerate(pieces, 1):
        targets = torch.tensor(piece[1:])[:, None]
        ref = log_probs(base, piece)
        nll["base"].append(-ref.gather(1, targets)[:, 0])
        for name, lm in variants.items():
            lp = log_probs(lm, piece)
            nll[name].append(-lp.gather(1, targets)[:, 0])
            kls[name].append((ref.exp() * (ref - lp)).sum(dim=-1).clamp_min(0))
            agree[name].append((ref.argmax(-1) == lp.argmax(-1)).float())
        if progress is not None:
            progress(done, len(pieces))
    report = QualityReport(model, base.weights, sum(len(p) - 1 for p in pieces), source)
    report.results.append(VariantQuality("base (" + base.weights + ")", _ppl(nll["base"])))
    for name, lm in variants.items():
        kl = torch.cat(kls[name]).double()
        report.results.append(VariantQuality(
            name, _ppl(nll[name]), kl.mean().item(), kl.median().item(), torch.quantile(kl, 0.99).item(),
            torch.cat(agree[name]).mean().item(), lm.model.groups_skipped()))
    return report


def _ppl(nll: list[torch.Tensor]) -> float:
    return math.exp(torch.cat(nll).double().mean().item())




def sparse_variant(lm: LoadedModel, run: SparseRun) -> LoadedModel:
    """The same weights (shared) with the sparse FFN at every position, as decode would run each token: teacher
    forcing runs the prompt path, so this variant runs on the reference ops, whose sparse FFN takes any rows."""
    from llamafast.backends import with_backend

    model = with_backend(lm.model, Backend.reference)
    model.set_sparsity(run)
    model.sparse_prefill = True
    return LoadedModel(model, lm.tokenizer, Backend.reference, lm.format, lm.source, 0.0, lm.weights)


def make_variant(lm: LoadedModel, name: str) -> LoadedModel:
    """The base model's weights as `name`: FP8 or GGUF blocks quantized from them (block weights dequantized
    first), or the whole model in another dtype."""
    from llamafast.backends import build
    from llamafast.config import BLOCK_FORMATS, WeightFormat
    from llamafast.load import block_copy, quantized
    from llamafast.quant import FP8Format

    if name.startswith("fp8_"):
        return quantized(lm, FP8Format(name.removeprefix("fp8_")))
    if name in BLOCK_FORMATS:
        return block_copy(lm, WeightFormat(name))
    dtype = getattr(torch, name)
    state = {k: v.to(dtype) if v.is_floating_point() and not k.endswith(".scale") else v
             for k, v in lm.model.state_dict().items()}
    model = build(lm.model.config, state, lm.backend, *lm.model.weight_formats, formats=lm.model.tensor_formats)
    return LoadedModel(model, lm.tokenizer, lm.backend, lm.format, lm.source, 0.0, name)
