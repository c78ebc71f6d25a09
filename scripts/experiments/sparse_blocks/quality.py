"""What a sparsified block checkpoint costs against the file it came from, on the CPU (reference path, fp32):

    python scripts/experiments/sparse_blocks/quality.py FILE.gguf SPARSE_DIR

SPARSE_DIR is `llamafast sparsify FILE.gguf SPARSE_DIR ...`'s output (gate and up the file's blocks, w2t in Q8_0:
llamafast/sparse/blocks.py). Every row is scored against FILE itself on eval's sampled stream (8 prompts x 128
tokens, seed 0): the dense run of SPARSE_DIR (what w2's Q8_0 costs alone), then its sparse FFN at each sparsity.
"""

from __future__ import annotations

import sys

import torch

from llamafast.bench.quality import compare, sampled_stream, sparse_variant
from llamafast.config import Backend, SparseMode, SparseRun
from llamafast.load import load_model


def main(file: str, sparse_dir: str) -> None:
    cpu = torch.device("cpu")
    base = load_model(file, device=cpu, backend=Backend.reference, dtype="float32")
    sparse = load_model(sparse_dir, device=cpu, backend=Backend.reference, dtype="float32")
    variants = {"sparse dir, dense (w2t Q8_0)": sparse_variant(sparse, SparseRun(0.0))}
    for mode in SparseMode:
        for s in (0.3, 0.5):
            variants[f"{mode.value} {s}"] = sparse_variant(sparse, SparseRun(s, mode))
    pieces = sampled_stream(base, 8, 128, 0)
    report = compare(base, variants, pieces, file, "sampled by FILE: 8 prompts x 128 tokens, seed 0")
    print(f"base {file} ({base.weights}), {report.tokens} positions; sparse {sparse_dir} ({sparse.weights})")
    print(f"{'weights':30} {'perplexity':>10} {'KL mean':>8} {'KL med':>8} {'KL p99':>8} {'top-1':>7} {'skipped':>8}")
    for r in report.results:
        kl = "" if r.kl_mean is None else f"{r.kl_mean:8.5f} {r.kl_median:8.5f} {r.kl_p99:8.4f} {r.top1_agreement:7.2%}"
        skipped = "" if r.groups_skipped is None else f"{r.groups_skipped:8.1%}"
        print(f"{r.name:30} {r.perplexity:10.4f} {kl} {skipped}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
